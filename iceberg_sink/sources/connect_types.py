"""Kafka Connect schemas as Spark types, and Debezium's logical values as the Iceberg types users expect.

A Connect JSON schema (``{"type": "struct", "fields": [...]}``) gives each field a physical type
(int8..int64, float32/64, boolean, string, bytes, struct, array, map) and, for logical types, a
``name``: these become the types Iceberg's Kafka Connect sink gives them (Decimal -> decimal(p, s),
Date -> date, Timestamp/MicroTimestamp/NanoTimestamp -> timestamp, ZonedTimestamp -> timestamptz,
Time/MicroTime/NanoTime -> long microseconds of the day, Uuid/Json/Enum -> string, ...; the table in
docs/cdc.md). :func:`connect_to_spark` gives the type, the converters turn the physical JSON value
into it in Spark (exactly: a decimal's base64 big-endian unscaled bytes are decoded, negative
values too). Used by sources/debezium.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import types as T

from iceberg_sink._sql_expr import Expr
from iceberg_sink._sql_expr import functions as F
from iceberg_sink.errors import InvalidInputError

_CONNECT_PRIMITIVES: dict[str, T.DataType] = {
    "int8": T.IntegerType(),
    "int16": T.IntegerType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "float": T.FloatType(),
    "float32": T.FloatType(),
    "double": T.DoubleType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}

# Logical types (the Connect schema's "name"), as Iceberg's Kafka Connect sink maps them.
DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATES = ("org.apache.kafka.connect.data.Date", "io.debezium.time.Date")
#: Time of day: the physical value's unit, as (multiplier, divisor) to microseconds.
TIMES = {
    "org.apache.kafka.connect.data.Time": (1000, 1),
    "io.debezium.time.Time": (1000, 1),
    "io.debezium.time.MicroTime": (1, 1),
    "io.debezium.time.NanoTime": (1, 1000),
}
#: Timestamps without a zone: the physical value's unit, as (multiplier, divisor) to microseconds.
TIMESTAMPS = {
    "org.apache.kafka.connect.data.Timestamp": (1000, 1),
    "io.debezium.time.Timestamp": (1000, 1),
    "io.debezium.time.MicroTimestamp": (1, 1),
    "io.debezium.time.NanoTimestamp": (1, 1000),
}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
#: Without a ``connect.decimal.precision`` parameter a Decimal is decimal(38, scale), as Iceberg's Kafka Connect sink does.
DEFAULT_DECIMAL_PRECISION = 38
_MICROS_PER_DAY = 86_400_000_000


def logical_name(schema: dict[str, Any]) -> str | None:
    name = schema.get("name")
    return name if isinstance(name, str) else None


def _decimal_type(schema: dict[str, Any], path: str) -> T.DecimalType:
    params = schema.get("parameters") or {}
    try:
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", DEFAULT_DECIMAL_PRECISION))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(
            f"Debezium envelope schema: field {path!r} is a Decimal with parameters {params!r}; expected integer "
            "'scale' and 'connect.decimal.precision'"
        ) from e
    if not (1 <= precision <= 38 and 0 <= scale <= precision):
        raise InvalidInputError(
            f"Debezium envelope schema: field {path!r} is a Decimal of precision {precision} and scale {scale}; "
            "Iceberg's decimals take a precision of 1 to 38 and a scale of 0 to the precision (configure the "
            "connector's decimal.handling.mode=string or double for wider values)"
        )
    return T.DecimalType(precision, scale)


def physical_type(schema: dict[str, Any], path: str) -> T.DataType:
    """The Spark type ``from_json`` reads a Connect value with (its physical form in JSON)."""
    kind = schema.get("type")
    if kind == "struct":
        return T.StructType(
            [
                T.StructField(f.get("field"), physical_type(f, sub_path(path, f.get("field"))), True)
                for f in schema.get("fields") or []
            ]
        )
    if kind == "array":
        return T.ArrayType(physical_type(schema.get("items") or {}, f"{path}.element"))
    if kind == "map":
        return T.MapType(
            physical_type(schema.get("keys") or {}, f"{path}.key"),
            physical_type(schema.get("values") or {}, f"{path}.value"),
        )
    if isinstance(kind, str) and kind in _CONNECT_PRIMITIVES:
        return _CONNECT_PRIMITIVES[kind]
    raise InvalidInputError(
        f"Debezium envelope schema: field {path or '(value)'!r} has Kafka Connect type {kind!r}; expected one of "
        f"struct, array, map, {', '.join(_CONNECT_PRIMITIVES)}"
    )


def sub_path(path: str, name: Any) -> str:
    return f"{path}.{name}" if path else str(name)


def connect_to_spark(schema: dict[str, Any], path: str = "") -> T.DataType:
    """The Spark type of a Kafka Connect JSON schema, logical types mapped (see docs/cdc.md):
    Decimal to decimal(p, s), VariableScaleDecimal to string, Date to date, Time/MicroTime/NanoTime to
    long (microseconds of the day), Timestamp/MicroTimestamp/NanoTimestamp to timestamp_ntz,
    ZonedTimestamp to timestamp; other names (Uuid, Json, Enum, EnumSet, ...) keep their physical type.

    Raises:
        InvalidInputError: an unknown Connect type, naming the field.
    """
    logical = logical_name(schema)
    kind = schema.get("type")
    if logical == DECIMAL and kind == "bytes":
        return _decimal_type(schema, path)
    if logical == VARIABLE_SCALE_DECIMAL and kind == "struct":
        return T.StringType()
    if logical in DATES and kind in ("int32", "int64"):
        return T.DateType()
    if logical in TIMES and kind in ("int32", "int64"):
        return T.LongType()
    if logical in TIMESTAMPS and kind == "int64":
        return T.TimestampNTZType()
    if logical == ZONED_TIMESTAMP and kind == "string":
        return T.TimestampType()
    if kind == "struct":
        return T.StructType(
            [
                T.StructField(f.get("field"), connect_to_spark(f, sub_path(path, f.get("field"))), True)
                for f in schema.get("fields") or []
            ]
        )
    if kind == "array":
        return T.ArrayType(connect_to_spark(schema.get("items") or {}, f"{path}.element"))
    if kind == "map":
        return T.MapType(
            connect_to_spark(schema.get("keys") or {}, f"{path}.key"),
            connect_to_spark(schema.get("values") or {}, f"{path}.value"),
        )
    return physical_type(schema, path)


def type_label(schema: dict[str, Any] | None, dtype: T.DataType) -> str:
    """How a refusal names a field's declared type: the Connect type (and logical name), else Spark's."""
    if schema is None:
        return dtype.simpleString()
    logical = logical_name(schema)
    kind = str(schema.get("type"))
    if logical in (DECIMAL, VARIABLE_SCALE_DECIMAL, *DATES, *TIMES, *TIMESTAMPS, ZONED_TIMESTAMP):
        return f"{kind} {logical} ({dtype.simpleString()})"
    return kind


def _let(value: Expr, body: Callable[[Expr], Expr]) -> Expr:
    """``body(value)`` with ``value`` computed once: a lambda variable, so an expression used several
    times in ``body`` is not copied into the plan each time (copies grow the plan past the driver's memory)."""
    return F.get(F.transform(F.array(value), body), 0)


def _unscaled(data: Expr) -> Expr:
    """The two's-complement big-endian integer in binary ``data`` (Connect's Decimal), as decimal(38, 0);
    null when it does not fit 38 digits."""

    def from_hex(hexed: Expr) -> Expr:
        n = F.length(hexed) / 2

        def byte(i: Expr) -> Expr:
            return F.conv(hexed.substr(i * 2 + 1, F.lit(2)), 16, 10).cast("int")

        def rest(signed: Expr) -> Expr:
            def step(acc: Expr, i: Expr) -> Expr:
                # try_*: a value past 38 digits is null (then refused), also under ANSI mode.
                return F.try_add(F.try_multiply(acc, F.lit(256)), byte(i)).try_cast("decimal(38,0)")

            more = F.aggregate(F.sequence(F.lit(1), (n - 1).cast("int")), signed, step)
            return F.when(n == 0, F.lit(0).cast("decimal(38,0)")).when(n == 1, signed).otherwise(more)

        first = byte(F.lit(0))
        return _let(F.when(first >= 128, first - 256).otherwise(first).cast("decimal(38,0)"), rest)

    return _let(F.hex(data), from_hex)


def _scaled_text(unscaled: Expr, scale: Expr) -> Expr:
    """The exact decimal text of ``unscaled`` * 10^-``scale`` (scale >= 0), for a cast to decimal or as is."""

    def text(u: Expr, k: Expr) -> Expr:
        def with_digits(digits: Expr) -> Expr:
            width = F.greatest(F.length(digits), k + 1)
            padded = F.concat(F.lit("0" * 40), digits)
            whole = padded.substr(F.length(padded) - width + 1, width)
            sign = F.when(u < 0, F.lit("-")).otherwise(F.lit(""))
            integral = whole.substr(F.lit(1), width - k)
            fraction = whole.substr(width - k + 1, k)
            return F.concat(sign, integral, F.when(k > 0, F.concat(F.lit("."), fraction)).otherwise(F.lit("")))

        return F.when(u.isNull() | k.isNull() | (k < 0), F.lit(None).cast("string")).otherwise(
            # Not abs(u): Spark's abs of a decimal rounds to 34 digits (Scala's BigDecimal context).
            _let(F.regexp_replace(u.cast("string"), "^-", ""), with_digits)
        )

    pair = F.struct(unscaled.alias("u"), scale.cast("int").alias("k"))
    return _let(pair, lambda p: text(p.getField("u"), p.getField("k")))


def _micros(value: Expr, unit: tuple[int, int]) -> Expr:
    multiplier, divisor = unit
    micros = value.cast("long")
    if multiplier != 1:
        micros = (micros.cast("decimal(38,0)") * F.lit(multiplier)).try_cast("long")
    if divisor != 1:  # in decimal: nanoseconds since the epoch are past a double's exact integers
        micros = F.floor(micros.cast("decimal(38,0)") / F.lit(divisor)).try_cast("long")
    return micros


def _timestamp_ntz(micros: Expr) -> Expr:
    days = F.floor(micros.cast("decimal(38,0)") / F.lit(_MICROS_PER_DAY)).try_cast("long")
    rest = micros - days * F.lit(_MICROS_PER_DAY)
    seconds = (rest.cast("decimal(20,0)") / F.lit(1_000_000)).cast("decimal(18,6)")
    epoch = F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")
    return epoch + F.make_dt_interval(days.try_cast("int"), F.lit(0), F.lit(0), seconds)


def _needs_conversion(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "struct":
        return logical_name(schema) == VARIABLE_SCALE_DECIMAL or any(
            _needs_conversion(f) for f in schema.get("fields") or []
        )
    if kind == "array":
        return _needs_conversion(schema.get("items") or {})
    if kind == "map":
        return _needs_conversion(schema.get("values") or {})
    # A time of day is long microseconds whatever its unit: an int64 NanoTime is long already, its value not.
    return logical_name(schema) in TIMES or connect_to_spark(schema) != physical_type(schema, "")


def convert_value(value: Expr, schema: dict[str, Any], path: str) -> Expr:
    """``value`` (as ``from_json`` read it with :func:`physical_type`) in the type :func:`connect_to_spark` gives."""
    if not _needs_conversion(schema):
        return value
    logical = logical_name(schema)
    kind = schema.get("type")
    target = connect_to_spark(schema, path)
    if logical == DECIMAL:
        assert isinstance(target, T.DecimalType)
        return _scaled_text(_unscaled(value), F.lit(target.scale)).try_cast(target)
    if logical == VARIABLE_SCALE_DECIMAL:
        return _scaled_text(_unscaled(value.getField("value")), value.getField("scale").cast("int"))
    if logical in DATES:
        return F.date_add(F.lit("1970-01-01").cast("date"), value.try_cast("int"))
    if logical in TIMES:
        return _micros(value, TIMES[logical])
    if logical in TIMESTAMPS:
        return _timestamp_ntz(_micros(value, TIMESTAMPS[logical]))
    if logical == ZONED_TIMESTAMP:
        return value.try_cast("timestamp")
    if kind == "struct":
        fields = [
            convert_value(value.getField(f.get("field")), f, sub_path(path, f.get("field"))).alias(f.get("field"))
            for f in schema.get("fields") or []
        ]
        return F.when(value.isNull(), F.lit(None)).otherwise(F.struct(*fields))
    if kind == "array":
        items = schema.get("items") or {}
        return F.transform(value, lambda x: convert_value(x, items, f"{path}.element"))
    assert kind == "map"
    values = schema.get("values") or {}
    return F.transform_values(value, lambda _k, v: convert_value(v, values, f"{path}.value"))


def fit_value(value: Expr, source: T.DataType, target: T.DataType) -> Expr:
    """``value`` of type ``source`` as ``target``, a union of it (extra struct fields null, promotions cast)."""
    if source == target:
        return value
    if isinstance(source, T.StructType) and isinstance(target, T.StructType):
        have = {f.name: f.dataType for f in source.fields}
        fields = [
            (
                fit_value(value.getField(f.name), have[f.name], f.dataType)
                if f.name in have
                else F.lit(None).cast(f.dataType)
            ).alias(f.name)
            for f in target.fields
        ]
        return F.when(value.isNull(), F.lit(None).cast(target)).otherwise(F.struct(*fields))
    if isinstance(source, T.ArrayType) and isinstance(target, T.ArrayType):
        return F.transform(value, lambda x: fit_value(x, source.elementType, target.elementType))
    if isinstance(source, T.MapType) and isinstance(target, T.MapType) and source.keyType == target.keyType:
        return F.transform_values(value, lambda _k, v: fit_value(v, source.valueType, target.valueType))
    return value.cast(target)


# -- one rule for values: a non-null JSON value that reads as null (or inf from a finite number) is refused

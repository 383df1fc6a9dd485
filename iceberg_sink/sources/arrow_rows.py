"""Debezium row images read in the Python worker (Arrow) instead of by Catalyst, where that is exact.

:func:`iceberg_sink.sources.debezium.read_envelope` reads each event's row image (``after``, or
``before`` for a delete) with its own schema part's types through Spark expressions: a ``from_json``
per schema part, a conversion per logical type, a refusal check and a promotion per column. At 160
columns that is about 500 expression trees Catalyst analyses, optimises, plans and generates code for
in every micro-batch: 4-5 s for 20 events (docs/benchmarks-debezium-wide.md). This module does the
same reading in one Arrow UDF: Catalyst sees a call and ``getField`` per column, and the worker
decodes the JSON with Python's parser and builds each column as an Arrow array.

It reads only what it reads exactly as the Spark expressions do (``tests/unit/test_arrow_rows.py``
compares both on drawn values): flat rows of Connect's int8..int64, float32/64, boolean, string and
bytes, and the logical types Decimal, Date, Time/MicroTime/NanoTime,
Timestamp/MicroTimestamp/NanoTimestamp and ZonedTimestamp (ISO-8601 with a zone, up to microseconds),
promoted to the batch's union type. Anything else, in a value or in a schema, is left to Spark:

- a schema part with a struct, array or map column, or VariableScaleDecimal: :func:`row_reader`
  returns None and the batch is read by Catalyst;
- a value the worker would not read exactly as Spark does (one that does not fit its declared type,
  which Spark refuses with a reason; a JSON kind its type does not take; a float that is not finite;
  a duplicate key; text that is not JSON): the Spark job fails with :data:`READ_BY_SPARK`, and the
  sink reads the batch again with Spark's expressions (job/reading.py), as it does for
  :data:`iceberg_sink.sources.envelope.STALE_COUNTS`. Refusals, dead letters and their reasons are
  therefore always Spark's.

Only the sink uses it (inside :func:`iceberg_sink.sources.envelope.reading_batch`, on a batch whose
statistics are plain: every event has a schema part and none holds the TOAST placeholder), and only
where PySpark has Arrow UDFs (4.1 and later).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas import functions as pandas_functions

from iceberg_sink.sources.connect_types import (
    DATES,
    DECIMAL,
    TIMES,
    TIMESTAMPS,
    ZONED_TIMESTAMP,
    connect_to_spark,
    logical_name,
)
from iceberg_sink.sources.envelope import READ_BY_SPARK
from iceberg_sink.writer.task_start import task_start

#: PySpark's Arrow UDFs (4.1 and later), else None.
_ARROW_UDF: Any = getattr(pandas_functions, "arrow_udf", None)


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: Timestamps the worker reads: years 0001-9999 (Spark's own range for casts and text).
_MIN_MICROS, _MAX_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999
_ZONED = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")


class _Leave(Exception):
    """A value the worker leaves to Spark."""


def _leave(what: str, value: Any) -> _Leave:
    return _Leave(f"{what}: {str(value)[:100]!r}")


def _int_in(low: int, high: int) -> Callable[[Any], Any]:
    def read(v: Any) -> Any:
        if type(v) is not int or not low <= v <= high:
            raise _leave("an integer out of its range or of another JSON kind", v)
        return v

    return read


def _number(v: Any) -> float:
    """A JSON number as Spark's parser reads it for a double: exact, finite."""
    if type(v) is int:
        if abs(v) > 2**53:  # past a double's exact integers: rounding rules differ
            raise _leave("a large integer for a floating-point column", v)
        return float(v)
    if type(v) is not float or not math.isfinite(v):
        raise _leave("a floating-point value that is not a finite number", v)
    return v


def _float32(v: Any) -> float:
    """A JSON number as Spark reads it for a float (rounded once, from the text, to 32 bits)."""
    d = _number(v)
    try:
        f: float = struct.unpack("<f", struct.pack("<f", d))[0]
    except OverflowError as e:
        raise _leave("a number past a float's range", v) from e
    if not math.isfinite(f):
        raise _leave("a number past a float's range", v)
    if f != d:
        # The nearest double rounded to 32 bits is the text rounded to 32 bits, unless the double sits
        # exactly halfway between two floats (its text may be on either side): left to Spark.
        other = math.nextafter(f, d)
        other = struct.unpack("<f", struct.pack("<f", other))[0]
        if other == f:  # nextafter in doubles stays on f's float: step to the next float
            step = struct.unpack("<i", struct.pack("<f", f))[0] + (1 if (d > f) == (f >= 0) else -1)
            other = struct.unpack("<f", struct.pack("<i", step))[0]
        if math.isfinite(other) and abs(d - f) == abs(other - d):
            raise _leave("a number halfway between two floats", v)
    return f


def _boolean(v: Any) -> Any:
    if type(v) is not bool:
        raise _leave("a value of another JSON kind for a boolean column", v)
    return v


def _string(v: Any) -> Any:
    if type(v) is not str:
        raise _leave("a value of another JSON kind for a string column", v)
    return v


def _bytes(v: Any) -> bytes:
    if type(v) is not str:
        raise _leave("a value of another JSON kind for a bytes column", v)
    try:
        data = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _leave("bytes that are not base64", v) from e
    if base64.b64encode(data).decode() != v:  # only the canonical form: decoders differ on the others
        raise _leave("bytes in a base64 form other than the canonical one", v)
    return data


def _decimal(precision: int, scale: int) -> Callable[[Any], Any]:
    limit = 10**precision

    def read(v: Any) -> Decimal:
        unscaled = int.from_bytes(_bytes(v), "big", signed=True)
        if abs(unscaled) >= limit:
            raise _leave(f"a decimal wider than its precision {precision}", v)
        sign, digits = (1 if unscaled < 0 else 0), tuple(int(d) for d in str(abs(unscaled)))
        return Decimal((sign, digits, -scale))

    return read


def _scaled(physical: Callable[[Any], Any], unit: tuple[int, int], low: int, high: int) -> Callable[[Any], int]:
    multiplier, divisor = unit

    def read(v: Any) -> int:
        out = (physical(v) * multiplier) // divisor
        if not low <= out <= high:
            raise _leave("a time or timestamp out of range", v)
        return int(out)

    return read


def _zoned(v: Any) -> int:
    if type(v) is not str or not _ZONED.fullmatch(v):
        raise _leave("a zoned timestamp in a form other than ISO-8601 with a zone", v)
    try:
        moment = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError as e:
        raise _leave("a zoned timestamp that is not a date and time", v) from e
    offset = moment.utcoffset()
    assert offset is not None
    naive = moment.replace(tzinfo=None) - offset
    micros = (naive - datetime(1970, 1, 1)) // _MICRO
    if not _MIN_MICROS <= micros <= _MAX_MICROS:
        raise _leave("a zoned timestamp out of range", v)
    return int(micros)


_MICRO = datetime(1970, 1, 1, 0, 0, 0, 1) - datetime(1970, 1, 1)


def _reader(schema: dict[str, Any]) -> Callable[[Any], Any] | None:
    """How the worker reads a field of Connect ``schema`` into the value Spark's expressions give it
    (:func:`iceberg_sink.sources.connect_types.connect_to_spark`), or None when it leaves it to Spark."""
    kind, logical = schema.get("type"), logical_name(schema)
    ints = {"int8": _INT32, "int16": _INT32, "int32": _INT32, "int64": _INT64}
    if logical == DECIMAL and kind == "bytes":
        target = connect_to_spark(schema)
        assert isinstance(target, T.DecimalType)
        return _decimal(target.precision, target.scale)
    if logical in DATES and kind in ("int32", "int64"):
        return _int_in(*_INT32)
    if logical in TIMES and kind in ints:
        return _scaled(_int_in(*ints[kind]), TIMES[logical], *_INT64)
    if logical in TIMESTAMPS and kind == "int64":
        return _scaled(_int_in(*_INT64), TIMESTAMPS[logical], _MIN_MICROS, _MAX_MICROS)
    if logical == ZONED_TIMESTAMP and kind == "string":
        return _zoned
    if isinstance(kind, str) and kind in ints:
        return _int_in(*ints[kind])
    if kind in ("float", "float32"):
        return _float32
    if kind in ("double", "float64"):
        return _number
    return {"boolean": _boolean, "string": _string, "bytes": _bytes}.get(str(kind))


def _arrow_type(dtype: T.DataType) -> pa.DataType | None:
    simple: dict[type[T.DataType], pa.DataType] = {
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
        T.TimestampNTZType: pa.timestamp("us"),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
    }
    if isinstance(dtype, T.DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    return simple.get(type(dtype))


class RowReader:
    """The Arrow UDF's work, shipped to the workers: for each event, its schema part's readers.

    An event names its schema part by its place in :attr:`texts` (:func:`reading_column` finds it on
    the JVM): a wide table's schema part is most of its event (25 of a 160-column event's 28 KB), and
    the worker needs only which one it is."""

    def __init__(self, parts: dict[str, list[tuple[str, Callable[[Any], Any]]]], target: T.StructType) -> None:
        self.texts = list(parts)
        self.parts = [parts[text] for text in self.texts]
        self.names = [f.name for f in target.fields]
        types = [_arrow_type(f.dataType) for f in target.fields]
        assert all(t is not None for t in types)
        self.struct = pa.struct([pa.field(f.name, t) for f, t in zip(target.fields, types, strict=True)])

    def __call__(self, images: pa.Array, parts: pa.Array) -> pa.Array:
        task_start()
        try:
            return self.read(images.to_pylist(), parts.to_pylist())
        except _Leave as e:
            raise RuntimeError(f"{READ_BY_SPARK} ({e})") from None

    def read(self, images: list[str | None], parts: list[int | None]) -> pa.Array:
        """``images`` as rows; ``parts``: each event's schema part, its place in :attr:`texts` (None or
        out of range: one this reader was not built for, or none)."""
        columns: dict[str, list[Any]] = {name: [None] * len(images) for name in self.names}
        present = [True] * len(images)
        for i, (image, part) in enumerate(zip(images, parts, strict=True)):
            if image is None:
                present[i] = False
                continue
            if part is None or not 0 <= part < len(self.parts):
                raise _leave("an event whose schema part this reader was not built for", part)
            readers = self.parts[part]
            document = _document(image)
            for name, read in readers:
                value = document.get(name)
                if value is not None:
                    columns[name][i] = read(value)
        try:
            arrays = [pa.array(columns[f.name], type=f.type) for f in self.struct]
        except (pa.ArrowException, UnicodeError, OverflowError, ValueError) as e:
            raise _leave("a value Arrow does not take as its type", e) from e
        mask = pa.array([not p for p in present], type=pa.bool_())
        return pa.StructArray.from_arrays(arrays, fields=list(self.struct), mask=mask)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _leave("a row image naming a field twice", [k for k, _ in pairs])
    return out


def _document(image: str) -> dict[str, Any]:
    try:
        document = json.loads(image, object_pairs_hook=_pairs)
    except ValueError as e:
        raise _leave("a row image that is not JSON", image) from e
    if not isinstance(document, dict):
        raise _leave("a row image that is not a JSON object", image)
    return document


def row_reader(parts: dict[str, dict[str, Any]], target: T.StructType) -> RowReader | None:
    """A reader for row images whose schema part (the envelope's ``schema`` text) is a key of
    ``parts`` (the part's row schema: its ``after`` field) as ``target`` (their union), or None when a
    part has a field the worker leaves to Spark (struct, array, map, VariableScaleDecimal) or
    ``target`` a type it does not build."""
    if any(_arrow_type(f.dataType) is None for f in target.fields):
        return None
    readers: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {}
    for text, row in parts.items():
        fields = []
        for field in row.get("fields") or []:
            read = _reader(field)
            name = field.get("field")
            if read is None or name not in target.fieldNames() or not _promotes(field, target[name].dataType):
                return None
            fields.append((name, read))
        readers[text] = fields
    return RowReader(readers, target)


def _promotes(schema: dict[str, Any], target: T.DataType) -> bool:
    """Whether a value read for Connect ``schema`` is the same value in ``target``: the union of the
    batch's parts widens int to long, float to double (the float's value, exact in a double) and a
    decimal's precision (the same scale), none of which changes a value."""
    own = connect_to_spark(schema)
    return (
        own == target
        or (isinstance(own, T.IntegerType) and isinstance(target, T.LongType))
        or (isinstance(own, T.FloatType) and isinstance(target, T.DoubleType))
        or (isinstance(own, T.DecimalType) and isinstance(target, T.DecimalType) and own.scale == target.scale)
    )


def reading_column(reader: RowReader, image: Column, schema: Column, target: T.StructType) -> Column:
    """The row image as ``target`` (``reader``'s), read by an Arrow UDF (:func:`arrow_udfs`) that is
    handed each event's image and the place of its schema part (``schema``: the part's text) among
    ``reader.texts``: -1 for another part, null for none."""
    assert _ARROW_UDF is not None

    def read(images: pa.Array, parts: pa.Array) -> pa.Array:  # its hints make it a scalar Arrow UDF
        return reader(images, parts)

    known = F.array(*[F.lit(text) for text in reader.texts])
    part = (F.array_position(known, schema) - F.lit(1)).cast("int")
    return _ARROW_UDF(read, target)(image, part)  # type: ignore[no-any-return]


def arrow_udfs() -> bool:
    """Whether this PySpark has Arrow UDFs (4.1 and later); without them Spark reads every image."""
    return _ARROW_UDF is not None

"""The order of Debezium events: the payload paths :func:`iceberg_sink.sources.debezium.read_envelope`
orders them by (``order_by``) and what each path's value becomes (``order_type``): a Spark type it is
cast to, or ``"binlog"``, a binlog file name's sequence number (MariaDB and MySQL; docs/cdc.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql.types import _parse_datatype_string

from iceberg_sink._sql import column, parse, string
from iceberg_sink.errors import InvalidInputError

BINLOG_ORDER = "binlog"
"""The ``order_type`` of a binlog file name (``mysql-bin.000042``): ordered by its sequence number."""
_BINLOG_EXPECTED = "a binlog file name (a name, a dot and its sequence number: mysql-bin.000042)"
# The sequence number: at least one digit after the last dot, at most 18 (a long holds them all).
_BINLOG_NUMBER = r"^.*[.]([0-9]{1,18})$"


def order_paths(
    order_by: str | Sequence[str] | None, order_type: str | Sequence[str], caller: str = "read_envelope"
) -> tuple[list[str], list[str]]:
    """The order's payload paths and their types, one each (``read_envelope``'s ``order_by`` and
    ``order_type``); no paths for ``order_by=None``. Checked without Spark, so the builder's
    ``.debezium(...)`` refuses them when called, not at the first batch.

    Raises:
        InvalidInputError: not a path or a non-empty list of them, or not one type or one per path.
    """
    paths: list[Any] = [order_by] if isinstance(order_by, str) else list(order_by) if order_by is not None else []
    types: list[Any] = list(order_type) if isinstance(order_type, list | tuple) else [order_type] * len(paths)
    if order_by is not None and (
        not paths or len(types) != len(paths) or not all(isinstance(p, str) and p for p in (*paths, *types))
    ):
        raise InvalidInputError(
            f"{caller}(order_by=..., order_type=...): expected a payload path or a non-empty list of them, and "
            f"one order type or one per path; received order_by={order_by!r}, order_type={order_type!r}"
        )
    return paths, types


def order_expected(kind: str) -> str:
    """What a refusal says an order value of ``kind`` should have been."""
    return _BINLOG_EXPECTED if kind == BINLOG_ORDER else f"a {kind}"


def order_value(raw: str, kind: str) -> Column:
    """The order value in column ``raw`` (payload text) as ``kind``: a Spark type it is cast to (null
    when it does not cast), or :data:`BINLOG_ORDER`: the file's sequence number as a long, null when
    ``raw`` is not a binlog file name. MySQL and MariaDB number their binlog files with at least six
    digits and go on past 999999 (``binlog.999999`` is followed by ``binlog.1000000``), so the names
    do not sort as text. Written as SQL text: ``Column.try_cast`` is Spark 4's, SQL's ``try_cast`` is
    Spark 3.5's too."""
    if kind == BINLOG_ORDER:
        # No match extracts "", which casts to null: one regular expression per value.
        return parse(f"try_cast(regexp_extract({column(raw)}, {string(_BINLOG_NUMBER)}, 1) AS BIGINT)")
    try:
        dtype = _parse_datatype_string(kind)
    except Exception as e:  # Spark's parser: an unknown type name
        raise InvalidInputError(
            f"read_envelope(order_type=...): expected a Spark type name (long, string, timestamp, ...) or "
            f"{BINLOG_ORDER!r}, received {kind!r}"
        ) from e
    return parse(f"try_cast({column(raw)} AS {dtype.simpleString()})")

"""One data file's equality keys as the key index holds them: sorted int64 keys or Arrow columns.

Both forms are immutable values, built once from the file's projected key columns
(:func:`index_rows`), kept in memory by :class:`~iceberg_sink.keyindex.index.KeyIndex`
and written to table storage by :mod:`~iceberg_sink.keyindex.persisted`.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema

from iceberg_sink._arrays import distinct


def as_int64(array: pa.Array) -> np.ndarray | None:
    """The values of an integer-like Arrow array (no nulls) as int64, or None for other types."""
    t = array.type
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            return None  # not a type Iceberg has; values above 2^63 would wrap
        return np.asarray(array.cast(pa.int64()))
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.asarray(array.view(pa.int32())).astype(np.int64)
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_date64(t):
        return np.asarray(array.view(pa.int64()))
    return None


@attrs.frozen(eq=False)
class SortedKeys:
    """Integer-like keys in ascending order, with the row position of each (the sorted form)."""

    keys: np.ndarray  # int64, ascending
    order: np.ndarray | None  # uint32 row position of each key; None: keys are in row order

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + (self.order.nbytes if self.order is not None else 0))

    def lookup(self, wanted: WantedKeys) -> np.ndarray:
        """Row positions (int64, ascending) whose key is one of ``wanted``."""
        keys = self.keys
        if not len(wanted.keys) or not len(keys):
            return np.empty(0, np.int64)
        if wanted.table is not None:
            # The rows whose key lies in the wanted keys' range are one slice of the sorted keys: each
            # is checked in the membership table, a read each, when that is fewer steps than a binary
            # search per wanted key (a file of fewer rows than it is asked keys, about).
            start = int(np.searchsorted(keys, wanted.keys[0], side="left"))
            stop = int(np.searchsorted(keys, wanted.keys[-1], side="right"))
            if stop - start <= _SLICE_PER_WANTED_KEY * len(wanted.keys):
                indices = np.flatnonzero(wanted.table[keys[start:stop] - wanted.keys[0]]) + start
                return self._rows(indices)
        # One binary search per key for its first row, then its repeats in the file, if any, follow.
        first = np.searchsorted(keys, wanted.keys)
        inside = first < len(keys)
        first = first[inside]
        first = first[keys[first] == wanted.keys[inside]]
        found = [first]
        following = first + 1
        while len(following):
            following = following[following < len(keys)]
            following = following[keys[following] == keys[following - 1]]
            found.append(following)
            following = following + 1
        return self._rows(np.concatenate(found))

    def _rows(self, indices: np.ndarray) -> np.ndarray:
        rows = indices if self.order is None else self.order[indices]
        return np.sort(rows.astype(np.int64))  # distinct: each row has one key, each key is looked up once


# A membership table costs a byte per value of the wanted keys' range: built when the range is at most
# this many values (16 MiB), or at most 64 values per wanted key up to four times that.
_TABLE_MAX_SPAN = 1 << 24
_TABLE_SPAN_PER_KEY = 64
# Reading a row's key in the table is about a tenth of a binary search step's cost (a search is some
# 15-20 steps): the table serves a file whose rows in the range are at most this many per wanted key.
_SLICE_PER_WANTED_KEY = 8


@attrs.frozen(eq=False)
class WantedKeys:
    """The distinct integer keys one lookup asks every file for (ascending), and, when their range is
    small enough, a membership table over it (``table[k - keys[0]]``): a lookup in a file with few
    rows then reads its rows in the range once each instead of searching for every wanted key
    (:meth:`SortedKeys.lookup`). Built once per checkpoint's deleted keys, used for every file."""

    keys: np.ndarray  # int64, ascending, distinct
    table: np.ndarray | None  # bool over keys[0] .. keys[-1]

    @classmethod
    def of(cls, values: np.ndarray) -> WantedKeys:
        keys = distinct(values.astype(np.int64, copy=False))
        if not len(keys):
            return cls(keys, None)
        span = int(keys[-1]) - int(keys[0]) + 1  # Python ints: no int64 overflow
        if span > min(4 * _TABLE_MAX_SPAN, max(_TABLE_MAX_SPAN, _TABLE_SPAN_PER_KEY * len(keys))):
            return cls(keys, None)
        table = np.zeros(span, dtype=np.bool_)
        table[keys - keys[0]] = True
        return cls(keys, table)


@attrs.frozen(eq=False)
class ArrowKeys:
    """The file's key columns as Arrow (the form for every other key)."""

    rows: pa.Table  # the file's key fields, projected to the index key's schema

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)


@attrs.frozen(eq=False)
class IndexEntry:
    """The keys of one data file, with the size and record count of the file they were read from."""

    file_size: int
    record_count: int
    keys: SortedKeys | ArrowKeys


def index_rows(rows: pa.Table, schema: Schema, ids: tuple[int, ...]) -> SortedKeys | ArrowKeys:
    """The best form for the key ``ids`` of ``rows`` (see the key index's module docstring, index.py)."""
    if len(ids) == 1 and schema.accessor_for_field(ids[0]).inner is None and rows.num_rows < 2**32:
        column = rows.column(schema.accessor_for_field(ids[0]).position).combine_chunks()
        values = as_int64(column) if column.null_count == 0 else None
        if values is not None:
            if len(values) < 2 or bool(np.all(values[1:] >= values[:-1])):
                return SortedKeys(values.copy(), None)
            order = np.argsort(values, kind="stable").astype(np.uint32)
            return SortedKeys(values[order], order)
    return ArrowKeys(rows)

"""The last change of each key, taken inside a writer task from rows sorted by key.

A batch whose changes its writer tasks reduce (topology/changes.py ``reduce_changes`` with
``in_writers``; issue 41) reaches each task with its rows sorted by key, a key's newest change
first, and three kinds of helper columns (vocab/columns.py): a copy of each key column
(``RUN_KEY_PREFIX`` + its position), the arrival number of a row that is a group of its own
(``RUN_ALONE_COLUMN``: a refused row or a truncate marker, null for a change) and a 64-bit hash of
the key (``RUN_HASH_COLUMN``). The first row of each run of equal (key, alone) values is what Spark's
window would have kept (``row_number() = 1``); nulls are equal to nulls, as in Spark's grouping.

The task keeps the hashes of the keys it kept, so that the driver can tell whether one key's changes
were in two tasks (a source not partitioned by the key): then neither task's row was the key's last
change for certain, and the batch is written again, reduced in Spark (job/road.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iceberg_sink._arrays import distinct, has_repeats
from iceberg_sink.vocab.columns import RUN_ALONE_COLUMN, RUN_HASH_COLUMN, RUN_KEY_PREFIX


def helper_columns(names: Sequence[str]) -> list[str]:
    """The helper columns among ``names``, in their order."""
    return [n for n in names if n.startswith(RUN_KEY_PREFIX) or n in (RUN_ALONE_COLUMN, RUN_HASH_COLUMN)]


class KeyRuns:
    """One task's reduction: :meth:`reduced` keeps the first row of each run; :attr:`hashes` then
    holds the hashes of the keys kept (rows alone have none)."""

    def __init__(self) -> None:
        self._previous: pa.RecordBatch | None = None  # the run columns of the last row seen
        self._hashes: list[np.ndarray] = []

    def reduced(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` (sorted as above, in order) with the first row of each run only, helper columns dropped."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            names = batch.schema.names
            runs = [n for n in names if n.startswith(RUN_KEY_PREFIX)] + [RUN_ALONE_COLUMN]
            missing = [n for n in (*runs, RUN_HASH_COLUMN) if n not in names]
            if missing or len(runs) < 2:
                raise ValueError(
                    f"a batch reduced in its writer tasks: expected the key, alone and hash helper columns, "
                    f"received the columns {names}"
                )
            starts = self._starts(batch, runs)
            kept = batch.filter(starts)
            self._previous = batch.select(runs).slice(batch.num_rows - 1, 1)
            hashes = kept.column(RUN_HASH_COLUMN).drop_null()
            if len(hashes):
                self._hashes.append(hashes.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
            yield kept.select([n for n in names if n not in helper_columns(names)])

    def _starts(self, batch: pa.RecordBatch, runs: Sequence[str]) -> pa.Array:
        rows = batch.num_rows
        previous = self._previous
        first = previous is None or any(
            previous.column(name)[0].as_py() != batch.column(name)[0].as_py() for name in runs
        )
        rest: pa.Array | None = None  # whether each later row differs from the row before it
        for name in runs:
            values = batch.column(name)
            after, before = values.slice(1), values.slice(0, rows - 1)
            both_null = pc.and_(pc.is_null(after), pc.is_null(before))
            differs = pc.invert(pc.or_(both_null, pc.fill_null(pc.equal(after, before), False)))
            rest = differs if rest is None else pc.or_(rest, differs)
        assert rest is not None  # runs holds the alone column at least
        return pa.concat_arrays([pa.array([first], pa.bool_()), rest])

    def hashes(self) -> bytes:
        """The distinct hashes of the keys kept, sorted, as little-endian 64-bit integers."""
        if not self._hashes:
            return b""
        return distinct(np.concatenate(self._hashes)).astype("<i8").tobytes()


def crossed(task_hashes: Iterable[bytes]) -> bool:
    """Whether a key hash is in the hashes of two tasks (:meth:`KeyRuns.hashes` of each): a key's
    changes were maybe in two tasks (two keys of one hash count too: the safe side)."""
    arrays = [np.frombuffer(h, dtype="<i8") for h in task_hashes if h]
    if len(arrays) < 2:
        return False
    every = np.concatenate(arrays)
    return has_repeats(every)

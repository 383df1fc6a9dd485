"""Values a writer task returns to the driver: written files and their column metrics."""

from __future__ import annotations

from collections import Counter

import attrs

from iceberg_sink import _codec
from iceberg_sink.vocab.files import DataFileMeta


@attrs.frozen
class WriteResult:
    """What one writer task produced for one checkpoint.

    Attributes:
        data_files: data files written.
        delete_files: position and equality delete files written (CDC modes).
        task_id: Spark partition id of the task, for metrics and logs.
        attempt_id: Spark task attempt id; results of failed attempts never reach the driver.
        skipped_deletes: rows whose key was provably new (see table/key_bounds.py): their equality
            deletes are in ``conditional_delete_files`` instead of ``delete_files``.
        conditional_delete_files: equality deletes of keys proven new, committed only if the proof
            no longer holds at commit time (the committer decides).
        truncated: the task received the checkpoint's truncate marker (topology/changes.py): the
            checkpoint's snapshot removes every older file of the table.
        arrow_row_bytes: the widest Arrow batch the task received, in bytes per row (0: not
            measured), for how Spark cuts the next write's batches (writer/arrow_batches.py).
    """

    data_files: tuple[DataFileMeta, ...] = ()
    delete_files: tuple[DataFileMeta, ...] = ()
    task_id: int = 0
    attempt_id: int = 0
    skipped_deletes: int = 0
    conditional_delete_files: tuple[DataFileMeta, ...] = ()
    truncated: bool = False
    arrow_row_bytes: int = 0

    # 3: conditional_delete_files (versions 1 and 2 decode with none). 4: truncated. 5: arrow_row_bytes.
    CODEC_VERSION = 5

    @property
    def is_empty(self) -> bool:
        """Whether the task wrote nothing and saw no truncate (its result need not reach the aggregator)."""
        return not (self.data_files or self.delete_files or self.conditional_delete_files or self.truncated)

    def encode(self) -> bytes:
        return _codec.dumps(
            "write-result",
            self.CODEC_VERSION,
            {
                "data_files": [f.to_json() for f in self.data_files],
                "delete_files": [f.to_json() for f in self.delete_files],
                "task_id": self.task_id,
                "attempt_id": self.attempt_id,
                "skipped_deletes": self.skipped_deletes,
                "conditional_delete_files": [f.to_json() for f in self.conditional_delete_files],
                "truncated": self.truncated,
                "arrow_row_bytes": self.arrow_row_bytes,
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> WriteResult:
        obj = _codec.loads(data, "write-result", (1, 2, 3, 4, 5))
        return cls(
            data_files=tuple(DataFileMeta.from_json(f) for f in obj["data_files"]),
            delete_files=tuple(DataFileMeta.from_json(f) for f in obj["delete_files"]),
            task_id=obj["task_id"],
            attempt_id=obj["attempt_id"],
            skipped_deletes=obj.get("skipped_deletes", 0),
            conditional_delete_files=tuple(DataFileMeta.from_json(f) for f in obj.get("conditional_delete_files", ())),
            truncated=obj.get("truncated", False),
            arrow_row_bytes=obj.get("arrow_row_bytes", 0),
        )


@attrs.define
class Written:
    """What the one write of a micro-batch produced: each table's task results, the dead-letter
    table's, the refused rows per source table, the most files a task held open, how long it took, and
    whether its tasks' reductions overlapped."""

    tables: dict[str, list[WriteResult]] = attrs.field(factory=dict)
    dead: list[WriteResult] = attrs.field(factory=list)
    counts: Counter[str] = attrs.field(factory=Counter)
    peaks: list[int] = attrs.field(factory=list)
    write_ms: float = 0.0
    #: Reduced in its writer tasks (writer/key_runs.py), a key's changes were maybe in two of them:
    #: these results are not the batch's.
    keys_crossed: bool = False

    def results(self) -> list[WriteResult]:
        """Every task result of the write: each table's, then the dead-letter table's."""
        return [r for results in self.tables.values() for r in results] + self.dead

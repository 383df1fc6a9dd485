"""Compaction settings: triggers and planning thresholds, validated once."""

from __future__ import annotations

import attrs

from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.topology import arguments

# Counts and sizes are at least 1, seconds more than 0; NaN and infinities are refused
# (topology/arguments.py, where every maintenance argument is checked).
_POSITIVE = {
    name: arguments.Number(name, "", integer=False, minimum=0.001 if name == "every_seconds" else 1)
    for name in (
        "every_n_commits",
        "small_files_per_partition",
        "small_files_bytes",
        "every_seconds",
        "delete_files",
        "delete_records",
        "target_file_size_bytes",
        "min_file_size_bytes",
        "max_group_bytes",
        "min_input_files",
        "delete_file_threshold",
    )
}


@attrs.frozen
class CompactionConfig:
    """When and how to compact.

    Triggers (any one starts a compaction; like Flink's table maintenance):
        every_n_commits: after this many commits since the last compaction.
        small_files_per_partition: when a partition received more than this many small files.
        small_files_bytes: when small files written since the last compaction exceed this many bytes.
        every_seconds: when this many seconds passed since the last compaction (checked after commits).
        delete_files: when the branch holds more than this many live delete files (snapshot summary
            ``total-delete-files``).
        delete_records: when the branch holds more than this many live delete rows, equality and
            position (``total-equality-deletes`` + ``total-position-deletes``).

    Planning:
        target_file_size_bytes: size of rewritten files (default: the table's write.target-file-size-bytes).
        min_file_size_bytes: files below this are "small" (default: 75% of the target).
        max_group_bytes: most bytes of input one rewrite task reads.
        min_input_files: a group needs at least this many files, unless it has deletes to apply.
        delete_file_threshold: rewrite a file when at least this many delete files apply to it.
        max_replans: how often a compaction whose groups were dropped on conflict (a concurrent
            commit added deletes for, or removed, files it rewrote) plans again at once (0: never).
        background: run on a background thread of the same SparkSession instead of between micro-batches.
    """

    every_n_commits: int | None = None
    small_files_per_partition: int | None = None
    small_files_bytes: int | None = None
    every_seconds: float | None = None
    delete_files: int | None = None
    delete_records: int | None = None
    target_file_size_bytes: int | None = None
    min_file_size_bytes: int | None = None
    max_group_bytes: int = 512 * 1024 * 1024
    min_input_files: int = 2
    delete_file_threshold: int = 1
    max_replans: int = 1
    background: bool = False

    def __attrs_post_init__(self) -> None:
        for name, number in _POSITIVE.items():
            number.check_optional(getattr(self, name), "compaction")
        arguments.MAX_REPLANS.check(self.max_replans, "compaction")
        if not isinstance(self.background, bool):
            raise InvalidSinkConfigError(
                f"compaction(background): expected True or False, received {self.background!r}"
            )

    @property
    def has_trigger(self) -> bool:
        return any(
            v is not None
            for v in (
                self.every_n_commits,
                self.small_files_per_partition,
                self.small_files_bytes,
                self.every_seconds,
                self.delete_files,
                self.delete_records,
            )
        )

    def target(self, table_default: int) -> int:
        return self.target_file_size_bytes or table_default

    def min_size(self, table_default: int) -> int:
        return self.min_file_size_bytes or int(self.target(table_default) * 0.75)

"""Post-commit topology, part 2: small-file compaction that is safe beside a live stream.

    plan (driver) ──groups──▶ rewrite (Spark tasks) ──new files──▶ validate + commit (driver)

- planner.py: bin-packs small files and files with deletes per partition into groups.
- rewriter.py: reads a group's data files, applies the deletes that apply to them, writes new files.
- job.py: commits a ``replace`` snapshot that keeps the data sequence number of the snapshot it read,
  so equality deletes the stream commits meanwhile still apply to the rewritten rows; groups that
  really conflict (file already removed, new position deletes) are dropped, not the stream.
- trigger.py: when to compact after commits (commit count, small files, bytes, time), inline or in
  the background, at most one compaction per table at a time.
"""

from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.job import CompactionResult, compact

__all__ = ["CompactionConfig", "CompactionResult", "compact"]

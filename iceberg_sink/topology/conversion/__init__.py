"""Post-commit topology, part 3: converting equality deletes into position deletes (format v2) or
deletion vectors (format v3).

    plan (driver, branch head S) ──▶ look keys up in data files ──▶ validate + commit (driver)

A full scan of a CDC table pays for every equality delete: readers load the delete keys and check
every row of every older data file of the partition. Converting them into *file-scoped* position
deletes (one per data file, Iceberg Java reads it as a bitmap of that file only) brings the scan
close to a merge-on-read table's, as Iceberg's Flink maintenance ("convert equality deletes") does.

- job.py: plan on S, read the key columns of the data files each equality delete applies to (pruned
  by key bounds), write one position delete file per data file (merged with that file's existing
  file-scoped position deletes; on v3 one DV per data file, merged with its live DV), and commit a
  ``replace`` snapshot that swaps the delete files, validated against the branch head of every attempt.
- the key index the trigger keeps between runs, so a run reads only the files committed since the
  previous one, is iceberg_sink/keyindex/ (the v3 committer resolves its deletes with it too).
- config.py: triggers (commits, live equality deletes, delete files) and where it runs.
- trigger.py: the post-commit step, one conversion per table at a time, in the background.
"""

from iceberg_sink.topology.conversion.config import ConversionConfig
from iceberg_sink.topology.conversion.job import ConversionResult, convert_equality_deletes

__all__ = ["ConversionConfig", "ConversionResult", "convert_equality_deletes"]

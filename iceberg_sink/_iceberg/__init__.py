"""Everything iceberg_sink needs from PyIceberg beyond its public table API, in one package.

PyIceberg 0.12 cannot write delete manifests, commit pre-built manifests, row deltas or rewrites.
This package builds them from PyIceberg's manifest and manifest-list writers and its catalog
``commit_table`` with explicit requirements. It is the only place that touches PyIceberg internals
and is pinned to ``pyiceberg==0.12.0`` (pyproject.toml); the interop tests (Iceberg Java, DuckDB)
check what it writes.

- ``files``: the sink's file values <-> PyIceberg's DataFile, partition paths, live files of a snapshot.
- ``metrics``: column metrics of written Parquet files.
- ``manifests``: manifest writers (format-version dispatch in one place), staged manifests.
- ``deletes``: the one rule for which delete file applies to which data file.
- ``producer``: one snapshot-producer base that every commit kind subclasses (row delta, rewrite
  files, rewrite manifests): sequence numbers, summaries, the branch update, requirements.
- ``retry``: the one retry loop of every commit (checkpoints, compaction, manifest rewrites).
- ``specs``: which specs hold live data, and the unpartitioned spec that global deletes need.
- ``projection``: reading old data files by field id at every nesting level.
- ``listing``: listing and deleting files under a location with the table's FileIO settings.
- ``puffin``, ``deletion_vectors``: Puffin files and format v3 deletion vectors (``deletion-vector-v1``
  blobs), written and read back; not committed by the sink yet (format v1 and v2 only, below).
"""

SUPPORTED_FORMAT_VERSIONS = (1, 2)

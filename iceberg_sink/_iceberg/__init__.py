"""Everything iceberg_sink needs from PyIceberg beyond its public table API, in one package.

PyIceberg 0.12 cannot write delete manifests, commit pre-built manifests, row deltas or rewrites.
This package builds them from PyIceberg's manifest and manifest-list writers and its catalog
``commit_table`` with explicit requirements. It is the only place that touches PyIceberg internals
and is pinned to ``pyiceberg==0.12.0`` (pyproject.toml); the interop tests (Iceberg Java, DuckDB)
check what it writes.

- ``files``: the sink's file values <-> PyIceberg's DataFile, partition paths, live files of a snapshot.
- ``metrics``: column metrics of written Parquet files.
- ``manifests``: manifest writers (format-version dispatch in one place), staged manifests.
- ``deletes``: the one rule for which delete file applies to which data file; ``live_rows`` applies it
  to a data file's rows (compaction, the key index, v3 delete resolution, TOAST lookups).
- ``entries``: a snapshot's live files, each manifest read once.
- ``encoding``: which Parquet columns are dictionary-encoded.
- ``producer``: one snapshot-producer base that every commit kind subclasses: sequence numbers,
  summaries, the branch update, requirements.
- ``row_delta``: the checkpoint's commit kind (``RowDelta``, with the ``SnapshotChanges`` it adds).
- ``rewrites``: the ``replace`` commit kinds of upkeep (``RewriteFiles``, ``RewriteManifests``, and
  ``ReplaceProducer``, their base, which ``delete_rewrite``'s ``RewriteDeletes`` also subclasses).
- ``live_vectors``: the live deletion vectors of a v3 snapshot, by data file (rewrites apply them).
- ``commit``: sending a prepared snapshot or metadata update to the catalog (stale ones retryable).
- ``retry``: the one retry loop of every commit (checkpoints, compaction, manifest rewrites).
- ``specs``: which specs hold live data, and the unpartitioned spec that global deletes need.
- ``projection``: reading old data files by field id at every nesting level.
- ``listing``: listing and deleting files under a location with the table's FileIO settings.
- ``puffin``, ``deletion_vectors``: Puffin files and format v3 deletion vectors (``deletion-vector-v1``
  blobs), written and read back; committed by v3 upserts (committer/vectors.py).
- ``lineage``: format v3 row lineage: manifests read with their first row ids, the v3 manifest list
  that assigns them, a snapshot's first-row-id and added-rows.
- ``v3_metadata``: writing v3 metadata files, which PyIceberg 0.12 refuses.
- ``metadata_cache``: a SQL catalog that parses a table's metadata file only when its location moved.
"""

SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)
"""The format versions the sink commits to. Version 3 takes appends, upserts/CDC (deletes as
deletion vectors), equality-delete conversion (into deletion vectors) and compaction, and v2 tables
upgrade to it; see docs/format-v3.md."""

DELETE_FILE_FORMAT_VERSIONS = (2, 3)
"""The format versions that take upserts and CDC: v2 commits the writers' delete files, v3 commits
them resolved into deletion vectors (committer/vectors.py)."""

V3_CHANGES_REFUSAL = (
    "a format v3 table takes deletes as deletion vectors only, never equality or position delete files "
    "(the sink's v3 commits resolve them into deletion vectors, committer/vectors.py)"
)

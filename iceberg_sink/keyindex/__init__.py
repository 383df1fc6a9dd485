"""The equality-key index: which live data file row holds a key (key -> file, position).

Two layouts (option ``iceberg-sink.key-index.mode``). ``driver``: keys.py holds sorted key arrays,
index.py builds and looks up a table's index in driver memory, persisted.py keeps its entries in the
table's storage. ``partitioned``: runs.py stores entries sorted by key hash in run files,
manifest.py names the runs of each partition, partitioned.py catches up, looks up and merges them,
runner.py runs those steps in the driver or on Spark's executors. The committer resolves a format v3
checkpoint's deletes through ``KeyIndex.match`` (deletion vectors), and the post-commit conversion
of equality deletes (topology/conversion) does the same for v2. Below both, above the format layer
(_iceberg/).
"""

"""The equality-key index: which live data file row holds a key (key -> file, position).

keys.py holds sorted key arrays, index.py builds and looks up a table's index, persisted.py keeps
its entries in the table's storage. The committer resolves a format v3 checkpoint's deletes through
it (deletion vectors), and the post-commit conversion of equality deletes (topology/conversion)
does the same for v2. Below both, above the format layer (_iceberg/).
"""

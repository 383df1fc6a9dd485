"""Topologies around the write: distribution of rows to writers before writing (none / hash /
range, distribution.py), the change reduction of upserts/CDC (changes.py) with the values of unchanged TOASTed columns
(toast.py), and what runs after each
commit: hooks (hooks.py), small-file compaction (compaction/), equality-delete conversion
(conversion/), table maintenance (maintenance.py) and the per-table maintenance lock (background.py).
"""

"""Topologies around the write: distribution of rows before writing (none / hash / range), and what
runs after each commit (hooks, compaction)."""

"""The ground floor: the vocabulary every layer speaks and nothing else.

files.py (a written file's value, Iceberg's file content kinds), columns.py (the op column, its codes
and the refusal marker), summary_keys.py (the snapshot summary keys), distribution.py (distribution
modes), locations.py (what a location is). Imports nothing of the package but errors and _codec.
"""

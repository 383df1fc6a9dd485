"""Table-level concerns shared by the stages: catalog access, schema checks and evolution, partition
specs, names, keys, key bounds, and the stored rows of a few keys (lookup.py). The binding of one
job to its table is job/binding.py.
"""

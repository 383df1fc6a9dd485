"""Table-level concerns shared by the stages: catalog access, schema checks and evolution, partition
specs, keys, and the binding of one job to its table (binding.py: create or check the table, evolve
its schema, settle its key, a routed table's own columns, the writer spec), and the stored rows of a
few keys (lookup.py).
"""

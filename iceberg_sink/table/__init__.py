"""Table-level concerns shared by the stages: catalog access, schema checks, partition specs."""

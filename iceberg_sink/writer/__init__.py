"""Writers: stateless, inside Spark tasks. Rows in (Arrow batches), files out (a WriteResult).

No catalog or table object reaches a task: a picklable WriterSpec describes the table, and each task
opens its own FileIO. Files are Parquet with Iceberg field ids and full column metrics.
"""

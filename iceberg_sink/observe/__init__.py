"""Observing a running sink: metrics, progress records and the Prometheus endpoint.

metrics.py keeps the counters (snake_case fields and Flink's metric names); progress.py builds the
one record per micro-batch (kept by the sink, logged as a JSON line); prometheus.py serves the
metrics over HTTP. Nothing here changes what is written.
"""

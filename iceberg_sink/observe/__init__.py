"""Observing a running sink: metrics, progress records and the Prometheus endpoint.

metrics.py keeps the counters and the per-micro-batch progress records (snake_case fields and
Flink's metric names); prometheus.py serves them over HTTP. Nothing here changes what is written.
"""

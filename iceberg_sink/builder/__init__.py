"""``IcebergSink.builder()``: fluent.py records options; ``build()`` validates them all at once, with
the checks that are not one option's in checks.py (a route, the Prometheus endpoint, the table as the
catalog holds it), and returns what the sink makes of the configuration."""

from iceberg_sink.builder.fluent import IcebergSinkBuilder

__all__ = ["IcebergSinkBuilder"]

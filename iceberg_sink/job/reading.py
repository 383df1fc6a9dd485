"""The first stage of every micro-batch: read it as the sink writes it.

The ``map_batches`` functions (``.map_batches``, ``.debezium``) in order, then strings compared as
the table compares them (table/collation.py), then a routed sink's table column (routing.py).
Rows a source or the route refused keep their mark (sources/rejects.py) for the dead-letter split.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame

from iceberg_sink.config import SinkConfig
from iceberg_sink.job.routing import route_column
from iceberg_sink.sources.rejects import fail_on_reject
from iceberg_sink.table.collation import binary_strings


def read_batch(config: SinkConfig, df: DataFrame, known_tables: Iterable[str] = ()) -> DataFrame:
    """``df`` after the ``map_batches`` functions (the DataFrame the sink writes), its collated
    strings made binary (table/collation.py). A routed sink's rows get their table name here
    (routing.py), marked refused when the route may not write it. Rows a source or the route refused
    (sources/rejects.py) keep their mark: the job decides, right before the writers (dead_letter.py
    ``enforce``), to fail the batch or dead-letter them. ``known_tables``: routed names already
    accepted (RoutedJob.known_tables)."""
    for fn in config.map_batches:
        df = fn(df)
    # Strings compared as the table compares them (table/collation.py): before any key, op code
    # or route value is compared.
    df = binary_strings(df)
    if config.route is not None:
        df = route_column(df, config.route, known_tables)
    if config.dead_letter is None:
        # Fail-fast: the first Spark job over the batch (a routed sink's column count, before any
        # table is created or evolved) fails on a refused row, so nothing is created for it.
        df = fail_on_reject(df)
    return df

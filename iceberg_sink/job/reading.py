"""The first stage of every micro-batch: read it as the sink writes it.

The ``map_batches`` functions (``.map_batches``, ``.debezium``) in order, then strings compared as
the table compares them (table/collation.py), then a routed sink's table column (routing.py).
Rows a source or the route refused keep their mark (sources/rejects.py) for the dead-letter split.
A single-table sink's functions run knowing its table's schema (sources/bare_types.py): a Debezium
reader settles the types of events without a schema part on the table's columns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.table import Table
from pyspark.sql import DataFrame

from iceberg_sink import options
from iceberg_sink.config import SinkConfig
from iceberg_sink.job import codegen
from iceberg_sink.job.routing import route_column
from iceberg_sink.observe.progress import read_took
from iceberg_sink.sources.bare_types import writing_table
from iceberg_sink.sources.envelope import read_again, reading_batch
from iceberg_sink.sources.rejects import fail_on_reject
from iceberg_sink.sources.transactions import CarryPlace, carrying
from iceberg_sink.table.collation import binary_strings

if TYPE_CHECKING:  # the single-table job (pipeline.py) reads its batches through here
    from iceberg_sink.job.pipeline import SinkJob

logger = logging.getLogger("iceberg_sink")

_T = TypeVar("_T")


def read_batch(
    config: SinkConfig,
    df: DataFrame,
    known_tables: Iterable[str] = (),
    table: Table | None = None,
    checkpoint: tuple[str, int, bool] | None = None,
) -> DataFrame:
    """``df`` after the ``map_batches`` functions (the DataFrame the sink writes), its collated
    strings made binary (table/collation.py). A routed sink's rows get their table name here
    (routing.py), marked refused when the route may not write it. Rows a source or the route refused
    (sources/rejects.py) keep their mark: the job decides, right before the writers (dead_letter.py
    ``enforce``), to fail the batch or dead-letter them. ``known_tables``: routed names already
    accepted (RoutedJob.known_tables). ``table``: a single-table sink's table as last loaded
    (:func:`last_loaded`), whose schema the functions run with (sources/bare_types.py).
    ``checkpoint``: (location, checkpoint id, whether the location is a bounded write's temporary
    one) of the checkpoint ``df`` becomes, where ``.debezium(transactions="consistent")`` carries
    incomplete source transactions (sources/transactions.py). Its wall time is the batch's ``read``
    phase (observe/progress.py ``read_took``: the record the job starts next takes it)."""
    started = time.monotonic()
    place = None
    if checkpoint is not None and config.carries_transactions:
        resolved = options.resolve(config.options, {})
        place = CarryPlace(
            location=checkpoint[0],
            checkpoint_id=checkpoint[1],
            temporary=checkpoint[2],
            max_events=resolved.get(options.TRANSACTIONS_MAX_HELD_EVENTS),
            max_batches=resolved.get(options.TRANSACTIONS_MAX_HELD_BATCHES),
        )
    with writing_table(table.schema() if table is not None else None), carrying(place):
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
    read_took(started)
    return df


def last_loaded(job: SinkJob) -> Table | None:
    """The table ``job`` writes as it last loaded it, for :func:`read_batch`; loaded now when the job
    has not loaded it yet (a stream's first batch). None without ``map_batches`` functions (nothing
    reads it), or when the table does not exist or cannot be loaded: the batch then settles its types
    by itself, and the job meets the catalog's answer when it checks the batch."""
    if not job.binding.config.map_batches:
        return None
    if job.binding.table is not None:
        return job.binding.table
    try:
        return job.binding.refresh()
    except Exception as e:  # no table yet, or the catalog does not answer
        logger.debug("table %s not loaded before reading the batch: %s", job.binding.name, e)
        return None


def read_again_if_stale(config: SinkConfig, df: DataFrame, attempt: Callable[[], _T]) -> _T:
    """``attempt()``: read one batch ``df`` (:func:`read_batch`) and write it, with Spark's settings for
    a small batch when ``config``'s bound says ``df`` is one (codegen.py), its Debezium readers planning
    on their last batch's statistics and reading row images with Arrow where they can
    (sources/envelope.py, sources/arrow_rows.py). When a Spark job of it met an event those
    statistics do not cover (STALE_COUNTS) or an image the Arrow reader leaves to Spark
    (READ_BY_SPARK), ``attempt()`` again, the batch's statistics counted and its images read by Spark.

    The check runs inside the jobs that read the batch's events, so it fails before the batch's
    committable is staged (job/road.py): nothing of the first attempt is committed, and its progress
    record is not reported (observe/progress.py); files its writer tasks wrote are left unreferenced
    (remove-orphans deletes them). A batch that fails otherwise leaves its readers without last
    statistics: the next one is counted."""
    max_rows = options.resolve(config.options, {}).get(options.INTERPRETED_MAX_ROWS)
    with codegen.sized(df, max_rows):
        try:
            with reading_batch(plan=True):
                return attempt()
        except Exception as e:
            why = read_again(e)
            if why is None:
                raise
            logger.info("this batch is read again, counted, by Spark's reader: %s", why)
        with reading_batch(plan=False):
            return attempt()

"""How many partitions the sink's own shuffles of a streaming micro-batch have: one rule, set once
around the whole micro-batch (reading it, planning it, writing it).

A shuffle that adaptive execution does not size has ``spark.sql.shuffle.partitions`` partitions, 200
by default, whatever the batch holds: every shuffle when adaptive execution is off, and the shuffles
inside a cached plan when it is on (a routed batch is cached, job/routing.py, and Spark keeps a cached
plan's partitioning: ``spark.sql.optimizer.canChangeCachedPlanOutputPartitioning``). The Kafka
guide's routed Debezium stream read its one-event first micro-batch's cache in six 200-task stages
and took 39 s on a 2-core machine.

The sink chooses instead (:func:`choose`), unless ``iceberg-sink.write.shuffle-partitions`` says:

- a batch Spark can size (a file source's files): one partition per 128 MiB, but as many as the
  cluster has cores while each gets at least 4 MiB (never fewer than one), and never more than
  ``spark.sql.shuffle.partitions`` (or the cores, when they are more);
- a Kafka micro-batch, which Spark cannot size: as above, by its records counted from Spark's offset
  log (topology/estimate.py ``counted``, sink.py ``KafkaBatchRecords``);
- a batch nothing can size (sockets, a Kafka stream's first micro-batch): the cluster's cores
  (``defaultParallelism``).

It is set on the stream's own session (a clone Spark makes for the query, used by nothing else of
the user's) for the micro-batch and put back before the micro-batch returns, so Spark's offset log
of the next micro-batch records the user's setting, as stateful operators need. A bounded
``write()`` runs on the user's session and is left alone: adaptive execution (on by default) sizes
its shuffles.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame

from iceberg_sink.topology.estimate import UNKNOWN_BYTES, estimated_bytes

logger = logging.getLogger("iceberg_sink")

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

#: Data one shuffle partition holds once the batch needs more partitions than the cluster has cores.
PARTITION_BYTES = 128 * 1024 * 1024
#: Below this much data per partition, fewer partitions than cores are used.
MIN_PARTITION_BYTES = 4 * 1024 * 1024


def choose(size_bytes: int | None, cores: int, most: int) -> int:
    """The shuffle partitions of a batch of ``size_bytes`` (None: unknown) on ``cores`` cores, at
    most ``most`` (the session's ``spark.sql.shuffle.partitions``) unless the cores are more."""
    cores = max(1, cores)
    if size_bytes is None or size_bytes >= UNKNOWN_BYTES:
        return cores
    by_size = math.ceil(size_bytes / PARTITION_BYTES)
    spread = min(cores, math.ceil(size_bytes / MIN_PARTITION_BYTES))
    return max(1, min(max(by_size, spread), max(most, cores)))


def partitions_for(df: DataFrame, configured: int, most: int) -> int:
    """The shuffle partitions of micro-batch ``df``: ``configured`` when > 0, else :func:`choose`."""
    if configured > 0:
        return configured
    return choose(estimated_bytes(df), df.sparkSession.sparkContext.defaultParallelism, most)


@contextmanager
def micro_batch(df: DataFrame, configured: int) -> Iterator[int]:
    """Run the body (a streaming micro-batch ``df``) with the sink's shuffle partitions; yields them.
    With adaptive execution on, they are where it starts (it may coalesce them further)."""
    conf = df.sparkSession.conf
    before = conf.get(SHUFFLE_PARTITIONS)
    chosen = partitions_for(df, configured, int(str(before)))
    if str(chosen) == str(before):
        yield chosen
        return
    logger.debug("micro-batch shuffles with %s partitions (the session's: %s)", chosen, before)
    conf.set(SHUFFLE_PARTITIONS, str(chosen))
    try:
        yield chosen
    finally:
        conf.set(SHUFFLE_PARTITIONS, str(before))

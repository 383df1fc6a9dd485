"""Which key index a job's committer and conversion resolve deletes with, and where its tasks run.

The partitioned index (keyindex/partitioned.py) runs its heavier tasks on the executors of the
Spark session the job last saw (each micro-batch's), the lighter ones in the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from iceberg_sink import options
from iceberg_sink.keyindex.runner import SparkRunner


def key_index_arguments(
    resolved: options.ResolvedOptions, session: Callable[[], SparkSession | None]
) -> dict[str, Any]:
    """The key index arguments of IcebergCommitter and ConversionTrigger for ``resolved`` options:
    the driver index's bound and persistence, and for the partitioned one its partitions and a
    runner on the Spark session ``session`` returns (else the active one)."""
    arguments: dict[str, Any] = {
        "key_index_max_bytes": resolved.get(options.CONVERSION_KEY_INDEX_MAX_BYTES),
        "key_index_persist": resolved.get(options.CONVERSION_KEY_INDEX_PERSIST),
    }
    if resolved.get(options.KEY_INDEX_MODE) != "partitioned":
        return arguments

    def context() -> SparkContext | None:
        spark = session() or SparkSession.getActiveSession()
        return spark.sparkContext if spark is not None else None

    return {
        **arguments,
        "key_index_partitions": resolved.get(options.KEY_INDEX_PARTITIONS),
        "key_index_partition_max_entries": resolved.get(options.KEY_INDEX_PARTITION_MAX_ENTRIES),
        "key_index_runner": SparkRunner(context, resolved.get(options.KEY_INDEX_DRIVER_MAX_BYTES)),
    }

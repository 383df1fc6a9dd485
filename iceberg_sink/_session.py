"""The one check every Spark object a caller hands the sink goes through first: ``write``'s and
``start``'s DataFrame, ``compact``'s SparkSession and the readers' DataFrames must be PySpark
objects of a classic session (``SparkSession.builder.master(...)``, ``spark-submit``, ``pyspark``).

A Spark Connect session (``SparkSession.builder.remote(...)``, ``SPARK_REMOTE``, ``pyspark-client``)
is refused by name: the driver side of the sink needs the JVM of the Spark application (the
SparkContext for broadcast variables that ship the writers' specs, the worker check and the
compaction's tasks), and under Connect a ``foreachBatch`` function runs in a Python process of the
server, not beside the caller's sink. Without this check such a call failed deep inside (PySpark's
``JVM_ATTRIBUTE_NOT_SUPPORTED`` on ``sparkContext``); any other object (a pandas DataFrame, an Arrow
table) failed with an ``AttributeError``. Both are refused before anything is created or committed.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from iceberg_sink.errors import InvalidSinkConfigError

CONNECT_UNSUPPORTED = (
    "iceberg_sink needs a classic SparkSession (SparkSession.builder.master(...), spark-submit or the pyspark "
    "shell): it uses the Spark application's JVM on the driver (broadcast variables, the Python workers' check, "
    "compaction tasks), which a Spark Connect client does not have. Start the job without "
    "SparkSession.builder.remote(...), SPARK_REMOTE or spark.remote"
)


def _described(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _is_connect(value: object) -> bool:
    # PySpark 4's Connect classes subclass the public DataFrame and SparkSession; PySpark 3.5's do
    # not. Their module names tell them apart without importing pyspark.sql.connect (which needs
    # grpcio, not installed with a classic PySpark).
    return _described(value).startswith("pyspark.sql.connect.")


def classic_frame(df: object, caller: str) -> DataFrame:
    """``df`` if it is a DataFrame of a classic SparkSession.

    Raises:
        InvalidSinkConfigError: a Spark Connect DataFrame, or not a PySpark DataFrame at all;
            ``caller`` names the call (``"write(df)"``).
    """
    if _is_connect(df):
        raise InvalidSinkConfigError(
            f"{caller}: received a Spark Connect DataFrame ({_described(df)}). " + CONNECT_UNSUPPORTED
        )
    if not isinstance(df, DataFrame):
        raise InvalidSinkConfigError(f"{caller}: expected a PySpark DataFrame, received {_described(df)}")
    return df


def classic_session(spark: object, caller: str) -> SparkSession:
    """``spark`` if it is a classic SparkSession.

    Raises:
        InvalidSinkConfigError: a Spark Connect session, or not a SparkSession at all.
    """
    if _is_connect(spark):
        raise InvalidSinkConfigError(
            f"{caller}: received a Spark Connect session ({_described(spark)}). " + CONNECT_UNSUPPORTED
        )
    if not isinstance(spark, SparkSession):
        raise InvalidSinkConfigError(f"{caller}: expected a SparkSession, received {_described(spark)}")
    return spark

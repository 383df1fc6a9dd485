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

from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession

from iceberg_sink.errors import InvalidSinkConfigError

_T = TypeVar("_T")

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


def _classic(value: object, cls: type[_T], caller: str, connect_kind: str, expected: str) -> _T:
    if _is_connect(value):
        raise InvalidSinkConfigError(
            f"{caller}: received a Spark Connect {connect_kind} ({_described(value)}). " + CONNECT_UNSUPPORTED
        )
    if not isinstance(value, cls):
        raise InvalidSinkConfigError(f"{caller}: expected {expected}, received {_described(value)}")
    return value


def classic_frame(df: object, caller: str) -> DataFrame:
    """``df`` if it is a DataFrame of a classic SparkSession.

    Raises:
        InvalidSinkConfigError: a Spark Connect DataFrame, or not a PySpark DataFrame at all;
            ``caller`` names the call (``"write(df)"``).
    """
    return _classic(df, DataFrame, caller, "DataFrame", "a PySpark DataFrame")


def classic_session(spark: object, caller: str) -> SparkSession:
    """``spark`` if it is a classic SparkSession.

    Raises:
        InvalidSinkConfigError: a Spark Connect session, or not a SparkSession at all.
    """
    return _classic(spark, SparkSession, caller, "session", "a SparkSession")

"""How Spark writes a stream's offset and commit logs on a local checkpoint location: by renaming
each file with ``java.io.File``, not through processes.

Every micro-batch Spark writes two small files into the query's checkpoint location (the offset log
entry before the batch, the commit log entry after it) through a ``CheckpointFileManager``. Its
default, ``FileContextBasedCheckpointFileManager``, renames each file through Hadoop's
``FileContext``; on the local filesystem without Hadoop's native library (PySpark from PyPI has
none), that rename asks for the link status of its paths, which Hadoop's ``RawLocalFileSystem``
answers by running a ``readlink`` process each time. A micro-batch ran about 15 of them (and 4
``chmod``), and Spark's ``walCommit`` and ``commitOffsets`` took 70-111 ms of every micro-batch
against 18-30 ms with ``FileSystemBasedCheckpointFileManager``, which renames with
``FileSystem.rename`` (``File.renameTo``): docs/benchmarks-cdc.md.

On the local filesystem the two give the same guarantee: ``FileContext``'s rename there is
Hadoop's default rename with options, which checks that the destination is absent and then renames,
not atomically, as ``FileSystemBasedCheckpointFileManager`` does. So a query whose checkpoint
location is on the local filesystem, on a session that names no manager itself
(``spark.sql.streaming.checkpointFileManagerClass``), starts with the file-system one; the session's
setting is put back once the query has started (Spark makes its logs' manager when it creates the
query, and the query's own session is a copy taken then). Any other filesystem keeps Spark's default
(HDFS's ``FileContext`` rename is atomic; object stores have managers of their own).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession

from iceberg_sink._session_settings import holding
from iceberg_sink._spark_schema import built

#: Spark's session setting naming the class that writes a query's checkpoint files.
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"

#: Where Spark keeps the file-system manager: Spark 4.1 moved it into a package of its own.
_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


def on_local_filesystem(spark: SparkSession, checkpoint_location: str) -> bool:
    """Whether ``checkpoint_location`` is on the local filesystem: a ``file:`` URI, or a path
    without a scheme where Hadoop's default filesystem (``fs.defaultFS``) is the local one."""
    scheme = urlparse(checkpoint_location).scheme.lower()
    if scheme == "file":
        return True
    if scheme and len(scheme) > 1:  # "C:" is a Windows drive, not a scheme
        return False
    default = spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS")  # type: ignore[union-attr]
    return default is None or str(default).lower().startswith("file:")


def _manager(spark: SparkSession) -> str | None:
    """The file-system manager's class name in this Spark (None: it has none of the known ones),
    looked up once per Spark context."""
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]

    def find() -> str | None:
        for name in _MANAGERS:
            try:
                JavaClass("java.lang.Class", client).forName(name)
            except Exception:  # Py4JJavaError: ClassNotFoundException
                continue
            return name
        return None

    return built(spark, ("checkpoint-file-manager",), find)  # type: ignore[no-any-return]


def query_settings(spark: SparkSession, checkpoint_location: str) -> dict[str, str]:
    """The session settings a query starting at ``checkpoint_location`` is started with (module
    docstring): the file-system manager for a local location the session names no manager for."""
    if spark.conf.get(MANAGER_KEY, None) is not None or not on_local_filesystem(spark, checkpoint_location):
        return {}
    manager = _manager(spark)
    return {MANAGER_KEY: manager} if manager is not None else {}


@contextmanager
def starting(spark: SparkSession, checkpoint_location: str) -> Iterator[None]:
    """Start a query at ``checkpoint_location`` inside this block: the session holds
    :func:`query_settings` until the block ends."""
    settings = query_settings(spark, checkpoint_location)
    if not settings:
        yield
        return
    with holding(spark, settings):
        yield

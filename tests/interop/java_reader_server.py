"""Apache Iceberg Java (on Spark) as a reader service: JSON lines on stdin/stdout.

Run with a python that has PySpark, and the Iceberg Spark runtime jar for that Spark (see
java_env.py: Iceberg 1.9.2 on PySpark 3.5.7, and the newest Iceberg on the project's PySpark 4.x)::

    <python> java_reader_server.py --jar <iceberg-spark-runtime-...jar> --jar <iceberg-aws-bundle-...jar>

One SparkSession serves every request. Each request is one JSON object on one line of stdin; each
reply is one JSON object on one line of stdout. Everything else (Spark, log4j, py4j, warnings) goes
to stderr: the real stdout file descriptor is duplicated for the protocol and fd 1 is pointed at
stderr before the JVM starts, so not even a stray ``System.out.println`` can corrupt the stream.

Requests (an optional ``"id"`` is echoed back in the reply)::

    {"op": "ping"}                                            -> {"ok": true, "spark": "3.5.x"}
    {"op": "read", "metadata": M, "where": W|null, "out": P}  -> {"ok": true, "rows": N}
    {"op": "snapshots", "metadata": M, "out": P}              -> {"ok": true, "rows": N}
    {"op": "files", "metadata": M, "out": P}                  -> {"ok": true, "rows": N}
    {"op": "metadata_table", "metadata": M, "name": T, "out": P}  (T: history, manifests, entries, ...)
    {"op": "sql", "query": Q, "out": P, "views": {name: M}|null}
    {"op": "read_many", "tables": [M, ...], "out": D}        -> {"ok": true, "rows": [N, ...]}
    {"op": "row_lineage", "metadata": M, "out": P}            (every column, _row_id, _last_updated_sequence_number)
    {"op": "lineage", "metadata": M}                          -> {"ok": true, "lineage": {...}} (local tables)
    {"op": "s3", "props": {...}}                              -> {"ok": true, "catalog": C}
    {"op": "column_default", "table": T, "name": N, "type": Y, "default": J, "required": B, "change": B}
                                                              -> {"ok": true}
    {"op": "shutdown"}                                        -> {"ok": true}, then exits
    failures                                                  -> {"ok": false, "error": "..."}

``M`` is a metadata.json path or file:// URI, read with ``spark.read.format("iceberg").load(M)``
(metadata tables with ``M + "#snapshots"`` etc.); ``P`` is where the result is written as an Arrow
IPC file. ``views`` registers each metadata file as a temp view before running the SQL. Map and
``read_many`` reads many tables in one request (no round trip per table) and writes table ``i`` to
``D/i.arrow``. Map and
struct columns of metadata tables (snapshot ``summary``, file ``partition``, metrics maps) are turned
into JSON strings; the ``files`` table leaves out ``lower_bounds``, ``upper_bounds``,
``key_metadata`` and ``readable_metrics``.

``s3://`` (and ``s3a://``) metadata locations are read with Iceberg's own ``S3FileIO`` (the AWS SDK v2
classes come from the ``iceberg-aws-bundle`` jar): the ``s3`` op names the endpoint and credentials
(PyIceberg's property names: ``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``,
``s3.region``, ``s3.path-style-access``) and the server defines a Spark catalog ``C`` for them: an
Iceberg ``JdbcCatalog`` on a SQLite file in the server's temporary directory (the sqlite-jdbc driver
is on ``--class-path``) whose FileIO is ``S3FileIO``. Each ``s3://`` metadata file is registered there
once, unchanged, under a generated name (``register_table`` writes nothing to S3), and read as that
table: Iceberg Java resolves every path in the metadata, manifest lists and manifests itself.
(Path-based loads cannot use S3FileIO: Iceberg reads them with ``HadoopFileIO``; and Iceberg's
``InMemoryCatalog`` ignores ``io-impl``.) The secret key is never logged: it only travels on stdin
and sits in the catalog's configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import IO, Any

_FILES_DROPPED = ("lower_bounds", "upper_bounds", "key_metadata", "readable_metrics")
_MAX_ERROR_CHARS = 20_000

_LOG4J2 = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeio.level = error
logger.snapshotscan.name = org.apache.iceberg.SnapshotScan
logger.snapshotscan.level = error
logger.basemetastore.name = org.apache.iceberg.BaseMetastoreTableOperations
logger.basemetastore.level = error
"""


def _protocol_stdout() -> IO[str]:
    """Keep the real stdout for replies; send fd 1 (and sys.stdout) to stderr for everyone else."""
    sys.stdout.flush()
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", encoding="utf-8", buffering=1)


def _start_spark(jars: list[str], class_path: list[str], driver_memory: str, cores: int, work_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    # Loopback only, and scratch space inside our own temporary directory.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2, encoding="utf-8")
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dderby.system.home={work_dir}"
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("iceberg-java-reader")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work_dir / "spark-warehouse"))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # On the JVM's own class path, where java.sql.DriverManager finds JDBC drivers.
        .config("spark.driver.extraClassPath", os.pathsep.join(class_path))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _to_arrow(df: Any) -> Any:
    """Collect a Spark DataFrame as one pyarrow Table (keeps the schema when there are no rows)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = df._collect_as_arrow()
    if batches:
        return pa.Table.from_batches(batches)
    schema = to_arrow_schema(df.schema)
    tz = df.sparkSession.conf.get("spark.sql.session.timeZone")
    fields = [
        pa.field(f.name, pa.timestamp("us", tz=tz), f.nullable)
        if pa.types.is_timestamp(f.type) and f.type.tz is not None
        else f
        for f in schema
    ]
    return pa.schema(fields).empty_table()


def _write_arrow(table: Any, out: str) -> None:
    import pyarrow as pa

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    tmp.replace(path)


def _jsonify_nested(df: Any, drop: tuple[str, ...] = ()) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StructType

    cols = []
    for field in df.schema.fields:
        if field.name in drop:
            continue
        if isinstance(field.dataType, MapType | StructType):
            cols.append(F.to_json(F.col(field.name)).alias(field.name))
        else:
            cols.append(F.col(field.name))
    return df.select(*cols)


_S3_PROPS = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key")
_S3_SCHEMES = ("s3://", "s3a://")
_REGISTERED_NAMESPACE = "registered"


class Server:
    def __init__(self, spark: Any, work_dir: Path) -> None:
        self.spark = spark
        self.work_dir = work_dir
        self._s3_catalogs: dict[tuple[tuple[str, str], ...], str] = {}
        self._s3_catalog: str | None = None  # the one the last "s3" op chose
        self._registered: dict[tuple[str, str], str] = {}  # (catalog, metadata location) -> table name

    def _use_s3(self, props: dict[str, Any]) -> dict[str, Any]:
        """Define (once per distinct set of properties) a catalog reading ``s3://`` through S3FileIO."""
        missing = [k for k in _S3_PROPS if not props.get(k)]
        if missing:
            raise ValueError(f"the s3 op needs {', '.join(_S3_PROPS)}; missing: {', '.join(missing)}")
        key = tuple(sorted((str(k), str(v)) for k, v in props.items()))
        name = self._s3_catalogs.get(key)
        if name is None:
            name = f"s3_reader_{len(self._s3_catalogs) + 1}"
            prefix = f"spark.sql.catalog.{name}"
            conf = {
                prefix: "org.apache.iceberg.spark.SparkCatalog",
                f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
                f"{prefix}.uri": f"jdbc:sqlite:file:{self.work_dir / name}.db",
                f"{prefix}.warehouse": str(self.work_dir / f"{name}-warehouse"),  # required, never written
                f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                f"{prefix}.cache-enabled": "false",
                f"{prefix}.s3.endpoint": str(props["s3.endpoint"]),
                f"{prefix}.s3.access-key-id": str(props["s3.access-key-id"]),
                f"{prefix}.s3.secret-access-key": str(props["s3.secret-access-key"]),
                f"{prefix}.s3.path-style-access": str(props.get("s3.path-style-access", "true")),
                f"{prefix}.client.region": str(props.get("s3.region", "us-east-1")),
            }
            for conf_key, value in conf.items():
                self.spark.conf.set(conf_key, value)
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.{_REGISTERED_NAMESPACE}")
            self._s3_catalogs[key] = name
        self._s3_catalog = name
        return {"ok": True, "catalog": name}

    def _registered_table(self, metadata: str) -> str:
        """The catalog table name of the ``s3://`` metadata file ``metadata`` (registered on first use)."""
        catalog = self._s3_catalog
        if catalog is None:
            raise ValueError(f"{metadata} is on S3: send the 's3' op with the endpoint and credentials first")
        name = self._registered.get((catalog, metadata))
        if name is None:
            name = f"{catalog}.{_REGISTERED_NAMESPACE}.t{len(self._registered) + 1}"
            quoted = metadata.replace("\\", "\\\\").replace("'", "\\'")
            self.spark.sql(
                f"CALL {catalog}.system.register_table(table => '{_REGISTERED_NAMESPACE}.{name.rsplit('.', 1)[1]}', "
                f"metadata_file => '{quoted}')"
            ).collect()
            self._registered[(catalog, metadata)] = name
        return name

    def _source(self, metadata: str) -> str:
        """What ``spark.read.format("iceberg").load`` takes for ``metadata``: the path itself, or the
        name of the catalog table registered for it when it is on S3."""
        if not metadata:
            raise ValueError("'metadata' is required")
        return self._registered_table(metadata) if metadata.startswith(_S3_SCHEMES) else metadata

    def _load(self, metadata: str, table: str | None = None) -> Any:
        source = self._source(metadata)
        if table is not None:
            source = f"{source}.{table}" if source != metadata else f"{metadata}#{table}"
        return self.spark.read.format("iceberg").load(source)

    def _finish(self, df: Any, req: dict[str, Any]) -> dict[str, Any]:
        where = req.get("where")
        if where:
            df = df.where(where)
        out = req.get("out")
        if not out:
            raise ValueError("'out' is required")
        table = _to_arrow(df)
        _write_arrow(table, out)
        return {"ok": True, "rows": table.num_rows}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "spark": self.spark.version}
        if op == "read":
            branch = req.get("branch")
            if branch:
                # A branch other than main: Iceberg's read option picks its head snapshot.
                source = self._source(str(req.get("metadata", "")))
                df = self.spark.read.format("iceberg").option("branch", branch).load(source)
                return self._finish(df, req)
            return self._finish(self._load(req.get("metadata", "")), req)
        if op == "snapshots":
            return self._finish(_jsonify_nested(self._load(req.get("metadata", ""), "snapshots")), req)
        if op == "files":
            df = _jsonify_nested(self._load(req.get("metadata", ""), "files"), _FILES_DROPPED)
            return self._finish(df, req)
        if op == "metadata_table":
            name = req.get("name")
            if not name:
                raise ValueError("'name' is required")
            return self._finish(_jsonify_nested(self._load(req.get("metadata", ""), str(name))), req)
        if op == "sql":
            for view, metadata in (req.get("views") or {}).items():
                self._load(metadata).createOrReplaceTempView(view)
            return self._finish(self.spark.sql(req["query"]), {**req, "where": None})
        if op == "read_many":
            return self._read_many(req)
        if op == "row_lineage":
            df = self._load(req.get("metadata", "")).select("*", "_row_id", "_last_updated_sequence_number")
            return self._finish(df, {**req, "where": None})
        if op == "lineage":
            return {"ok": True, "lineage": self._lineage(str(req.get("metadata", "")))}
        if op == "column_default":
            return self._column_default(req)
        if op == "s3":
            props = req.get("props")
            if not isinstance(props, dict):
                raise ValueError("'props' (the S3 FileIO properties) is required")
            return self._use_s3(props)
        raise ValueError(f"unknown op {op!r}")

    def _column_default(self, req: dict[str, Any]) -> dict[str, Any]:
        """Iceberg Java's ``UpdateSchema`` on catalog table ``T`` (Spark SQL cannot set default
        values): add column ``N`` of primitive type ``Y`` whose initial- and write-default is ``J``
        (the spec's JSON single-value form), required if ``B``; or with ``change``, set the existing
        column's write-default to ``J`` (its initial-default stays)."""
        jvm = self.spark._jvm
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(self.spark._jsparkSession, req["table"])
        column_type = jvm.org.apache.iceberg.types.Types.fromPrimitiveString(req["type"])
        value = jvm.org.apache.iceberg.SingleValueParser.fromJson(column_type, json.dumps(req["default"]))
        literal = jvm.org.apache.iceberg.expressions.Expressions.lit(value).to(column_type)
        update = table.updateSchema()
        if req.get("change"):
            update = update.updateColumnDefault(req["name"], literal)
        elif req.get("required"):
            update = update.allowIncompatibleChanges().addRequiredColumn(req["name"], column_type, "", literal)
        else:
            update = update.addColumn(req["name"], column_type, "", literal)
        update.commit()
        self.spark.sql(f"REFRESH TABLE {req['table']}")
        return {"ok": True}

    def _lineage(self, metadata: str) -> dict[str, Any]:
        """Iceberg Java's own reading of a local table's row lineage (``TableMetadataParser``, and
        ``ManifestFiles.read``, which gives files the first row ids they inherit)."""
        jvm = self.spark._jvm
        io = jvm.org.apache.iceberg.hadoop.HadoopFileIO(self.spark._jsc.hadoopConfiguration())
        md = jvm.org.apache.iceberg.TableMetadataParser.read(io, metadata)
        snapshots = [
            {"snapshot_id": s.snapshotId(), "first_row_id": s.firstRowId(), "added_rows": s.addedRows()}
            for s in md.snapshots()
        ]
        files = []
        current = md.currentSnapshot()
        for manifest in current.dataManifests(io) if current is not None else []:
            reader = jvm.org.apache.iceberg.ManifestFiles.read(manifest, io, md.specsById())
            it = reader.iterator()
            while it.hasNext():
                f = it.next()
                files.append({"path": str(f.location()), "first_row_id": f.firstRowId(), "records": f.recordCount()})
            reader.close()
        return {
            "format_version": md.formatVersion(),
            "next_row_id": md.nextRowId(),
            "snapshots": snapshots,
            "files": files,
        }

    def _read_many(self, req: dict[str, Any]) -> dict[str, Any]:
        """Every table of ``req["tables"]``, one after the other in this one request.

        One Spark job per table: a ``UNION ALL`` of the tables of one schema was measured slower
        (its many scan branches compile and run worse than repeated jobs of one plan shape)."""
        locations = req.get("tables")
        out = req.get("out")
        if not isinstance(locations, list) or not out:
            raise ValueError("'tables' (a list of metadata locations) and 'out' (a directory) are required")
        rows = []
        for i, metadata in enumerate(locations):
            table = _to_arrow(self._load(str(metadata)))
            _write_arrow(table, str(Path(out) / f"{i}.arrow"))
            rows.append(table.num_rows)
        return {"ok": True, "rows": rows}


def _error_text(exc: BaseException) -> str:
    """The exception's type and message, with the Java exception text and its "Caused by" chain but
    without the Java stack frames."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    kept = [ln for ln in lines if not ln.lstrip().startswith("at ") and not re.match(r"\s*\.\.\. \d+ more", ln)]
    return "\n".join(kept)[:_MAX_ERROR_CHARS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--jar", action="append", required=True, help="a jar for spark.jars (the Iceberg Spark runtime, the AWS bundle)"
    )
    parser.add_argument(
        "--class-path", action="append", default=[], help="a jar for the driver's class path (the JDBC driver)"
    )
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--cores", type=int, default=1)
    args = parser.parse_args(argv)

    proto = _protocol_stdout()
    with tempfile.TemporaryDirectory(prefix="iceberg-java-reader-") as work:
        spark = _start_spark(args.jar, args.class_path, args.driver_memory, args.cores, Path(work))
        server = Server(spark, Path(work))
        try:
            for line in sys.stdin:
                if not line.strip():
                    continue
                req: dict[str, Any] = {}
                try:
                    parsed = json.loads(line)
                    if not isinstance(parsed, dict):
                        raise ValueError("a request must be a JSON object")
                    req = parsed
                    reply = {"ok": True} if req.get("op") == "shutdown" else server.handle(req)
                except Exception as exc:
                    traceback.print_exc(file=sys.stderr)
                    reply = {"ok": False, "error": _error_text(exc)}
                if "id" in req:
                    reply["id"] = req["id"]
                proto.write(json.dumps(reply, default=str) + "\n")
                proto.flush()
                if req.get("op") == "shutdown":
                    break
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

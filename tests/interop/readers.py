"""Independent readers of Iceberg tables, each starting from a metadata.json file.

- ``JavaIcebergReader``: Apache Iceberg Java in a long-lived Spark subprocess (java_reader_server.py):
  1.9.2 on Spark 3.5 from the Java reader venv, or the newest release on the project's own Spark 4.x
  (java_env.py: ``reference_runtime``, ``newest_runtime``).
- ``duckdb_read``: DuckDB 1.5.5's iceberg extension, loaded from the PyPI extension packages.
- ``pyiceberg_read``: PyIceberg's ``StaticTable`` (append-only tables: it refuses equality deletes).
- ``normalize``: turns any of their results into a sorted list of plain dicts that compare equal
  across readers.

Every function takes a metadata location as a plain path or a ``file://`` URI. ``JavaIcebergReader``
also reads ``s3://`` tables straight from S3 with Iceberg's ``S3FileIO`` once told the endpoint and
credentials (``use_s3``, or ``read_s3``); ``duckdb_read`` reads them with DuckDB's httpfs
(``duckdb_s3_read``). ``assert_readers_agree`` checks that every Java reader and DuckDB return the
same rows as a model.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs

from tests.interop.java_env import JavaEnv, ReaderRuntime, reference_runtime

SERVER_SCRIPT: Path = Path(__file__).resolve().with_name("java_reader_server.py")

# Variables of the parent's PySpark 4 / venv that must not leak into the Spark 3.5 server.
_SCRUBBED_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONF_DIR",
)


# The S3 FileIO properties handed to the server (never logged: the secret key is among them).
_S3_KEYS = ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key", "s3.region", "s3.path-style-access")

_TIMED_OUT = "<timed out>"  # sentinel: never a reply line, since those end with a newline


_CATALOG_DECLARATION = re.compile(r"\s*SET\s+`?spark\.sql\.catalog\.([A-Za-z0-9_]+)`?\s*=", re.IGNORECASE)
_CATALOG_NUMBERS = itertools.count(1)


class JavaReaderError(RuntimeError):
    """The Java reader server answered a request with an error (carries the Java exception text)."""


class JavaReaderDied(RuntimeError):
    """The Java reader server process exited or stopped answering; carries its stderr tail."""


def _local_path(location: str | os.PathLike[str]) -> str:
    """A plain filesystem path for ``location`` (a path or a ``file://`` URI)."""
    text = os.fspath(location)
    if text.startswith("file://"):
        return text[len("file://") :]
    if text.startswith("file:"):
        return text[len("file:") :]
    return text


def _read_ipc(path: Path) -> pa.Table:
    with pa.OSFile(str(path), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    return table


def s3_filesystem(props: Mapping[str, str]) -> pafs.S3FileSystem:
    """An Arrow S3 client from PyIceberg's S3 FileIO properties (``s3.endpoint``, ``s3.access-key-id``,
    ``s3.secret-access-key``, ``s3.region``; path-style addressing)."""
    return pafs.S3FileSystem(
        access_key=props["s3.access-key-id"],
        secret_key=props["s3.secret-access-key"],
        region=props.get("s3.region", "us-east-1"),
        endpoint_override=props["s3.endpoint"],
        force_virtual_addressing=False,
    )


class JavaIcebergReader:
    """Apache Iceberg Java (1.9.2 on Spark 3.5 by default) reading tables straight from their metadata.json.

    One server subprocess with one SparkSession serves all calls; start-up takes ~10 s, a small
    read ~0.5-1 s. Calls are serialized (thread-safe). Results travel as Arrow IPC files in a
    private temporary directory. Timestamps come back as ``timestamp[us, tz=UTC]`` (timestamptz)
    and ``timestamp[us]`` (timestamp); strings/binary as ``string``/``binary``.

    Tables on S3: after ``use_s3(props)`` (PyIceberg's S3 FileIO properties: endpoint, keys, region,
    path-style access) every ``s3://`` metadata location is read by Iceberg Java's own ``S3FileIO``
    against that endpoint, with the AWS SDK v2 of the matching ``iceberg-aws-bundle`` jar from Maven
    Central; a missing object fails the read with Iceberg's "Location does not exist: s3://...".
    """

    def __init__(
        self,
        env: JavaEnv | ReaderRuntime | None = None,
        *,
        driver_memory: str = "1g",
        cores: int = 1,
        startup_timeout: float = 300.0,
        request_timeout: float = 600.0,
    ) -> None:
        self.runtime = env if isinstance(env, ReaderRuntime) else reference_runtime(env)
        self.label = self.runtime.label
        self.request_timeout = request_timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._s3_props: dict[str, str] | None = None
        self._catalogs: set[str] = set()
        self._dir = Path(tempfile.mkdtemp(prefix="iceberg-java-reader-"))
        self.stderr_path = self._dir / "server-stderr.log"
        self._stderr: IO[bytes] = self.stderr_path.open("wb")
        child_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        child_env["PYTHONUNBUFFERED"] = "1"
        started = time.monotonic()
        jar_args = [arg for jar in self.runtime.jars for arg in ("--jar", str(jar))]
        jar_args += [arg for jar in self.runtime.class_path for arg in ("--class-path", str(jar))]
        self._proc = subprocess.Popen(
            [
                str(self.runtime.python),
                str(SERVER_SCRIPT),
                *jar_args,
                "--driver-memory",
                driver_memory,
                "--cores",
                str(cores),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
            env=child_env,
            cwd=str(self._dir),
        )
        self._finalizer = weakref.finalize(self, _kill, self._proc)
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read_stdout, name="java-reader-stdout", daemon=True)
        self._pump.start()
        try:
            reply = self._request({"op": "ping"}, timeout=startup_timeout)
        except BaseException:
            self.close()
            raise
        self.spark_version = str(reply.get("spark"))
        self.startup_seconds = time.monotonic() - started

    # -- plumbing -------------------------------------------------------------------------------

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def stderr_tail(self, max_lines: int = 60) -> str:
        """The last lines the server wrote to stderr (Spark's log, Python tracebacks)."""
        self._stderr.flush()
        try:
            with self.stderr_path.open("r", encoding="utf-8", errors="replace") as fh:
                return "".join(collections.deque(fh, maxlen=max_lines))
        except OSError:
            return ""

    def _died(self, what: str) -> JavaReaderDied:
        code = self._proc.poll()
        return JavaReaderDied(
            f"Java Iceberg reader server {what} (exit code {code}); "
            f"stderr tail ({self.stderr_path}):\n{self.stderr_tail()}"
        )

    def _request(self, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("JavaIcebergReader is closed")
            if self._proc.poll() is not None:
                raise self._died("is not running")
            req_id = next(self._ids)
            started = time.monotonic()
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps({**req, "id": req_id}) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                raise self._died("closed its input") from exc
            deadline = time.monotonic() + (self.request_timeout if timeout is None else timeout)
            while True:
                remaining = deadline - time.monotonic()
                try:
                    line = self._replies.get(timeout=remaining) if remaining > 0 else _TIMED_OUT
                except queue.Empty:
                    line = _TIMED_OUT
                if line is None:  # stdout closed: the server is exiting
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=30)
                    self._closed = True
                    raise self._died(f"exited while handling {req.get('op')!r}")
                if line is _TIMED_OUT:
                    _kill(self._proc)  # the protocol is out of step now; do not reuse it
                    self._closed = True
                    raise self._died(f"did not answer {req.get('op')!r} in {deadline - started:.0f}s and was killed")
                try:
                    reply = json.loads(line)
                except ValueError as exc:
                    _kill(self._proc)  # something else wrote to the protocol stream; it cannot be trusted
                    self._closed = True
                    raise self._died(f"wrote a non-JSON line to stdout: {line[:500]!r}") from exc
                if reply.get("id") == req_id:
                    break
        if not reply.get("ok"):
            raise JavaReaderError(f"{req.get('op')} failed: {reply.get('error')}")
        return dict(reply)

    def _table_request(self, req: dict[str, Any]) -> pa.Table:
        out = self._dir / f"result-{uuid.uuid4().hex}.arrow"
        try:
            reply = self._request({**req, "out": str(out)})
            table = _read_ipc(out)
        finally:
            out.unlink(missing_ok=True)
        if table.num_rows != reply.get("rows"):
            raise JavaReaderError(f"server reported {reply.get('rows')} rows, the Arrow file has {table.num_rows}")
        return table

    # -- API ------------------------------------------------------------------------------------

    def ping(self) -> str:
        """Round-trip to the server; returns the Spark version."""
        return str(self._request({"op": "ping"}).get("spark"))

    def read(
        self, metadata_location: str | os.PathLike[str], where: str | None = None, branch: str | None = None
    ) -> pa.Table:
        """``spark.read.format("iceberg").load(metadata_location)``, filtered by the Spark SQL ``where``;
        ``branch`` reads that branch's head instead of main's."""
        return self._table_request(
            {"op": "read", "metadata": os.fspath(metadata_location), "where": where, "branch": branch}
        )

    def read_many(self, metadata_locations: Sequence[str | os.PathLike[str]]) -> list[pa.Table]:
        """``read`` of every table, in one request (one round trip, one Spark job per table in the
        server: about 0.05-0.1 s a small table). The tables come back in the order given."""
        out = self._dir / f"many-{uuid.uuid4().hex}"
        locations = [os.fspath(m) for m in metadata_locations]
        try:
            reply = self._request({"op": "read_many", "tables": locations, "out": str(out)})
            tables = [_read_ipc(out / f"{i}.arrow") for i in range(len(locations))]
        finally:
            shutil.rmtree(out, ignore_errors=True)
        for location, table, rows in zip(locations, tables, reply.get("rows") or [], strict=True):
            if table.num_rows != rows:
                raise JavaReaderError(f"{location}: server reported {rows} rows, the Arrow file has {table.num_rows}")
        return tables

    def snapshots(self, metadata_location: str | os.PathLike[str]) -> pa.Table:
        """The ``#snapshots`` metadata table; ``summary`` is a JSON object string."""
        return self._table_request({"op": "snapshots", "metadata": os.fspath(metadata_location)})

    def files(self, metadata_location: str | os.PathLike[str]) -> pa.Table:
        """The ``#files`` metadata table (data and delete files of the current snapshot).

        ``partition`` and the metrics maps are JSON strings (e.g. ``{"ts_day":"2024-01-01","id_bucket":0}``);
        ``lower_bounds``, ``upper_bounds``, ``key_metadata`` and ``readable_metrics`` are left out.
        """
        return self._table_request({"op": "files", "metadata": os.fspath(metadata_location)})

    def metadata_table(self, metadata_location: str | os.PathLike[str], name: str) -> pa.Table:
        """Any metadata table (``history``, ``manifests``, ``entries``, ``refs``, ``delete_files``, ...);
        map and struct columns become JSON strings."""
        return self._table_request({"op": "metadata_table", "metadata": os.fspath(metadata_location), "name": name})

    def sql(self, query: str, views: Mapping[str, str | os.PathLike[str]] | None = None) -> pa.Table:
        """A free-form Spark SQL query; ``views`` maps temp view names to metadata locations to
        register first (Spark cannot query ``iceberg.`<path>``` directly).

        The server's SparkSession is shared by every test of the session and keeps a catalog once it
        is initialized, so setting a catalog a second time would silently keep the first one's
        warehouse: declaring a catalog name already declared is refused; ``catalog()`` gives fresh names.
        """
        declared = _CATALOG_DECLARATION.match(query)
        if declared:
            name = declared.group(1)
            if name in self._catalogs:
                raise JavaReaderError(
                    f"catalog {name!r} is already declared in this Java reader's shared SparkSession "
                    "(its first settings would stay in force); use JavaIcebergReader.catalog() for a fresh name"
                )
            self._catalogs.add(name)
        named = {name: os.fspath(loc) for name, loc in (views or {}).items()}
        return self._table_request({"op": "sql", "query": query, "views": named})

    def catalog(self, warehouse: str | os.PathLike[str], *, jdbc_uri: str | None = None) -> str:
        """Declare a Spark catalog of Iceberg Java under a name no earlier call used and return the
        name: a Hadoop catalog on ``warehouse``, or a JDBC catalog at ``jdbc_uri`` (caching off)."""
        name = f"java_cat_{next(_CATALOG_NUMBERS)}"
        location = warehouse.as_uri() if isinstance(warehouse, Path) else os.fspath(warehouse)
        statements = [f"SET spark.sql.catalog.{name}=org.apache.iceberg.spark.SparkCatalog"]
        if jdbc_uri is None:
            statements.append(f"SET spark.sql.catalog.{name}.type=hadoop")
        else:
            statements += [
                f"SET `spark.sql.catalog.{name}.catalog-impl`=org.apache.iceberg.jdbc.JdbcCatalog",
                f"SET spark.sql.catalog.{name}.uri={jdbc_uri}",
                f"SET `spark.sql.catalog.{name}.cache-enabled`=false",
            ]
        statements.append(f"SET spark.sql.catalog.{name}.warehouse={location}")
        for statement in statements:
            self.sql(statement)
        return name

    def column_default(
        self, table: str, name: str, iceberg_type: str, default: Any, *, required: bool = False, change: bool = False
    ) -> None:
        """Add column ``name`` (a primitive ``iceberg_type``) to catalog table ``table`` with
        ``default`` (JSON single-value form) as its initial- and write-default, through Iceberg Java's
        ``UpdateSchema`` (Spark SQL cannot set defaults); with ``change``, set the write-default of
        the existing column instead."""
        req = {"op": "column_default", "table": table, "name": name, "type": iceberg_type, "default": default}
        self._request({**req, "required": required, "change": change})

    def row_lineage(self, metadata_location: str | os.PathLike[str]) -> pa.Table:
        """Every row with the row lineage metadata columns ``_row_id`` and ``_last_updated_sequence_number``."""
        return self._table_request({"op": "row_lineage", "metadata": os.fspath(metadata_location)})

    def lineage(self, metadata_location: str | os.PathLike[str]) -> dict[str, Any]:
        """Java's view of a local table's row lineage: format version, next-row-id, each snapshot's
        first-row-id and added-rows, and each live data file's (inherited) first row id."""
        return dict(self._request({"op": "lineage", "metadata": os.fspath(metadata_location)})["lineage"])

    def use_s3(self, props: Mapping[str, str]) -> None:
        """Read ``s3://`` metadata locations from now on with S3FileIO configured from ``props``
        (PyIceberg's ``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``,
        ``s3.path-style-access``). Cheap when ``props`` are the ones already in use."""
        wanted = {k: str(props[k]) for k in _S3_KEYS if k in props}
        if wanted == self._s3_props:
            return
        self._request({"op": "s3", "props": wanted})
        self._s3_props = wanted

    def read_s3(
        self,
        props: Mapping[str, str],
        metadata_location: str,
        where: str | None = None,
        branch: str | None = None,
    ) -> pa.Table:
        """``use_s3(props)`` then ``read`` of the ``s3://`` metadata location."""
        self.use_s3(props)
        return self.read(metadata_location, where=where, branch=branch)

    def close(self) -> None:
        """Stop the server (politely, then by force) and remove the temporary directory."""
        with self._lock:
            if not self._closed and self._proc.poll() is None:
                try:
                    assert self._proc.stdin is not None
                    self._proc.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
                    self._proc.stdin.flush()
                    self._proc.stdin.close()
                    self._proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._closed = True
            self._finalizer()
            self._stderr.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> JavaIcebergReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


# -- DuckDB -----------------------------------------------------------------------------------------

_DUCKDB_EXTENSIONS = ("parquet", "avro", "iceberg")  # load order: iceberg needs the other two


def duckdb_extension_paths() -> dict[str, Path]:
    """The ``.duckdb_extension`` files shipped by the duckdb-extension-* PyPI packages, for the
    installed DuckDB version."""
    import duckdb

    version = f"v{duckdb.__version__}"
    paths: dict[str, Path] = {}
    for name in _DUCKDB_EXTENSIONS:
        spec = find_spec(f"duckdb_extension_{name}")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"PyPI package duckdb-extension-{name} is not installed")
        found = sorted(
            p
            for loc in spec.submodule_search_locations
            for p in Path(loc).glob(f"extensions/*/{name}.duckdb_extension")
        )
        exact = [p for p in found if p.parent.name == version]
        if not exact:
            raise RuntimeError(f"no {name}.duckdb_extension for DuckDB {version} in duckdb-extension-{name}: {found}")
        paths[name] = exact[0]
    return paths


def duckdb_connect() -> Any:
    """A DuckDB connection with parquet, avro and iceberg loaded from local files (never downloads),
    and ``TimeZone = 'UTC'``."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for path in duckdb_extension_paths().values():
        con.load_extension(str(path))
    con.execute("SET TimeZone = 'UTC'")
    return con


def duckdb_read(
    metadata_location: str | os.PathLike[str],
    where: str | None = None,
    snapshot_id: int | None = None,
    file_cache: bool = True,
) -> pa.Table:
    """``select * from iceberg_scan('<metadata.json>') [where ...]`` with DuckDB's iceberg extension.

    ``where`` is a DuckDB SQL predicate; ``snapshot_id`` reads that snapshot (e.g. a branch head)
    instead of the current one. Plain paths and file:// URIs both work; no version guessing is
    needed since the exact metadata file is given. ``file_cache=False`` turns DuckDB's external file
    cache off, through which DuckDB 1.5.5 misreads a Puffin file holding a small DV after a larger one
    (tests/integration/test_v3_dv_layout.py): for tables whose DVs are packed on purpose.
    """
    path = _local_path(metadata_location).replace("'", "''")
    at = f", snapshot_from_id={int(snapshot_id)}" if snapshot_id is not None else ""
    query = f"select * from iceberg_scan('{path}'{at})"
    if where:
        query += f" where ({where})"
    con = duckdb_connect()
    try:
        if not file_cache:
            con.execute("SET enable_external_file_cache = false")
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


def duckdb_read_many(metadata_locations: Sequence[str | os.PathLike[str]]) -> list[pa.Table]:
    """``duckdb_read`` of every table, over one connection (the extensions are loaded once)."""
    con = duckdb_connect()
    try:
        return [
            con.sql(f"select * from iceberg_scan('{_local_path(m).replace(chr(39), chr(39) * 2)}')").to_arrow_table()
            for m in metadata_locations
        ]
    finally:
        con.close()


def httpfs_extension() -> Path:
    """DuckDB's httpfs extension from PyPI duckdb-extension-httpfs (never downloaded)."""
    import duckdb

    spec = find_spec("duckdb_extension_httpfs")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    found = sorted(
        p for loc in locations for p in Path(loc).glob(f"extensions/v{duckdb.__version__}/httpfs.duckdb_extension")
    )
    if not found:
        raise RuntimeError(
            f"PyPI package duckdb-extension-httpfs has no httpfs extension for DuckDB {duckdb.__version__}"
        )
    return found[0]


def duckdb_s3_read(props: Mapping[str, str], metadata_location: str) -> pa.Table:
    """``iceberg_scan`` of an ``s3://`` metadata file with DuckDB's httpfs extension (PyPI
    duckdb-extension-httpfs, never downloaded), against the endpoint and keys in ``props``."""
    con = duckdb_connect()
    try:
        con.load_extension(str(httpfs_extension()))
        endpoint = props["s3.endpoint"].removeprefix("http://")
        con.execute(
            "CREATE SECRET s3_reader (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
            [props["s3.access-key-id"], props["s3.secret-access-key"], props.get("s3.region", "us-east-1"), endpoint],
        )
        path = metadata_location.replace("'", "''")
        return con.sql(f"select * from iceberg_scan('{path}')").to_arrow_table()
    finally:
        con.close()


# -- PyIceberg --------------------------------------------------------------------------------------


def pyiceberg_read(metadata_location: str | os.PathLike[str], row_filter: str | None = None) -> pa.Table:
    """``StaticTable.from_metadata(...).scan(row_filter).to_arrow()`` (PyIceberg filter syntax)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(os.fspath(metadata_location))
    return table.scan(row_filter=row_filter if row_filter else AlwaysTrue()).to_arrow()


# -- comparing results ------------------------------------------------------------------------------


class _NaN:
    """Stands for a floating-point NaN so that NaN == NaN in normalized rows."""

    _instance: _NaN | None = None

    def __new__(cls) -> _NaN:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NaN)

    def __hash__(self) -> int:
        return hash("NaN")

    def __repr__(self) -> str:
        return "NaN"


NAN: _NaN = _NaN()


def _norm(value: Any, typ: pa.DataType) -> Any:
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return str(value)
    if pa.types.is_dictionary(typ):
        return _norm(value, typ.value_type)
    if pa.types.is_floating(typ):
        return NAN if math.isnan(value) else float(value)
    if pa.types.is_timestamp(typ):
        if typ.tz is not None:
            return value.astimezone(dt.UTC)
        return value
    if pa.types.is_map(typ):
        return {_norm(k, typ.key_type): _norm(v, typ.item_type) for k, v in value}
    if pa.types.is_struct(typ):
        return {typ.field(i).name: _norm(value[typ.field(i).name], typ.field(i).type) for i in range(typ.num_fields)}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_norm(v, typ.value_type) for v in value]
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (3, None)
    if isinstance(value, _NaN):
        return (2, None)
    if isinstance(value, dict | list):
        return (1, repr(value))
    return (0, value)


def normalize(table: pa.Table, sort_by: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of ``table`` as plain dicts, in a canonical order, comparable across readers.

    - Column order does not matter (dicts); column names must match.
    - ``timestamptz`` (Arrow timestamp with any tz) -> aware ``datetime`` in UTC (``datetime.UTC``),
      whatever zone the reader labelled it with (Spark "UTC", DuckDB "Etc/UTC", PyIceberg "UTC").
      ``timestamp`` without zone -> naive ``datetime``. Aware and naive never compare equal, so a
      timestamptz/timestamp mix-up between readers shows up as a difference.
      Nanosecond timestamps are cast to microseconds and raise if that would lose precision.
    - NaN -> the ``NAN`` sentinel (equal to itself); -0.0 == 0.0 as in Python.
    - decimal -> ``Decimal`` as is (``Decimal("1.5") == Decimal("1.50")``); date -> ``date``;
      binary, large_binary, fixed -> ``bytes``; string/large_string -> ``str``; UUID -> ``str``.
    - struct -> dict, list -> list, map -> dict, all normalized recursively.
    - Rows are sorted by ``sort_by`` (None last, NaN just before None), then by the whole row, so
      the result is canonical even when ``sort_by`` is not unique.

    Python equality is loose across numeric types (``1 == 1.0 == True == Decimal(1)``): compare
    ``canonical_schema`` too when the column types matter.
    """
    missing = [c for c in sort_by if c not in table.column_names]
    if missing:
        raise KeyError(f"sort_by columns {missing} not in {table.column_names}")
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        column = table.column(name)
        typ = column.type
        if pa.types.is_timestamp(typ) and typ.unit == "ns":
            column = column.cast(pa.timestamp("us", tz=typ.tz), safe=True)
            typ = column.type
        columns[name] = [_norm(v, typ) for v in column.to_pylist()]
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    if not columns:
        rows = [{} for _ in range(table.num_rows)]
    return _canonical_order(rows, sort_by)


def _canonical_order(rows: list[dict[str, Any]], sort_by: Sequence[str]) -> list[dict[str, Any]]:
    return sorted(
        rows,
        key=lambda row: (
            tuple(_sort_key(row[c]) for c in sort_by),
            repr(sorted(row.items(), key=lambda kv: kv[0])),
        ),
    )


def canonical_type(typ: pa.DataType) -> str:
    """An Arrow type's name with reader-specific spellings folded together: large_string ->
    string, large_binary -> binary, large_list -> list, any timestamp zone -> "UTC", dictionary
    -> its value type, nullability and field metadata ignored."""
    if pa.types.is_dictionary(typ):
        return canonical_type(typ.value_type)
    if pa.types.is_large_string(typ) or pa.types.is_string(typ) or pa.types.is_string_view(typ):
        return "string"
    if pa.types.is_large_binary(typ) or pa.types.is_binary(typ) or pa.types.is_binary_view(typ):
        return "binary"
    if pa.types.is_timestamp(typ):
        return f"timestamp[{typ.unit}{', tz=UTC' if typ.tz is not None else ''}]"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return f"list<{canonical_type(typ.value_type)}>"
    if pa.types.is_map(typ):
        return f"map<{canonical_type(typ.key_type)}, {canonical_type(typ.item_type)}>"
    if pa.types.is_struct(typ):
        inner = ", ".join(f"{typ.field(i).name}: {canonical_type(typ.field(i).type)}" for i in range(typ.num_fields))
        return f"struct<{inner}>"
    return str(typ)


def canonical_schema(table: pa.Table | pa.Schema) -> dict[str, str]:
    """``{column: canonical_type}`` for comparing column types across readers."""
    schema = table.schema if isinstance(table, pa.Table) else table
    return {field.name: canonical_type(field.type) for field in schema}


# -- every reader against a model ------------------------------------------------------------------


def _want(expected: pa.Table | Sequence[Mapping[str, Any]], sort_by: Sequence[str]) -> list[dict[str, Any]]:
    """The model as ``normalize`` would give it: an Arrow table is normalized; rows (dicts of plain
    values, e.g. an earlier ``normalize`` result) are put in ``normalize``'s order."""
    if isinstance(expected, pa.Table):
        return normalize(expected, sort_by)
    return _canonical_order([dict(r) for r in expected], sort_by)


def _difference(label: str, location: str, got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str:
    """An assertion message: who read what, and a few rows only one side has."""
    extra = [r for r in got if r not in want][:3]
    missing = [r for r in want if r not in got][:3]
    return (
        f"{label} read {len(got)} rows of {location}, the model has {len(want)}; "
        f"read but not in the model: {extra}; in the model but not read: {missing}"
    )


def assert_readers_agree(
    java_readers: Sequence[JavaIcebergReader],
    metadata_location: str | os.PathLike[str],
    expected: pa.Table | Sequence[Mapping[str, Any]],
    sort_by: Sequence[str],
    *,
    s3: Mapping[str, str] | None = None,
    duckdb: bool = True,
    duckdb_file_cache: bool = True,
) -> None:
    """Every Java reader (e.g. Iceberg Java 1.9.2 and the newest) and DuckDB read exactly ``expected``.

    ``expected`` is the model: an Arrow table (normalized here) or rows as dicts of plain values in
    ``normalize``'s form (e.g. its result; ``NAN`` for NaN, UTC datetimes for timestamptz). ``s3``
    are the S3 FileIO properties when the table is on S3 (Java through S3FileIO, DuckDB through
    httpfs). The assertion message names the reader that differs. ``duckdb_file_cache``: as
    ``duckdb_read``'s ``file_cache`` (a local table only).
    """
    want = _want(expected, sort_by)
    location = os.fspath(metadata_location)
    for java in java_readers:
        if s3 is not None:
            java.use_s3(s3)
        got = normalize(java.read(location), sort_by)
        assert got == want, _difference(java.label, location, got, want)
    if duckdb:
        if s3 is not None:
            assert duckdb_file_cache, "DuckDB's file cache is only turned off for local tables"
            table = duckdb_s3_read(s3, location)
        else:
            table = duckdb_read(location, file_cache=duckdb_file_cache)
        got = normalize(table, sort_by)
        assert got == want, _difference("DuckDB", location, got, want)


def assert_readers_agree_many(
    java_readers: Sequence[JavaIcebergReader],
    expected: Mapping[str, pa.Table | Sequence[Mapping[str, Any]]],
    sort_by: Sequence[str],
    *,
    duckdb: bool = True,
) -> None:
    """``assert_readers_agree`` of many local tables (metadata location -> model), one request per
    Java reader (``read_many``) and one DuckDB connection."""
    locations = list(expected)
    wants = [_want(expected[m], sort_by) for m in locations]
    results: list[tuple[str, list[pa.Table]]] = [(java.label, java.read_many(locations)) for java in java_readers]
    if duckdb:
        results.append(("DuckDB", duckdb_read_many(locations)))
    for label, tables in results:
        for location, want, table in zip(locations, wants, tables, strict=True):
            got = normalize(table, sort_by)
            assert got == want, _difference(label, location, got, want)

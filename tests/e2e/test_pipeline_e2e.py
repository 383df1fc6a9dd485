"""The real pipeline, end to end: PostgreSQL -> Debezium -> Kafka -> Spark -> iceberg_sink -> Iceberg.

Every component is real and started here, on loopback: PostgreSQL from the Debian packages
(``wal_level=logical``, pgoutput), Apache Kafka 4.x (KRaft, one node), Kafka Connect standalone with
Debezium's PostgreSQL connector (JsonConverter, with the ``schema`` part), and Spark's Kafka source
(scripts/pipeline_components.py fetches the jars from Maven Central once).

A workload generator (:class:`Workload`) runs random DML on four tables with the column types of
issue 19 (inserts, updates, deletes, primary key updates, multi-table transactions, a row updated
twice in one transaction, one ``ALTER TABLE ... ADD COLUMN``, one ``TRUNCATE``). One stream
(tests/e2e/pipeline_driver.py: ``subscribePattern`` + ``.debezium(key_from="key")`` + ``.route`` +
``.cdc(key_column=...)`` + add-columns) writes every table; during the workload the Spark driver
is SIGKILLed, the broker restarted and Kafka Connect SIGKILLed and restarted (it re-sends what came
after its last flushed offset: duplicates must not double anything). Then the stream drains the
topics, and ``iceberg-sink run pipeline.yaml --available-now`` (the YAML form of the same pipeline)
resumes on the same checkpoint location; every Iceberg table, read by Iceberg Java and DuckDB, must equal PostgreSQL's
``SELECT *`` of its source table, value for value; every committed snapshot names the Kafka offsets
it holds.

Profiles: the CI profile (default) runs a few seconds of workload and one kill; the long profile
(``ICEBERG_SINK_E2E_PROFILE=long``: 10 minutes, a kill every ~90 seconds) runs on demand
(docs/postgres-debezium-kafka.md records its result).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.catalog import load_catalog

from iceberg_sink.sources.kafka_offsets import parse_summary
from tests.e2e.pipeline_driver import NAMESPACE, pipeline_yaml
from tests.integration.kafka import components, spark_kafka_conf, started_components
from tests.integration.postgres import USER, PostgresServer
from tests.interop.readers import JavaIcebergReader, duckdb_read

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROFILE = os.environ.get("ICEBERG_SINK_E2E_PROFILE", "ci")
PROFILES = {
    # seconds of workload, seconds between driver kills (the first kill once a checkpoint committed)
    "ci": {"workload_s": 20.0, "kill_every_s": None, "steps_per_s": 4.0},
    "long": {"workload_s": 600.0, "kill_every_s": 90.0, "steps_per_s": 10.0},
}
TOPIC_PREFIX = "shop"
DRAIN_TIMEOUT_S = 1800.0  # minutes of Spark on a busy 2-core machine; seconds on an idle one

# -- Connector settings: Debezium's defaults ---------------------------------------------------------
#
# The sink takes the connector's real events with its default settings: NUMERIC as Connect Decimal
# (precise), dates, timestamps and zoned timestamps as Debezium's logical types (issue 18 part 2).
CONNECTOR_WORKAROUNDS: dict[str, str] = {}
CONNECTOR_SETTINGS = {"skipped.operations": "none"}
"""Debezium skips TRUNCATE by default (``skipped.operations=t``): ``none`` makes it emit the ``t``
event (pgoutput's publication of all tables publishes truncates), which the pipeline applies
(``.debezium(truncate="apply")``, tests/e2e/pipeline_driver.py)."""
TRUNCATE_AS_DELETE = False
"""The workload's TRUNCATE is a real ``TRUNCATE`` (True: a ``DELETE FROM`` of every row instead)."""
TODAY_REPRESENTATION: dict[str, Callable[[Any], Any]] = {}
"""Columns whose Iceberg type is not the one issue 18 part 2 defines: none any more."""


def iceberg_table(pg_table: str) -> str:
    """The routed Iceberg table of PostgreSQL table ``public.<pg_table>`` of database ``shop``: the
    table's own name, in the route's namespace (sources/source_names.py)."""
    return f"{NAMESPACE}.{pg_table}"


# The Iceberg type each PostgreSQL type must become (issue 18 part 2), checked for every type that
# TODAY_REPRESENTATION does not list.
TARGET_TYPES = {
    "numeric": "decimal(10, 2)",
    "date": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "uuid": "string",
    "jsonb": "string",
    "boolean": "boolean",
    "bytea": "binary",
    "text[]": "list<string>",
    "varchar": "string",
    "text": "string",
    "bigint": "long",
    "smallint": "int",
}

TABLES = {
    "customers": {
        "ddl": "id bigint primary key, name varchar(40), credit numeric(10,2), born date, vip boolean, tags text[]",
        "key": "id",
    },
    "orders": {
        "ddl": "id bigint primary key, customer_id bigint, placed timestamptz, amount numeric(10,2), "
        "qty smallint, note text",
        "key": "id",
    },
    "events": {
        "ddl": "event_id uuid primary key, happened timestamp, payload jsonb, raw bytea",
        "key": "event_id",
    },
    "accounts": {
        "ddl": "code varchar(12) primary key, region smallint, opened date, units bigint",
        "key": "code",
    },
}
ADDED_COLUMN = ("customers", "email", "varchar(60)")
ORDER_COLUMN = "lsn"


class Workload:
    """Random DML on :data:`TABLES` through one connection (each step one transaction)."""

    def __init__(self, port: int, seed: int) -> None:
        import psycopg2

        self.conn = psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname="shop")
        self.random = random.Random(seed)
        self.next_id = {"customers": 1, "orders": 1, "accounts": 1}
        self.steps = 0
        self.altered = False
        self.truncated = False
        self.counts: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def create(self) -> None:
        with self.conn, self.conn.cursor() as cur:
            for name, table in TABLES.items():
                cur.execute(f"CREATE TABLE {name} ({table['ddl']})")

    def _value(self, table: str) -> dict[str, Any]:
        r = self.random
        if table == "customers":
            row: dict[str, Any] = {
                "name": r.choice(["Ada", "Grace", "Linus", "Zoë", "O'Brien", None]),
                "credit": decimal.Decimal(r.randint(-99999999, 99999999)) / 100 if r.random() > 0.1 else None,
                "born": dt.date(1950, 1, 1) + dt.timedelta(days=r.randint(0, 25000)),
                "vip": r.choice([True, False, None]),
                "tags": r.choice([["a", "b"], [], ["x,y", 'q"uote'], None]),
            }
            if self.altered:
                row["email"] = r.choice([f"u{r.randint(0, 999)}@example.com", None])
            return row
        if table == "orders":
            return {
                "customer_id": r.randint(1, 50),
                "placed": dt.datetime(2024, 3, 10, 1, 30, tzinfo=dt.UTC) + dt.timedelta(seconds=r.randint(0, 10**8)),
                "amount": decimal.Decimal(r.randint(0, 10**8)) / 100,
                "qty": r.randint(-32768, 32767),
                "note": r.choice(["", "ok", "über\tnote", None]),
            }
        if table == "events":
            return {
                "happened": dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=r.randint(0, 10**15)),
                "payload": json.dumps({"n": r.randint(0, 100), "tags": ["a", r.choice(["b", "c"])], "ok": True}),
                "raw": bytes(r.randint(0, 255) for _ in range(r.randint(0, 12))),
            }
        return {
            "region": r.randint(0, 9),
            "opened": dt.date(2020, 1, 1) + dt.timedelta(days=r.randint(0, 2000)),
            "units": r.randint(-(2**62), 2**62),
        }

    def _new_key(self, table: str) -> Any:
        if table == "events":
            return str(uuid.UUID(int=self.random.getrandbits(128)))
        n = self.next_id[table]
        self.next_id[table] += 1
        return n if table != "accounts" else f"AC-{n:05d}"

    def _existing(self, cur: Any, table: str) -> Any:
        key = TABLES[table]["key"]
        cur.execute(f"SELECT {key} FROM {table} ORDER BY random() LIMIT 1")
        row = cur.fetchone()
        return row[0] if row else None

    def _insert(self, cur: Any, table: str) -> None:
        row = {TABLES[table]["key"]: self._new_key(table), **self._value(table)}
        columns = ", ".join(row)
        cur.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(row))})", list(row.values()))

    def _update(self, cur: Any, table: str) -> None:
        key = self._existing(cur, table)
        if key is None:
            return self._insert(cur, table)
        row = self._value(table)
        sets = ", ".join(f"{c} = %s" for c in row)
        cur.execute(f"UPDATE {table} SET {sets} WHERE {TABLES[table]['key']} = %s", [*row.values(), key])

    def _delete(self, cur: Any, table: str) -> None:
        key = self._existing(cur, table)
        if key is not None:
            cur.execute(f"DELETE FROM {table} WHERE {TABLES[table]['key']} = %s", [key])

    def _move_key(self, cur: Any, table: str) -> None:
        key = self._existing(cur, table)
        if key is not None:
            cur.execute(
                f"UPDATE {table} SET {TABLES[table]['key']} = %s WHERE {TABLES[table]['key']} = %s",
                [self._new_key(table), key],
            )

    def step(self) -> None:
        r = self.random
        with self.conn, self.conn.cursor() as cur:
            kind = r.choices(["insert", "update", "delete", "move", "multi", "twice"], [5, 4, 2, 1, 2, 1])[0]
            table = r.choice(list(TABLES))
            if kind == "insert":
                self._insert(cur, table)
            elif kind == "update":
                self._update(cur, table)
            elif kind == "delete":
                self._delete(cur, table)
            elif kind == "move":
                self._move_key(cur, r.choice(["customers", "accounts", "orders"]))
            elif kind == "multi":  # one transaction over several tables
                self._insert(cur, "orders")
                self._update(cur, "customers")
                self._delete(cur, "accounts")
                self._insert(cur, "events")
            else:  # the same row changed twice in one transaction: the later change must win
                self._update(cur, table)
                key = self._existing(cur, table)
                if key is not None:
                    row = self._value(table)
                    sets = ", ".join(f"{c} = %s" for c in row)
                    cur.execute(f"UPDATE {table} SET {sets} WHERE {TABLES[table]['key']} = %s", [*row.values(), key])
                    self._delete(cur, table)
            self._count(kind)
        self.steps += 1

    def alter(self) -> None:
        table, column, kind = ADDED_COLUMN
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self.altered = True

    def truncate(self, table: str = "events") -> None:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"DELETE FROM {table}" if TRUNCATE_AS_DELETE else f"TRUNCATE {table}")
        self.truncated = True

    def run(self, seconds: float, steps_per_s: float, stop: threading.Event) -> None:
        """Steps until ``stop`` is set, at least ``seconds`` long: the ALTER at 40 % of that time, the
        TRUNCATE at 60 %."""
        started = time.monotonic()
        while not stop.is_set() or time.monotonic() - started < seconds:
            elapsed = time.monotonic() - started
            if not self.altered and elapsed >= 0.4 * seconds:
                self.alter()
            if not self.truncated and elapsed >= 0.6 * seconds:
                self.truncate()
            self.step()
            time.sleep(self.random.expovariate(steps_per_s))

    def close(self) -> None:
        self.conn.close()


# -- reading both sides ------------------------------------------------------------------------------


def postgres_rows(port: int, table: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """``SELECT *`` of ``table`` (column -> PostgreSQL type, rows)."""
    import psycopg2

    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname="shop")) as conn:
        cur = conn.cursor()
        cur.execute(
            "SELECT column_name, data_type, udt_name FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position",
            [table],
        )
        types = {}
        for name, data_type, udt in cur.fetchall():
            kind = {
                "character varying": "varchar",
                "timestamp without time zone": "timestamp",
                "timestamp with time zone": "timestamptz",
                "ARRAY": f"{udt.lstrip('_')}[]",
            }.get(data_type, data_type)
            types[name] = kind
        cur.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        return types, [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def canonical(value: Any, pg_type: str) -> Any:
    """One comparable form of a value of PostgreSQL type ``pg_type``, from either side."""
    if value is None:
        return None
    if pg_type == "jsonb":
        return json.loads(value) if isinstance(value, str) else value
    if pg_type == "bytea":
        return bytes(value)
    if pg_type == "timestamptz" and isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)
    if pg_type == "numeric":
        return decimal.Decimal(value).quantize(decimal.Decimal("0.01"))
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def iceberg_value(value: Any, pg_type: str) -> Any:
    if value is not None and pg_type in TODAY_REPRESENTATION:
        value = TODAY_REPRESENTATION[pg_type](value)
    return canonical(value, pg_type)


def compare(name: str, pg_types: dict[str, str], pg_rows: list[dict[str, Any]], read: Any, reader: str) -> None:
    key = TABLES[name]["key"]
    want = {canonical(r[key], pg_types[key]): {c: canonical(v, pg_types[c]) for c, v in r.items()} for r in pg_rows}
    got: dict[Any, dict[str, Any]] = {}
    for row in read.to_pylist():
        row.pop(ORDER_COLUMN, None)  # the sink keeps .cdc's order column (Debezium's lsn) in each table
        unknown = [c for c in row if c not in pg_types]
        assert not unknown, f"{reader}: table {name} has columns {unknown} PostgreSQL's table has not"
        converted = {c: iceberg_value(row.get(c), t) for c, t in pg_types.items()}
        assert converted[key] not in got, f"{reader}: table {name} holds key {converted[key]!r} twice"
        got[converted[key]] = converted
    missing = sorted(map(str, want.keys() - got.keys()))[:10]
    extra = sorted(map(str, got.keys() - want.keys()))[:10]
    assert not missing and not extra, f"{reader}: {name}: keys missing in Iceberg {missing}, extra {extra}"
    differ = [(k, want[k], got[k]) for k in want if want[k] != got[k]]
    assert not differ, f"{reader}: {name}: {len(differ)} rows differ, e.g. {differ[:3]}"


# -- the components ------------------------------------------------------------------------------------


class Driver:
    """tests/e2e/pipeline_driver.py in its own process group, its output in a file."""

    module = "tests.e2e.pipeline_driver"  # the driver program it runs

    def __init__(self, folder: Path, request: dict[str, Any]) -> None:
        self.folder = folder
        self.request_file = folder / "request.json"
        self.request_file.write_text(json.dumps(request))
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = folder / "driver-0.out"

    def start(self) -> None:
        self.out = self.folder / f"driver-{self.runs}.out"
        self.runs += 1
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, str(self.request_file)],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the pipeline driver exited ({self.proc.returncode}):\n{self.text()[-8000:]}", pytrace=False)

    def wait_for(self, what: str, count: int = 1, timeout_s: float = 1200) -> None:
        deadline = time.monotonic() + timeout_s
        while self.text().count(what) < count:
            self.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(
                    f"driver: no {count} x {what!r} within {timeout_s} s:\n{self.text()[-6000:]}", pytrace=False
                )
            time.sleep(0.5)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def spark_position(checkpoint: Path) -> dict[str, dict[int, int]]:
    """The Kafka end offsets of the last micro-batch Spark committed at ``checkpoint``."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    return {t: {int(p): o for p, o in parts.items()} for t, parts in json.loads(lines[2]).items()}


def reached(position: dict[str, dict[int, int]], end: dict[str, dict[int, int]]) -> bool:
    return all(position.get(t, {}).get(p, -1) >= o for t, parts in end.items() for p, o in parts.items())


def run_cli_drain(config: Path, checkpoint: Path, end: dict[str, dict[int, int]]) -> str:
    """``iceberg-sink run CONFIG --available-now`` until Spark's position reaches ``end``."""
    outputs = []
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "iceberg_sink.cli", "--json", "run", str(config), "--available-now"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DRAIN_TIMEOUT_S,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
        outputs.append(done.stdout + done.stderr[-4000:])
        assert done.returncode == 0, f"iceberg-sink run failed ({done.returncode}):\n{outputs[-1][-8000:]}"
        position = spark_position(checkpoint)
        if reached(position, end):
            return "\n".join(outputs)
        assert time.monotonic() < deadline, f"not drained: at {position}, end {end}"


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[dict[str, Any]]:
    pc = components()
    pg = PostgresServer({"wal_level": "logical", "max_wal_senders": "4", "max_replication_slots": "4"})
    with started_components(pg) as started:
        pg.start()
        pg.create_database("shop")
        broker = pc.KafkaBroker(tmp_path / "kafka")
        started.append(broker)
        broker.start()
        connector = pc.debezium_postgres_connector(
            "shop-connector", pg.port, "shop", USER, TOPIC_PREFIX, **CONNECTOR_SETTINGS, **CONNECTOR_WORKAROUNDS
        )
        # Offsets flushed every 5 s: a SIGKILL loses up to 5 s of them, which Connect then re-sends.
        connect = pc.KafkaConnect(tmp_path / "connect", broker.bootstrap, connector, offset_flush_ms=5000)
        started.append(connect)
        yield {"pg": pg, "broker": broker, "connect": connect}


def test_postgres_to_iceberg_through_debezium_and_kafka(
    pipeline: dict[str, Any], java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    profile = PROFILES[PROFILE]
    pg, broker, connect = pipeline["pg"], pipeline["broker"], pipeline["connect"]
    workload = Workload(pg.port, seed=int(os.environ.get("ICEBERG_SINK_E2E_SEED", "19")))
    workload.create()
    for _ in range(40):  # rows the connector's initial snapshot reads ('r' events)
        workload.step()
    connect.start()

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": warehouse.as_uri()}
    checkpoint = tmp_path / "checkpoint"
    request = {
        "bootstrap": broker.bootstrap,
        "pattern": f"{TOPIC_PREFIX}[.]public[.].*",
        "catalog": catalog_props,
        "checkpoint": str(checkpoint),
        "jars": spark_kafka_conf()["spark.jars"],
    }
    driver = Driver(tmp_path, request)
    try:
        run_pipeline(driver, workload, profile, broker, connect, checkpoint, request, tmp_path)
    finally:
        driver.kill()
    check_tables(load_catalog("e2e", **catalog_props), pg.port, java_reader)
    workload.close()


def run_pipeline(
    driver: Driver,
    workload: Workload,
    profile: dict[str, Any],
    broker: Any,
    connect: Any,
    checkpoint: Path,
    request: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The stream through the workload and its faults, then drained with ``iceberg-sink run``."""
    driver.start()
    driver.wait_for("COMMITTED")

    stop = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            workload.run(profile["workload_s"], profile["steps_per_s"], stop)
        except BaseException as e:
            failure.append(e)

    worker = threading.Thread(target=work, name="workload")
    worker.start()
    faults: list[str] = []
    try:
        # Fault 1: SIGKILL of the Spark driver once it committed a checkpoint of the running workload.
        commits = driver.text().count("COMMITTED")
        driver.wait_for("COMMITTED", commits + 1)
        driver.kill()
        faults.append("driver SIGKILL")
        # Fault 2: the broker restarts while Connect produces (the driver is down meanwhile).
        broker.restart()
        faults.append("broker restart")
        driver.start()
        driver.wait_for("STREAMING")
        # Fault 3: Kafka Connect SIGKILLed: its unflushed offsets are lost and it re-sends.
        connect.restart(signal.SIGKILL)
        faults.append("connect SIGKILL + restart")
        kill_every = profile["kill_every_s"]
        last_kill = time.monotonic()
        stop.set()  # the workload ends once it ran for workload_s, the faults above included
        while worker.is_alive():
            driver.check_alive()
            if kill_every and time.monotonic() - last_kill > kill_every:
                driver.kill()
                driver.start()
                faults.append("driver SIGKILL")
                last_kill = time.monotonic()
            worker.join(1)
    finally:
        stop.set()
        worker.join()
    if failure:
        raise failure[0]
    assert workload.altered and workload.truncated, workload.counts

    # Drain: let Connect catch up (the end offsets stop moving).
    previous: dict[str, dict[int, int]] = {}
    end = broker.end_offsets(request["pattern"])
    while end != previous:
        time.sleep(10)
        previous, end = end, broker.end_offsets(request["pattern"])
    # The running driver drains the topics (a kill now would throw away its batch in progress) ...
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not reached(spark_position(checkpoint), end):
        driver.check_alive()
        assert time.monotonic() < deadline, f"not drained: at {spark_position(checkpoint)}, end {end}"
        time.sleep(2)
    driver.kill()
    # ... and the same pipeline from its YAML file resumes from the same checkpoint location.
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(pipeline_yaml(request)))
    run_cli_drain(config, checkpoint, end)

    print(f"e2e profile {PROFILE}: {workload.steps} steps {workload.counts}; faults {faults}")


def check_tables(catalog: Any, port: int, java_reader: JavaIcebergReader) -> None:
    """Every Iceberg table equals its PostgreSQL table (Iceberg Java and DuckDB), with its types."""
    for name in TABLES:
        pg_types, pg_rows = postgres_rows(port, name)
        table = catalog.load_table(iceberg_table(name))
        iceberg_types = {f.name: str(f.field_type) for f in table.schema().fields}
        for column, pg_type in pg_types.items():
            if pg_type in TODAY_REPRESENTATION or column not in iceberg_types:
                continue
            assert iceberg_types[column] == TARGET_TYPES[pg_type], (name, column, pg_type, iceberg_types)
        compare(name, pg_types, pg_rows, java_reader.read(table.metadata_location), "Iceberg Java")
        compare(name, pg_types, pg_rows, duckdb_read(table.metadata_location), "DuckDB")
        # Every committed checkpoint names how far each Kafka partition is.
        for snapshot in table.snapshots():
            summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
            if "iceberg-sink.checkpoint-id" in summary:
                assert parse_summary(summary), (name, summary)

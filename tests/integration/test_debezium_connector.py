"""The sink on events Debezium's PostgreSQL connector really emits (not events the project wrote).

PostgreSQL (``wal_level=logical``, pgoutput), a Kafka broker and Kafka Connect with Debezium's
PostgreSQL connector all run here (tests/integration/kafka.py, scripts/pipeline_components.py); the
records the connector produced are read back with Kafka's console consumer, as ``key``, ``value``,
``topic``, ``partition`` and ``offset`` rows, and written through ``.debezium(key_from="key")`` +
``.cdc(...)`` micro-batch by micro-batch with ``IcebergSink.write`` (the test session's Spark, which
has no Kafka source; the stream through Spark's Kafka source is tests/e2e). The table, read by
Iceberg Java and DuckDB, must equal PostgreSQL's ``SELECT *``.

Two tables: a plain one (with and without the schema part), and one whose column names and values
data chose to be hard (``${...}``, which Spark would substitute in SQL text, beside a decoy column
named as that substitution; a quote, a backslash, emoji, a trailing space; NaN and infinities, the
largest double, a negative zero, a numeric at its precision, timestamps past the nanosecond range).
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.integration.kafka import components, started_components
from tests.integration.postgres import USER, PostgresServer
from tests.interop.readers import NAN, JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

# name -> (DDL, the first step's statements (parameters), the second step's: deletes only)
Statements = list[tuple[str, tuple[Any, ...]]]
SCENARIOS: dict[str, tuple[str, Statements, Statements]] = {
    "plain": (
        "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(40), qty smallint, tags text[], ok boolean)",
        [
            ("INSERT INTO items VALUES (%s, %s, %s, %s, %s)", (1, "one", 1, ["a"], True)),
            ("INSERT INTO items VALUES (%s, %s, %s, %s, %s)", (2, "two", 2, [], False)),
            ("INSERT INTO items VALUES (%s, %s, %s, %s, %s)", (3, None, None, None, None)),
            ("UPDATE items SET name = 'uno', tags = ARRAY['x', 'y'] WHERE id = 1", ()),
        ],
        [("DELETE FROM items WHERE id = 2", ())],
    ),
    "hostile": (
        'CREATE TABLE items (id bigint PRIMARY KEY, "Price ${currency}" numeric(10,2), "Price " numeric(10,2), '
        '"it\'s \\ ${env:HOME} 😀" text, ratio double precision, at timestamp)',
        [
            (
                "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s)",
                (1, Decimal("12.34"), Decimal("1.00"), "it's \\ ${env:HOME} 😀\n", float("nan"), "2024-01-01 10:00:00"),
            ),
            ("INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s)", (2, Decimal("-0.01"), None, "", float("inf"), None)),
            (
                "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s)",
                (3, None, Decimal("2.00"), None, float("-inf"), "2262-04-12 00:00:00.000001"),
            ),
            (
                "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s)",
                (4, Decimal("99999999.99"), Decimal("0.00"), "${x}", -0.0, "1677-09-21 00:12:43.145224"),
            ),
            (
                'UPDATE items SET "Price ${currency}" = %s, ratio = %s WHERE id = 1',
                (Decimal("5.50"), 1.7976931348623157e308),
            ),
        ],
        [("DELETE FROM items WHERE id = 2", ())],
    ),
}


@pytest.fixture
def captured(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A PostgreSQL table changed in two steps, captured by Debezium (the test's parameter: the
    scenario and ``schemas.enable``): step 1 inserts and updates, step 2 only deletes (default replica
    identity: the delete's ``before`` holds the key, the other columns null)."""
    import psycopg2

    ddl, step_1, step_2 = SCENARIOS[request.param[0]]

    pc = components()
    pg = PostgresServer({"wal_level": "logical", "max_wal_senders": "4", "max_replication_slots": "4"})
    with started_components(pg) as started:
        pg.start()
        pg.create_database("shop")
        conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user=USER, dbname="shop")
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(ddl)
        broker = pc.KafkaBroker(tmp_path / "kafka")
        started.append(broker)
        broker.start()
        connect = pc.KafkaConnect(
            tmp_path / "connect",
            broker.bootstrap,
            pc.debezium_postgres_connector("items", pg.port, "shop", USER, "shop"),
            schemas_enable=request.param[1],
        )
        started.append(connect)
        connect.start()
        for statement, parameters in step_1:
            cur.execute(statement, parameters)
        first = len(step_1)  # one event each
        for statement, parameters in step_2:
            cur.execute(statement, parameters)
        # Each delete and its tombstone.
        records = broker.consume("shop.public.items", first + 2 * len(step_2), timeout_s=120)
        cur.execute("SELECT * FROM items")
        names = [d[0] for d in cur.description]
        want = sorted(
            ({n: NAN if v != v else v for n, v in zip(names, r, strict=True)} for r in cur.fetchall()),
            key=lambda r: r["id"],
        )
        conn.close()
        yield {"records": records, "first": first, "want": want}


def batch(spark: SparkSession, records: list[tuple[str, str]], first_offset: int) -> Any:
    rows = [
        (None if k == "null" else k, None if v == "null" else v, "shop.public.items", 0, first_offset + i)
        for i, (k, v) in enumerate(records)
    ]
    return spark.createDataFrame(rows, "key string, value string, topic string, partition int, offset long")


@pytest.mark.parametrize(
    "captured",
    [("plain", True), ("plain", False), ("hostile", True)],
    ids=["schemas", "no-schemas", "hostile-schemas"],
    indirect=True,
)
def test_real_connector_events_inserts_updates_then_a_lone_delete(
    spark: SparkSession,
    captured: dict[str, Any],
    catalog_props: dict[str, str],
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    records, first = captured["records"], captured["first"]
    assert len(records) == first + 2, records  # one delete: it and its tombstone
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .table("shop.items")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", order_by="lsn", key=["id"])
        .build()
    )
    checkpoint = str(tmp_path / "writes")
    sink.write(batch(spark, records[:first], 0), checkpoint_location=checkpoint)
    sink.write(batch(spark, records[first:], first), checkpoint_location=checkpoint)  # the delete alone
    table = sink.load_table()
    want = captured["want"]
    for read in (java_reader.read(table.metadata_location), duckdb_read(table.metadata_location)):
        assert [{c: v for c, v in r.items() if c != "lsn"} for r in normalize(read, ["id"])] == want

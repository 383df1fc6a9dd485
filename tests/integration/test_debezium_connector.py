"""The sink on events Debezium's PostgreSQL connector really emits (not events the project wrote).

PostgreSQL (``wal_level=logical``, pgoutput), a Kafka broker and Kafka Connect with Debezium's
PostgreSQL connector all run here (tests/integration/kafka.py, scripts/pipeline_components.py); the
records the connector produced are read back with Kafka's console consumer, as ``key``, ``value``,
``topic``, ``partition`` and ``offset`` rows, and written through ``.debezium(key_from="key")`` +
``.cdc(...)`` micro-batch by micro-batch with ``IcebergSink.write`` (the test session's Spark, which
has no Kafka source; the stream through Spark's Kafka source is tests/e2e). The table, read by
Iceberg Java and DuckDB, must equal PostgreSQL's ``SELECT *``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.integration.kafka import components, started_components
from tests.integration.postgres import USER, PostgresServer
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

DDL = "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(40), qty smallint, tags text[], ok boolean)"
ROWS = [(1, "one", 1, ["a"], True), (2, "two", 2, [], False), (3, None, None, None, None)]


@pytest.fixture
def captured(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A PostgreSQL table changed in two steps, captured by Debezium (``schemas.enable`` from the
    test's parameter): step 1 inserts and updates, step 2 only deletes (default replica identity:
    the delete's ``before`` holds the key, the other columns null)."""
    import psycopg2

    pc = components()
    pg = PostgresServer({"wal_level": "logical", "max_wal_senders": "4", "max_replication_slots": "4"})
    with started_components(pg) as started:
        pg.start()
        pg.create_database("shop")
        conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user=USER, dbname="shop")
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(DDL)
        broker = pc.KafkaBroker(tmp_path / "kafka")
        started.append(broker)
        broker.start()
        connect = pc.KafkaConnect(
            tmp_path / "connect",
            broker.bootstrap,
            pc.debezium_postgres_connector("items", pg.port, "shop", USER, "shop"),
            schemas_enable=request.param,
        )
        started.append(connect)
        connect.start()
        for row in ROWS:
            cur.execute("INSERT INTO items VALUES (%s, %s, %s, %s, %s)", row)
        cur.execute("UPDATE items SET name = 'uno', tags = ARRAY['x', 'y'] WHERE id = 1")
        first = 4  # three creates and one update
        cur.execute("DELETE FROM items WHERE id = 2")
        records = broker.consume("shop.public.items", first + 2, timeout_s=120)  # the delete and its tombstone
        cur.execute("SELECT * FROM items")
        names = [d[0] for d in cur.description]
        want = sorted((dict(zip(names, r, strict=True)) for r in cur.fetchall()), key=lambda r: r["id"])
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
    [
        True,
        False,
    ],
    ids=["schemas", "no-schemas"],
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
    assert len(records) == first + 2, records
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

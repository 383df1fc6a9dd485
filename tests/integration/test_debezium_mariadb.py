"""The sink on events Debezium's MariaDB connector really emits: binlog positions, MySQL's types.

MariaDB (binary log in row format), a Kafka broker and Kafka Connect with Debezium's MariaDB
connector all run here (tests/integration/mariadb.py, tests/integration/kafka.py,
scripts/pipeline_components.py). A table holding most of MySQL's column types, at the edges of their
ranges (unsigned 64-bit integers, 38-digit decimals, negative and over-24-hour TIMEs, the TIMESTAMP
limit, control characters and emoji in text), is snapshotted, then changed by transactions that
change one key several times (their events share a GTID and differ by binlog position and row), a
multi-row update, a delete and re-insert of one key in one transaction, and, in a second micro-batch,
an ``ALTER TABLE ... ADD COLUMN``; the connector's schema changes, transaction boundaries and
heartbeats (on their own topics, which a subscription to the prefix reads too) go into the batches. The records are read back with Kafka's console consumer and
written with ``IcebergSink.write`` through ``.debezium(order_by=[file, pos, row])`` + ``.cdc(...)``
into a format v2 table (equality deletes) and a v3 one (deletion vectors); Iceberg Java and DuckDB
must read each equal to MariaDB's ``SELECT *``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink
from tests.integration.kafka import components, started_components
from tests.integration.mariadb import PASSWORD, USER, MariaDBServer
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

TOPIC = "maria.shop.items"
SCHEMA_CHANGES, TRANSACTIONS, HEARTBEATS = "maria", "maria.transaction", "__debezium-heartbeat.maria"
DDL = """CREATE TABLE items (
  id bigint PRIMARY KEY, name varchar(64) CHARACTER SET utf8mb4, qty tinyint, flag tinyint(1),
  small smallint unsigned, u int unsigned, ub bigint unsigned, price decimal(10, 2), big decimal(38, 10),
  f float, d double, dt date, dtm datetime(6), ts timestamp(3) NULL DEFAULT NULL, tm time(6), yr year,
  e enum('a', 'b', 'c'), s set('x', 'y', 'z'), j json, bin varbinary(16), bits bit(5), flags bit(12), txt text)"""
COLUMNS = "id, name, qty, flag, small, u, ub, price, big, f, d, dt, dtm, ts, tm, yr, e, s, j, bin, bits, flags, txt"
SNAPSHOT = [
    (1, "one\x01\t\n😀", -128, 1, 65535, 4294967295, 18446744073709551615, Decimal("-12.34"),
     Decimal("1234567890123456789012345678.0123456789"), 1.5, -2.5e300, "1000-01-01", "2024-02-29 12:34:56.123456",
     "2038-01-19 03:14:07.999", "-838:59:59.000000", 1901, "c", "x,z", '{"k": [1, 2], "s": "\\u00e9"}',
     b"\x00\xff\x00", 0b10101, 0xABC, "text\r\nwith % and / and ..."),
    (2, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
     None, None, None, None),
    (3, "three", 127, 0, 0, 0, 0, Decimal("0.00"), Decimal("-0.0000000001"), -0.0, 0.0, "9999-12-31",
     "1000-01-01 00:00:00", "1970-01-01 00:00:01", "838:59:59.999999", 2155, "a", "", "[]", b"", 0, 1, ""),
]  # fmt: skip


def _insert(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    marks = ", ".join(["%s"] * len(rows[0]))
    cur.executemany(f"INSERT INTO items ({COLUMNS}) VALUES ({marks})", rows)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three snapshotted rows, a first micro-batch of streamed transactions and a second after an
    ``ALTER TABLE``, captured by Debezium's MariaDB connector (Connect JSON with schemas)."""
    root = tmp_path_factory.mktemp("mariadb-capture")
    pc = components()
    db = MariaDBServer()
    with started_components(db) as started:
        db.start()
        with contextlib.closing(db.connect()) as conn:
            cur = conn.cursor()
            cur.execute("CREATE DATABASE shop")
            cur.execute("USE shop")
            cur.execute(DDL)
            _insert(cur, SNAPSHOT)
            broker = pc.KafkaBroker(root / "kafka")
            started.append(broker)
            broker.start()
            connect = pc.KafkaConnect(
                root / "connect",
                broker.bootstrap,
                pc.debezium_mariadb_connector(
                    "items",
                    db.port,
                    "shop",
                    USER,
                    PASSWORD,
                    "maria",
                    root / "schema-history.dat",
                    **{
                        # Unsigned 64-bit values above 2^63 - 1 as decimal(20, 0): Debezium's default
                        # ("long") wraps them to negative numbers.
                        "bigint.unsigned.handling.mode": "precise",
                        # Transaction boundaries (topic maria.transaction) and heartbeats
                        # (__debezium-heartbeat.maria), beside the schema changes (topic maria).
                        "provide.transaction.metadata": "true",
                        "heartbeat.interval.ms": "200",
                    },
                ),
            )
            started.append(connect)
            connect.start()
            # The connector snapshots the table after its task is running: change it only once the
            # snapshot is in the topic (else the changes may be read by the snapshot instead).
            broker.consume(TOPIC, len(SNAPSHOT), timeout_s=120)
            _insert(cur, [(4, "four", *[None] * 21), (5, "five", *[None] * 21)])
            conn.begin()
            cur.execute("UPDATE items SET name = 'a' WHERE id = 1")
            cur.execute("UPDATE items SET name = 'b', qty = qty + 1 WHERE id = 1")
            cur.execute("UPDATE items SET txt = concat(coalesce(txt, ''), '!')")  # every row: one event per row
            cur.execute("DELETE FROM items WHERE id = 2")
            cur.execute("INSERT INTO items (id, name) VALUES (2, 'two again')")
            conn.commit()
            first = 3 + 2 + 2 + 5 + 2 + 1  # snapshot, inserts, updates of 1, update of all, delete + tombstone, insert
            cur.execute("ALTER TABLE items ADD COLUMN note varchar(10) NULL")
            cur.execute("UPDATE items SET note = 'n' WHERE id = 3")
            cur.execute("DELETE FROM items WHERE id = 4")
            cur.execute("INSERT INTO items (id, note) VALUES (6, 'six')")
            records = [(TOPIC, k, v) for k, v in broker.consume(TOPIC, first + 4, timeout_s=120)]
            # What a subscription to the prefix ("maria.*") reads beside the table's changes.
            side = {}
            for topic in (SCHEMA_CHANGES, TRANSACTIONS, HEARTBEATS):
                count = sum(broker.end_offsets(topic).get(topic, {}).values())
                side[topic] = [(topic, k, v) for k, v in broker.consume(topic, count, timeout_s=60)]
            cur.execute("SELECT * FROM items")
            names = [d[0] for d in cur.description]
            want = [_as_iceberg(dict(zip(names, r, strict=True))) for r in cur.fetchall()]
        yield {"records": records, "side": side, "first": first, "want": sorted(want, key=lambda r: r["id"])}


def _as_iceberg(row: dict[str, Any]) -> dict[str, Any]:
    """A MariaDB row as the sink stores Debezium's values: TIMESTAMP is UTC (timestamptz), TIME a long
    of microseconds (it may be negative or over 24 hours), BIT(n) the bytes of its value, least
    significant first (Debezium's ``io.debezium.data.Bits``; MariaDB gives them most significant first)."""
    out = dict(row)
    if out["ts"] is not None:
        out["ts"] = out["ts"].replace(tzinfo=dt.UTC)
    if out["tm"] is not None:
        out["tm"] = out["tm"] // dt.timedelta(microseconds=1)
    for bits in ("bits", "flags"):
        if out[bits] is not None:
            out[bits] = bytes(reversed(out[bits]))
    return out


def batch(spark: SparkSession, records: list[tuple[str, str, str]], first_offset: int) -> DataFrame:
    """Kafka rows of (topic, key, value) records (offsets made up: the sink does not read them here)."""
    rows = [
        (None if k == "null" else k, None if v == "null" else v, topic, 0, first_offset + i)
        for i, (topic, k, v) in enumerate(records)
    ]
    return spark.createDataFrame(rows, "key string, value string, topic string, partition int, offset long")


@pytest.mark.parametrize("format_version", [2, 3])
def test_real_mariadb_events_ordered_by_binlog_position(
    spark: SparkSession,
    captured: dict[str, Any],
    catalog_props: dict[str, str],
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    format_version: int,
) -> None:
    records, first, side = captured["records"], captured["first"], captured["side"]
    assert len(records) == first + 4, records
    # The schema changes include the ALTER; the transaction has its BEGIN and END; heartbeats came.
    assert any("ADD COLUMN note" in v for _, _, v in side[SCHEMA_CHANGES]), side[SCHEMA_CHANGES]
    assert {json.loads(v)["payload"]["status"] for _, _, v in side[TRANSACTIONS]} == {"BEGIN", "END"}
    assert side[HEARTBEATS], "no heartbeat"
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .table(f"shop.items_v{format_version}")
        .create_if_missing(format_version=format_version)
        .schema_evolution("add-columns")
        .debezium(
            value_column="value",
            table_column=None,
            order_by=["source.file", "source.pos", "source.row"],
            order_type=["binlog", "long", "long"],
            order_column="binlog",
        )
        .cdc(op_column="op", order_by="binlog", key=["id"])
        .build()
    )
    checkpoint = str(tmp_path / "writes")
    # Each micro-batch also holds the connector's other events, as a subscription to "maria.*" reads them.
    one = side[TRANSACTIONS] + records[:first] + side[HEARTBEATS]
    sink.write(batch(spark, one, 0), checkpoint_location=checkpoint)
    two = side[SCHEMA_CHANGES] + records[first:]  # after the ALTER
    sink.write(batch(spark, two, len(one)), checkpoint_location=checkpoint)
    table = sink.load_table()
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["ub"] == "decimal(20, 0)" and types["big"] == "decimal(38, 10)", types
    assert (types["ts"], types["dtm"], types["dt"], types["tm"]) == ("timestamptz", "timestamp", "date", "long"), types
    assert types["note"] == "string", types
    want = captured["want"]
    for read in (java_reader.read(table.metadata_location), duckdb_read(table.metadata_location)):
        assert [{c: v for c, v in r.items() if c != "binlog"} for r in normalize(read, ["id"])] == want

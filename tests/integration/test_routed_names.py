"""The tables a routed Debezium stream writes (issue 42 item 9): the names a user would pick, one
source per table across batches, and a restart whose naming rule would move a checkpoint's sources
to other tables refused at start, naming both.

Before: PostgreSQL's ``shop.public.customers`` went to ``ns.shop_s_public_s_customers`` (the guide
said ``shop.customers``), two databases' ``public.orders`` arriving in different batches merged into
one table, and an upgraded job silently started new, empty tables beside the ones its checkpoint
wrote. Tables are read back by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError
from iceberg_sink.sources.source_names import earlier_default_source, identity, name_of
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


def event(
    op: str, lsn: int, row: dict[str, Any], db: str = "shop", schema: str | None = "public", table: str = "customers"
) -> str:
    source = {"db": db, "table": table, "lsn": lsn, **({"schema": schema} if schema is not None else {})}
    payload = {"before": None, "after": row, "op": op, "ts_ms": 1_700_000_000_000, "source": source}
    return json.dumps(payload)


def frame(spark: SparkSession, values: list[str]) -> DataFrame:
    rows = [(json.dumps({"id": json.loads(v)["after"]["id"]}), v) for v in values]
    return spark.createDataFrame(rows, "key string, value string")


def routed(lake: Path, dead_letter: str | None = None, **debezium: Any) -> IcebergSink:
    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .route(table_column="source_table", namespace="shop")
        .debezium(value_column="value", key_from="key", **debezium)
        .cdc(op_column="op", order_by="lsn", key_column="key_columns")
        .create_if_missing()
    )
    return (builder.dead_letter(dead_letter) if dead_letter is not None else builder).build()


def tables(sink: IcebergSink) -> list[str]:
    return sorted(".".join(t) for t in sink.config.catalog.load().list_tables("shop"))


def read(java_reader: JavaIcebergReader, sink: IcebergSink, table: str) -> list[dict[str, Any]]:
    location = sink.load_table(table).metadata_location
    java = normalize(java_reader.read(location).select(["id", "name"]), ["id"])
    assert java == normalize(duckdb_read(location).select(["id", "name"]), ["id"])
    return java


def test_the_rule_and_its_python_twin() -> None:
    assert name_of(identity("shop", "public", "customers"), None) == "customers"
    assert name_of(identity("shop", "sales", "orders"), None) == "sales__orders"
    assert name_of(identity("inventory", None, "customers"), None) == "customers"  # MySQL: no schema
    assert name_of(identity("db", "dbo", "t"), None) == "t"  # SQL Server's default schema
    assert (
        name_of(identity("shop", "public", "order_items"), ("db", "schema", "table")) == "shop_s_public_s_order__items"
    )
    assert name_of(identity("shop", "public", "order_items"), ("table",)) == "order_items"
    # The previous default's names read back into their source (and nothing else does).
    assert earlier_default_source("shop_s_public_s_order__items") == "shop.public.order_items"
    assert earlier_default_source("inventory_s_customers") == "inventory..customers"
    assert earlier_default_source("customers") is None
    assert earlier_default_source("order_items") is None  # a single _ is not that rule's


def test_default_names_are_the_source_tables_own(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = routed(tmp_path / "lake")
    values = [
        event("c", 1, {"id": 1, "name": "ada"}),
        event("c", 2, {"id": 1, "name": "north"}, schema="sales", table="regions"),
        event("u", 3, {"id": 1, "name": "ada l"}),
    ]
    sink.write(frame(spark, values), checkpoint_location=str(tmp_path / "ckpt"))
    assert tables(sink) == ["shop.customers", "shop.sales__regions"]
    assert read(java_reader, sink, "shop.customers") == [{"id": 1, "name": "ada l"}]
    assert read(java_reader, sink, "shop.sales__regions") == [{"id": 1, "name": "north"}]
    # One progress record per table of the micro-batch (docs/metrics.md): before, a routed sink kept none.
    records = {r["table"]: r for r in sink.progress()}
    assert sorted(records) == ["shop.customers", "shop.sales__regions"]
    assert {r["checkpoint_id"] for r in records.values()} == {0}
    assert records["shop.customers"]["status"] == "committed" and records["shop.customers"]["rows"] == 1
    assert records["shop.customers"]["snapshot_id"] == sink.load_table("shop.customers").current_snapshot().snapshot_id
    assert set(records["shop.customers"]["phases_ms"]) >= {"read", "build", "write", "commit"}
    assert records["shop.customers"]["phases_ms"] == records["shop.sales__regions"]["phases_ms"]  # one batch
    # Each table's state records its source.
    recorded = tmp_path / "ckpt" / "iceberg_sink" / "tables" / "shop.customers" / "sources.json"
    assert json.loads(recorded.read_text()) == {"sources": ["shop.public.customers"]}


@pytest.mark.parametrize("dead_letter", [True, False])
def test_a_second_source_for_a_table_in_a_later_batch_is_refused(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, dead_letter: bool
) -> None:
    """One MySQL connector reading two databases: both ``orders`` tables map to ``shop.orders``. In
    one batch the reader refuses both; in two batches the second used to merge into the first's table."""
    sink = routed(tmp_path / "lake", dead_letter="shop.errors" if dead_letter else None)
    ckpt = str(tmp_path / "ckpt")
    first = event("c", 1, {"id": 1, "name": "one"}, db="tenant1", schema=None, table="orders")
    sink.write(frame(spark, [first]), checkpoint_location=ckpt)
    other = event("c", 2, {"id": 2, "name": "two"}, db="tenant2", schema=None, table="orders")
    fine = event("c", 3, {"id": 3, "name": "three"}, db="tenant1", schema=None, table="orders")
    snapshots = len(sink.load_table("shop.orders").snapshots())
    if not dead_letter:
        with pytest.raises(InvalidInputError, match=r"holds the rows of source tenant1\.\.orders.*tenant2\.\.orders"):
            sink.write(frame(spark, [other, fine]), checkpoint_location=ckpt)
        assert len(sink.load_table("shop.orders").snapshots()) == snapshots  # nothing committed
        assert read(java_reader, sink, "shop.orders") == [{"id": 1, "name": "one"}]
        return
    sink.write(frame(spark, [other, fine]), checkpoint_location=ckpt)
    assert read(java_reader, sink, "shop.orders") == [{"id": 1, "name": "one"}, {"id": 3, "name": "three"}]
    last = {r["table"]: r for r in sink.progress() if r["checkpoint_id"] == 1}
    assert sorted(last) == ["shop.errors", "shop.orders"] and last["shop.errors"]["dead_letter_records"] == 1
    errors = sink.load_table("shop.errors").scan().to_arrow().to_pylist()
    assert len(errors) == 1 and errors[0]["source_table"] == "shop.orders"
    assert "tenant1..orders" in errors[0]["reason"] and "tenant2..orders" in errors[0]["reason"]
    assert json.loads(errors[0]["raw"])["id"] == 2
    # Two sources meeting in a new table in one batch: neither is chosen, both are refused.
    invoices = [
        event("c", 4, {"id": 1, "name": "x"}, db="tenant1", schema=None, table="invoices"),
        event("c", 5, {"id": 1, "name": "y"}, db="tenant2", schema=None, table="invoices"),
    ]
    sink.write(frame(spark, invoices), checkpoint_location=ckpt)
    assert "shop.invoices" not in tables(sink)
    reasons = [e["reason"] for e in sink.load_table("shop.errors").scan().to_arrow().to_pylist()]
    assert (
        sum("is the name of two sources in this batch (tenant1..invoices and tenant2..invoices)" in r for r in reasons)
        == 2
    )


def test_a_restart_that_would_move_a_checkpoints_tables_is_refused_at_start(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A checkpoint of the previous release (default names <db>_s_<schema>_s_<table>, no recorded
    sources) restarted with this release's default: refused naming both tables, before any batch;
    with the old rule named it goes on writing the old table."""
    lake, ckpt = tmp_path / "lake", str(tmp_path / "ckpt")
    earlier = ("db", "schema", "table")
    routed(lake, table_fields=earlier).write(
        frame(spark, [event("c", 1, {"id": 1, "name": "a"})]), checkpoint_location=ckpt
    )
    state = Path(ckpt) / "iceberg_sink" / "tables"
    assert [p.name for p in state.iterdir()] == ["shop.shop_s_public_s_customers"]
    (state / "shop.shop_s_public_s_customers" / "sources.json").unlink()  # as the previous release left it
    sink = routed(lake)
    second = frame(spark, [event("u", 2, {"id": 1, "name": "b"})])
    with pytest.raises(
        InvalidSinkConfigError,
        match=r"shop\.shop_s_public_s_customers \(source shop\.public\.customers\) would now go to shop\.customers",
    ):
        sink.write(second, checkpoint_location=ckpt)
    assert "shop.customers" not in tables(sink)
    routed(lake, table_fields=earlier).write(second, checkpoint_location=ckpt)
    assert read(java_reader, sink, "shop.shop_s_public_s_customers") == [{"id": 1, "name": "b"}]
    # Now the source is recorded: another rule is refused from the record, not from the name.
    with pytest.raises(InvalidSinkConfigError, match=r"would now go to shop\.customers"):
        sink.write(second, checkpoint_location=ckpt)
    shutil.rmtree(tmp_path / "fresh", ignore_errors=True)
    sink.write(second, checkpoint_location=str(tmp_path / "fresh"))  # a new checkpoint starts the new names
    assert read(java_reader, sink, "shop.customers") == [{"id": 1, "name": "b"}]

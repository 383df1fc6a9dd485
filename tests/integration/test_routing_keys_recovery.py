"""A routed CDC stream whose tables have different keys (named per row in a key column, or the
builder's default) and gain a column mid-stream (``.schema_evolution("add-columns")``), with the
driver SIGKILLed right after a schema change and between two tables' commits. After every restart
each table holds each checkpoint exactly once and reads (DuckDB) as the model keyed by its own key
after those checkpoints; at the end Iceberg Java and DuckDB read each table equal to that model.

Updates and deletes recur on the same keys across checkpoints, and ``cdc.orders`` holds the same
``id`` in two regions, so a table written with a wrong key (the builder's ``id`` instead of its own)
would keep stale rows or delete other rows."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog

from iceberg_sink import _faults
from iceberg_sink.committer.store import CheckpointStore
from tests.integration.test_routing_recovery import committed, run_driver
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.slow, pytest.mark.interop]

DDL = (
    "tbl string, pk string, region string, id long, sku string, name string, qty long, note string, lsn long, op string"
)
# Each table's key: orders names (region, id) in its rows' pk column in its first checkpoint, in
# some rows until NAMED_UNTIL and in none after (its identifier fields key it then); skus names sku
# in every row; plain names none (the builder's key=["id"]).
KEYS = {"orders": ("region", "id"), "plain": ("id",), "skus": ("sku",)}
TABLES = sorted(KEYS)
NAMED_UNTIL = 4
NAMES = [f"cdc.{t}" for t in TABLES]  # with one commit thread, tables commit in name order: orders, plain, skus
# The checkpoint from which a table's rows carry a value in ``note`` (the column is added then).
NOTE_FROM = {"orders": 2, "skus": 5}
COLUMNS = {
    "orders": {"region", "id", "name", "qty", "note", "lsn"},
    "plain": {"id", "name", "lsn"},
    "skus": {"sku", "name", "qty", "note", "lsn"},
}
FILES = 7
# (kill [point, checkpoint, nth hit], tables holding checkpoint c after the kill, tables with c stored)
KILLS: list[tuple[list[Any], list[str], list[str]]] = [
    # orders' note column committed, nothing of checkpoint 2 written.
    ([_faults.AFTER_SCHEMA_CHANGE, 2, 1], [], []),
    # Between the first two tables' commits.
    ([_faults.AFTER_COMMIT, 3, 1], ["cdc.orders"], NAMES),
    # Between the second and third: skus, the one left, gained note in this checkpoint (orders'
    # committable was removed after its commit; plain's is not yet).
    ([_faults.AFTER_COMMIT, 5, 2], ["cdc.orders", "cdc.plain"], ["cdc.plain", "cdc.skus"]),
    # The first table's commit reached the catalog, its result unseen.
    ([_faults.COMMIT_SENT, 6, 1], ["cdc.orders"], NAMES),
]

Model = dict[str, dict[tuple[Any, ...], dict[str, Any]]]


def change_rows(files: int, per_file: int, seed: int) -> list[list[dict[str, Any]]]:
    """Each file's changes (every table in every file, its first change of a file an upsert)."""
    rng = random.Random(seed)
    live: dict[str, set[tuple[Any, ...]]] = {t: set() for t in TABLES}
    lsn = 0
    out = []
    for f in range(files):
        rows = []
        for i in range(per_file):
            table = TABLES[i] if i < len(TABLES) else rng.choice(TABLES)
            if table == "orders":
                key: tuple[Any, ...] = (rng.choice(["eu", "us"]), rng.randrange(5))
            elif table == "plain":
                key = (rng.randrange(8),)
            else:
                key = (f"s{rng.randrange(6)}",)
            lsn += 1
            row: dict[str, Any] = {c: None for c in ("pk", "region", "id", "sku", "name", "qty", "note")}
            row |= dict(zip(KEYS[table], key, strict=True)) | {"tbl": table, "lsn": lsn}
            if i >= len(TABLES) and key in live[table] and rng.random() < 0.35:
                row["op"] = "D"
                live[table].discard(key)
            else:
                row["op"] = "U" if key in live[table] else "I"
                live[table].add(key)
                row["name"] = f"{table}-{lsn}"
                if table != "plain":
                    row["qty"] = rng.randrange(100)
                if f >= NOTE_FROM.get(table, files):
                    row["note"] = f"n{lsn}"
            if table == "orders" and (f == 0 or (f < NAMED_UNTIL and rng.random() < 0.5)):
                row["pk"] = "region, id"
            elif table == "skus":
                row["pk"] = "sku"
            rows.append(row)
        out.append(rows)
    return out


def write_files(directory: Path, files: list[list[dict[str, Any]]]) -> None:
    types = {"string": pa.string(), "long": pa.int64()}
    schema = pa.schema([(name, types[kind]) for name, kind in (c.split() for c in DDL.split(", "))])
    directory.mkdir(parents=True)
    for f, rows in enumerate(files):
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema), path)
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the file source's order


def model_after(files: list[list[dict[str, Any]]], checkpoints: int) -> Model:
    """Each table's rows by its own key after the first ``checkpoints`` files."""
    model: Model = {t: {} for t in TABLES}
    for rows in files[:checkpoints]:
        for row in sorted(rows, key=lambda r: int(r["lsn"])):
            table = row["tbl"]
            key = tuple(row[k] for k in KEYS[table])
            if row["op"] == "D":
                model[table].pop(key, None)
            else:
                model[table][key] = {c: row[c] for c in COLUMNS[table]}
    return model


def rows_of(got: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    return normalize(got, columns)


def expected_rows(model: Model, table: str, columns: list[str]) -> list[dict[str, Any]]:
    return normalize(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in model[table].values()]), columns)


def test_differently_keyed_routed_tables_with_a_column_added_survive_kills(
    tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    (tmp_path / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}
    files = change_rows(FILES, per_file=24, seed=11)
    write_files(tmp_path / "src", files)
    catalog = load_catalog("crash", **props)
    catalog.create_namespace("cdc")
    stream = {
        "key": ["id"],
        "key_column": "pk",
        "partition_by": [],
        "schema_evolution": "add-columns",
        "ddl": DDL,
        # Kills between the first and second and the second and third tables' commits need an order.
        "write_options": {"iceberg-sink.route.commit-threads": 1},
        # One table at a time, so kills fall between two tables' commits (test_routing_recovery.py
        # kills atomic routed checkpoints, the default on a SQL catalog).
        "atomic_commits": "off",
    }

    def check_held(where: str, held_by: dict[str, int]) -> None:
        for table, name in zip(TABLES, NAMES, strict=True):
            loaded = catalog.load_table(name)
            columns = loaded.schema().column_names
            expected = expected_rows(model_after(files, held_by[name]), table, columns)
            assert rows_of(duckdb_read(loaded.metadata_location), columns) == expected, f"{name} {where}: DuckDB"

    for kill, holding, stored in KILLS:
        point, checkpoint, _ = kill
        output = run_driver(tmp_path, props, kill, stream)
        where = f"killed at {point} of checkpoint {checkpoint}"
        assert f"KILLING at {point} {checkpoint}" in output and "timeout" not in output, output[-4000:]
        held_by = {}
        for name in NAMES:
            held = committed(catalog, name)
            held_by[name] = checkpoint + (1 if name in holding else 0)
            assert held == list(range(held_by[name])), f"{name} {where}"
            pending = CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids()
            assert pending == ([checkpoint] if name in stored else []), f"{name} {where}"
        if point == _faults.AFTER_SCHEMA_CHANGE:
            # The column is there before any data of the checkpoint that needs it.
            assert "note" in catalog.load_table("cdc.orders").schema().column_names
        check_held(where, held_by)
    output = run_driver(tmp_path, props, None, stream)
    assert "DONE" in output, output[-4000:]
    final = model_after(files, FILES)
    for table, name in zip(TABLES, NAMES, strict=True):
        assert committed(catalog, name) == list(range(FILES)), name
        assert CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids() == [], name
        loaded = catalog.load_table(name)
        schema = loaded.schema()
        assert tuple(schema.find_column_name(i) for i in sorted(schema.identifier_field_ids)) == KEYS[table], name
        columns = schema.column_names
        assert set(columns) == COLUMNS[table], name
        expected = expected_rows(final, table, columns)
        assert len(expected) > 3, name
        assert rows_of(java_reader.read(loaded.metadata_location), columns) == expected, f"{name}: Iceberg Java"
        assert rows_of(duckdb_read(loaded.metadata_location), columns) == expected, f"{name}: DuckDB"
    # Both regions' rows of one id survived somewhere: (region, id) really is orders' key.
    ids = [key[1] for key in final["orders"]]
    assert len(ids) > len(set(ids)), "the data must hold one id in two regions"
    print(json.dumps({t: len(final[t]) for t in TABLES}))

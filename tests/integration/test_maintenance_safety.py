"""Maintenance that cannot destroy a table: every numeric argument checked in one place, every rewrite
verified before it commits, orphan removal refused where other tables' files lie, and expiry deleting
what Iceberg Java's ExpireSnapshots deletes. Real Spark, real SQLite catalogs, tables read back by
Iceberg Java and DuckDB."""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidSinkConfigError, MaintenanceRefusedError
from iceberg_sink._iceberg import rewrites
from iceberg_sink._iceberg.delete_rewrite import RewriteDeletes
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.files import branch_head
from iceberg_sink.cli import EXIT_OK, EXIT_USAGE, main
from iceberg_sink.cli.main import EXIT_REFUSED
from iceberg_sink.topology import maintenance
from iceberg_sink.topology.compaction import CompactionConfig, compact
from iceberg_sink.topology.conversion import ConversionConfig
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize


def far_future() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(days=1)


def local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def files_under(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def upsert_table(spark: SparkSession, lake: Path, name: str = "db.t") -> IcebergSink:
    """Two upserts: two data files and one equality delete file (the second write's keys 3, 4 existed)."""
    sink = (
        IcebergSink.builder().embedded(lake).table(name).create_if_missing(format_version=2).upsert(key=["id"]).build()
    )
    sink.write(spark.createDataFrame([(i, "a") for i in range(5)], "id long, v string"))
    sink.write(spark.createDataFrame([(i, "b") for i in range(3, 8)], "id long, v string"))
    return sink


EXPECTED = [{"id": i, "v": "a" if i < 3 else "b"} for i in range(8)]


def check_rows(java_reader: JavaIcebergReader, table: Table, expected: list[dict[str, object]]) -> None:
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected


# ---- numeric arguments ----------------------------------------------------------------------------

BAD_OPTIONS = {
    "rewrite-manifests": {"--entries-per-manifest": ["-3", "0", "nan", "inf", "1.5"]},
    "expire-snapshots": {"--older-than-hours": ["-1", "nan", "inf", "-inf", "1e300"], "--retain-last": ["0", "-2"]},
    "remove-orphans": {"--older-than-hours": ["0.5", "-1", "nan", "inf", "1e300"]},
    "convert-equality-deletes": {"--max-replans": ["-1", "nan"]},
    "compact": {"--min-input-files": ["0", "-1", "inf"], "--target-file-size-bytes": ["0", "-5", "nan"]},
    "inspect": {"--limit": ["-1", "nan"]},
}


def test_every_numeric_option_of_every_command_is_refused_naming_it_and_nothing_changes(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    sink = upsert_table(spark, lake)
    before = sink.load_table().metadata_location
    where = ["db.t", "--embedded", str(lake)]
    for command, options in BAD_OPTIONS.items():
        for option, values in options.items():
            for value in values:
                with pytest.raises(SystemExit) as exited:
                    main([command, *where, f"{option}={value}"])
                err = capsys.readouterr().err
                assert exited.value.code == EXIT_USAGE, (command, option, value, err)
                assert f"argument {option}: expected " in err and f"received {value!r}" in err, err
                assert "Traceback" not in err
    config = tmp_path / "pipeline.yaml"
    config.write_text("source: {format: rate}\nsink: {table: db.t}\n")
    for option, value in (("--timeout", "nan"), ("--timeout", "-1"), ("--timeout", "inf"), ("--max-batches", "0")):
        with pytest.raises(SystemExit) as exited:
            main(["run", str(config), option, value])
        assert exited.value.code == EXIT_USAGE and f"argument {option}: expected " in capsys.readouterr().err
    assert sink.load_table().metadata_location == before  # nothing was committed
    # A good value still works.
    assert main(["rewrite-manifests", *where, "--entries-per-manifest", "1"]) == EXIT_OK


def test_every_numeric_argument_of_the_maintenance_apis_is_refused_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = upsert_table(spark, tmp_path / "lake")
    before = sink.load_table().metadata_location
    load = sink.load_table
    calls: list[tuple[str, Callable[[], object]]] = []
    for bad in (-3, 0, math.nan, math.inf, 2.0, True):
        calls.append(
            ("entries_per_manifest", lambda bad=bad: maintenance.rewrite_manifests(load, entries_per_manifest=bad))
        )  # type: ignore[misc]
    for bad in (0, -1, math.nan, 1.5):
        calls.append(("retain_last", lambda bad=bad: maintenance.expire_snapshots(load, far_future(), retain_last=bad)))  # type: ignore[misc]
    for bad in (-1, math.nan, math.inf):
        calls.append(("max_replans", lambda bad=bad: maintenance.convert_equality_deletes(load, max_replans=bad)))  # type: ignore[misc]
        calls.append(("max_replans", lambda bad=bad: CompactionConfig(max_replans=bad)))  # type: ignore[misc]
        calls.append(("max_replans", lambda bad=bad: ConversionConfig(max_replans=bad)))  # type: ignore[misc]
    for name in ("target_file_size_bytes", "min_input_files", "every_seconds", "max_group_bytes"):
        for bad in (0, -1, math.nan, math.inf):
            calls.append((name, lambda name=name, bad=bad: CompactionConfig(**{name: bad})))  # type: ignore[misc]
    for bad in (0, math.nan, math.inf):
        calls.append(("every_n_commits", lambda bad=bad: ConversionConfig(every_n_commits=bad)))  # type: ignore[misc]
    calls.append(("older_than", lambda: maintenance.remove_orphan_files(load, dt.timedelta(days=10**6))))
    calls.append(("older_than", lambda: maintenance.expire_snapshots(load, dt.datetime(2020, 1, 1))))
    for name, call in calls:
        with pytest.raises(InvalidSinkConfigError, match=rf"\b{name}\)?: expected ") as refused:
            call()
        assert "received" in str(refused.value), str(refused.value)
    assert sink.load_table().metadata_location == before


# ---- every rewrite verifies its snapshot before committing ----------------------------------------


def test_a_rewrite_that_would_change_the_live_files_is_refused_and_leaves_nothing(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    lake = tmp_path / "lake"
    sink = upsert_table(spark, lake)
    table = sink.load_table()
    metadata_dir = local(table.location()) / "metadata"
    files_before = files_under(metadata_dir)
    data, deletes = live_files(table, branch_head(table, "main"))
    assert len(data) == 2 and len(deletes) == 1
    seq = table.current_snapshot().sequence_number  # type: ignore[union-attr]

    # A manifest rewrite that would list no entry (what --entries-per-manifest -3 committed).
    with pytest.raises(MaintenanceRefusedError, match="3 live files would be dropped"):
        rewrites.RewriteManifests(table, "main", -3, {}).prepare()
    # A compaction replacing a file that is not live, or adding one that already is.
    with pytest.raises(MaintenanceRefusedError, match="files it replaces are not live"):
        rewrites.RewriteFiles(table, "main", [], frozenset({"file:///nowhere/x.parquet"}), seq, {}).prepare()
    with pytest.raises(MaintenanceRefusedError, match="files it adds are already live"):
        rewrites.RewriteFiles(table, "main", [data[0].meta], frozenset({data[1].meta.path}), seq, {}).prepare()
    # A conversion asked to remove a data file (it rewrites delete manifests only: the file would stay).
    with pytest.raises(MaintenanceRefusedError, match="it neither keeps nor adds"):
        RewriteDeletes(table, "main", [], frozenset({data[0].meta.path}), {}).prepare()
    # Nothing committed, and the manifests the refused attempts wrote are gone.
    assert sink.load_table().metadata_location == table.metadata_location
    assert files_under(metadata_dir) == files_before

    # The real rewrites pass the same check, and the table reads the same.
    assert maintenance.convert_equality_deletes(sink.load_table).snapshot_id is not None
    assert maintenance.rewrite_manifests(sink.load_table, entries_per_manifest=1) is not None
    assert compact(spark, sink.load_table).snapshot_id is not None
    check_rows(java_reader, sink.load_table(), EXPECTED)


def test_rewrite_manifests_with_a_bad_entry_count_never_empties_the_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    sink = upsert_table(spark, lake)
    before = sink.load_table().metadata_location
    for value in ("-3", "0"):
        with pytest.raises(SystemExit) as exited:
            main(["rewrite-manifests", "db.t", "--embedded", str(lake), "--entries-per-manifest", value])
        assert exited.value.code == EXIT_USAGE
        assert "argument --entries-per-manifest: expected an integer at least 1" in capsys.readouterr().err
    assert sink.load_table().metadata_location == before
    check_rows(java_reader, sink.load_table(), EXPECTED)


# ---- expire-snapshots deletes what Iceberg Java's ExpireSnapshots deletes ------------------------


def java_expire(java_reader: JavaIcebergReader, work: Path, metadata_location: str, snapshot_ids: list[int]) -> None:
    """Iceberg Java's expire_snapshots procedure (file cleanup on) on the table state of
    ``metadata_location``, through a Hadoop catalog holding a copy of that metadata file: the files it
    deletes are the table's own (metadata names them by absolute path)."""
    hadoop = work / "hadoop"
    table_dir = hadoop / "db" / "t" / "metadata"
    table_dir.mkdir(parents=True)
    shutil.copy(local(metadata_location), table_dir / "v1.metadata.json")
    (table_dir / "version-hint.text").write_text("1")
    for key, value in (
        ("spark.sql.catalog.expiry_check", "org.apache.iceberg.spark.SparkCatalog"),
        ("spark.sql.catalog.expiry_check.type", "hadoop"),
        ("spark.sql.catalog.expiry_check.warehouse", hadoop.as_uri()),
    ):
        java_reader.sql(f"SET {key}={value}")
    ids = ", ".join(f"{i}L" for i in snapshot_ids)
    result = java_reader.sql(
        "CALL expiry_check.system.expire_snapshots(table => 'db.t', older_than => TIMESTAMP '2000-01-01 00:00:00', "
        f"retain_last => 1, snapshot_ids => array({ids}))"
    )
    assert result.num_rows == 1


def test_expiry_after_a_compaction_deletes_the_replaced_files_as_iceberg_java_does(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    lake = tmp_path / "lake"
    sink = upsert_table(spark, lake)
    data, deletes = live_files(sink.load_table(), branch_head(sink.load_table(), "main"))
    replaced = {local(f.meta.path) for f in data + deletes}
    assert len(replaced) == 3
    result = compact(spark, sink.load_table)
    assert result.rewritten_data_files == 2 and result.removed_delete_files == 1
    table = sink.load_table()
    dry = maintenance.expire_snapshots(sink.load_table, far_future(), retain_last=1, dry_run=True)
    assert len(dry.expired_snapshot_ids) == 2

    # Iceberg Java on this table state; then the lake is put back as it was.
    backup = tmp_path / "backup"
    shutil.copytree(lake, backup)
    on_disk = files_under(lake)
    java_expire(java_reader, tmp_path / "java", table.metadata_location, list(dry.expired_snapshot_ids))
    java_deleted = on_disk - files_under(lake)
    assert replaced <= {Path(p) for p in java_deleted}, "Iceberg Java deletes the replaced files"
    shutil.rmtree(lake)
    shutil.copytree(backup, lake)

    expired = maintenance.expire_snapshots(sink.load_table, far_future(), retain_last=1)
    assert sorted(expired.expired_snapshot_ids) == sorted(dry.expired_snapshot_ids)
    ours = on_disk - files_under(lake)
    assert ours == java_deleted
    assert {str(local(p)) for p in expired.deleted_files} == ours == {str(local(p)) for p in dry.deleted_files}
    assert not any(p.exists() for p in replaced)
    check_rows(java_reader, sink.load_table(), EXPECTED)


# ---- remove-orphans refuses where other tables' files lie ---------------------------------------


def age_everything(root: Path) -> None:
    old = time.time() - 10 * 86400
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))


def test_remove_orphans_refuses_a_table_located_at_the_warehouse_root_or_above_another_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    other = upsert_table(spark, lake, "db.other")
    catalog = load_catalog(
        "iceberg_sink",
        type="sql",
        uri=f"sqlite:///{lake / 'catalog.db'}",
        warehouse=(lake / "warehouse").as_uri(),
    )
    warehouse = (lake / "warehouse").as_uri()
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "v", StringType(), required=False))
    catalog.create_table("db.at_root", schema=schema, location=warehouse)
    catalog.create_table("db.parent", schema=schema, location=f"{warehouse}/shared")
    catalog.create_table("db.child", schema=schema, location=f"{warehouse}/shared/child")
    for name in ("db.at_root", "db.parent", "db.child"):
        IcebergSink.builder().embedded(lake).table(name).build().write(
            spark.createDataFrame([(1, "x")], "id long, v string")
        )
    age_everything(lake)
    everything = files_under(lake)

    for name, reason in (
        ("db.at_root", "the catalog's warehouse root"),
        ("db.parent", "the location of table db.child"),
    ):
        load = IcebergSink.builder().embedded(lake).table(name).build().load_table
        with pytest.raises(MaintenanceRefusedError, match=reason):
            maintenance.remove_orphan_files(load, dt.timedelta(hours=1))
        with pytest.raises(MaintenanceRefusedError, match=reason):
            maintenance.remove_orphan_files(load, dt.timedelta(hours=1), dry_run=True)
        assert main(["remove-orphans", name, "--embedded", str(lake), "--older-than-hours", "1"]) == EXIT_REFUSED
        assert reason in capsys.readouterr().err
    assert files_under(lake) == everything  # nothing deleted
    check_rows(java_reader, other.load_table(), EXPECTED)
    # A table with a location of its own is cleaned as before.
    stray = local(other.load_table().location()) / "data" / "stray.parquet"
    stray.write_bytes(b"x")
    age_everything(lake)
    assert main(["remove-orphans", "db.other", "--embedded", str(lake), "--older-than-hours", "1"]) == EXIT_OK
    assert not stray.exists()
    check_rows(java_reader, other.load_table(), EXPECTED)


def test_remove_orphans_refuses_when_the_listing_holds_another_tables_metadata(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    sink = upsert_table(spark, lake)
    location = sink.load_table().location()
    # A table of another catalog (not listed by this one) inside this table's folder.
    inner_catalog = load_catalog(
        "elsewhere", type="sql", uri=f"sqlite:///{tmp_path / 'elsewhere.db'}", warehouse=(tmp_path / "wh2").as_uri()
    )
    inner_catalog.create_namespace("x")
    inner = inner_catalog.create_table(
        "x.inner", schema=Schema(NestedField(1, "id", LongType(), required=False)), location=f"{location}/data/inner"
    )
    inner.append(pa.table({"id": pa.array([1], pa.int64())}))
    # This table's own leftovers in its metadata folder (a crashed commit's manifest list) do not count.
    own_dir = local(location) / "metadata"
    crashed = own_dir / "snap-1-0-crashed.avro"
    crashed.write_bytes(b"x")
    age_everything(tmp_path)
    everything = files_under(local(location))

    with pytest.raises(MaintenanceRefusedError, match=r"Iceberg metadata files that are not in this table's history"):
        maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1))
    assert main(["remove-orphans", "db.t", "--embedded", str(lake), "--older-than-hours", "1"]) == EXIT_REFUSED
    assert "not in this table's history" in capsys.readouterr().err
    assert files_under(local(location)) == everything
    assert inner_catalog.load_table("x.inner").scan().to_arrow().num_rows == 1

    # Without the foreign table, the table's own leftovers are removed.
    shutil.rmtree(local(location) / "data" / "inner")
    result = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1))
    assert crashed.as_uri() in result.orphan_files and not crashed.exists()
    check_rows(java_reader, sink.load_table(), EXPECTED)

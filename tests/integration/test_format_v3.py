"""Format v3 tables written by the sink (streaming and ``write()``, partitioned and not, with manifest
merges and driver failures), read back by Iceberg Java 1.9.2, the newest Iceberg Java, DuckDB and
PyIceberg, and their row lineage checked against Java's own reading of it and against the spec."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, _faults
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink._iceberg.manifests import data_file_first_row_id
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

SCHEMA = "id long, user_id long, ts timestamp, v string"
TABLES = {"flat": [], "partitioned": ["day(ts)", "bucket(4, user_id)"]}


def rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    base = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "user_id": pa.array([i % 7 for i in ids], pa.int64()),
            "ts": pa.array([base + dt.timedelta(hours=5 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "v": [f"v{i}" for i in ids],
        }
    )


def builder(tmp: Path, name: str) -> Any:
    return (
        IcebergSink.builder()
        .embedded(tmp / "data")
        .table(f"db.{name}")
        # Merging every 3 manifests: some commits rewrite earlier entries, whose row ids must stay.
        .create_if_missing(
            partition_by=TABLES[name], format_version=3, properties={"commit.manifest.min-count-to-merge": "3"}
        )
    )


def frame(spark: SparkSession, table: pa.Table) -> Any:
    return spark.createDataFrame(table.to_pylist(), SCHEMA)


def fail_at(point: str) -> None:
    def fail(at: str, _checkpoint: int) -> None:
        if at == point:
            raise RuntimeError(f"driver lost at {point}")

    _faults.install(fail)


@pytest.fixture(scope="module")
def written(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Table, pa.Table]]:
    """Each table: a bounded write, a stream of three micro-batches, then two more writes, each of
    which first fails (committable stored but not committed; committed but not acknowledged) and is
    run again by a new sink, as a restarted driver would."""
    result = {}
    for name in TABLES:
        tmp = tmp_path_factory.mktemp(f"v3-{name}")
        batches = [rows(0, 40), rows(40, 25), rows(65, 30), rows(95, 20), rows(115, 35), rows(150, 15)]
        ckpt = str(tmp / "ckpt-writes")
        sink = builder(tmp, name).build()
        sink.write(frame(spark, batches[0]), checkpoint_location=ckpt, checkpoint_id=0)
        (tmp / "src").mkdir()
        for i, batch in enumerate(batches[1:4]):
            pq.write_table(batch, tmp / "src" / f"part-{i}.parquet")
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp / "src"))
        query = sink.start(stream, str(tmp / "ckpt-stream"), trigger={"availableNow": True})
        query.awaitTermination(600)
        assert query.exception() is None
        for checkpoint, (batch, point) in enumerate(
            [(batches[4], _faults.AFTER_MANIFESTS), (batches[5], _faults.AFTER_COMMIT)], start=1
        ):
            fail_at(point)
            try:
                with pytest.raises(RuntimeError, match="driver lost"):
                    sink.write(frame(spark, batch), checkpoint_location=ckpt, checkpoint_id=checkpoint)
            finally:
                _faults.clear()
            sink = builder(tmp, name).build()
            sink.write(frame(spark, batch), checkpoint_location=ckpt, checkpoint_id=checkpoint)
        result[name] = (sink.load_table(), pa.concat_tables(batches))
    return result


@pytest.mark.parametrize("name", list(TABLES))
def test_every_reader_reads_the_v3_table_exactly_once(
    written: dict[str, tuple[Table, pa.Table]], java_readers: tuple[JavaIcebergReader, ...], name: str
) -> None:
    table, expected = written[name]
    assert table.metadata.format_version == 3
    snapshots = table.metadata.snapshots
    assert len(snapshots) == 6  # one per checkpoint: nothing doubled by the replays
    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(expected, ["id"])


def _our_files(table: Table) -> dict[str, tuple[int | None, int]]:
    """Each live data file -> (its first row id as the sink reads it, its data sequence number);
    files the sink did not write included."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    files = {}
    for manifest in read_manifests(table.io, snapshot, 3):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in read_entries(table.io, manifest):
            files[entry.data_file.file_path] = (data_file_first_row_id(entry.data_file), entry.sequence_number or 0)
    return files


@pytest.mark.parametrize("name", list(TABLES))
def test_java_reads_the_row_lineage_the_sink_committed(
    written: dict[str, tuple[Table, pa.Table]], java_readers: tuple[JavaIcebergReader, ...], name: str
) -> None:
    table, _ = written[name]
    ranges = [(s.first_row_id, s.added_rows) for s in table.metadata.snapshots]
    # The spec's arithmetic: each snapshot starts at the table's next-row-id and moves it by added-rows.
    assert ranges[0][0] == 0
    for (first, added), (following, _) in itertools.pairwise(ranges):
        assert first is not None and added is not None and following == first + added
    assert table.metadata.next_row_id == ranges[-1][0] + ranges[-1][1]  # type: ignore[operator]
    # At least as many ids as rows were added (merged manifests reserve room for their existing rows).
    assert table.metadata.next_row_id >= 165
    ours = _our_files(table)
    for java in java_readers:
        view = java.lineage(table.metadata_location)
        assert view["format_version"] == 3 and view["next_row_id"] == table.metadata.next_row_id, java.label
        assert [(s["first_row_id"], s["added_rows"]) for s in view["snapshots"]] == ranges, java.label
        theirs = {f["path"]: f["first_row_id"] for f in view["files"]}
        assert theirs == {path: first for path, (first, _) in ours.items()}, java.label
    # Every live row has an id, and no two rows share one.
    spans = sorted(
        (first, first + pq.read_metadata(path.removeprefix("file://")).num_rows)
        for path, (first, _) in ours.items()
        if first is not None
    )
    assert len(spans) == len(ours) and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def _row_lineage(table: Table, positions: bool = True) -> list[dict[str, Any]]:
    """The spec's ``_row_id`` (the file's first row id plus the row's position) and
    ``_last_updated_sequence_number`` (the file's data sequence number) of every row; without
    ``positions``, what Iceberg Java 1.9.2 reports instead (the file's first row id for every row)."""
    result = []
    for path, (first, sequence) in _our_files(table).items():
        assert first is not None
        ids = pq.read_table(path.removeprefix("file://"), columns=["id"])["id"].to_pylist()
        result.extend(
            {"id": i, "_row_id": first + (pos if positions else 0), "_last_updated_sequence_number": sequence}
            for pos, i in enumerate(ids)
        )
    return sorted(result, key=lambda r: r["id"])


@pytest.mark.parametrize("name", list(TABLES))
def test_java_gives_every_row_the_row_id_the_spec_says(
    written: dict[str, tuple[Table, pa.Table]], java_readers: tuple[JavaIcebergReader, ...], name: str
) -> None:
    """The newest Iceberg Java gives every row the spec's ``_row_id`` and ``_last_updated_sequence_number``.
    Iceberg Java 1.9.2 (row lineage was not final before 1.10) reads the files' first row ids right but
    leaves the row's position out of ``_row_id``: every row of a file gets the file's first row id. This
    test pins that down, so a change on either side shows."""
    table, _ = written[name]
    spec, without_positions = _row_lineage(table), _row_lineage(table, positions=False)
    assert spec != without_positions  # files of more than one row: the two readings differ
    for java in java_readers:
        got = java.row_lineage(table.metadata_location).select(["id", "_row_id", "_last_updated_sequence_number"])
        want = without_positions if java.label.startswith("Iceberg Java 1.9.") else spec
        assert sorted(got.to_pylist(), key=lambda r: r["id"]) == want, java.label


def test_appends_to_a_v3_table_iceberg_java_wrote_keep_its_row_ids_and_deletion_vectors(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """The newest Iceberg Java writes a v3 table (two inserts, two deletes as deletion vectors); the
    sink appends to it with manifest merging on every second manifest, so it rewrites Java's data and
    delete manifests. Every reader sees the right rows, Java's rows keep their ids, and the lineage
    Java reads is the sink's."""
    java = java_readers[-1]
    warehouse = tmp_path / "java-warehouse"
    jw = java.catalog(warehouse)
    for statement in [
        f"CREATE TABLE {jw}.db.t (id bigint, v string) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')",
        f"INSERT INTO {jw}.db.t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",
        f"INSERT INTO {jw}.db.t VALUES (5, 'e'), (6, 'f')",
        f"DELETE FROM {jw}.db.t WHERE id = 2",
        f"DELETE FROM {jw}.db.t WHERE id = 5",
        f"ALTER TABLE {jw}.db.t SET TBLPROPERTIES ('commit.manifest.min-count-to-merge'='2')",
    ]:
        java.sql(statement)
    metadata = max((warehouse / "db" / "t" / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:-14]))
    lineage_before = {r["id"]: r for r in java.row_lineage(metadata.as_uri()).to_pylist()}
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    catalog = load_catalog("t", **catalog_props)
    catalog.create_namespace("db")
    catalog.register_table("db.t", metadata.as_uri())
    sink = IcebergSink.builder().catalog("t", **catalog_props).table("db.t").build()
    for chunk in ([7, 8], [9], [10, 11, 12]):
        sink.write(spark.createDataFrame([(i, f"v{i}") for i in chunk], "id long, v string"))
    table = sink.load_table()
    expected = [{"id": i, "v": v} for i, v in [(1, "a"), (3, "c"), (4, "d"), (6, "f")]]
    expected += [{"id": i, "v": f"v{i}"} for i in range(7, 13)]
    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(
        pa.Table.from_pylist(expected), ["id"]
    )
    # The sink merged Java's deletion-vector manifests into one of its own.
    snapshot = table.current_snapshot()
    assert snapshot is not None
    delete_manifests = [m for m in read_manifests(table.io, snapshot, 3) if m.content == ManifestContent.DELETES]
    ours = {s.snapshot_id for s in table.metadata.snapshots[-3:]}
    assert len(delete_manifests) == 1 and delete_manifests[0].added_snapshot_id in ours
    # Row lineage: Java's rows keep their ids; Java reads the sink's lineage as the sink does.
    after = {r["id"]: r for r in java.row_lineage(table.metadata_location).to_pylist()}
    for i in (1, 3, 4, 6):
        assert after[i]["_row_id"] == lineage_before[i]["_row_id"]
        assert after[i]["_last_updated_sequence_number"] == lineage_before[i]["_last_updated_sequence_number"]
    ranges = [(s.first_row_id, s.added_rows) for s in table.metadata.snapshots]
    view = java.lineage(table.metadata_location)
    assert [(s["first_row_id"], s["added_rows"]) for s in view["snapshots"]] == ranges
    assert view["next_row_id"] == table.metadata.next_row_id == ranges[-1][0] + ranges[-1][1]  # type: ignore[operator]
    assert {f["path"]: f["first_row_id"] for f in view["files"]} == {p: f for p, (f, _) in _our_files(table).items()}
    spec = {r["id"]: r for r in _row_lineage_of(table, range(7, 13))}
    assert {i: after[i] for i in range(7, 13)} == spec


def _row_lineage_of(table: Table, ids: range) -> list[dict[str, Any]]:
    """The spec's lineage of the rows ``ids`` (all in files the sink wrote, so no deletes apply)."""
    wanted = set(ids)
    rows = []
    for path, (first, sequence) in _our_files(table).items():
        assert first is not None
        values = pq.read_table(path.removeprefix("file://"), columns=["id", "v"]).to_pylist()
        rows.extend(
            {**r, "_row_id": first + pos, "_last_updated_sequence_number": sequence}
            for pos, r in enumerate(values)
            if r["id"] in wanted
        )
    return rows


def test_a_table_with_a_variant_column_is_refused_at_build_naming_the_type(
    java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """The newest Iceberg Java creates v3 tables with a ``variant`` column, a type PyIceberg 0.12
    cannot parse: the sink cannot load such a table, and says so at build(), naming the table and the
    type, before anything is written."""
    import sqlite3

    from iceberg_sink import InvalidSinkConfigError

    java = java_readers[-1]
    warehouse = tmp_path / "java-warehouse"
    jw = java.catalog(warehouse)
    java.sql(f"CREATE TABLE {jw}.db.v (id bigint, j variant) USING iceberg TBLPROPERTIES ('format-version'='3')")
    metadata = max((warehouse / "db" / "v" / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:-14]))
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    load_catalog("t", **props).create_namespace("db")
    # PyIceberg's register_table would parse the metadata (and fail): the catalog row is written as
    # another engine sharing the catalog database would.
    with sqlite3.connect(tmp_path / "cat.db") as con:
        con.execute(
            "insert into iceberg_tables (catalog_name, table_namespace, table_name, metadata_location) "
            "values ('t', 'db', 'v', ?)",
            (metadata.as_uri(),),
        )
    with pytest.raises(
        InvalidSinkConfigError, match=r"(?s)table 'db.v': could not be loaded .*Unsupported field type: 'variant'"
    ):
        IcebergSink.builder().catalog("t", **props).table("db.v").build()


def test_a_compaction_whose_commit_merges_its_own_manifest_keeps_untouched_row_ids(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """Issue 42, item 5: a compaction rewrites the manifest holding a file it compacts and a file it
    does not; with ``commit.manifest.min-count-to-merge=3`` the same commit merges that new manifest.
    Reading it back cleared the untouched file's explicit first row id (as for a manifest of an
    upgraded v2 table), so it got new ids (2 -> 6 here). Iceberg Java keeps the ids of a manifest its
    own commit wrote; so does the sink now."""
    from iceberg_sink.topology.compaction import CompactionConfig

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.t")
        .create_if_missing(
            partition_by=["region"], format_version=3, properties={"commit.manifest.min-count-to-merge": "3"}
        )
        .build()
    )
    ddl = "id long, region string"
    sink.write(spark.createDataFrame([(1, "eu"), (2, "eu"), (3, "us")], ddl).coalesce(1))  # one manifest, 2 files
    sink.write(spark.createDataFrame([(4, "eu")], ddl))
    before = {p: first for p, (first, _) in _our_files(sink.load_table()).items()}
    [untouched] = [p for p in before if "region=us" in p]
    assert before[untouched] is not None
    result = sink.compact(
        spark,
        CompactionConfig(min_input_files=2, min_file_size_bytes=1 << 30),
        partition_filter=lambda _spec, values: values == ("eu",),
    )
    assert result.rewritten_data_files == 2, result
    table = sink.load_table()
    after = {p: first for p, (first, _) in _our_files(table).items()}
    assert after[untouched] == before[untouched], (before, after)
    for java in java_readers:
        theirs = {f["path"]: f["first_row_id"] for f in java.lineage(table.metadata_location)["files"]}
        assert theirs == after, java.label
    assert_readers_agree(
        java_readers,
        table.metadata_location,
        [{"id": i, "region": r} for i, r in enumerate(["eu", "eu", "us", "eu"], 1)],
        ["id"],
    )

"""An embedded catalog whose folder holds characters URLs escape or read (a space, a literal ``%20``
and ``%41``, ``+``, a non-ASCII letter). ``embedded(root)`` spelled the warehouse with
``Path.as_uri()`` (``My%20Lake``), which PyIceberg's file IO (as Hadoop's) reads literally: every table
went to a sibling folder named with the escapes; and the SQLite URL decoded ``%41`` and cut at ``?``,
putting the catalog in a file beside the folder. Now the catalog and every file of the table are
under the folder given, upserts, compaction, expiry and orphan removal agree on which file is which,
and Iceberg Java, DuckDB and PyIceberg read what was written. Roots holding ``?`` or ``#`` (which a
table location, a URL, cuts at) are refused before anything is created."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.topology import maintenance
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

SPECIAL = "My Lake é %20 50%41 a+b"
SCHEMA = "id long, p string, v string"


def _local(location: str) -> Path:
    assert location.startswith("file:///"), location
    return Path(location.removeprefix("file://"))


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_warehouse_path_with_url_special_characters(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, format_version: int
) -> None:
    lake = tmp_path / SPECIAL
    sink = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.t")
        .create_if_missing(partition_by=["p"], format_version=format_version)
        .upsert(key=["id", "p"])
        .build()
    )
    model: dict[tuple[int, str], str] = {}

    def write(rows: list[tuple[int, str, str]]) -> None:
        sink.write(spark.createDataFrame(rows, SCHEMA))
        model.update({(i, p): v for i, p, v in rows})

    write([(1, "a b", "x"), (2, "50%", "y"), (3, "q?r#s", "z")])
    write([(1, "a b", "x2"), (4, "50%", "w")])
    sink.compact(spark)
    write([(2, "50%", "y2"), (3, "q?r#s", "z2")])
    table = sink.load_table()
    root = _local(table.location())
    assert root == lake / "warehouse" / "db" / "t" and root.is_dir(), table.location()
    assert [p.name for p in tmp_path.iterdir()] == [SPECIAL]  # nothing beside the folder given
    assert (lake / "catalog.db").is_file()
    # An orphan in the table's data folder, and every file old enough for the orphan removal.
    orphan = root / "data" / "00000-crashed-task.parquet"
    orphan.write_bytes(b"x")
    long_ago = time.time() - 3 * 86400
    for path in root.rglob("*"):
        os.utime(path, (long_ago, long_ago))
    files = {p for p in root.rglob("*") if p.is_file()}

    removed = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1))
    assert [Path(p).name for p in removed.orphan_files] == [orphan.name]
    assert {p for p in root.rglob("*") if p.is_file()} == files - {orphan}
    expired = maintenance.expire_snapshots(sink.load_table, dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert expired.expired_snapshot_ids, expired
    # The compaction's replaced files went with the expired snapshots: really gone, not mis-spelled.
    assert expired.deleted_files, expired
    gone = {_local(p) for p in expired.deleted_files}
    assert gone <= files and not [p for p in gone if p.exists()]
    write([(5, "a b", "v")])
    write([(1, "a b", "x3"), (5, "a b", "v2")])  # equality deletes (v2) in the partition folder p=a+b

    table = sink.load_table()
    live = [{"id": i, "p": p, "v": v} for (i, p), v in model.items()]
    assert_readers_agree(java_readers, table.metadata_location, live, ["id"])
    if format_version == 2:  # equality deletes become position deletes (v3: deletion vectors, already)
        sink.convert_equality_deletes()
        table = sink.load_table()
        assert_readers_agree(java_readers, table.metadata_location, live, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(pa.Table.from_pylist(live), ["id"])


@pytest.mark.parametrize("bad", ["?", "#", "\n"])
def test_an_embedded_root_holding_a_character_a_location_cuts_at_is_refused(tmp_path: Path, bad: str) -> None:
    lake = tmp_path / f"lake{bad}1"
    with pytest.raises(InvalidSinkConfigError, match=r"embedded\(root\): expected a folder whose path holds no"):
        IcebergSink.builder().embedded(lake).table("db.t").create_if_missing().build()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("spelling", "folder"),
    [
        ("file://{base}/ck%20b%41", "ck%20b%41"),  # Spark (Hadoop) reads the path literally
        ("file://{base}/ck a%20b", "ck a%20b"),  # PyArrow refused the raw space; Spark takes it
        ("file:{base}/ck-hadoop-style", "ck-hadoop-style"),  # how Spark prints a local location
        ("{base}/ck é %41 #1 ?q", "ck é %41 #1 ?q"),
    ],
    ids=["escaped-uri", "uri-with-space", "file-colon-path", "raw-path"],
)
def test_the_sinks_checkpoint_state_is_where_spark_keeps_its_own(
    spark: SparkSession, tmp_path: Path, spelling: str, folder: str
) -> None:
    """The sink read ``file:///ck/a%20b`` as ``a b`` (PyArrow decodes) and ``file:/ck`` as the relative
    ``./file:/ck``, while Spark keeps its offsets in ``a%20b`` and ``/ck``: the sink's committables
    lived apart from Spark's state and the sink could not read Spark's offset log (the Kafka offsets
    of snapshot summaries come from it)."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1}\n{"id": 2}\n', encoding="utf-8")
    base = tmp_path / "checkpoints"
    base.mkdir()
    location = spelling.format(base=base)
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.s").create_if_missing().build()
    query = sink.start(spark.readStream.schema("id long").json(str(source)), location, {"availableNow": True})
    query.awaitTermination(300)
    assert query.exception() is None
    assert sorted(sink.load_table().scan().to_arrow()["id"].to_pylist()) == [1, 2]
    assert [p.name for p in base.iterdir()] == [folder]
    assert {"offsets", "commits", "iceberg_sink"} <= {p.name for p in (base / folder).iterdir()}
    assert CheckpointStore(location, create=False).spark_offset_log(0) is not None
    assert not Path("file:").exists()


@pytest.mark.parametrize("location", ["ck:1", "file:ck"])
def test_a_location_spark_cannot_use_is_refused_before_anything_is_written(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    """Spark fails a query whose checkpoint location has a colon before its first slash ("Relative path
    in absolute URI": Hadoop takes ``ck`` or ``file`` as a scheme). The sink kept its state in
    ``./ck:1`` anyway, so a bounded write used a location its stream could never use, and a stream
    left a folder behind before Spark failed it. Both are refused now, before anything is created."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().build()
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(InvalidSinkConfigError, match=r"expected a path or a URI with an absolute path.*refuses"):
        sink.write(df, checkpoint_location=location)
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1}\n', encoding="utf-8")
    with pytest.raises(InvalidSinkConfigError, match=r"expected a path or a URI with an absolute path"):
        sink.start(spark.readStream.schema("id long").json(str(source)), location, {"availableNow": True})
    assert list(work.iterdir()) == []
    with pytest.raises(InvalidSinkConfigError, match="does not exist yet"):  # not even created
        sink.load_table()
    sink.write(df, checkpoint_location=f"./{location}")  # the folder of that name, as the message says
    assert [p.name for p in work.iterdir()] == [location]
    assert sink.load_table().scan().to_arrow()["id"].to_pylist() == [1]

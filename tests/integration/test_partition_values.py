"""Identity partition values that are awkward in a path are valid input: read back exactly.

Values with ``/``, ``..``, ``%``, ``#``, ``?``, spaces, newlines and non-ASCII text, and values far
longer than a file name may be (a 300-character value once failed every task with ``OSError: File
name too long``): each is written, read back exactly by Apache Iceberg Java and DuckDB (filtered by
the value too), and every file stays inside the table's data folder with each path segment well
under 255 bytes. The exact value lives in the manifest; only the folder name is shortened.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.avro_read import fetch_entries
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

LONG = "x" * 300
VALUES = [
    "a/b",
    "..",
    "../../escape",
    "/",
    "100%",
    "%2F",
    "#hash",
    "what?",
    "with space",
    " ",
    "",
    "line\nbreak",
    "tab\there",
    "ünïcødé",
    "日本語",
    "emoji \U0001f600",
    "=",
    "a=b",
    "+plus",
    LONG,
    LONG[:-1] + "y",  # same long prefix as LONG: the shortened folder names must differ
    "é" * 200,  # 400 UTF-8 bytes, 1,200 once URL-escaped
    "/" * 120,
    None,
]


def _rows() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(len(VALUES)), pa.int64()),
            "p": pa.array(VALUES, pa.string()),
            "v": pa.array([f"row-{i}" for i in range(len(VALUES))], pa.string()),
        }
    )


def _local(uri: str) -> Path:
    # Iceberg paths are not URL-decoded (Java's and PyArrow's FileIO take the escaped folder name
    # "p=..%2F..%2Fescape" literally), so neither is this.
    parsed = urlparse(uri)
    return Path(parsed.path) if parsed.scheme == "file" else Path(uri)


@pytest.fixture(scope="module")
def written(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> IcebergSink:
    tmp = tmp_path_factory.mktemp("partition-values")
    sink = IcebergSink.builder().embedded(tmp / "lake").table("db.pv").create_if_missing(partition_by=["p"]).build()
    rows = _rows()
    sink.write(spark.createDataFrame(rows.to_pandas(), "id long, p string, v string"))
    # The streaming path too: the same values again, under new ids.
    src = tmp / "src"
    src.mkdir()
    again = rows.set_column(0, "id", pa.array(range(100, 100 + len(VALUES)), pa.int64()))
    pa.parquet.write_table(again, src / "part-0.parquet")  # type: ignore[attr-defined]
    schema = spark.read.parquet(str(src)).schema
    query = sink.start(spark.readStream.schema(schema).parquet(str(src)), str(tmp / "ckpt"), {"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    return sink


def _expected() -> list[dict[str, object]]:
    rows = _rows().to_pylist()
    return sorted(
        [r for r in rows] + [{**r, "id": r["id"] + 100} for r in rows],  # type: ignore[operator]
        key=lambda r: r["id"],  # type: ignore[arg-type,return-value]
    )


def test_every_reader_returns_each_value_exactly(written: IcebergSink, java_reader: JavaIcebergReader) -> None:
    location = written.load_table().metadata_location
    expected = _expected()
    assert normalize(java_reader.read(location), ["id"]) == expected
    assert normalize(duckdb_read(location), ["id"]) == expected


@pytest.mark.parametrize("value", [LONG, "a/b", "..", "line\nbreak", "日本語", "100%"])
def test_filtered_reads_find_the_value(written: IcebergSink, java_reader: JavaIcebergReader, value: str) -> None:
    location = written.load_table().metadata_location
    literal = value.replace("'", "''")
    expected = [r for r in _expected() if r["p"] == value]
    assert len(expected) == 2
    assert normalize(java_reader.read(location, where=f"p = '{literal}'"), ["id"]) == expected
    assert normalize(duckdb_read(location, where=f"p = '{literal}'"), ["id"]) == expected


def test_manifests_keep_the_exact_values(written: IcebergSink) -> None:
    table = written.load_table()
    files = table.inspect.files().to_pylist()
    assert sorted((f["partition"]["p"] for f in files), key=lambda v: (v is None, v or "")) == sorted(
        VALUES * 2, key=lambda v: (v is None, v or "")
    )


def test_files_stay_inside_the_data_folder_with_short_segments(written: IcebergSink) -> None:
    table = written.load_table()
    data = _local(table.location()) / "data"
    paths = [f["file_path"] for f in table.inspect.files().to_pylist()]
    folders = set()
    for uri in paths:
        local = _local(uri)
        assert local.is_file(), uri
        resolved = Path(os.path.realpath(local))
        assert resolved.is_relative_to(os.path.realpath(data)), f"{uri} is outside {data}"
        relative = resolved.relative_to(os.path.realpath(data))
        assert len(relative.parts) == 2, f"{uri}: expected <partition folder>/<file>"
        folders.add(relative.parts[0])
        for segment in relative.parts:
            assert len(segment.encode()) <= 200, f"segment of {len(segment.encode())} bytes in {uri}"
    # One folder per distinct value (None included): shortened names do not collide.
    assert len(folders) == len(VALUES)
    # Every file under the data folder is one the table references.
    on_disk = {str(p.resolve()) for p in data.rglob("*.parquet")}
    assert on_disk == {str(_local(u).resolve()) for u in paths}


# 0.1 and 1e300 have no single-precision form: PyIceberg 0.12's Cython decoder read them back as
# 0.10000000149011612 and inf, and the committed manifests said so (_iceberg/avro_read.py).
FLOATS = [float("nan"), -0.0, 0.0, float("inf"), float("-inf"), None, 1.5, -1.5, 0.0, -0.0, 0.1, 1e300]


def test_float_partition_sources_with_nan_and_signed_zeros(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    # Valid input. Iceberg Java keeps -0.0 and 0.0 in separate partitions (its PartitionKey compares
    # with Double.equals); a file of the 0.0 partition holding a -0.0 row would carry a partition
    # value its rows do not have. The writers' own split is checked in tests/unit/test_task_writer.py.
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.f").create_if_missing(partition_by=["f"]).build()
    rows = [(i, v) for i, v in enumerate(FLOATS)]
    sink.write(spark.createDataFrame(rows, "id long, f double"))
    location = sink.load_table().metadata_location
    expected = normalize(pa.table({"id": [r[0] for r in rows], "f": pa.array(FLOATS, pa.float64())}), ["id"])
    for got in (java_reader.read(location), duckdb_read(location)):
        assert normalize(got, ["id"]) == expected
        signs = {r["id"]: str(r["f"]) for r in got.to_pylist()}
        assert (signs[1], signs[2], signs[8], signs[9]) == ("-0.0", "0.0", "0.0", "-0.0")
    assert sorted(r["id"] for r in java_reader.read(location, where="isnan(f)").to_pylist()) == [0]
    for value, index in (("0.1", 10), ("1e300", 11)):  # pruned by the manifests' partition values
        assert [r["id"] for r in java_reader.read(location, where=f"f = {value}").to_pylist()] == [index]
        assert [r["id"] for r in duckdb_read(location, where=f"f = {value}").to_pylist()] == [index]
    # Each file's partition value (in the manifest) is the value of every row in it, sign included.
    # Read with the sink's reader: PyIceberg's own (inspect.files) rounds doubles.
    table = sink.load_table()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    for manifest in snapshot.manifests(table.io):
        for entry in fetch_entries(table.io, manifest):
            values = pa.parquet.read_table(_local(entry.data_file.file_path))["f"].to_pylist()  # type: ignore[attr-defined]
            partition = entry.data_file.partition[0]
            assert {repr(v) for v in values} == {repr(partition)}, (partition, values)

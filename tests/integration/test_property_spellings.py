"""Table properties as Iceberg Java reads them: its codec and distribution names in any case.

Iceberg Java looks ``write.parquet.compression-codec`` and ``write.distribution-mode`` up as enums,
upper-cased (``ZSTD``, ``LZ4_RAW``, ``Hash`` all work there), so a table it or a user's ``TBLPROPERTIES``
created may hold such spellings. The sink refused such a table at ``build()`` ("expected one of
'zstd', ..."): a stream could not start on a table every Java writer writes to. Now the sink reads
them as Java does, writes its files with that codec, and Iceberg Java and DuckDB read them back."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidSinkConfigError
from tests.interop.readers import JavaIcebergReader, assert_readers_agree


@pytest.mark.parametrize(
    ("codec", "written"),
    [("ZSTD", "ZSTD"), ("LZ4_RAW", "LZ4"), ("Gzip", "GZIP"), ("UNCOMPRESSED", "UNCOMPRESSED")],
)
def test_codec_and_distribution_names_in_any_case_as_java_reads_them(
    spark: SparkSession, tmp_path: Path, java_readers: list[JavaIcebergReader], codec: str, written: str
) -> None:
    builder = IcebergSink.builder().embedded(tmp_path / "lake")
    catalog = builder.table("db.t").create_if_missing().build().config.catalog.load()
    catalog.create_namespace("db")
    catalog.create_table(
        "db.t",
        Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType())),
        properties={"write.parquet.compression-codec": codec, "write.distribution-mode": "Hash"},
    )
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").upsert(key=["id"]).build()
    sink.write(spark.createDataFrame([(i, f"v{i}") for i in range(50)], "id long, v string"))
    sink.write(spark.createDataFrame([(i, f"w{i}") for i in range(0, 50, 5)], "id long, v string"))
    table = sink.load_table()
    files = sorted(Path(table.location().removeprefix("file://")).rglob("*.parquet"))
    assert len(files) >= 3  # two data files and an equality delete file
    for path in files:
        meta = pq.ParquetFile(path).metadata
        assert {meta.row_group(0).column(c).compression for c in range(meta.num_columns)} == {written}, path
    live = [{"id": i, "v": f"w{i}" if i % 5 == 0 else f"v{i}"} for i in range(50)]
    assert_readers_agree(java_readers, table.metadata_location, live, ["id"])


def test_a_codec_the_sink_cannot_write_is_refused_by_name(tmp_path: Path) -> None:
    """LZO is valid for Iceberg Java (parquet-mr with Hadoop's LZO codec); PyArrow cannot write it."""
    builder = IcebergSink.builder().embedded(tmp_path / "lake")
    catalog = builder.table("db.t").create_if_missing().build().config.catalog.load()
    catalog.create_namespace("db")
    catalog.create_table(
        "db.t", Schema(NestedField(1, "id", LongType())), properties={"write.parquet.compression-codec": "LZO"}
    )
    with pytest.raises(InvalidSinkConfigError, match=r"expected one of 'zstd', .*'lz4_raw'.*; received 'LZO'"):
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build()

"""The interop readers read back exactly what PyIceberg appended (and can tell when they do not)."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from tests.interop.java_env import NEWEST_ICEBERG_VERSION, REFERENCE_ICEBERG_VERSION, JavaEnv
from tests.interop.readers import (
    NAN,
    JavaIcebergReader,
    JavaReaderDied,
    JavaReaderError,
    assert_readers_agree,
    canonical_schema,
    duckdb_read,
    duckdb_read_many,
    normalize,
    pyiceberg_read,
)

pytest_plugins = ["tests.interop.fixtures"]
pytestmark = pytest.mark.interop

UTC = dt.UTC
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "i", IntegerType(), required=False),
    NestedField(3, "s", StringType(), required=False),
    NestedField(4, "d", DoubleType(), required=False),
    NestedField(5, "b", BooleanType(), required=False),
    NestedField(6, "dt", DateType(), required=False),
    NestedField(7, "ts", TimestamptzType(), required=False),
    NestedField(8, "tsn", TimestampType(), required=False),
    NestedField(9, "dec", DecimalType(10, 2), required=False),
    NestedField(10, "bin", BinaryType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=7, field_id=1000, transform=DayTransform(), name="ts_day"),
    PartitionField(source_id=1, field_id=1001, transform=BucketTransform(4), name="id_bucket"),
)
ARROW_SCHEMA: pa.Schema = SCHEMA.as_arrow()
BATCHES = 3
ROWS_PER_BATCH = 10

# Edge values cycled through the rows; each list's length is coprime-ish with the others so that
# combinations vary. None is a null, math.nan a NaN.
INTS = [0, -(2**31), 2**31 - 1, None, 42, -7, 1]
STRINGS = ["a", "", "ñ€😀 'quoted'", None, "z" * 50, "b"]
DOUBLES = [math.nan, None, -0.0, 1.5, math.inf, -math.inf, 1e300, -2.25, 5e-324]
BOOLS = [True, False, None]
DATES = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(2024, 2, 29), None, dt.date(9999, 12, 31)]
TSS = [
    dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC),
    dt.datetime(2024, 1, 1, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(2024, 1, 2, 12, 30, 15, 123456, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # pre-epoch: day transform is -1
    None,
    dt.datetime(2024, 1, 3, 6, 0, tzinfo=UTC),
    dt.datetime(2000, 6, 15, 8, 0, 1, tzinfo=UTC),
]
TSNS = [
    dt.datetime(2024, 1, 1, 12, 0),
    None,
    dt.datetime(1900, 1, 1, 0, 0, 0, 1),
    dt.datetime(2030, 12, 31, 23, 59),
]
DECIMALS = [
    Decimal("1.50"),
    Decimal("-12345678.90"),
    Decimal("99999999.99"),
    None,
    Decimal("0.00"),
    Decimal("0.01"),
]
BINARIES = [b"\x00\x01", b"", None, bytes(range(256)), b"\xff"]


def _row(k: int) -> dict[str, Any]:
    def pick(values: list[Any]) -> Any:
        return values[k % len(values)]

    return {
        "id": k if k != BATCHES * ROWS_PER_BATCH - 1 else 2**62,
        "i": pick(INTS),
        "s": pick(STRINGS),
        "d": pick(DOUBLES),
        "b": pick(BOOLS),
        "dt": pick(DATES),
        "ts": pick(TSS),
        "tsn": pick(TSNS),
        "dec": pick(DECIMALS),
        "bin": pick(BINARIES),
    }


@dataclass(frozen=True)
class AppendedTable:
    """A PyIceberg-written table and, per append, the metadata file and all rows up to it."""

    metadata: list[str]  # metadata location after append 1, 2, 3
    rows: list[list[dict[str, Any]]]  # rows visible after append 1, 2, 3

    @property
    def current(self) -> str:
        return self.metadata[-1]

    @property
    def all_rows(self) -> list[dict[str, Any]]:
        return self.rows[-1]


def _expected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return normalize(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), ["id"])


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> AppendedTable:
    warehouse = tmp_path_factory.mktemp("warehouse")
    catalog = SqlCatalog("interop", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=warehouse.as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", SCHEMA, partition_spec=SPEC)
    metadata: list[str] = []
    rows: list[list[dict[str, Any]]] = []
    seen: list[dict[str, Any]] = []
    for batch in range(BATCHES):
        new = [_row(batch * ROWS_PER_BATCH + j) for j in range(ROWS_PER_BATCH)]
        table.append(pa.Table.from_pylist(new, schema=ARROW_SCHEMA))
        seen = seen + new
        metadata.append(table.metadata_location)
        rows.append(list(seen))
    return AppendedTable(metadata=metadata, rows=rows)


# -- full reads -------------------------------------------------------------------------------------


def test_java_reads_what_was_appended(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    got = java_reader.read(appended.current)
    assert got.num_rows == BATCHES * ROWS_PER_BATCH
    assert normalize(got, ["id"]) == _expected(appended.all_rows)


def test_every_java_reader_and_duckdb_read_what_was_appended(
    java_readers: tuple[JavaIcebergReader, ...], appended: AppendedTable
) -> None:
    """Iceberg Java 1.9.2 on Spark 3.5, the newest Iceberg Java on this venv's Spark 4, and DuckDB."""
    assert [r.runtime.iceberg_version for r in java_readers] == [REFERENCE_ICEBERG_VERSION, NEWEST_ICEBERG_VERSION]
    assert java_readers[0].spark_version.startswith("3.5.")
    assert java_readers[1].spark_version.startswith("4.1.")
    expected = pa.Table.from_pylist(appended.all_rows, schema=ARROW_SCHEMA)
    for metadata, rows in zip(appended.metadata, appended.rows, strict=True):
        assert_readers_agree(java_readers, metadata, pa.Table.from_pylist(rows, schema=ARROW_SCHEMA), ["id"])
    for reader in java_readers:
        assert canonical_schema(reader.read(appended.current)) == canonical_schema(ARROW_SCHEMA), reader.label
    with pytest.raises(AssertionError, match=r"Iceberg Java 1\.9\.2 .*read 30 rows of .*the model has 29"):
        assert_readers_agree(java_readers, appended.current, expected.slice(1), ["id"])


def test_duckdb_reads_what_was_appended(appended: AppendedTable) -> None:
    assert normalize(duckdb_read(appended.current), ["id"]) == _expected(appended.all_rows)


def test_pyiceberg_reads_what_was_appended(appended: AppendedTable) -> None:
    assert normalize(pyiceberg_read(appended.current), ["id"]) == _expected(appended.all_rows)


def test_readers_agree_on_column_types(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    expected = canonical_schema(ARROW_SCHEMA)
    assert expected["ts"] == "timestamp[us, tz=UTC]" and expected["tsn"] == "timestamp[us]"
    assert canonical_schema(java_reader.read(appended.current)) == expected
    assert canonical_schema(duckdb_read(appended.current)) == expected
    assert canonical_schema(pyiceberg_read(appended.current)) == expected


def test_older_metadata_file_is_an_older_table_version(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    first, plain_uri = appended.metadata[0], appended.metadata[1]
    assert first.startswith("file://")
    expected_first = _expected(appended.rows[0])
    assert normalize(java_reader.read(first), ["id"]) == expected_first
    assert normalize(duckdb_read(first), ["id"]) == expected_first
    assert normalize(pyiceberg_read(first), ["id"]) == expected_first
    # A plain path works as well as a file:// URI.
    plain = plain_uri.removeprefix("file://")
    assert normalize(java_reader.read(plain), ["id"]) == _expected(appended.rows[1])
    assert normalize(duckdb_read(plain), ["id"]) == _expected(appended.rows[1])


# -- filtered reads ---------------------------------------------------------------------------------

DAY2 = dt.datetime(2024, 1, 2, tzinfo=UTC)
FILTERS: list[tuple[str, str, Callable[[dict[str, Any]], bool]]] = [
    # partition source columns (day(ts), bucket(id)): exercises Iceberg Java's partition pruning
    (
        "ts_from_day2",
        "ts >= TIMESTAMP'2024-01-02 00:00:00'",
        lambda r: r["ts"] is not None and r["ts"] >= DAY2,
    ),
    (
        "ts_pre_epoch",
        "ts < TIMESTAMP'1970-01-01 00:00:00'",
        lambda r: r["ts"] is not None and r["ts"] < dt.datetime(1970, 1, 1, tzinfo=UTC),
    ),
    ("ts_null", "ts IS NULL", lambda r: r["ts"] is None),
    ("id_in", "id IN (3, 7, 11, 4611686018427387904)", lambda r: r["id"] in {3, 7, 11, 2**62}),
    # non-partition columns
    ("s_prefix", "s LIKE 'z%'", lambda r: r["s"] is not None and r["s"].startswith("z")),
    ("dec_range", "dec > 0 AND dec < 100", lambda r: r["dec"] is not None and 0 < r["dec"] < 100),
    (
        "tsn_before",
        "tsn < TIMESTAMP_NTZ'2024-01-01 12:00:00'",
        lambda r: r["tsn"] is not None and r["tsn"] < dt.datetime(2024, 1, 1, 12),
    ),
    # Spark SQL orders NaN above every other double, so `d > 1` keeps NaN rows (Python would not).
    ("d_gt_1_spark_nan", "d > 1", lambda r: r["d"] is not None and (r["d"] is NAN or r["d"] > 1)),
]


@pytest.mark.parametrize(("where", "keep"), [(w, k) for _, w, k in FILTERS], ids=[n for n, _, _ in FILTERS])
def test_java_filtered_read_equals_python_filter(
    java_reader: JavaIcebergReader,
    appended: AppendedTable,
    where: str,
    keep: Callable[[dict[str, Any]], bool],
) -> None:
    expected = [row for row in _expected(appended.all_rows) if keep(row)]
    assert expected, "a filter that keeps nothing proves nothing"
    assert len(expected) < len(appended.all_rows), "a filter that keeps everything proves nothing"
    assert normalize(java_reader.read(appended.current, where=where), ["id"]) == expected


def test_duckdb_filtered_read(appended: AppendedTable) -> None:
    got = duckdb_read(appended.current, where="ts >= TIMESTAMPTZ '2024-01-02 00:00:00+00' AND id < 20")
    expected = [r for r in _expected(appended.all_rows) if r["ts"] is not None and r["ts"] >= DAY2 and r["id"] < 20]
    assert expected
    assert normalize(got, ["id"]) == expected


# -- metadata tables --------------------------------------------------------------------------------


def test_snapshots_one_per_append(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    snaps = normalize(java_reader.snapshots(appended.current), ["committed_at", "snapshot_id"])
    assert len(snaps) == BATCHES
    assert [s["operation"] for s in snaps] == ["append"] * BATCHES
    assert snaps[0]["parent_id"] is None
    assert [s["parent_id"] for s in snaps[1:]] == [s["snapshot_id"] for s in snaps[:-1]]
    totals = [int(json.loads(s["summary"])["total-records"]) for s in snaps]
    assert totals == [ROWS_PER_BATCH * (n + 1) for n in range(BATCHES)]
    assert java_reader.snapshots(appended.metadata[0]).num_rows == 1


def test_files_cover_all_rows(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    files = java_reader.files(appended.current)
    records = files.column("record_count").to_pylist()
    assert sum(records) == BATCHES * ROWS_PER_BATCH
    assert set(files.column("content").to_pylist()) == {0}  # data files only
    partitions = [json.loads(p) for p in files.column("partition").to_pylist()]
    assert all(set(p) <= {"ts_day", "id_bucket"} and "id_bucket" in p for p in partitions)
    assert {p.get("ts_day") for p in partitions} >= {"1969-12-31", "2024-01-01", "2024-01-02"}


def test_java_sql_with_views(java_reader: JavaIcebergReader, appended: AppendedTable) -> None:
    got = java_reader.sql(
        "select count(*) as n, count(d) as nd, sum(cast(isnan(d) as int)) as nans from t",
        views={"t": appended.current},
    ).to_pylist()
    doubles = [r["d"] for r in appended.all_rows]
    assert got == [
        {
            "n": len(doubles),
            "nd": sum(d is not None for d in doubles),
            "nans": sum(d is not None and math.isnan(d) for d in doubles),
        }
    ]


def test_read_many_equals_one_read_per_table(
    java_reader: JavaIcebergReader, appended: AppendedTable, tmp_path: Path
) -> None:
    """Three versions of one table and a table of another schema with no rows, in a mixed order."""
    catalog = SqlCatalog("many", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("db")
    empty = catalog.create_table("db.empty", Schema(NestedField(1, "k", StringType(), required=False)))
    locations = [appended.metadata[2], empty.metadata_location, appended.metadata[0], appended.metadata[1]]
    java = java_reader.read_many(locations)
    duck = duckdb_read_many(locations)
    assert (
        [t.num_rows for t in java]
        == [t.num_rows for t in duck]
        == [3 * ROWS_PER_BATCH, 0, ROWS_PER_BATCH, 2 * ROWS_PER_BATCH]
    )
    assert java[1].column_names == duck[1].column_names == ["k"]
    for location, got in zip(locations, java, strict=True):
        assert canonical_schema(got) == canonical_schema(java_reader.read(location))
        assert normalize(got, ["id"] if got.num_rows else []) == normalize(
            java_reader.read(location), ["id"] if got.num_rows else []
        )
    for location, got in zip(locations, duck, strict=True):
        assert normalize(got, ["id"] if got.num_rows else []) == normalize(
            duckdb_read(location), ["id"] if got.num_rows else []
        )


TAMPER_READERS = ("java-1.9.2", "java-newest", "duckdb")


@pytest.fixture
def two_file_table(tmp_path: Path) -> tuple[str, list[Path], pa.Table]:
    """A table of two appends, one data file each, both files of the same size (so one can stand in
    for the other byte for byte); returns the metadata location, the data files and all rows."""
    catalog = SqlCatalog("tamper", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
    table = catalog.create_table("db.t", schema)
    first = pa.table({"id": [1], "s": ["aaaa"]}, schema=schema)
    second = pa.table({"id": [2], "s": ["bbbb"]}, schema=schema)
    table.append(first)
    table.append(second)
    files = [Path(p.removeprefix("file://")) for p in sorted(table.inspect.files()["file_path"].to_pylist())]
    assert len(files) == 2 and files[0].stat().st_size == files[1].stat().st_size
    return table.metadata_location, files, pa.concat_tables([first, second])


@pytest.mark.parametrize("reader", TAMPER_READERS)
def test_each_reader_fails_on_a_tampered_table(
    java_readers: tuple[JavaIcebergReader, ...], two_file_table: tuple[str, list[Path], pa.Table], reader: str
) -> None:
    """Each reader's check can fail: a data file replaced by another one's bytes (same size, valid
    Parquet) is a difference from the model; a deleted data file is an error naming it."""
    metadata, files, rows = two_file_table
    java = {"java-1.9.2": (java_readers[0],), "java-newest": (java_readers[1],), "duckdb": ()}[reader]
    check_duckdb = reader == "duckdb"
    assert_readers_agree(java, metadata, rows, ["id"], duckdb=check_duckdb)

    files[1].write_bytes(files[0].read_bytes())  # the second append now holds the first one's row
    with pytest.raises(AssertionError, match="read 2 rows"):
        assert_readers_agree(java, metadata, rows, ["id"], duckdb=check_duckdb)
    kept = pq.read_table(files[0]).column("id").to_pylist()
    assert_readers_agree(
        java, metadata, [{"id": kept[0], "s": "aaaa" if kept == [1] else "bbbb"}] * 2, ["id"], duckdb=check_duckdb
    )

    files[0].unlink()
    error: type[BaseException] = JavaReaderError if java else Exception
    with pytest.raises(error) as failure:
        assert_readers_agree(java, metadata, rows, ["id"], duckdb=check_duckdb)
    assert not isinstance(failure.value, AssertionError), "a missing file must fail the read, not lose rows"
    assert files[0].name in str(failure.value)


def test_java_errors_are_reported_and_the_server_survives(java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    with pytest.raises(JavaReaderError, match=r"NotFoundException|FileNotFoundException"):
        java_reader.read(tmp_path / "missing" / "00001-x.metadata.json")
    with pytest.raises(JavaReaderError, match="UNRESOLVED_COLUMN"):
        java_reader.sql("select no_such_column from range(1)")
    assert java_reader.ping().startswith("3.5.")


def test_java_server_that_dies_is_reported_with_its_stderr(java_env: JavaEnv) -> None:
    with pytest.raises(JavaReaderDied, match=r"(?s)exit code 1.*stderr tail.*Java gateway"):
        JavaIcebergReader(java_env, driver_memory="not-a-size")


# -- normalize --------------------------------------------------------------------------------------


def test_normalize_semantics() -> None:
    a = pa.table(
        {
            "k": pa.array([2, 1, None], pa.int64()),
            "x": pa.array([math.nan, 0.5, None], pa.float64()),
            "t": pa.array([dt.datetime(2024, 1, 1, 1, tzinfo=UTC)] * 3, pa.timestamp("us", tz="+01:00")),
        }
    )
    # Same rows, other column order, other row order, other zone label and unit.
    b = pa.table(
        {
            "t": pa.array([dt.datetime(2024, 1, 1, 1, tzinfo=UTC)] * 3, pa.timestamp("ns", tz="Etc/UTC")),
            "x": pa.array([None, 0.5, math.nan], pa.float64()),
            "k": pa.array([None, 1, 2], pa.int64()),
        }
    )
    assert normalize(a, ["k"]) == normalize(b, ["k"])
    rows = normalize(a, ["k"])
    assert [r["k"] for r in rows] == [1, 2, None]
    assert rows[1]["x"] is NAN and rows[0]["t"].tzinfo is UTC
    # A naive timestamp is not the same value as an aware one.
    naive = pa.table({"t": pa.array([dt.datetime(2024, 1, 1, 1)], pa.timestamp("us"))})
    aware = pa.table({"t": pa.array([dt.datetime(2024, 1, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))})
    assert normalize(naive, []) != normalize(aware, [])
    # NaN differs from null and from a number.
    assert normalize(pa.table({"x": [math.nan]}), []) != normalize(pa.table({"x": pa.array([None], pa.float64())}), [])
    assert normalize(pa.table({"x": [math.nan]}), []) != normalize(pa.table({"x": [1.0]}), [])

"""Builder validation: every problem reported at once, naming option, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from iceberg_sink import IcebergSink, IcebergSinkError, InvalidSinkConfigError, options


def test_invalid_error_is_a_value_error_and_root_error() -> None:
    assert issubclass(InvalidSinkConfigError, ValueError)
    assert issubclass(InvalidSinkConfigError, IcebergSinkError)


def test_build_reports_every_problem_at_once(tmp_path: Path) -> None:
    builder = (
        IcebergSink.builder()
        .embedded(tmp_path)
        .table("no_namespace")
        .distribution_mode("random")
        .write_option("write.target-file-size-bytes", "lots")
        .write_option("no.such.option", 1)
        .create_if_missing(partition_by=["bucket(user_id)", "day(ts)"])
    )
    with pytest.raises(InvalidSinkConfigError) as info:
        builder.build()
    message = str(info.value)
    assert "table: table name 'no_namespace' holds no namespace" in message
    assert "distribution_mode: expected one of none, hash, range, received 'random'" in message
    assert "'write.target-file-size-bytes' from the builder: expected int, received 'lots'" in message
    assert "unknown write option 'no.such.option'" in message
    assert "bucket needs a positive width" in message


def test_missing_table_without_create_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"db.t does not exist.*create_if_missing"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").build()


def test_table_is_required(tmp_path: Path) -> None:
    with pytest.raises(InvalidSinkConfigError, match="table: required"):
        IcebergSink.builder().embedded(tmp_path).build()


def test_unloadable_catalog_is_reported_without_secrets(tmp_path: Path) -> None:
    builder = IcebergSink.builder().catalog("bad", type="nonsense", **{"s3.secret-access-key": "hunter2"}).table("db.t")
    with pytest.raises(InvalidSinkConfigError) as info:
        builder.build()
    assert "hunter2" not in str(info.value)
    assert "***" in str(info.value)


def test_valid_build_records_options(tmp_path: Path) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path)
        .table("db.events")
        .create_if_missing(partition_by=["day(ts)", "bucket(16, user_id)"])
        .distribution_mode("hash")
        .branch("audit")
        .write_option("write.target-file-size-bytes", 128 * 1024 * 1024)
        .write_option("write.metadata.metrics.column.name", "truncate(4)")
        .build()
    )
    assert sink.config.branch == "audit"
    assert sink.config.distribution_mode == "hash"
    assert sink.config.options["write.target-file-size-bytes"] == 128 * 1024 * 1024
    assert sink.config.options["write.metadata.metrics.column.name"] == "truncate(4)"
    assert "secret" not in repr(sink.config.catalog).lower()


def test_precedence_builder_over_table_over_default() -> None:
    table_props = {"write.target-file-size-bytes": "1000", "commit.retry.num-retries": "9"}
    resolved = options.resolve({"write.target-file-size-bytes": 5}, table_props)
    assert resolved.get(options.TARGET_FILE_SIZE_BYTES) == 5
    assert resolved.get(options.COMMIT_NUM_RETRIES) == 9
    assert resolved.get(options.COMMIT_MIN_WAIT_MS) == options.COMMIT_MIN_WAIT_MS.default


def test_bad_table_property_names_the_property() -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"'commit.retry.num-retries' from table property: expected int"):
        options.resolve({}, {"commit.retry.num-retries": "often"})


def test_options_doc_lists_every_option() -> None:
    table = options.options_table_markdown()
    for option in options.OPTIONS:
        assert f"`{option.key}`" in table
    docs = Path(__file__).parents[2] / "docs" / "options.md"
    assert docs.read_text() == options.options_doc(), (
        "docs/options.md is stale: python -m iceberg_sink.options > docs/options.md"
    )


def test_only_file_io_settings_travel_to_tasks() -> None:
    from iceberg_sink.table.catalog import file_io_properties

    props = {
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.secret-access-key": "task-needs-this",
        "credential": "client:catalog-secret",
        "token": "bearer",
        "auth.manager": object(),
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
    }
    assert file_io_properties(props) == {
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.secret-access-key": "task-needs-this",
        "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
    }


def test_manifest_merge_properties_are_table_properties_only() -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"'commit.manifest.min-count-to-merge' is a table property only"):
        options.validate_builder_options({"commit.manifest.min-count-to-merge": 5})
    resolved = options.resolve({}, {"commit.manifest.min-count-to-merge": "5"})
    assert resolved.get(options.MANIFEST_MIN_COUNT_TO_MERGE) == 5
    assert resolved.get(options.MANIFEST_MERGE_ENABLED) is True


def test_bad_choice_lists_the_allowed_values_readably(tmp_path: Path) -> None:
    # The empty default of write.distribution-mode used to print as "expected one of , none, ...".
    with pytest.raises(InvalidSinkConfigError) as info:
        options.resolve({}, {"write.distribution-mode": "random"})
    message = str(info.value)
    assert "expected one of , " not in message
    assert "'write.distribution-mode' from table property: expected one of '' (empty: the default)" in message
    assert "'none', 'hash', 'range'; received 'random'" in message
    # The same message reaches the user at build() for an existing table with the bad property.
    sink = IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing().build()
    catalog = sink.config.catalog.load()
    catalog.create_namespace("db")
    catalog.create_table("db.t", Schema(NestedField(1, "id", LongType())), properties={"write.distribution-mode": "x"})
    with pytest.raises(InvalidSinkConfigError, match=r"expected one of '' \(empty: the default\), 'none'"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").build()
    with pytest.raises(InvalidSinkConfigError, match=r"expected one of 'zstd', 'snappy'.*received 'fast'"):
        options.validate_builder_options({"write.parquet.compression-codec": "fast"})


@pytest.mark.parametrize(
    "uri",
    [
        "postgresql+psycopg2://sink:pw-9f3c1e7a@127.0.0.1:5432/catalog",
        "sqlite://sink:pw-9f3c1e7a@//tmp/catalog.db",
        "postgresql://sink:pw-9f3c1e7a@db.example/catalog?sslmode=require",
    ],
)
def test_a_password_in_a_catalog_uri_is_never_shown(uri: str) -> None:
    from iceberg_sink.table.catalog import CatalogConfig

    builder = IcebergSink.builder().catalog("pg", type="sql", uri=uri, warehouse="file:///tmp/wh").table("db.t")
    with pytest.raises(InvalidSinkConfigError) as info:
        builder.build()  # the driver is missing or the URL is refused: either way an error naming the catalog
    assert "pw-9f3c1e7a" not in str(info.value), str(info.value)
    assert "'pg'" in str(info.value) and "://***@" in str(info.value) and "//sink" not in str(info.value)
    assert "pw-9f3c1e7a" not in repr(CatalogConfig("pg", {"uri": uri}))
    assert "pw-9f3c1e7a" not in repr(IcebergSink.builder().embedded("/tmp/x").table("db.t")._catalog)


def test_choices_are_read_in_any_case_as_iceberg_java_reads_them() -> None:
    resolved = options.resolve({}, {"write.parquet.compression-codec": "LZ4_RAW", "write.distribution-mode": "RANGE"})
    assert resolved.get(options.PARQUET_COMPRESSION) == "lz4_raw"
    assert resolved.get(options.DISTRIBUTION_MODE) == "range"
    assert options.parquet_codec("uncompressed") == options.parquet_codec("none") == "none"
    assert options.parquet_codec("zstd") == "zstd"
    with pytest.raises(InvalidSinkConfigError, match=r"received 'LZO'"):
        options.resolve({}, {"write.parquet.compression-codec": "LZO"})

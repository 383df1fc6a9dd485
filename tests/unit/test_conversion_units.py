"""Pieces of the equality-delete conversion: key-bounds pruning, file-scoped position deletes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from iceberg_sink._iceberg.deletes import DeleteRules, keys_may_match
from iceberg_sink._iceberg.encoding import dictionary_columns
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.position_deletes import (
    FILE_PATH_ID,
    POS_ID,
    read_positions,
    referenced_data_file,
    write_position_deletes,
)
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.topology.conversion import ConversionConfig
from iceberg_sink.vocab.files import DataFileMeta, FileContent

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))


def long_bytes(v: int) -> bytes:
    return v.to_bytes(8, "little", signed=True)


def int_bytes(v: int) -> bytes:
    return v.to_bytes(4, "little", signed=True)


def meta(
    content: FileContent,
    lower: dict[int, bytes],
    upper: dict[int, bytes],
    nulls: dict[int, int] | None = None,
    values: dict[int, int] | None = None,
    path: str = "file:///t/data/a.parquet",
    partition: tuple[object, ...] = (),
) -> DataFileMeta:
    return DataFileMeta(
        content=content,
        path=path,
        spec_id=0,
        partition=partition,
        record_count=10,
        file_size_in_bytes=100,
        lower_bounds=lower,
        upper_bounds=upper,
        null_value_counts=nulls if nulls is not None else {1: 0, 2: 0},
        value_counts=values or {1: 10, 2: 10},
        equality_ids=(1,) if content == FileContent.EQUALITY_DELETES else None,
    )


def test_key_bounds_prune_only_disjoint_ranges_and_compare_after_widening() -> None:
    # The data file was written while id was an int (4-byte bounds); the delete after it became long.
    data = meta(FileContent.DATA, {1: int_bytes(-5)}, {1: int_bytes(100)})
    inside = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(100)}, {1: long_bytes(2**40)})
    outside = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(101)}, {1: long_bytes(2**40)})
    below = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(-(2**40))}, {1: long_bytes(-6)})
    assert keys_may_match(inside, data, SCHEMA)
    assert not keys_may_match(outside, data, SCHEMA)
    assert not keys_may_match(below, data, SCHEMA)
    # A negative int bound is sign-extended, not read as a large unsigned number.
    assert keys_may_match(meta(FileContent.EQUALITY_DELETES, {1: long_bytes(-5)}, {1: long_bytes(-5)}), data, SCHEMA)


def test_nulls_and_missing_metrics_never_prune_a_possible_match() -> None:
    data_with_nulls = meta(FileContent.DATA, {1: long_bytes(0)}, {1: long_bytes(10)}, nulls={1: 2})
    null_delete = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(50)}, {1: long_bytes(60)}, nulls={1: 1})
    # The delete's null key matches the data file's null keys, whatever the ranges.
    assert keys_may_match(null_delete, data_with_nulls, SCHEMA)
    no_nulls = meta(FileContent.DATA, {1: long_bytes(0)}, {1: long_bytes(10)})
    assert not keys_may_match(null_delete, no_nulls, SCHEMA)
    # A delete holding only null keys cannot match a file without nulls.
    only_null = meta(FileContent.EQUALITY_DELETES, {}, {}, nulls={1: 3}, values={1: 3})
    assert not keys_may_match(only_null, no_nulls, SCHEMA)
    # Null counts unknown on both sides (either may hold nulls) or missing bounds: no pruning.
    unknown = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(50)}, {1: long_bytes(60)}, nulls={})
    assert keys_may_match(unknown, meta(FileContent.DATA, {1: long_bytes(0)}, {1: long_bytes(10)}, nulls={}), SCHEMA)
    assert not keys_may_match(unknown, no_nulls, SCHEMA)  # the data file has no null to match
    unbounded = meta(FileContent.EQUALITY_DELETES, {1: long_bytes(50)}, {})
    assert keys_may_match(unbounded, no_nulls, SCHEMA)


def test_string_keys_compare_as_utf8_bytes() -> None:
    schema = Schema(NestedField(1, "id", StringType(), required=False))
    data = meta(FileContent.DATA, {1: b"apple"}, {1: b"mango"})
    assert keys_may_match(meta(FileContent.EQUALITY_DELETES, {1: b"m"}, {1: b"z"}), data, schema)
    assert not keys_may_match(meta(FileContent.EQUALITY_DELETES, {1: "ñ".encode()}, {1: "日".encode()}), data, schema)


def test_file_scoped_position_deletes_apply_to_their_file_only(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    data = meta(FileContent.DATA, {}, {}, path=(tmp_path / "d.parquet").as_uri(), partition=(3,))
    written = write_position_deletes(
        io, (tmp_path / "p.parquet").as_uri(), data, [pa.array([7, 2, 7], pa.int64()), pa.array([0], pa.int32())]
    )
    rows = pq.read_table(tmp_path / "p.parquet")
    assert rows.column("pos").to_pylist() == [0, 2, 7]
    assert set(rows.column("file_path").to_pylist()) == {data.path}
    assert [f.metadata[b"PARQUET:field_id"] for f in rows.schema] == [str(FILE_PATH_ID).encode(), str(POS_ID).encode()]
    assert written.record_count == 3 and written.partition == (3,) and written.content == FileContent.POSITION_DELETES
    assert dict(written.lower_bounds)[POS_ID] == long_bytes(0) and dict(written.upper_bounds)[POS_ID] == long_bytes(7)
    assert referenced_data_file(written) == data.path
    assert read_positions(io, written.path, data.path).to_pylist() == [0, 2, 7]
    rules = DeleteRules([])
    scoped = LiveFile(written, 5, "")
    assert rules.applies(scoped, LiveFile(data, 5, ""))
    other = LiveFile(meta(FileContent.DATA, {}, {}, path="file:///t/other.parquet", partition=(3,)), 1, "")
    assert not rules.applies(scoped, other)
    # A position delete file naming several files applies to its whole partition (by the rule).
    wide = LiveFile(meta(FileContent.POSITION_DELETES, {}, {}, path="file:///t/pd.parquet", partition=(3,)), 5, "")
    assert referenced_data_file(wide.meta) is None and rules.applies(wide, other)
    with pytest.raises(ValueError, match="no position"):
        write_position_deletes(io, (tmp_path / "e.parquet").as_uri(), data, [])


@pytest.mark.parametrize("dictionary", [True, False])
def test_positions_are_read_for_the_one_data_file_asked_of_a_file_naming_several(
    tmp_path: Path, dictionary: bool
) -> None:
    """A position delete file naming several data files (as Iceberg Java's partition-scoped ones
    do), its paths dictionary-encoded or plain and across row groups: only the positions of the
    data file asked for, in the file's order; none for a file it does not name."""
    names = [f"s3://b/data/{n}.parquet" for n in ("a", "b", "c")]
    paths = [names[0]] * 5 + [names[1]] * 3 + [names[2]] * 4
    pos = [0, 3, 4, 8, 9, 1, 2, 7, 5, 6, 10, 11]
    rows = pa.table({"file_path": pa.array(paths), "pos": pa.array(pos, pa.int64())})
    pq.write_table(rows, tmp_path / "p.parquet", use_dictionary=dictionary, row_group_size=4)
    io, where = PyArrowFileIO(), (tmp_path / "p.parquet").as_uri()
    for name in names:
        assert read_positions(io, where, name).to_pylist() == [p for f, p in zip(paths, pos, strict=True) if f == name]
    assert read_positions(io, where, "s3://b/data/d.parquet").to_pylist() == []
    assert read_positions(io, where, names[0]).type == pa.int64()


@pytest.mark.parametrize("count", [1, 2, 300, 50_000])
def test_position_delete_files_follow_the_writers_dictionary_rule(tmp_path: Path, count: int) -> None:
    """The path column gets a dictionary and the positions are plain: what the writers' rule
    (``dictionary_columns``) decides for one path and distinct positions, which the writer takes
    as known instead of weighing every file's positions."""
    io = PyArrowFileIO()
    data = meta(FileContent.DATA, {}, {}, path=(tmp_path / "d.parquet").as_uri(), partition=())
    positions = np.arange(0, 3 * count, 3, dtype=np.int64)
    rows = pa.table({"file_path": pa.array([data.path] * count), "pos": pa.array(positions)})
    rule = dictionary_columns(rows)
    assert rule == (["file_path"] if count > 1 else [])
    write_position_deletes(io, (tmp_path / "p.parquet").as_uri(), data, [positions])
    chunk = pq.ParquetFile(tmp_path / "p.parquet").metadata.row_group(0)
    assert [chunk.column(c).has_dictionary_page for c in range(2)] == [name in rule for name in ("file_path", "pos")]
    assert pq.read_table(tmp_path / "p.parquet").column("pos").to_numpy().tolist() == positions.tolist()


def test_conversion_config_names_bad_values() -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"every_n_commits.*received 0"):
        ConversionConfig(every_n_commits=0)
    with pytest.raises(InvalidSinkConfigError, match=r"background.*received 'yes'"):
        ConversionConfig(every_n_commits=1, background="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidSinkConfigError, match=r"max_replans.*received -1"):
        ConversionConfig(every_n_commits=1, max_replans=-1)
    assert not ConversionConfig().has_trigger and ConversionConfig(delete_files=10).has_trigger


def test_int_key_schema_is_accepted() -> None:
    schema = Schema(NestedField(1, "id", IntegerType(), required=False))
    data = meta(FileContent.DATA, {1: int_bytes(1)}, {1: int_bytes(5)})
    assert not keys_may_match(meta(FileContent.EQUALITY_DELETES, {1: int_bytes(6)}, {1: int_bytes(9)}), data, schema)

"""The conversion's key index: exact lookups in every key form, reuse across runs, memory bound."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import DateType, LongType, NestedField, StringType, StructType, TimestampType

from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink._iceberg.live_rows import key_columns
from iceberg_sink._iceberg.projection import key_schema
from iceberg_sink.keyindex import keys as keys_module
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.vocab.files import DataFileMeta, FileContent

IO = PyArrowFileIO()


def schema_of(*fields: NestedField) -> Schema:
    return Schema(*fields, NestedField(99, "payload", StringType(), required=False))


def write(tmp_path: Path, name: str, schema: Schema, columns: dict[str, list[Any]]) -> DataFileMeta:
    rows = len(next(iter(columns.values())))
    table = pa.table({**columns, "payload": [f"p{i}" for i in range(rows)]}).cast(arrow_schema(schema))
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(table, path)
    return DataFileMeta(
        content=FileContent.DATA,
        path=path,
        spec_id=0,
        partition=(),
        record_count=rows,
        file_size_in_bytes=Path(path).stat().st_size,
    )


def deleted(schema: Schema, ids: tuple[int, ...], columns: dict[str, list[Any]]) -> pa.Table:
    wanted = key_schema(schema, ids)
    return key_columns(pa.table(columns).cast(arrow_schema(wanted)), wanted, ids)


def expected(columns: dict[str, list[Any]], keys: dict[str, list[Any]]) -> list[int]:
    """Positions whose key tuple is one of ``keys`` (None equal to None, as in Iceberg)."""
    names = list(keys)
    wanted = set(zip(*(keys[n] for n in names), strict=True))
    return [i for i, row in enumerate(zip(*(columns[n] for n in names), strict=True)) if row in wanted]


def lookup(
    index: KeyIndex, schema: Schema, meta: DataFileMeta, ids: tuple[int, ...], keys: dict[str, list[Any]]
) -> tuple[list[int], bool]:
    positions, read = index.matching_positions(IO, schema, meta, ids, deleted(schema, ids, keys), None)
    return positions.to_pylist(), read


LONG = schema_of(NestedField(1, "id", LongType(), required=True))


def test_unsorted_long_keys_with_repeats_are_found_from_memory_after_the_first_read(tmp_path: Path) -> None:
    columns = {"id": [5, 3, 9, 3, 1, 7, 5, 2]}
    meta = write(tmp_path, "a", LONG, columns)
    keys = {"id": [3, 5, 4, 100]}
    index = KeyIndex()
    assert lookup(index, LONG, meta, (1,), keys) == (expected(columns, keys), True)
    assert lookup(index, LONG, meta, (1,), keys) == (expected(columns, keys), False)
    assert lookup(index, LONG, meta, (1,), {"id": [2, 1]}) == ([4, 7], False)
    assert index.files == 1
    assert index.nbytes == 8 * 8 + 4 * 8  # sorted keys and their row positions


def test_a_file_already_sorted_by_key_keeps_only_its_keys(tmp_path: Path) -> None:
    columns = {"id": list(range(0, 200, 2))}
    meta = write(tmp_path, "a", LONG, columns)
    index = KeyIndex()
    assert lookup(index, LONG, meta, (1,), {"id": [0, 1, 198, 50]}) == ([0, 25, 99], True)
    assert index.nbytes == 8 * 100


@pytest.mark.parametrize(
    ("field_type", "values", "keys"),
    [
        (DateType(), [dt.date(2026, 1, d) for d in (3, 1, 2, 1)], [dt.date(2026, 1, 1), dt.date(2025, 1, 1)]),
        (
            TimestampType(),
            [dt.datetime(2026, 1, 1, h) for h in (4, 2, 3)],
            [dt.datetime(2026, 1, 1, 3), dt.datetime(2026, 1, 1, 4)],
        ),
    ],
)
def test_date_and_timestamp_keys_use_the_sorted_form(
    tmp_path: Path, field_type: Any, values: list[Any], keys: list[Any]
) -> None:
    schema = schema_of(NestedField(1, "k", field_type, required=True))
    columns = {"k": values}
    meta = write(tmp_path, "a", schema, columns)
    index = KeyIndex()
    assert lookup(index, schema, meta, (1,), {"k": keys}) == (expected(columns, {"k": keys}), True)
    assert index.nbytes == len(values) * 12


def test_a_nullable_key_holding_nulls_matches_null_to_null(tmp_path: Path) -> None:
    schema = schema_of(NestedField(1, "id", LongType(), required=False))
    columns = {"id": [4, None, 2, None, 4]}
    meta = write(tmp_path, "a", schema, columns)
    index = KeyIndex()
    for keys in ({"id": [None, 2]}, {"id": [4]}, {"id": [None]}):
        assert lookup(index, schema, meta, (1,), keys)[0] == expected(columns, keys)
    # Without a null in the file the sorted form serves; a null key then matches nothing.
    sorted_meta = write(tmp_path, "b", schema, {"id": [3, 1, 2]})
    assert lookup(index, schema, sorted_meta, (1,), {"id": [None, 1]})[0] == [1]


def test_long_string_keys(tmp_path: Path) -> None:
    schema = schema_of(NestedField(1, "k", StringType(), required=True))
    long = "x" * 50_000
    columns = {"k": [long + "a", "b", long + "b", "é" * 3, long + "a"]}
    meta = write(tmp_path, "a", schema, columns)
    index = KeyIndex()
    keys = {"k": [long + "a", "é" * 3, long]}
    assert lookup(index, schema, meta, (1,), keys) == (expected(columns, keys), True)
    assert lookup(index, schema, meta, (1,), keys) == (expected(columns, keys), False)
    assert index.nbytes > 150_000  # the strings themselves are kept


def test_multi_column_and_nested_keys(tmp_path: Path) -> None:
    schema = schema_of(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "s", StructType(NestedField(4, "a", LongType(), required=False)), required=False),
    )
    columns = {
        "id": [1, 1, 2, 2, 3],
        "region": ["eu", "us", "eu", None, None],
        "s": [{"a": 1}, {"a": 2}, None, {"a": None}, {"a": 5}],
    }
    meta = write(tmp_path, "a", schema, columns)
    index = KeyIndex()
    keys = {"id": [1, 2, 3], "region": ["us", None, "eu"]}
    assert lookup(index, schema, meta, (1, 2), {**keys})[0] == expected(columns, keys)
    # s.a = null inside a set struct is not the key of a row whose struct s is null.
    nested = deleted(schema, (4,), {"s": [{"a": None}]})
    positions, _ = index.matching_positions(IO, schema, meta, (4,), nested, None)
    assert positions.to_pylist() == [3]


def test_memory_bound_reads_files_that_do_not_fit_at_every_lookup(tmp_path: Path) -> None:
    small = write(tmp_path, "small", LONG, {"id": [1, 2]})
    big = write(tmp_path, "big", LONG, {"id": list(range(100))})
    index = KeyIndex(max_bytes=100)
    assert lookup(index, LONG, small, (1,), {"id": [2]}) == ([1], True)
    assert lookup(index, LONG, big, (1,), {"id": [2]}) == ([2], True)
    assert lookup(index, LONG, big, (1,), {"id": [3]}) == ([3], True)  # 800 bytes: never kept
    assert lookup(index, LONG, small, (1,), {"id": [1]}) == ([0], False)
    assert index.nbytes == 16
    nothing = KeyIndex(max_bytes=0)
    assert lookup(nothing, LONG, small, (1,), {"id": [2]}) == ([1], True)
    assert lookup(nothing, LONG, small, (1,), {"id": [2]}) == ([1], True)
    assert nothing.nbytes == 0


def test_an_entry_is_checked_against_the_file_size_and_record_count(tmp_path: Path) -> None:
    meta = write(tmp_path, "a", LONG, {"id": [1, 2, 3]})
    index = KeyIndex()
    assert lookup(index, LONG, meta, (1,), {"id": [3]}) == ([2], True)
    # Another file under the same path (never in a table, but the index must not trust the path).
    other = write(tmp_path, "a", LONG, {"id": [3, 3, 1, 0]})
    assert lookup(index, LONG, other, (1,), {"id": [3]}) == ([0, 1], True)
    assert lookup(index, LONG, other, (1,), {"id": [3]}) == ([0, 1], False)
    assert index.files == 1


def test_a_manifest_record_count_that_disagrees_with_the_file_is_an_error(tmp_path: Path) -> None:
    meta = write(tmp_path, "a", LONG, {"id": [1, 2, 3]})
    wrong = DataFileMeta(
        content=FileContent.DATA,
        path=meta.path,
        spec_id=0,
        partition=(),
        record_count=4,
        file_size_in_bytes=meta.file_size_in_bytes,
    )
    with pytest.raises(ValueError, match="expected 4 rows"):
        lookup(KeyIndex(), LONG, wrong, (1,), {"id": [1]})


def test_retain_drops_files_no_longer_live_and_keys_of_other_schemas(tmp_path: Path) -> None:
    a = write(tmp_path, "a", LONG, {"id": [1, 2]})
    b = write(tmp_path, "b", LONG, {"id": [3, 4]})
    index = KeyIndex()
    lookup(index, LONG, a, (1,), {"id": [1]})
    lookup(index, LONG, b, (1,), {"id": [3]})
    index.remember_positions("pos-a", a.path, np.array([0], np.int64))
    index.remember_positions("pos-b", b.path, np.array([0, 1], np.int64))
    assert (index.files, index.nbytes) == (2, 32 + 24)
    index.retain({b.path}, {"pos-a", "pos-b"}, LONG.schema_id)  # a was compacted away
    assert (index.files, index.nbytes) == (1, 16 + 16)
    assert lookup(index, LONG, b, (1,), {"id": [4]}) == ([1], False)
    index.retain({b.path}, set(), LONG.schema_id)  # pos-b was merged into a newer file
    assert index.nbytes == 16
    index.retain({b.path}, set(), LONG.schema_id + 1)  # the schema changed
    assert (index.files, index.nbytes) == (0, 0)


def test_positions_of_position_delete_files_are_remembered(tmp_path: Path) -> None:
    index = KeyIndex()
    index.remember_positions("never-read", "data.parquet", np.array([1, 5], np.int64))
    assert index.positions(IO, "never-read", "data.parquet").tolist() == [1, 5]


@pytest.mark.parametrize("seed", range(5))
def test_sorted_lookups_match_a_plain_scan_with_many_repeats(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(-20, 20, size=int(rng.integers(1, 300))).tolist()
    if seed % 2:
        values.sort()  # kept without row positions
    columns = {"id": values}
    meta = write(tmp_path, f"f{seed}", LONG, columns)
    index = KeyIndex()
    for _ in range(5):
        keys = {"id": rng.integers(-25, 25, size=int(rng.integers(0, 30))).tolist()}
        assert lookup(index, LONG, meta, (1,), keys)[0] == expected(columns, keys)


def test_sorted_positions_merges_deduplicates_and_sorts() -> None:
    from iceberg_sink._iceberg.position_deletes import sorted_positions

    assert sorted_positions([np.array([1, 4, 9]), pa.array([4, 2], pa.int32()), np.array([], np.int64)]).tolist() == [
        1,
        2,
        4,
        9,
    ]
    assert sorted_positions([]).tolist() == []
    already = np.array([0, 3, 7], np.int64)
    assert sorted_positions([already]) is already


def test_files_sharing_deleted_keys_build_their_wanted_keys_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's data files ask with one of two tables of deleted keys (equality delete files
    that apply to some files and not others), interleaved in path order: each table's distinct keys
    are built once (a sort of the checkpoint's keys), not once per change of table, and every file
    gets its own positions."""
    metas = [write(tmp_path, f"f{i}", LONG, {"id": list(range(i * 10, i * 10 + 10))}) for i in range(6)]
    one = deleted(LONG, (1,), {"id": [1, 21, 41]})
    two = deleted(LONG, (1,), {"id": [12, 33, 55]})
    builds: list[int] = []
    real = keys_module.WantedKeys.of

    def counted(values: np.ndarray) -> keys_module.WantedKeys:
        builds.append(len(values))
        return real(values)

    monkeypatch.setattr(keys_module.WantedKeys, "of", staticmethod(counted))
    asked = [(meta, one if i % 2 == 0 else two) for i, meta in enumerate(metas)]
    found, read = KeyIndex().match(IO, LONG, {(1,): asked}, None)
    assert builds == [3, 3], builds
    assert read == 6
    want = {meta.path: [position] for meta, position in zip(metas, [1, 2, 1, 3, 1, 5], strict=True)}
    assert {path: np.concatenate(rows).tolist() for path, rows in found.items()} == want

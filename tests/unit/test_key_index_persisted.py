"""The key index kept in table storage: the entry format (round trip, corruption and mismatch
detected), a new index (a restarted driver) loading instead of reading data files, write failures
that only log, and the cleanup of entries whose data files are gone (sink, expiry, orphan removal).
Real task writers, committer and SQLite catalog; PyIceberg reads the result."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import attrs
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink.committer import vectors
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committer import IcebergCommitter
from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.keyindex.keys import ArrowKeys, IndexEntry, SortedKeys, index_rows
from iceberg_sink.keyindex.persisted import EntryHeader, decode, encode, entry_name, index_location
from iceberg_sink.topology import maintenance
from iceberg_sink.vocab.files import DataFileMeta
from tests.helpers import LosingCatalog, write_batches, writer_spec
from tests.unit.test_v3_upserts import NO_WAIT, catalog, committable, committer, model, rows_in

__all__ = ["catalog"]  # the fixture, imported to be used here

LONG = Schema(NestedField(1, "id", LongType(), required=True))
PAIR = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "region", StringType(), required=False))


def header(n: int, ids: tuple[int, ...] = (1,)) -> EntryHeader:
    return EntryHeader("file:///t/data/a.parquet", 1234, n, 0, ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200))
def test_sorted_entries_round_trip_with_and_without_row_order(values: list[int]) -> None:
    rows = pa.table({"id": pa.array(values, pa.int64())})
    entry = IndexEntry(1234, len(values), index_rows(rows, LONG, (1,)))
    assert isinstance(entry.keys, SortedKeys)
    got_header, got = decode(encode(header(len(values)), entry))
    assert got_header == header(len(values))
    assert isinstance(got.keys, SortedKeys) and (got.file_size, got.record_count) == (1234, len(values))
    assert got.keys.keys.tolist() == entry.keys.keys.tolist()
    assert (got.keys.order is None) == (entry.keys.order is None)
    if entry.keys.order is not None:
        assert got.keys.order is not None and got.keys.order.tolist() == entry.keys.order.tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.none() | st.integers(-5, 5), st.none() | st.text(max_size=6)), max_size=50))
def test_arrow_entries_round_trip_with_nulls_and_several_fields(pairs: list[tuple[int | None, str | None]]) -> None:
    rows = pa.table({"id": [p[0] for p in pairs], "region": [p[1] for p in pairs]}).cast(arrow_schema(PAIR))
    entry = IndexEntry(1234, len(pairs), index_rows(rows, PAIR, (1, 2)))
    assert isinstance(entry.keys, ArrowKeys)
    got_header, got = decode(encode(header(len(pairs), (1, 2)), entry))
    assert got_header.key_ids == (1, 2)
    assert isinstance(got.keys, ArrowKeys) and got.keys.rows.equals(rows)


def test_every_flipped_byte_and_every_truncation_is_detected() -> None:
    rows = pa.table({"id": pa.array([5, 3, 9, 1], pa.int64())})
    data = encode(header(4), IndexEntry(1234, 4, index_rows(rows, LONG, (1,))))
    for i in range(len(data)):
        broken = bytearray(data)
        broken[i] ^= 0x40
        with pytest.raises(CorruptFileError, match="key index entry"):
            decode(bytes(broken))
    for n in range(len(data)):
        with pytest.raises(CorruptFileError):
            decode(data[:n])
    with pytest.raises(CorruptFileError, match="expected a file starting with"):
        decode(b"PAR1" + data[4:])


# The v3 committer's index: checkpoint 0 writes four rows; checkpoint 1's deletes reach its file.


def first_commit(cat: LosingCatalog) -> tuple[Table, tuple[DataFileMeta, ...]]:
    committer(cat).commit(committable(cat.load_table("db.t"), 0, [(i, "x", "I") for i in range(1, 6)]))
    table = cat.load_table("db.t")
    deletes = write_batches(
        writer_spec(table, checkpoint_id=1, op_column="op", equality_field_ids=(1,)),
        pa.table({"id": pa.array([2, 4], pa.int64()), "v": pa.array([None, None], pa.string()), "op": ["D", "D"]}),
    ).delete_files
    return table, deletes


def entry_path(table: Table) -> Path:
    (data,) = table.inspect.files()["file_path"].to_pylist()
    return Path(index_location(table).removeprefix("file://")) / entry_name(data)


def resolve(table: Table, deletes: tuple[DataFileMeta, ...], index: KeyIndex) -> vectors.ResolvedDeletes:
    resolved = vectors.resolve(table, table.current_snapshot(), (), deletes, (), index)
    index.flush()
    assert [v.record_count for v in resolved.vectors] == [2]  # rows 2 and 4, however found
    return resolved


def test_a_new_index_loads_the_persisted_entry_instead_of_reading_the_data_file(catalog: LosingCatalog) -> None:
    table, deletes = first_commit(catalog)
    first = KeyIndex(persist=True)
    assert resolve(table, deletes, first).data_files_read == 1 and first.persisted.written == 1
    assert entry_path(table).is_file()
    restarted = KeyIndex(persist=True)
    assert resolve(table, deletes, restarted).data_files_read == 0
    assert (restarted.persisted.loaded, restarted.files) == (1, 1)
    # Without persisting (the option off), nothing is loaded nor written.
    off = KeyIndex(persist=False)
    assert resolve(table, deletes, off).data_files_read == 1 and off.persisted.loaded == 0
    # An entry that does not fit the memory bound is neither kept nor written.
    entry_path(table).unlink()
    tiny = KeyIndex(max_bytes=0, persist=True)
    assert resolve(table, deletes, tiny).data_files_read == 1 and not entry_path(table).exists()


def test_a_corrupt_entry_is_detected_rebuilt_from_the_data_file_and_rewritten(catalog: LosingCatalog) -> None:
    table, deletes = first_commit(catalog)
    resolve(table, deletes, KeyIndex(persist=True))
    path = entry_path(table)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit in the keys
    path.write_bytes(bytes(raw))
    index = KeyIndex(persist=True)
    assert resolve(table, deletes, index).data_files_read == 1
    assert (index.persisted.corrupt, index.persisted.loaded, index.persisted.written) == (1, 0, 1)
    again = KeyIndex(persist=True)
    assert resolve(table, deletes, again).data_files_read == 0 and again.persisted.loaded == 1


@pytest.mark.parametrize("what", ["record count", "key ids", "schema id", "path"])
def test_an_entry_of_another_file_or_key_is_not_used(catalog: LosingCatalog, what: str) -> None:
    table, deletes = first_commit(catalog)
    resolve(table, deletes, KeyIndex(persist=True))
    path = entry_path(table)
    good, entry = decode(path.read_bytes())
    changed = {
        "record count": EntryHeader(good.data_path, good.file_size, good.record_count + 1, good.schema_id, (1,)),
        "key ids": EntryHeader(good.data_path, good.file_size, good.record_count, good.schema_id, (2,)),
        "schema id": EntryHeader(good.data_path, good.file_size, good.record_count, good.schema_id + 1, (1,)),
        "path": EntryHeader(good.data_path + "x", good.file_size, good.record_count, good.schema_id, (1,)),
    }[what]
    assert isinstance(entry.keys, SortedKeys)
    # Keys that would find other rows: a mismatched entry, if used, gives wrong positions.
    shifted = IndexEntry(entry.file_size, entry.record_count, SortedKeys(entry.keys.keys + 1, entry.keys.order))
    if what == "record count":  # a whole entry of one row more
        keys = np.append(np.sort(entry.keys.keys + 1), 100)
        shifted = IndexEntry(entry.file_size, entry.record_count + 1, SortedKeys(keys, None))
    path.write_bytes(encode(changed, shifted))
    index = KeyIndex(persist=True)
    assert resolve(table, deletes, index).data_files_read == 1
    assert (index.persisted.mismatched, index.persisted.loaded) == (1, 0)


def persisting_committer(cat: LosingCatalog) -> IcebergCommitter:
    return IcebergCommitter(
        lambda: cat.load_table("db.t"), "main", "job", NO_WAIT, sleep=lambda s: None, key_index_persist=True
    )


CHECKPOINTS = [
    [(i, "x", "I") for i in range(1, 6)],
    [(2, None, "D"), (3, "y", "U")],
    [(3, "y2", "U"), (4, "z", "U"), (6, "n", "I")],
]


def test_a_restarted_committer_resolves_its_first_checkpoint_without_reading_a_data_file(
    catalog: LosingCatalog,
) -> None:
    first = persisting_committer(catalog)
    for n, rows in enumerate(CHECKPOINTS):
        first.commit(committable(catalog.load_table("db.t"), n, rows))
    first._key_index.flush()
    # Key 1 is within the key bounds of checkpoint 0's file only, which checkpoints 1 and 2 indexed.
    restarted = persisting_committer(catalog)
    outcome = restarted.commit(committable(catalog.load_table("db.t"), 3, [(1, "a2", "U")]))
    assert (outcome.key_index_data_files_read, outcome.key_index_entries_loaded) == (0, 1)
    assert rows_in(catalog.load_table("db.t")) == model([*CHECKPOINTS, [(1, "a2", "U")]])


def test_an_index_write_that_fails_only_logs_and_every_commit_lands(
    catalog: LosingCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    table = catalog.load_table("db.t")
    blocker = Path(index_location(table).removeprefix("file://"))
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the index folder would be: every entry write fails")
    c = persisting_committer(catalog)
    for n, rows in enumerate(CHECKPOINTS):
        assert c.commit(committable(catalog.load_table("db.t"), n, rows)).snapshot is not None
    c._key_index.flush()
    assert c._key_index.persisted.write_failures >= 1 and c._key_index.persisted.written == 0
    assert "cannot write key index entry" in caplog.text
    assert rows_in(catalog.load_table("db.t")) == model(CHECKPOINTS)


def entries(table: Table) -> set[str]:
    folder = Path(index_location(table).removeprefix("file://"))
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def data_files(table: Table) -> set[str]:
    return set(table.inspect.files()["file_path"].to_pylist())


def test_the_index_deletes_the_entries_of_files_that_left_the_branch_head(catalog: LosingCatalog) -> None:
    c = persisting_committer(catalog)
    for n, rows in enumerate(CHECKPOINTS):
        c.commit(committable(catalog.load_table("db.t"), n, rows))
    c._key_index.flush()
    table = catalog.load_table("db.t")
    assert len(entries(table)) == 2  # checkpoint 2's deletes reached the files of checkpoints 0 and 1
    vectors.resolve(table, None, (), (), (), c._key_index)  # a head without them (a truncate's)
    c._key_index.flush()
    assert not entries(table) and c._key_index.persisted.deleted == 2


def test_expiry_deletes_the_entries_of_the_data_files_it_deletes_and_orphan_removal_keeps_live_ones(
    catalog: LosingCatalog,
) -> None:
    c = persisting_committer(catalog)
    for n, rows in enumerate(CHECKPOINTS):
        c.commit(committable(catalog.load_table("db.t"), n, rows))
    c._key_index.flush()
    table = catalog.load_table("db.t")
    old = entries(table)
    assert len(old) == 2
    # Another writer (its index not persisting, so it deletes no entry) truncates: every file goes.
    rows = pa.table({"id": pa.array([9], pa.int64()), "v": ["z"], "op": ["I"]})
    result = write_batches(writer_spec(table, checkpoint_id=3, op_column="op", equality_field_ids=(1,)), rows)
    stored = CommitAggregator("db.t", "main", "job").aggregate(
        table, table.io, 3, [attrs.evolve(result, truncated=True)]
    )
    assert stored is not None and committer(catalog).commit(stored).snapshot is not None
    # A later checkpoint, by a restarted driver (it never held the old files), indexes the new file.
    again = persisting_committer(catalog)
    again.commit(committable(catalog.load_table("db.t"), 4, [(9, "z2", "U")]))
    again._key_index.flush()
    assert entries(catalog.load_table("db.t")) >= old  # nothing has deleted them yet
    live = entries(catalog.load_table("db.t")) - old
    assert len(live) == 1
    gone = maintenance.expire_snapshots(
        lambda: catalog.load_table("db.t"), dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1), retain_last=1
    )
    table = catalog.load_table("db.t")
    assert {entry_name(p) for p in gone.deleted_files} >= old
    assert entries(table) == live
    # An entry of a data file the table never referenced is an orphan; the live one is kept.
    stray = entry_name("file:///elsewhere/never.parquet")
    (Path(index_location(table).removeprefix("file://")) / stray).write_bytes(b"left by a crashed writer")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    orphans = maintenance.remove_orphan_files(lambda: catalog.load_table("db.t"), now=later)
    assert f"{index_location(table)}/{stray}" in orphans.orphan_files
    assert entries(table) == live
    assert rows_in(catalog.load_table("db.t")) == {9: "z2"}

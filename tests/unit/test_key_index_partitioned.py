"""The partitioned key index against a brute-force answer: every key kind, merges, restarts,
files leaving the head, corrupt and missing runs."""

from __future__ import annotations

import decimal
import random
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyiceberg.io import FileIO
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    UUIDType,
)

from iceberg_sink import _faults
from iceberg_sink.keyindex import fetch, runs
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.keyindex.manifest import IndexKey, Manifest
from iceberg_sink.keyindex.partitioned import PartitionedIndex
from iceberg_sink.keyindex.runner import LocalRunner
from iceberg_sink.keyindex.runs import RunFile
from iceberg_sink.vocab.files import DataFileMeta
from tests.unit.test_key_index import IO, deleted, expected, schema_of, write

LONG = schema_of(NestedField(1, "id", LongType(), required=True))
OPTIONAL_LONG = schema_of(NestedField(1, "id", LongType(), required=False))
STRING = schema_of(NestedField(1, "id", StringType(), required=True))
PAIR = schema_of(NestedField(1, "a", StringType(), required=False), NestedField(2, "b", IntegerType(), required=False))
NESTED = schema_of(
    NestedField(3, "s", StructType(NestedField(4, "id", LongType(), required=False)), required=False),
)


def index(tmp_path: Path, io: FileIO = IO, **kwargs: Any) -> PartitionedIndex:
    settings = {"partitions": 4, "block": 3, "fan_in": 2, **kwargs}
    return PartitionedIndex(io, str(tmp_path / "index" / "partitioned"), **settings)


def ask(
    idx: PartitionedIndex,
    schema: Schema,
    ids: tuple[int, ...],
    files: list[tuple[DataFileMeta, dict[str, list[Any]]]],
    keys: dict[str, list[Any]],
    live: set[str] | None = None,
) -> tuple[dict[str, list[int]], int]:
    key = IndexKey.of(schema, ids)
    assert key is not None
    requests = [(meta, deleted(schema, ids, keys)) for meta, _ in files]
    found, read = idx.match(schema, key, requests, None, live)
    return {p: v.tolist() for p, v in found.items()}, read


def brute(files: list[tuple[DataFileMeta, dict[str, list[Any]]]], keys: dict[str, list[Any]]) -> dict[str, list[int]]:
    return {meta.path: expected(columns, keys) for meta, columns in files}


def test_the_kind_of_a_key() -> None:
    assert IndexKey.of(LONG, (1,)).kind == runs.INT  # type: ignore[union-attr]
    assert IndexKey.of(OPTIONAL_LONG, (1,)).kind == runs.DIGEST  # type: ignore[union-attr]
    assert IndexKey.of(STRING, (1,)).kind == runs.DIGEST  # type: ignore[union-attr]
    assert IndexKey.of(schema_of(NestedField(1, "x", DoubleType(), required=True)), (1,)) is None
    # An int promoted to long keeps its entries; a string key is another index.
    as_int = schema_of(NestedField(1, "id", IntegerType(), required=True))
    assert IndexKey.of(as_int, (1,)) == IndexKey.of(LONG, (1,))
    assert IndexKey.of(STRING, (1,)) != IndexKey.of(LONG, (1,))


def test_mix_is_a_bijection_on_a_sample() -> None:
    values = np.array([-(2**63), -1, 0, 1, 2**63 - 1, *range(-5000, 5000)], np.int64)
    assert len(np.unique(runs.mix(values))) == len(np.unique(values))


def test_a_key_repeated_over_many_blocks_is_found_in_every_one(tmp_path: Path) -> None:
    columns = {"id": [7] * 20 + list(range(100, 140)) + [7] * 5}
    meta = write(tmp_path, "a", LONG, columns)
    idx = index(tmp_path)
    found, read = ask(idx, LONG, (1,), [(meta, columns)], {"id": [7, 120, 5000]})
    assert found == brute([(meta, columns)], {"id": [7, 120, 5000]})
    assert read == 1
    assert ask(idx, LONG, (1,), [(meta, columns)], {"id": [7]})[1] == 0  # covered: nothing read again


def _pairs(r: random.Random, n: int) -> dict[str, list[Any]]:
    return {
        "a": [None if r.random() < 0.2 else f"x{r.randrange(5)}" for _ in range(n)],
        "b": [None if r.random() < 0.2 else r.randrange(5) for _ in range(n)],
    }


OPTIONAL_STRING = schema_of(NestedField(1, "id", StringType(), required=False))


CASES = {
    "long": (LONG, (1,), lambda r: {"id": [r.randrange(60) for _ in range(r.randrange(1, 40))]}),
    "optional long": (
        OPTIONAL_LONG,
        (1,),
        lambda r: {"id": [None if r.random() < 0.2 else r.randrange(30) for _ in range(r.randrange(1, 30))]},
    ),
    "string": (STRING, (1,), lambda r: {"id": [f"k{r.randrange(50)}" for _ in range(r.randrange(1, 30))]}),
    # Nulls in some files' keys or deletes and not in others: a key hashes alike either way.
    "optional string": (
        OPTIONAL_STRING,
        (1,),
        lambda r: {"id": [None if r.random() < 0.1 else f"k{r.randrange(20)}" for _ in range(r.randrange(1, 20))]},
    ),
    "pair with nulls": (PAIR, (1, 2), lambda r: _pairs(r, r.randrange(1, 30))),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", range(4))
def test_checkpoints_of_random_files_agree_with_brute_force(
    tmp_path: Path, case: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema, ids, draw = CASES[case]
    r = random.Random(f"{case}-{seed}")
    # Blocks read one request each, coalesced across small gaps, or every run in one request; by
    # PyArrow's streams (read_at) or fsspec's (seek and read, one range at a time); in the caller's
    # thread, as on a local file system, or by the pool, as on object storage.
    request = r.choice([1, 64, 16384, 10**9])
    monkeypatch.setattr(fetch, "LOCAL_REQUEST_BYTES", request)
    monkeypatch.setattr(fetch, "REMOTE_REQUEST_BYTES", request)
    at_once = r.random() < 0.5
    monkeypatch.setattr(fetch, "remote", lambda path: at_once)
    idx = index(
        tmp_path,
        r.choice([IO, FsspecFileIO({})]),
        partitions=r.choice([1, 2, 4, 8]),
        block=r.choice([1, 3, 16]),
        fan_in=r.choice([2, 3]),
        whole_entries=r.choice([0, 10**9]),  # merged by partition, or as one key range
        partition_max_entries=r.choice([10**9, 8, 40]),  # partitions split as the index grows, or never
    )
    files: list[tuple[DataFileMeta, dict[str, list[Any]]]] = []
    merged = 0
    for step in range(12):
        columns = draw(r)
        files.append((write(tmp_path, f"f{step}", schema, columns), columns))
        if len(files) > 3 and r.random() < 0.3:  # a file leaves the head (compacted away, deleted)
            files.pop(r.randrange(len(files)))
        keys = draw(r)
        live = {m.path for m, _ in files}
        asked = r.sample(files, r.randrange(1, len(files) + 1))
        found, _ = ask(idx, schema, ids, asked, keys, live)
        assert found == brute(asked, keys), (case, seed, step)
        if r.random() < 0.3:  # a restarted driver: the index from storage, nothing read again
            merged += idx.counters.runs_merged
            idx = PartitionedIndex(
                idx.io,
                idx.location,
                partitions=idx.partitions,
                block=idx.block,
                fan_in=idx.fan_in,
                whole_entries=idx.whole_entries,
                partition_max_entries=idx.partition_max_entries,
            )
            again, read = ask(idx, schema, ids, asked, keys, live)
            assert (again, read) == (found, 0)
    assert merged + idx.counters.runs_merged > 0


def test_a_corrupt_or_missing_run_is_rebuilt_never_trusted(tmp_path: Path) -> None:
    files = []
    for n in range(4):
        columns = {"id": [f"u{uuid.UUID(int=n * 100 + i)}" for i in range(30)]}
        files.append((write(tmp_path, f"f{n}", STRING, columns), columns))
    idx = index(tmp_path, fan_in=8)
    keys = {"id": [k for _, columns in files for k in columns["id"][::2]] + ["absent"]}  # every block is read
    assert ask(idx, STRING, (1,), files, keys)[0] == brute(files, keys)
    run_files = sorted((tmp_path / "index").rglob("*.run"))
    assert run_files
    for run_file in run_files:
        raw = bytearray(run_file.read_bytes())
        raw[-5] ^= 0xFF  # an entry's byte: its block's CRC no longer holds
        run_file.write_bytes(bytes(raw))
    runs.HEADERS.clear()
    runs.ENTRIES.clear()
    fresh = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=8)
    found, read = ask(fresh, STRING, (1,), files, keys)
    assert found == brute(files, keys)
    assert (read, fresh.counters.rebuilds) == (4, 1)
    for f in (tmp_path / "index").rglob("*.run"):
        f.unlink()
    runs.HEADERS.clear()
    runs.ENTRIES.clear()
    found, _ = ask(fresh, STRING, (1,), files, keys)
    assert found == brute(files, keys)
    assert fresh.counters.rebuilds == 2


@pytest.mark.parametrize("whole_entries", [0, 10**9])
def test_merges_drop_the_entries_of_files_that_left_and_delete_unused_runs(tmp_path: Path, whole_entries: int) -> None:
    idx = index(tmp_path, partitions=4, fan_in=2, whole_entries=whole_entries)
    files = []
    for n in range(6):
        columns = {"id": list(range(n * 10, n * 10 + 10))}
        files.append((write(tmp_path, f"f{n}", LONG, columns), columns))
        live = {m.path for m, _ in files[-2:]}  # only the last two stay live
        ask(idx, LONG, (1,), files[-2:], {"id": [0]}, live)
    key = IndexKey.of(LONG, (1,))
    assert key is not None
    stats = idx.stats(key)
    assert stats["covered_files"] == 2
    assert stats["entries"] < 60  # entries of the files that left were merged away
    on_disk = {str(p) for p in (tmp_path / "index").rglob("*.run")}
    assert on_disk == {r.path for r in idx.manifest(key).runs}


def test_decimal_uuid_binary_timestamp_and_nested_keys(tmp_path: Path) -> None:
    schema = schema_of(
        NestedField(1, "d", DecimalType(10, 2), required=False),
        NestedField(2, "u", UUIDType(), required=False),
        NestedField(5, "b", BinaryType(), required=False),
        NestedField(6, "t", TimestampType(), required=False),
    )
    import datetime as dt

    d = [decimal.Decimal("1.50"), None, decimal.Decimal("-2.00"), decimal.Decimal("1.50")]
    u = [uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes, None, uuid.UUID(int=1).bytes]
    b = [b"x", b"", None, b"x"]
    t = [dt.datetime(2026, 1, 1), None, dt.datetime(2026, 1, 2), dt.datetime(2026, 1, 1)]
    columns = {"d": d, "u": u, "b": b, "t": t}
    meta = write(tmp_path, "a", schema, columns)
    keys = {
        "d": [decimal.Decimal("1.50"), None],
        "u": [uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes],
        "b": [b"x", b""],
        "t": [dt.datetime(2026, 1, 1), None],
    }
    found, _ = ask(index(tmp_path), schema, (1, 2, 5, 6), [(meta, columns)], keys)
    assert found == {meta.path: [0, 1, 3]}
    nested = {"s": [{"id": 1}, {"id": None}, None, {"id": 1}]}
    meta = write(tmp_path, "n", NESTED, nested)
    # A null struct and a struct holding a null id are different keys.
    found, _ = ask(index(tmp_path / "n"), NESTED, (4,), [(meta, nested)], {"s": [{"id": None}]})
    assert found == {meta.path: [1]}


def test_the_key_index_routes_through_the_partitioned_index(tmp_path: Path) -> None:
    columns = {"id": [3, 1, 2]}
    meta = write(tmp_path, "a", LONG, columns)
    key_index = KeyIndex(partitions=4)
    key_index.partitioned = PartitionedIndex(IO, str(tmp_path / "index"), partitions=4)
    found, read = key_index.match(IO, LONG, {(1,): [(meta, deleted(LONG, (1,), {"id": [2, 3]}))]}, None)
    assert ({p: np.concatenate(v).tolist() for p, v in found.items()}, read) == ({meta.path: [0, 2]}, 1)
    assert key_index.files == 0  # nothing held in the driver's index
    # The files retain() keeps are the live ones the partitioned index keeps covering.
    other = write(tmp_path, "b", LONG, {"id": [7]})
    key_index.retain({other.path}, set(), LONG.schema_id)
    key_index.match(IO, LONG, {(1,): [(other, deleted(LONG, (1,), {"id": [7]}))]}, None)
    key = IndexKey.of(LONG, (1,))
    assert key is not None and key_index.partitioned.stats(key)["covered_files"] == 1


def test_a_corrupt_manifest_or_pointer_starts_the_index_again(tmp_path: Path) -> None:
    columns = {"id": [4, 8, 15, 16, 23, 42]}
    meta = write(tmp_path, "a", LONG, columns)
    idx = index(tmp_path)
    assert ask(idx, LONG, (1,), [(meta, columns)], {"id": [15]}) == ({meta.path: [2]}, 1)
    manifests = list((tmp_path / "index").rglob("manifest-*.json"))
    assert len(manifests) == 1  # the previous one is deleted once the pointer moves
    manifests[0].write_text(manifests[0].read_text().replace('"bits"', '"bats"'))
    fresh = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=2)
    assert ask(fresh, LONG, (1,), [(meta, columns)], {"id": [42, 4]}) == ({meta.path: [0, 5]}, 1)
    assert fresh.counters.rebuilds == 1
    pointer = next((tmp_path / "index").rglob("current"))
    pointer.write_text("not json")
    again = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=2)
    assert ask(again, LONG, (1,), [(meta, columns)], {"id": [23]}) == ({meta.path: [4]}, 1)


def test_orphan_removal_keeps_the_current_manifest_and_its_runs(tmp_path: Path) -> None:
    from iceberg_sink.keyindex.manifest import current_files, is_pointer

    columns = {"id": list(range(10))}
    meta = write(tmp_path, "a", LONG, columns)
    idx = index(tmp_path)
    ask(idx, LONG, (1,), [(meta, columns)], {"id": [1]})
    listed = [str(p) for p in (tmp_path / "index").rglob("*") if p.is_file()]
    pointers = [p for p in listed if is_pointer(p)]
    assert len(pointers) == 1
    assert current_files(IO, pointers[0], listed) == set(listed)
    assert not is_pointer(str(tmp_path / "index" / "partitioned" / "x" / "runs" / "current"))
    Path(pointers[0]).write_text("[")
    assert current_files(IO, pointers[0], listed) == set(listed)  # unreadable: everything kept


def test_one_index_per_location_in_a_process(tmp_path: Path) -> None:
    """A table's v3 committer and its conversion share one index: two writers of one folder would
    each delete runs the other's manifest names."""
    import gc

    first = PartitionedIndex.shared(IO, str(tmp_path / "a" / "partitioned"), None, 4)
    assert PartitionedIndex.shared(IO, str(tmp_path / "a" / "partitioned/"), None, 16) is first
    other = PartitionedIndex.shared(IO, str(tmp_path / "b" / "partitioned"), None, 4)
    assert other is not first
    location = first.location
    del first
    gc.collect()
    assert PartitionedIndex.shared(IO, location, None, 8).partitions == 8  # none alive: a new one


def test_a_manifest_that_cannot_be_saved_keeps_the_answer_and_the_stored_index(tmp_path: Path) -> None:
    idx = index(tmp_path, fan_in=2, whole_entries=10**9)
    files: list[tuple[DataFileMeta, dict[str, list[Any]]]] = []

    def checkpoint(n: int, into: PartitionedIndex) -> tuple[dict[str, list[int]], int]:
        columns = {"id": list(range(n * 10, n * 10 + 10))}
        files.append((write(tmp_path, f"f{n}", LONG, columns), columns))
        keys = {"id": [k for _, c in files for k in c["id"][::3]]}
        found, read = ask(into, LONG, (1,), files, keys)
        assert found == brute(files, keys)
        return found, read

    checkpoint(0, idx)
    checkpoint(1, idx)
    pointer = next((tmp_path / "index").rglob("current"))
    saved = pointer.read_text()
    pointer.unlink()
    pointer.mkdir()  # the pointer cannot be written (root ignores permissions; a folder stops it)
    for n in range(2, 5):  # merges happen meanwhile (fan_in 2): the stored manifest's runs must stay
        checkpoint(n, idx)
    pointer.rmdir()
    pointer.write_text(saved)
    fresh = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=2, whole_entries=10**9)
    keys = {"id": [k for _, c in files for k in c["id"]]}
    found, read = ask(fresh, LONG, (1,), files, keys)
    assert found == brute(files, keys)
    assert (read, fresh.counters.rebuilds) == (3, 0)  # the files after the failure; nothing lost


def test_a_lookup_no_run_can_answer_runs_no_task(tmp_path: Path) -> None:
    """On a cluster every task is a Spark job's: keys whose partitions hold no run ask nothing."""
    runner = LocalRunner()
    idx = PartitionedIndex(IO, str(tmp_path / "index" / "partitioned"), runner, partitions=16)
    meta = write(tmp_path, "a", LONG, {"id": [1]})
    ask(idx, LONG, (1,), [(meta, {"id": [1]})], {"id": [1]})  # one run, in key 1's partition only
    before = runner.tasks
    found, read = ask(idx, LONG, (1,), [(meta, {"id": [1]})], {"id": list(range(100, 110))})
    assert (found, read, runner.tasks - before) == ({meta.path: []}, 0, 0)


@pytest.mark.parametrize("point", [_faults.INDEX_RUNS_WRITTEN, _faults.INDEX_MANIFEST_WRITTEN])
def test_a_driver_dying_inside_a_save_leaves_only_orphans(tmp_path: Path, point: str) -> None:
    """Killed after new runs (or the new manifest) are written and before the pointer moves: the
    stored index is the one before, right about what it covers; the new files are orphans that orphan
    removal takes; a new driver catches up and answers right."""
    from iceberg_sink.keyindex.manifest import current_files, is_pointer

    asked = []
    for n in range(5):
        columns = {"id": list(range(n * 10, n * 10 + 10))}
        asked.append((write(tmp_path, f"f{n}", LONG, columns), columns))
    keys = {"id": [3, 17, 44, 45]}
    idx = index(tmp_path, fan_in=2)
    assert ask(idx, LONG, (1,), asked[:2], keys)[0] == brute(asked[:2], keys)
    stored = {str(p) for p in (tmp_path / "index").rglob("*") if p.is_file()}

    def die(at: str, checkpoint: int) -> None:
        if at == point:
            raise KeyboardInterrupt(f"driver killed at {at}")  # not an Exception: nothing catches it

    _faults.install(die)
    try:
        with pytest.raises(KeyboardInterrupt):
            ask(idx, LONG, (1,), asked, keys)  # catches up f2..f4 and merges: a save
    finally:
        _faults.clear()
    listed = [str(p) for p in (tmp_path / "index").rglob("*") if p.is_file()]
    assert set(listed) > stored  # the dead driver's runs (and manifest) are there, named by nothing current
    (pointer,) = [p for p in listed if is_pointer(p)]
    assert current_files(IO, pointer, listed) == stored
    runs.HEADERS.clear()
    runs.ENTRIES.clear()
    restarted = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=2)
    found, read = ask(restarted, LONG, (1,), asked, keys)
    assert (found, read) == (brute(asked, keys), 3)  # the files the stored index did not cover


@pytest.mark.parametrize(
    "lengths",
    [[16] * 7, [16] * 7 + [5], [1], [3, 3, 1], [4, 9, 2, 16], [16, 16, 20]],
    ids=["full", "partial last", "one word", "tiny", "uneven", "longer last"],
)
def test_block_checksums_are_each_words_position_weighted_sum(lengths: list[int]) -> None:
    r = random.Random(len(lengths))
    data = r.randbytes(4 * sum(lengths))
    expected_sums, at = [], 0
    for n in lengths:
        words = [int.from_bytes(data[4 * (at + i) : 4 * (at + i + 1)], "little") for i in range(n)]
        expected_sums.append(sum(w * (i + 1) for i, w in enumerate(words)) % 2**64)
        at += n
    assert runs._block_sums(data, np.array(lengths)).tolist() == expected_sums


@pytest.mark.parametrize("width", [runs._EXACT_WIDTH, runs._EXACT_WIDTH + 1, 4096])
def test_block_checksums_are_exact_for_wide_blocks_of_large_words(width: int) -> None:
    """Blocks up to ``_EXACT_WIDTH`` words are summed in float64: exact only while every sum stays
    below 2^53. Words near 2^32 in blocks at, just past and far past that width: past it, a float sum
    of 4096 such words (about 2^55) would lose its low bits."""
    r = random.Random(width)
    words = [[r.randrange(2**31, 2**32) for _ in range(width)] for _ in range(3)]
    data = b"".join(w.to_bytes(4, "little") for block in words for w in block)
    expected = [sum(w * (i + 1) for i, w in enumerate(block)) % 2**64 for block in words]
    assert runs._block_sums(data, np.array([width] * 3)).tolist() == expected


def test_runs_a_lookup_reads_most_of_are_kept_whole_and_sparse_ones_are_not(tmp_path: Path) -> None:
    """A large index's lookup needs a block here and there of its large runs but nearly every block of
    the small runs of the last checkpoints (they span every partition, and their blocks lie closer
    than a read coalesces): those are decoded whole and kept in the run cache, however large the
    index, so the next lookup reads them no more; the large runs are not kept."""
    rng = np.random.default_rng(5)

    def run(name: str, n: int) -> tuple[str, np.ndarray]:
        entries = np.empty(n, runs.DTYPES[runs.INT])
        entries["s"] = np.sort(rng.choice(2**62, n, replace=False)).astype(np.uint64)
        entries["f"], entries["p"] = 0, np.arange(n)
        path = str(tmp_path / name)
        runs.write_run(IO, path, runs.INT, entries, [(f"{name}.parquet", 1, n)], 32)
        return path, entries

    (small_path, small), (large_path, large) = run("small.run", 3_000), run("large.run", 300_000)
    runs.HEADERS.clear()
    runs.ENTRIES.clear()
    keys = runs.distinct_hashes(np.concatenate([small[::3], large[::3000]])[["s"]])
    found = runs.lookup(IO, [(small_path, keys), (large_path, keys)])
    assert [len(hits) for hits, _ in found] == [1_000, 100]
    assert runs.ENTRIES.get(small_path) is not None  # 1,000 keys in 94 blocks: every block needed
    assert runs.ENTRIES.get(large_path) is None  # 100 keys in 9,375 blocks
    Path(small_path).unlink()  # kept: the next lookup does not read the file
    again = runs.lookup(IO, [(small_path, keys)])
    assert (again[0][0] == found[0][0]).all()
    runs.ENTRIES.clear()


def test_partitions_that_merge_the_same_runs_merge_in_one_task(tmp_path: Path) -> None:
    """Catch-up runs span every partition, so every partition merges the same ones: one merge task
    and one run for them all (a run per partition made a 10M-row index write 16 runs a checkpoint)."""
    idx = index(tmp_path, partitions=8, fan_in=2, whole_entries=0)  # merged by partition
    files: list[tuple[DataFileMeta, dict[str, list[Any]]]] = []
    keys = {"id": [1, 250, 777, 1999]}
    for n in range(10):
        columns = {"id": list(range(n * 200, n * 200 + 200))}
        files.append((write(tmp_path, f"f{n}", LONG, columns), columns))
        written = idx.counters.runs_written
        found, _ = ask(idx, LONG, (1,), files, keys)
        assert found == brute(files, keys)
        assert idx.counters.runs_written - written in (1, 2)  # the catch-up's run, and a merge's
    assert idx.counters.runs_merged >= 8
    key = IndexKey.of(LONG, (1,))
    assert key is not None
    assert idx.stats(key)["runs"] <= 3  # runs serving all eight partitions, not eight of each


@pytest.mark.parametrize("whole_entries", [0, 10**9])
def test_partitions_split_as_the_index_grows_and_merges_rewrite_their_runs_half_by_half(
    tmp_path: Path, whole_entries: int
) -> None:
    """A partition past ``partition_max_entries`` splits every partition in two, in the manifest
    only: no run is rewritten then, each half is served by its parent's runs, and lookups stay exact
    before and after later merges rewrite them; a restarted driver reads the split index as it is."""
    idx = index(tmp_path, partitions=1, fan_in=2, whole_entries=whole_entries, partition_max_entries=50)
    key = IndexKey.of(LONG, (1,))
    assert key is not None
    r = random.Random(7)
    files: list[tuple[DataFileMeta, dict[str, list[Any]]]] = []
    sizes = []
    for n in range(12):
        columns = {"id": [r.randrange(10**12) for _ in range(40)]}
        files.append((write(tmp_path, f"f{n}", LONG, columns), columns))
        keys = {"id": [k for _, c in r.sample(files, min(3, len(files))) for k in c["id"][::7]] + [-1]}
        before = idx.manifest(key)
        found, _ = ask(idx, LONG, (1,), files, keys)
        assert found == brute(files, keys), n
        after = idx.manifest(key)
        sizes.append(after.partitions)
        if after.partitions > before.partitions:
            assert max(after.partition_entries()) <= 50
            # Every run of a half reaches into it; every entry's partition is served by its run.
            for b, indexes in enumerate(after.slices):
                lo, hi = after.bounds(b)
                assert all(after.runs[i].lo <= hi and after.runs[i].hi >= lo for i in indexes)
    assert idx.counters.splits >= 3 and sizes == sorted(sizes) and sizes[-1] >= 8, sizes
    assert sum(c for _, _, c in idx.manifest(key).covered) == 12 * 40
    on_disk = {str(p) for p in (tmp_path / "index").rglob("*.run")}
    assert on_disk == {run.path for run in idx.manifest(key).runs}
    again = PartitionedIndex(IO, idx.location, partitions=1, block=3, fan_in=2, whole_entries=whole_entries)
    keys = {"id": [k for _, c in files for k in c["id"][::5]]}
    assert ask(again, LONG, (1,), files, keys) == (brute(files, keys), 0)
    assert again.manifest(key).partitions == sizes[-1]


def test_a_split_serves_each_half_with_the_runs_that_reach_into_it() -> None:
    key = IndexKey.of(LONG, (1,))
    assert key is not None
    half = 2**63
    manifest = Manifest.empty(key, 2, 3).with_runs(
        [
            RunFile("low", 10, 100, 5, half // 4),  # the first quarter of the hashes only
            RunFile("all", 40, 400, 0, 2**64 - 1),  # every partition
            RunFile("high", 20, 200, half + 1, 2**64 - 10),  # the upper half
        ],
        [],
    )
    assert manifest.slices == ((0, 1), (1, 2))
    split = manifest.split()
    assert split.partitions == 4
    assert split.slices == ((0, 1), (1,), (1, 2), (1, 2))
    assert split.partition_entries() == pytest.approx([10 + 10, 10, 10 + 10, 10 + 10])
    assert [split.bounds(b) for b in (0, 3)] == [(0, 2**62 - 1), (3 * 2**62, 2**64 - 1)]


def test_a_catch_up_of_several_runs_leaves_one_run_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first build cut into several tasks writes several runs, each spanning every partition: they
    are merged together at once, so a lookup reads one run per partition, not one per build task
    (three build runs under the fan-in were never merged: a 10M-row index read three blocks a key)."""
    from iceberg_sink.keyindex import partitioned

    monkeypatch.setattr(partitioned, "ROWS_PER_TASK", 20)  # two 10-row files a build task
    idx = index(tmp_path, partitions=4, fan_in=4, whole_entries=0)
    files = []
    for n in range(6):
        columns = {"id": list(range(n * 10, n * 10 + 10))}
        files.append((write(tmp_path, f"f{n}", LONG, columns), columns))
    keys = {"id": [0, 13, 27, 41, 58]}
    found, read = ask(idx, LONG, (1,), files, keys)
    assert (found, read) == (brute(files, keys), 6)
    key = IndexKey.of(LONG, (1,))
    assert key is not None
    manifest = idx.manifest(key)
    assert idx.counters.runs_written > 3  # three build runs, then their merge
    assert all(len(s) == 1 for s in manifest.slices), manifest.slices
    again = PartitionedIndex(IO, idx.location, partitions=4, block=3, fan_in=4, whole_entries=0)
    assert ask(again, LONG, (1,), files, keys) == (brute(files, keys), 0)


@pytest.mark.parametrize("where", ["local", "object storage"])
@pytest.mark.parametrize("keys", [100, 1_000, 10_000, 60_000])
def test_a_lookups_expected_bytes_are_the_bytes_it_reads(
    tmp_path: Path, keys: int, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weight that sends a lookup to the driver or the executors is the bytes ``_groups`` reads for
    uniform hashes (within a fifth), from keys a block each apart to keys that coalesce the whole run;
    a count of blocks alone took a first lookup of a 30M-row index (whole runs read) for a few MB."""
    monkeypatch.setattr(fetch, "remote", lambda path: where != "local")
    entries = 400_000
    e = np.empty(entries, runs.DTYPES[runs.DIGEST])
    rng = np.random.default_rng(keys)
    e["s"], e["t"] = rng.integers(0, 2**63, entries, dtype=np.uint64), rng.integers(0, 2**63, entries, dtype=np.uint64)
    e["f"], e["p"] = 0, np.arange(entries)
    path = str(tmp_path / "a.run")
    run = runs.write_run(IO, path, runs.DIGEST, runs.sort_entries(e), [("f", 1, entries)], 32)
    header = runs.read_header(IO, path)
    wanted = np.sort(rng.integers(0, 2**63, keys, dtype=np.uint64))
    _, _, spans = runs._groups(path, header, runs._blocks_for(header.firsts, wanted))
    read = sum(size for _, size in spans)
    data_bytes = run.nbytes - header.data_offset
    expected = runs.expected_read_bytes(path, data_bytes, keys, 32 * header.dtype.itemsize)
    assert 0.8 * read <= expected <= 1.2 * read, (read, expected, data_bytes)


class LookupWeights(LocalRunner):
    """Runs in this process and records the weight of every lookup."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[int] = []

    def run(self, task: Any, items: Any, io: FileIO, location: str, weight: int) -> Any:
        if task.__name__ == "_lookup":
            self.weights.append(weight)
        return super().run(task, items, io, location, weight)


def test_the_runner_is_told_the_bytes_a_lookup_reads(tmp_path: Path) -> None:
    """A lookup's weight, which decides where it runs, grows to the run's size when its keys are
    dense enough to read all of it, not with the blocks they fall in alone."""
    recording = LookupWeights()
    weights = recording.weights
    idx = index(tmp_path, partitions=1, block=4, runner=recording, whole_entries=0)
    columns = {"id": list(range(200_000))}
    files = [(write(tmp_path, "f0", LONG, columns), columns)]
    few, dense = {"id": [5, 100_000]}, {"id": list(range(0, 200_000, 20))}
    assert ask(idx, LONG, (1,), files, few)[0] == brute(files, few)
    assert ask(idx, LONG, (1,), files, dense)[0] == brute(files, dense)
    run_bytes = sum(r.nbytes for r in idx.manifest(IndexKey.of(LONG, (1,))).runs)  # type: ignore[arg-type]
    assert weights[0] < 2_000 and weights[1] > run_bytes // 2, (weights, run_bytes)


def test_a_run_held_whole_weighs_nothing_so_its_lookups_stay_in_the_driver(tmp_path: Path) -> None:
    """A dense lookup keeps its run whole in this process; the next lookup of as many keys reads
    nothing and is weighed so (before: the run's bytes again, which sent the steady lookups of a
    30M-row v2 table to a Spark job of ~0.1 s per checkpoint though the driver held every run they read)."""
    recording = LookupWeights()
    weights = recording.weights
    runs.ENTRIES.clear()
    idx = index(tmp_path, partitions=1, block=4, runner=recording, whole_entries=0)
    columns = {"id": list(range(200_000))}
    files = [(write(tmp_path, "f0", LONG, columns), columns)]
    dense, other = {"id": list(range(0, 200_000, 8))}, {"id": list(range(3, 200_000, 8))}  # every other block
    assert ask(idx, LONG, (1,), files, dense)[0] == brute(files, dense)
    assert ask(idx, LONG, (1,), files, other)[0] == brute(files, other)
    run_bytes = sum(r.nbytes for r in idx.manifest(IndexKey.of(LONG, (1,))).runs)  # type: ignore[arg-type]
    assert weights[0] > run_bytes // 2 and weights[1] == 0, (weights, run_bytes)
    runs.ENTRIES.clear()
    assert ask(idx, LONG, (1,), files, other)[0] == brute(files, other)
    assert weights[2] > run_bytes // 2, weights  # not held any more: weighed as read again

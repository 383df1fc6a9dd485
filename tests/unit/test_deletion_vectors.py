"""Deletion vectors (format v3): the ``deletion-vector-v1`` blob and the Puffin files that hold them.

Round trips through our own reader, checks that corruption is refused, and PyIceberg 0.12's own
Puffin/DV reader (the one its scans use) reading our files. Iceberg Java reading ours and us reading
Java's: tests/interop/test_deletion_vectors_java.py.
"""

from __future__ import annotations

import itertools
import json
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io import FileIO
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.io.pyarrow import PyArrowFileIO, _read_deletes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile
from pyroaring import BitMap, BitMap64

from iceberg_sink import CorruptFileError
from iceberg_sink._iceberg import deletion_vectors as dv
from iceberg_sink._iceberg.puffin import MAGIC as PUFFIN_MAGIC
from iceberg_sink._iceberg.puffin import Blob, read_footer, write_puffin

B = 1 << 32  # one bucket of the 64-bit bitmap
CASES: dict[str, np.ndarray] = {
    "empty": np.empty(0, np.int64),
    "single zero": np.array([0]),
    "single": np.array([123_456]),
    "dense run": np.arange(0, 200_000),
    "sparse": np.arange(7, 5_000_000, 997),
    "every other row": np.arange(0, 300_000, 2),  # bitset containers: no run pays off
    "bucket edges": np.array([B - 1, B, B + 1, 2 * B - 1]),
    "several buckets with gaps": np.concatenate(
        [np.arange(10), np.arange(3 * B, 3 * B + 70_000), [7 * B + 5, 40 * B, 40 * B + 2**31]]
    ),
    "largest position": np.array([0, dv.MAX_POSITION]),
    "1M positions": np.concatenate([np.arange(0, 600_000), np.arange(1_000_000, 1_800_000, 2)]),
}


def _positions(values: np.ndarray) -> np.ndarray:
    return np.unique(np.asarray(values, dtype=np.int64))


def _frame(vector: bytes) -> bytes:
    """A blob around ``vector`` with a correct length, magic and CRC (for hand-made vectors)."""
    body = dv.MAGIC + vector
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


@pytest.fixture
def io() -> FileIO:
    return PyArrowFileIO()


@pytest.mark.parametrize("name", list(CASES))
def test_blob_round_trip(name: str) -> None:
    want = _positions(CASES[name])
    blob = dv.serialize([want])
    got = dv.deserialize(blob)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    # The framing of the spec: length = magic + vector, then the magic, CRC-32 over magic + vector.
    assert int.from_bytes(blob[:4], "big") == len(blob) - 8
    assert blob[4:8] == bytes.fromhex("D1D33964")
    assert int.from_bytes(blob[-4:], "big") == zlib.crc32(blob[4:-4])


@pytest.mark.parametrize("name", list(CASES))
def test_vector_is_croaring_64_bit_portable_format(name: str) -> None:
    """The vector equals CRoaring's own 64-bit portable serialization (``roaring64``, pyroaring's
    BitMap64), run-optimized: an independent writer of the RoaringFormatSpec's 64-bit extension."""
    want = _positions(CASES[name])
    reference = BitMap64(want.tolist())
    reference.run_optimize()
    assert dv.serialize([want])[8:-4] == reference.serialize()


def test_unsorted_duplicated_input_from_several_arrays() -> None:
    blob = dv.serialize([pa.array([5, 1, 5], pa.int64()), np.array([3 * B, 1, 0])])
    np.testing.assert_array_equal(dv.deserialize(blob), [0, 1, 5, 3 * B])


def test_runs_are_written_as_run_containers() -> None:
    blob = dv.serialize([np.arange(0, 1_000_000)])
    # bucket count (8) + key (4) + a bitmap with the run cookie 12347: 16 containers of one run.
    cookie = int.from_bytes(blob[8 + 12 : 8 + 16], "little")
    assert cookie & 0xFFFF == 12347
    assert len(blob) < 300  # 1M deleted rows in one run: about 14 bytes per 65,536 (a bitset: 8 KiB)


def test_reads_bitmaps_without_runs_and_empty_buckets_as_java_writes_them() -> None:
    """Java's RoaringPositionBitmap writes an (empty) bitmap for every key below the largest, and
    a bitmap that was never run-optimized has the no-run cookie 12346 with an offset header."""
    low = BitMap([1, 2, 3, *range(70_000, 80_000, 2)])  # array and bitset containers, no runs
    vector = (
        (3).to_bytes(8, "little")
        + (0).to_bytes(4, "little")
        + BitMap().serialize()
        + (1).to_bytes(4, "little")
        + low.serialize()
        + (2).to_bytes(4, "little")
        + BitMap([9]).serialize()
    )
    assert int.from_bytes(low.serialize()[:4], "little") == 12346
    want = [B + p for p in low] + [2 * B + 9]
    np.testing.assert_array_equal(dv.deserialize(_frame(vector)), want)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 70_000),
            st.integers(0, 3 * B + 5),
            st.integers(0, dv.MAX_POSITION),
            st.sampled_from([B - 1, B, 65_535, 65_536, dv.MAX_POSITION]),
        ),
        max_size=300,
    ),
    st.lists(st.tuples(st.integers(0, 3 * B), st.integers(1, 70_000)), max_size=3),
)
def test_round_trip_property(points: list[int], runs: list[tuple[int, int]]) -> None:
    values = np.array(points + [p for start, n in runs for p in range(start, start + n)], dtype=np.int64)
    want = _positions(values)
    blob = dv.serialize([values])
    np.testing.assert_array_equal(dv.deserialize(blob), want)
    reference = BitMap64(want.tolist())
    reference.run_optimize()
    assert blob[8:-4] == reference.serialize()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 5, 65_535, 65_536, B - 1, B, B + 3, 7 * B, dv.MAX_POSITION]), max_size=8),
    st.lists(st.tuples(st.integers(0, 3 * B), st.integers(1, 5_000)), max_size=3),
    st.lists(st.integers(0, 4 * B), max_size=200),
)
def test_adding_to_a_vector_read_back_is_the_vector_of_all_its_positions(
    points: list[int], runs: list[tuple[int, int]], added: list[int]
) -> None:
    """A live DV gains a checkpoint's positions in its bitmaps (committer/vectors.py): the blob is the
    one a fresh vector of every position gives, byte for byte, and the vector read is unchanged."""
    old = np.array(points + [p for start, n in runs for p in range(start, start + n)], dtype=np.int64)
    read = dv.deserialize_vector(dv.serialize([old]))
    new = np.array(added, dtype=np.int64)
    merged = read.union([new, new[::-1]])
    everything = _positions(np.concatenate([old, new]))
    np.testing.assert_array_equal(merged.positions(), everything)
    assert len(merged) == len(everything)
    assert dv.serialize(merged) == dv.serialize([everything])
    np.testing.assert_array_equal(read.positions(), _positions(old))  # the vector read is unchanged
    assert dv.serialize(read) == dv.serialize([old])


def test_a_position_out_of_range_is_refused_when_added_to_a_vector() -> None:
    read = dv.deserialize_vector(dv.serialize([np.array([3])]))
    with pytest.raises(ValueError, match="positions from 0 to"):
        read.union([np.array([dv.MAX_POSITION + 1])])


@pytest.mark.parametrize("bad", [-1, dv.MAX_POSITION + 1, (2**31 - 1) << 32])
def test_positions_out_of_range_are_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="positions from 0 to"):
        dv.serialize([np.array([1, bad])])


# -- corruption ---------------------------------------------------------------------------------


def _blob() -> bytes:
    return dv.serialize([np.concatenate([np.arange(100), np.arange(5 * B, 5 * B + 10)])])


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1 :]


def test_a_flipped_bit_fails_the_crc() -> None:
    blob = _blob()
    for at in (8, 20, len(blob) - 10, len(blob) - 1):
        with pytest.raises(CorruptFileError, match="CRC-32 mismatch"):
            dv.deserialize(_flip(blob, at), where="dv of d1.parquet")


def test_a_wrong_magic_is_refused_even_with_a_matching_crc() -> None:
    blob = _blob()
    body = b"\xd1\xd3\x39\x65" + blob[8:-4]
    with pytest.raises(CorruptFileError, match="expected the deletion vector magic d1d33964, got d1d33965"):
        dv.deserialize(blob[:4] + body + zlib.crc32(body).to_bytes(4, "big"))


@pytest.mark.parametrize("cut", [1, 5, 40])
def test_a_truncated_or_overlong_blob_is_refused(cut: int) -> None:
    blob = _blob()
    with pytest.raises(CorruptFileError, match=r"bytes of vector and magic|too short"):
        dv.deserialize(blob[:-cut])
    with pytest.raises(CorruptFileError, match="bytes of vector and magic"):
        dv.deserialize(blob + bytes(cut))


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        ((2).to_bytes(8, "little") + (1).to_bytes(4, "little") + BitMap([1]).serialize(), "ends before its 2 buckets"),
        (
            (2).to_bytes(8, "little")
            + (1).to_bytes(4, "little")
            + BitMap([1]).serialize()
            + (1).to_bytes(4, "little")
            + BitMap([2]).serialize(),
            "bucket key 1 after 1",
        ),
        ((1).to_bytes(8, "little") + (2**31 - 1).to_bytes(4, "little") + BitMap([1]).serialize(), "at most"),
        ((1).to_bytes(8, "little") + (0).to_bytes(4, "little") + b"\x00\x00\x00\x00", "no Roaring bitmap cookie"),
        ((1).to_bytes(8, "little") + (0).to_bytes(4, "little") + BitMap([1, 2, 3]).serialize()[:-2], "runs past"),
        ((0).to_bytes(8, "little") + b"\x00", "1 bytes follow the vector's 0 buckets"),
    ],
)
def test_a_malformed_vector_is_refused(vector: bytes, message: str) -> None:
    with pytest.raises(CorruptFileError, match=message):
        dv.deserialize(_frame(vector))


# -- Puffin files -------------------------------------------------------------------------------

DATA_FILES = {
    "s3://bucket/db/t/data/00000-0-a.parquet": CASES["1M positions"],
    "file:/warehouse/db/t/data/x=1/00001-0-b.parquet": CASES["several buckets with gaps"],
    "/warehouse/db/t/data/00002-0-c.parquet": CASES["single zero"],
}


def _write(
    io: FileIO, tmp_path: Path, name: str = "dv.puffin", spaced: bool = False
) -> tuple[str, tuple[dv.DeletionVector, ...]]:
    path = str(tmp_path / name)
    return path, dv.write_deletion_vectors(io, path, {k: [v] for k, v in DATA_FILES.items()}, spaced)


@pytest.mark.parametrize("spaced", [False, True], ids=["side-by-side", "spaced"])
def test_puffin_file_layout_and_footer(io: FileIO, tmp_path: Path, spaced: bool) -> None:
    path, dvs = _write(io, tmp_path, spaced=spaced)
    raw = Path(path).read_bytes()
    assert raw[:4] == raw[-4:] == PUFFIN_MAGIC == b"PFA1"
    assert raw[-8:-4] == bytes(4)  # flags: footer not compressed
    payload_size = int.from_bytes(raw[-12:-8], "little")
    assert raw[-12 - payload_size - 4 : -12 - payload_size] == b"PFA1"
    footer = json.loads(raw[-12 - payload_size : -12])
    assert footer["properties"] == {"created-by": "iceberg-sink"}
    assert [b["properties"]["referenced-data-file"] for b in footer["blobs"]] == sorted(DATA_FILES)
    for blob, written in zip(footer["blobs"], dvs, strict=True):
        assert blob["type"] == "deletion-vector-v1"
        assert blob["fields"] == [2147483645]
        assert blob["snapshot-id"] == blob["sequence-number"] == -1
        assert "compression-codec" not in blob
        assert (blob["offset"], blob["length"]) == (written.content_offset, written.content_size_in_bytes)
        assert blob["properties"]["cardinality"] == str(written.cardinality)
    # Blobs follow the magic back to back, or each followed by one zero byte more than its own
    # length (all but the last); every DV of the file names the same file and size.
    assert dvs[0].content_offset == 4
    for before, after in itertools.pairwise(dvs):
        end = before.content_offset + before.content_size_in_bytes
        gap = before.content_size_in_bytes + 1 if spaced else 0
        assert after.content_offset == end + gap
        assert raw[end : after.content_offset] == bytes(gap)
    last = dvs[-1].content_offset + dvs[-1].content_size_in_bytes
    assert raw[last : last + 4] == b"PFA1"  # the footer right after the last blob
    assert {(d.path, d.file_size_in_bytes) for d in dvs} == {(path, len(raw))}
    assert read_footer(io, path)[0].property("referenced-data-file") == sorted(DATA_FILES)[0]


@pytest.mark.parametrize("spaced", [False, True], ids=["side-by-side", "spaced"])
@pytest.mark.parametrize("file_io", [PyArrowFileIO(), FsspecFileIO({})], ids=["pyarrow", "fsspec"])
def test_write_and_read_back_each_dv(file_io: FileIO, tmp_path: Path, spaced: bool) -> None:
    path = f"file://{tmp_path}/dv.puffin"
    dvs = dv.write_deletion_vectors(file_io, path, {k: [v] for k, v in DATA_FILES.items()}, spaced)
    for d in dvs:
        want = _positions(DATA_FILES[d.referenced_data_file])
        assert d.cardinality == len(want)
        got = dv.read_deletion_vector(file_io, d.path, d.content_offset, d.content_size_in_bytes, d.cardinality)
        np.testing.assert_array_equal(got, want)


def test_merging_a_previous_dv_into_a_new_one(io: FileIO, tmp_path: Path) -> None:
    (old,) = dv.write_deletion_vectors(io, str(tmp_path / "old.puffin"), {"d.parquet": [np.array([1, 5, 9])]})
    previous = dv.read_deletion_vector(io, old.path, old.content_offset, old.content_size_in_bytes, old.cardinality)
    (new,) = dv.write_deletion_vectors(io, str(tmp_path / "new.puffin"), {"d.parquet": [previous, np.array([2, 5])]})
    assert new.cardinality == 4
    got = dv.read_deletion_vector(io, new.path, new.content_offset, new.content_size_in_bytes, new.cardinality)
    np.testing.assert_array_equal(got, [1, 2, 5, 9])


def test_corrupted_dv_in_a_file_is_refused(io: FileIO, tmp_path: Path) -> None:
    path, dvs = _write(io, tmp_path)
    d = dvs[1]
    raw = bytearray(Path(path).read_bytes())
    raw[d.content_offset + 20] ^= 0xFF
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError, match=rf"deletion vector at .*dv.puffin@{d.content_offset}: CRC-32 mismatch"):
        dv.read_deletion_vector(io, path, d.content_offset, d.content_size_in_bytes)
    with pytest.raises(CorruptFileError, match="bytes of vector and magic"):  # a wrong offset or length
        dv.read_deletion_vector(io, path, d.content_offset, d.content_size_in_bytes - 1)


def test_cardinality_and_location_are_checked(io: FileIO, tmp_path: Path) -> None:
    path, dvs = _write(io, tmp_path)
    d = dvs[0]
    with pytest.raises(CorruptFileError, match="its manifest entry says"):
        dv.read_deletion_vector(io, path, d.content_offset, d.content_size_in_bytes, d.cardinality + 1)
    with pytest.raises(CorruptFileError, match="the file holds"):
        dv.read_deletion_vector(io, path, d.file_size_in_bytes - 10, 100)


def test_a_file_that_is_not_puffin_is_refused(io: FileIO, tmp_path: Path) -> None:
    path = tmp_path / "not.puffin"
    path.write_bytes(b"PAR1" + bytes(40) + b"PAR1")
    with pytest.raises(CorruptFileError, match="not a Puffin file"):
        read_footer(io, str(path))
    path.write_bytes(
        PUFFIN_MAGIC + PUFFIN_MAGIC + b"{}" + (2).to_bytes(4, "little") + b"\x01\x00\x00\x00" + PUFFIN_MAGIC
    )
    with pytest.raises(CorruptFileError, match="compressed"):
        read_footer(io, str(path))
    path.write_bytes(PUFFIN_MAGIC + PUFFIN_MAGIC + b"{}" + (2).to_bytes(4, "little") + bytes(4) + PUFFIN_MAGIC)
    with pytest.raises(CorruptFileError, match="malformed Puffin footer"):
        read_footer(io, str(path))


def test_nothing_to_write_is_refused(io: FileIO, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no deletion vector to write"):
        dv.write_deletion_vectors(io, str(tmp_path / "a.puffin"), {})
    with pytest.raises(ValueError, match="no position to delete in d2"):
        dv.write_deletion_vectors(
            io, str(tmp_path / "a.puffin"), {"d1": [np.array([1])], "d2": [np.empty(0, np.int64)]}
        )
    assert not (tmp_path / "a.puffin").exists()


def test_an_existing_file_is_not_overwritten(io: FileIO, tmp_path: Path) -> None:
    path, _ = _write(io, tmp_path)
    with pytest.raises(FileExistsError):
        dv.write_deletion_vectors(io, path, {"d": [np.array([1])]})


# -- PyIceberg 0.12's reader --------------------------------------------------------------------


@pytest.mark.parametrize("spaced", [False, True], ids=["side-by-side", "spaced"])
def test_pyiceberg_reads_our_puffin_files(io: FileIO, tmp_path: Path, spaced: bool) -> None:
    """PyIceberg's own Puffin and DV reader (pyiceberg.table.puffin / deletion_vector) gives the
    same positions for every blob, and so does ``_read_deletes``, the function its scans call for a
    PUFFIN delete file."""
    path, dvs = _write(io, tmp_path, spaced=spaced)
    puffin = PuffinFile(Path(path).read_bytes())
    assert {b.type for b in puffin.footer.blobs} == {"deletion-vector-v1"}
    read = {v.referenced_data_file: v.to_vector() for v in deletion_vectors_from_puffin_file(puffin)}
    assert set(read) == set(DATA_FILES)
    for data_file, positions in DATA_FILES.items():
        np.testing.assert_array_equal(read[data_file].to_numpy(), _positions(positions))
    for d in dvs:
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=d.path,
            file_format=FileFormat.PUFFIN,
            record_count=d.cardinality,
            file_size_in_bytes=d.file_size_in_bytes,
            referenced_data_file=d.referenced_data_file,
            content_offset=d.content_offset,
            content_size_in_bytes=d.content_size_in_bytes,
        )
        scanned = _read_deletes(io, delete_file)[d.referenced_data_file]
        np.testing.assert_array_equal(scanned.to_numpy(), _positions(DATA_FILES[d.referenced_data_file]))


# PyIceberg 0.12 keeps a Python list entry for every bucket key below the largest one (it fills the
# gaps with empty bitmaps): the largest position (key 2^31 - 2) would take billions of entries. Data
# files never hold more than 2^32 rows; the gaps case covers keys up to 40.
@pytest.mark.parametrize("name", [n for n in CASES if n not in ("empty", "largest position")])
def test_pyiceberg_reads_each_case(name: str, io: FileIO, tmp_path: Path) -> None:
    path = str(tmp_path / "dv.puffin")
    dv.write_deletion_vectors(io, path, {"d.parquet": [CASES[name]]})
    (vector,) = deletion_vectors_from_puffin_file(PuffinFile(Path(path).read_bytes()))
    np.testing.assert_array_equal(vector.to_vector().to_numpy(), _positions(CASES[name]))


@pytest.mark.parametrize(
    ("lengths", "gaps"), [([], []), ([7], [0]), ([7, 3], [8, 0]), ([12, 1_500_000, 40], [13, 1_500_001, 0])]
)
def test_spaced_gaps_keep_a_read_from_widening_over_the_next_blob(lengths: list[int], gaps: list[int]) -> None:
    assert dv.spaced_gaps(lengths) == gaps
    # A read of blob i widens to the next cached range only if it starts within len(i) bytes of its
    # end (DuckDB's ShouldExpandToFillGap): every later blob starts further away than that.
    offset, starts = 4, []
    for n, g in zip(lengths, gaps, strict=True):
        starts.append(offset)
        offset += n + g
    for i, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        assert all(later - (start + n) > n for later in starts[i + 1 :])


def test_puffin_gaps_must_match_the_blobs(io: FileIO, tmp_path: Path) -> None:
    blobs = [Blob(type="t", fields=(), data=b"ab"), Blob(type="t", fields=(), data=b"c")]
    for gaps in ([1], [1, -1]):
        with pytest.raises(ValueError, match="expected 2 counts of zero bytes"):
            write_puffin(io, str(tmp_path / "x.puffin"), blobs, created_by="t", gaps=gaps)
    assert not (tmp_path / "x.puffin").exists()

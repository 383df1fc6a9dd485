"""Iceberg Java reads the deletion vectors we write, and we read the ones Java writes.

Iceberg Java's own code, not a Spark reader: ``tests/interop/java/DvTool.java`` is compiled here
against ``iceberg-core`` of the reference version (1.9.2) and the newest release, fetched from Maven
Central with their dependencies (maven.py). It reads a DV as Java's delete loader does (the bytes at
the manifest entry's offset and length through ``PositionDeleteIndex.deserialize``, which checks
length, magic, CRC-32 and cardinality) after parsing the footer with ``PuffinReader``; it writes DVs
with the calls ``BaseDVFileWriter`` makes (``PositionDeleteIndex.serialize`` and a ``PuffinWriter``).
Committing DVs to a table (and Spark/DuckDB reading such a table) comes with the sink's v3 path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile

from iceberg_sink._iceberg import deletion_vectors as dv
from iceberg_sink._iceberg.puffin import read_blob, read_footer
from tests.interop.java_env import NEWEST_ICEBERG_VERSION, REFERENCE_ICEBERG_VERSION, core_jars

pytestmark = pytest.mark.interop

SOURCE = Path(__file__).parent / "java" / "DvTool.java"
B = 1 << 32
CASES: dict[str, np.ndarray] = {
    "data/single-zero.parquet": np.array([0]),
    "data/dense-run.parquet": np.arange(0, 200_000),
    "data/sparse.parquet": np.arange(7, 5_000_000, 997),
    "data/every-other.parquet": np.arange(0, 300_000, 2),
    "data/bucket-edges.parquet": np.array([B - 1, B, B + 1, 2 * B - 1]),
    "data/gaps.parquet": np.concatenate([np.arange(10), np.arange(3 * B, 3 * B + 70_000), [7 * B + 5, 40 * B]]),
    "s3://bucket/db/t/data/1M positions.parquet": np.concatenate(
        [np.arange(0, 600_000), np.arange(1_000_000, 1_800_000, 2)]
    ),
}


@dataclass(frozen=True)
class JavaDvTool:
    """DvTool compiled against one Iceberg Java version."""

    version: str
    class_path: str

    def run(self, *args: str) -> list[dict[str, Any]]:
        proc = subprocess.run(
            ["java", "-Xmx1g", "-cp", self.class_path, "DvTool", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, f"Iceberg Java {self.version} DvTool {args[0]} failed:\n{proc.stderr[-4000:]}"
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    def read(self, puffin: Path, out: Path) -> list[tuple[dict[str, Any], np.ndarray]]:
        out.mkdir(parents=True, exist_ok=True)
        return [
            (b, np.fromfile(out / f"{b['index']}.pos", dtype="<i8")) for b in self.run("read", str(puffin), str(out))
        ]

    def write(self, puffin: Path, positions: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        args = [str(puffin)]
        for i, (data_file, pos) in enumerate(positions.items()):
            pos_file = puffin.parent / f"{puffin.name}.{i}.pos"
            np.asarray(pos, dtype="<i8").tofile(pos_file)
            args += [data_file, str(pos_file)]
        return self.run("write", *args)


@pytest.fixture(scope="session", params=[REFERENCE_ICEBERG_VERSION, NEWEST_ICEBERG_VERSION])
def java_dv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> JavaDvTool:
    version = str(request.param)
    assert shutil.which("javac") and shutil.which("java"), "a JDK (java and javac) is needed for the Java DV checks"
    jars = core_jars(version)
    classes = tmp_path_factory.mktemp(f"dvtool-{version}")
    jar_path = ":".join(str(j) for j in jars)
    subprocess.run(
        ["javac", "-nowarn", "-cp", jar_path, "-d", str(classes), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return JavaDvTool(version=version, class_path=f"{classes}:{jar_path}")


def _want(values: np.ndarray) -> np.ndarray:
    return np.unique(np.asarray(values, dtype=np.int64))


@pytest.mark.parametrize("spaced", [False, True], ids=["side-by-side", "spaced"])
def test_java_reads_our_dvs(java_dv: JavaDvTool, tmp_path: Path, spaced: bool) -> None:
    """Iceberg Java's Puffin reader (its footer, each blob by offset) reads every DV of a file, the
    blobs side by side or spaced apart (zero bytes between them that no footer entry covers)."""
    path = tmp_path / "ours.puffin"
    ours = dv.write_deletion_vectors(PyArrowFileIO(), str(path), {k: [v] for k, v in CASES.items()}, spaced)
    if spaced:
        assert ours[1].content_offset > ours[0].content_offset + 2 * ours[0].content_size_in_bytes
    read = java_dv.read(path, tmp_path / "out")
    assert len(read) == len(ours)
    for written, (blob, positions) in zip(ours, read, strict=True):
        assert blob["type"] == "deletion-vector-v1"
        assert blob["fields"] == [2147483645]
        assert (blob["snapshot_id"], blob["sequence_number"]) == (-1, -1)
        assert blob["compression_codec"] is None
        assert (blob["offset"], blob["length"]) == (written.content_offset, written.content_size_in_bytes)
        assert blob["properties"] == {
            "referenced-data-file": written.referenced_data_file,
            "cardinality": str(written.cardinality),
        }
        assert blob["cardinality"] == written.cardinality
        np.testing.assert_array_equal(positions, _want(CASES[written.referenced_data_file]))


def test_we_read_java_dvs_and_merge_into_them(java_dv: JavaDvTool, tmp_path: Path) -> None:
    io = PyArrowFileIO()
    path = tmp_path / "java.puffin"
    written = java_dv.write(path, CASES)
    footer = read_footer(io, str(path))
    assert [(b.offset, b.length) for b in footer] == [(w["offset"], w["length"]) for w in written]
    for blob in written:
        data_file = blob["properties"]["referenced-data-file"]
        got = dv.read_deletion_vector(io, str(path), blob["offset"], blob["length"], blob["cardinality"])
        np.testing.assert_array_equal(got, _want(CASES[data_file]))
    # PyIceberg reads Java's file to the same positions.
    for vector in deletion_vectors_from_puffin_file(PuffinFile(path.read_bytes())):
        if vector.referenced_data_file != "data/gaps.parquet":  # PyIceberg: one list entry per key
            np.testing.assert_array_equal(vector.to_vector().to_numpy(), _want(CASES[vector.referenced_data_file]))

    # A new DV of a data file carries the previous one's positions (at most one DV per data file).
    merged_path = tmp_path / "merged.puffin"
    new_positions = {"data/sparse.parquet": np.array([1, 2, 8, 3 * B]), "data/gaps.parquet": np.array([11, 40 * B + 1])}
    previous = {
        b["properties"]["referenced-data-file"]: dv.read_deletion_vector(
            io, str(path), b["offset"], b["length"], b["cardinality"]
        )
        for b in written
    }
    dv.write_deletion_vectors(io, str(merged_path), {f: [previous[f], new] for f, new in new_positions.items()})
    for blob, positions in java_dv.read(merged_path, tmp_path / "merged"):
        data_file = blob["properties"]["referenced-data-file"]
        np.testing.assert_array_equal(positions, _want(np.concatenate([CASES[data_file], new_positions[data_file]])))


def test_same_blob_bytes_as_java(java_dv: JavaDvTool, tmp_path: Path) -> None:
    """Where Java writes no empty buckets (the keys run from 0 without a gap), its blob and ours are
    the same bytes: same framing, same run-optimized Roaring containers."""
    io = PyArrowFileIO()
    cases = {k: v for k, v in CASES.items() if k != "data/gaps.parquet"}
    path = tmp_path / "java.puffin"
    for blob in java_dv.write(path, cases):
        data_file = blob["properties"]["referenced-data-file"]
        java_bytes = read_blob(io, str(path), blob["offset"], blob["length"])
        assert dv.serialize([cases[data_file]]) == java_bytes, data_file


def test_java_refuses_a_corrupted_dv(java_dv: JavaDvTool, tmp_path: Path) -> None:
    """The Java check can fail: a DV whose stored position changed by one bit still parses as a
    Roaring bitmap, and Java's CRC-32 check refuses it (as ours does)."""
    path = tmp_path / "ours.puffin"
    (written,) = dv.write_deletion_vectors(PyArrowFileIO(), str(path), {"data/a.parquet": [np.array([123_456])]})
    raw = bytearray(path.read_bytes())
    raw[written.content_offset + written.content_size_in_bytes - 5] ^= 0x01  # the last byte of the value
    path.write_bytes(bytes(raw))
    with pytest.raises(AssertionError, match=r"(?i)crc"):
        java_dv.read(path, tmp_path / "out")

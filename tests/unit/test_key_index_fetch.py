"""Ranged reads of key index runs (keyindex/fetch.py): many ranges of many files read at once give
exactly the bytes one read after another would, whatever the stream kind; errors come back as
themselves."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io import FileIO
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from iceberg_sink.keyindex import fetch


@pytest.mark.parametrize("at_once", [True, False], ids=["threads (object storage)", "caller's thread (local)"])
@pytest.mark.parametrize("io", [PyArrowFileIO(), FsspecFileIO({})], ids=["pyarrow read_at", "fsspec seek+read"])
def test_every_range_of_every_file_comes_back_as_written(
    tmp_path: Path, io: FileIO, at_once: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "remote", lambda path: at_once)
    r = random.Random(7)
    contents = {}
    for i in range(5):
        data = r.randbytes(r.randrange(0, 200_000))
        (tmp_path / f"f{i}").write_bytes(data)
        contents[str(tmp_path / f"f{i}")] = data
    wanted = []
    for path, data in contents.items():
        ranges = []
        for _ in range(r.randrange(0, 300)):
            offset = r.randrange(0, len(data) + 10)
            ranges.append((offset, r.randrange(0, 5000)))  # some run past the end: fewer bytes back
        wanted.append((path, ranges))
    got = fetch.read_ranges(io, wanted)
    assert got == [[contents[p][o : o + n] for o, n in ranges] for p, ranges in wanted]


def test_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    (tmp_path / "there").write_bytes(b"x" * 100)
    with pytest.raises(FileNotFoundError):
        fetch.read_ranges(PyArrowFileIO(), [(str(tmp_path / "there"), [(0, 10)]), (str(tmp_path / "gone"), [(0, 1)])])


def test_each_keeps_order_runs_at_once_and_raises_the_first_error() -> None:
    seen: set[str] = set()

    def square(x: int) -> int:
        seen.add(threading.current_thread().name)
        time.sleep(0.0005)  # a read's wait: the other slices go on meanwhile
        return x * x

    assert fetch.each(square, list(range(1000))) == [x * x for x in range(1000)]
    assert len(seen) > 1  # more than one thread took part

    ended: list[int] = []

    def fail(x: int) -> int:
        if x == 0:
            raise ValueError("item 0")
        time.sleep(0.0005)
        ended.append(x)
        return x

    with pytest.raises(ValueError, match="item 0"):
        fetch.each(fail, list(range(1000)))
    # The other slices ran to their end before the error came back (read_ranges closes the
    # streams they read then); the failing slice stopped at its first item.
    slices = min(fetch.READ_THREADS, 1000)
    assert sorted(ended) == [x for x in range(1000) if x % slices != 0]


def test_a_request_is_worth_more_bytes_on_object_storage() -> None:
    for local in ("/tmp/x/run", "file:///tmp/x/run"):
        assert fetch.request_bytes(local) == fetch.LOCAL_REQUEST_BYTES and not fetch.remote(local)
    for remote in ("s3://bucket/run", "s3a://b/run", "gs://b/run", "abfss://c@a.dfs.core.windows.net/run"):
        assert fetch.request_bytes(remote) == fetch.REMOTE_REQUEST_BYTES and fetch.remote(remote)


def test_local_reads_stay_in_the_callers_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_bytes(bytes(range(256)) * 100)
    seen: set[str] = set()
    mapped = fetch._mapped

    def watched_map(file: str, ranges: Any) -> list[bytes]:
        seen.add(threading.current_thread().name)
        return mapped(file, ranges)

    monkeypatch.setattr(fetch, "_mapped", watched_map)
    io = FsspecFileIO({})
    original = io.new_input

    def watched(location: str) -> Any:
        seen.add(threading.current_thread().name)
        return original(location)

    io.new_input = watched  # type: ignore[method-assign]
    data = (tmp_path / "f").read_bytes()
    paths = [(str(tmp_path / "f"), [(i, 10) for i in range(0, 20000, 100)])] * 8
    expected = [[data[o : o + n] for o, n in ranges] for _, ranges in paths]
    for each_io in (PyArrowFileIO(), io):
        assert fetch.read_ranges(each_io, paths) == expected
    assert seen == {threading.current_thread().name}


def test_a_local_run_is_mapped_at_the_path_pyarrow_would_open(tmp_path: Path) -> None:
    """PyArrow's FileIO reads local ranges from a mapping (no stream opened), for plain paths and
    file URIs alike, names with spaces and percent signs included; other schemes are not mapped."""
    io = PyArrowFileIO()
    opened: list[str] = []
    original = io.new_input

    def watched(location: str) -> Any:
        opened.append(location)
        return original(location)

    io.new_input = watched  # type: ignore[method-assign]
    data = random.Random(3).randbytes(70_000)
    (tmp_path / "a run %41.run").write_bytes(data)
    (tmp_path / "empty.run").write_bytes(b"")
    ranges = [(0, 10), (69_990, 100), (80_000, 5), (12_345, 1280)]
    for path in (str(tmp_path / "a run %41.run"), f"file://{tmp_path}/a run %41.run"):
        assert fetch.read_ranges(io, [(path, ranges)]) == [[data[o : o + n] for o, n in ranges]]
        with original(path).open(seekable=True) as stream:  # the file PyArrow's FileIO itself opens
            assert stream.read() == data
    assert fetch.read_ranges(io, [(str(tmp_path / "empty.run"), ranges)]) == [[b"", b"", b"", b""]]
    assert opened == []
    assert fetch._local_paths(io, ["s3://bucket/run"]) is None
    assert fetch._local_paths(FsspecFileIO({}), [str(tmp_path / "empty.run")]) is None

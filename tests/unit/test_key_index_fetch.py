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


def test_local_reads_stay_in_the_callers_thread(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(range(256)) * 100)
    seen: set[str] = set()
    io = PyArrowFileIO()
    original = io.new_input

    def watched(location: str) -> Any:
        seen.add(threading.current_thread().name)
        return original(location)

    io.new_input = watched  # type: ignore[method-assign]
    paths = [(str(tmp_path / "f"), [(i, 10) for i in range(0, 20000, 100)])] * 8
    fetch.read_ranges(io, paths)
    assert seen == {threading.current_thread().name}

"""Reads of key index runs: many byte ranges of many files at once.

    runs.py: the ranges a lookup needs ──▶ read_ranges ──▶ every file opened once, all ranges read
                                                         by a pool of threads, in slices

A lookup of a large index reads about one small range per key it looks up (runs.py), so its time on
object storage is the number of requests times their latency unless the requests overlap: on a
loopback S3 (SeaweedFS), 10,000 keys against a 30M-row index took 9 s one request after another.
Two rules keep that down, both here:

- **Requests overlap.** On object storage the ranges of every run of a lookup are read by up to
  ``READ_THREADS`` threads (``read_at`` of PyArrow's files takes no lock and releases the GIL; a
  stream without it is read one range after another, under a lock per file). On a local file system
  the caller's thread reads them: threads gained nothing there (0.070 s against 0.072 s for the
  lookup above) and kept the memory of what they read in malloc arenas of their own.
- **A request costs bytes.** Two ranges closer than :func:`request_bytes` are read in one request
  (the bytes between them come along): about the bytes a request's latency could have moved, 16 KiB
  on a local file system, 1 MiB on object storage.
- **A local run is mapped, not read.** A PyArrow FileIO's local file is mapped into memory
  (``mmap``) and its ranges sliced out of the mapping: a lookup of 10,000 keys against a 30M-row
  index takes about 8,000 ranges, and a ``read_at`` call each cost more than the bytes did. Runs are
  written once and never changed in place, so a mapping cannot see a file shrink under it; the path
  is the one PyArrow's FileIO would open (its ``parse_location``).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

T = TypeVar("T")
R = TypeVar("R")

READ_THREADS = 16
LOCAL_REQUEST_BYTES = 16 * 1024
REMOTE_REQUEST_BYTES = 1024 * 1024
_LOCAL_SCHEMES = ("", "file")

_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def remote(path: str) -> bool:
    """Whether ``path`` is on object storage (or any store but the local file system)."""
    scheme = path.split("://", 1)[0] if "://" in path else ""
    return scheme not in _LOCAL_SCHEMES


def overlapped(paths: Iterable[str]) -> bool:
    """Whether reads of ``paths`` run on the pool: when any is remote (module docstring)."""
    return any(remote(p) for p in paths)


def request_bytes(path: str) -> int:
    """The bytes one read request is worth at ``path``: ranges closer than this are read as one."""
    return REMOTE_REQUEST_BYTES if remote(path) else LOCAL_REQUEST_BYTES


def _executor() -> ThreadPoolExecutor:
    """This process's read pool (a forked Spark worker makes its own: threads do not survive a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(READ_THREADS, thread_name_prefix="iceberg-sink-index-read"))
        return _pool[1]


def each(fn: Callable[[T], R], items: Sequence[T], at_once: bool = True) -> list[R]:
    """``[fn(item) for item in items]``; ``at_once``: the items cut into up to ``READ_THREADS``
    slices run at once (a slice per thread, not a future per item: a future costs more than a read
    from a local file). The first exception raised is raised here, once every slice has ended."""
    if len(items) < 2 or not at_once:
        return [fn(item) for item in items]
    slices = min(READ_THREADS, len(items))

    def run(index: int) -> list[R]:
        return [fn(item) for item in items[index::slices]]

    pool = _executor()
    futures = [pool.submit(run, index) for index in range(slices)]
    wait(futures)  # every slice ends before anything is raised: the caller may close what they read
    out: list[Any] = [None] * len(items)
    for index, future in enumerate(futures):
        out[index::slices] = future.result()
    return out


class _Locked:
    """``read_at`` for a stream that can only seek and read: one range after another."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def read_at(self, size: int, offset: int) -> bytes:
        with self.lock:
            self.stream.seek(offset)
            return bytes(self.stream.read(size))


def read_ranges(io: FileIO, wanted: Sequence[tuple[str, Sequence[tuple[int, int]]]]) -> list[list[bytes]]:
    """For each ``(path, [(offset, size), ...])`` of ``wanted``, the bytes of each range (fewer where
    the file ends first). Every file is opened once; every range of every file is read at once.

    Raises:
        FileNotFoundError: a file is missing (no other error hides it).
    """
    paths = [path for path, _ in wanted]
    at_once = overlapped(paths)
    local = _local_paths(io, paths) if not at_once else None
    if local is not None:
        return [_mapped(file, ranges) for file, (_, ranges) in zip(local, wanted, strict=True)]
    opened: list[Any] = [None] * len(paths)

    def open_one(index: int) -> None:
        opened[index] = io.new_input(paths[index]).open(seekable=True)

    try:
        each(open_one, range(len(paths)), at_once)
        readers = [s if hasattr(s, "read_at") else _Locked(s) for s in opened]
        jobs = [(i, offset, size) for i, (_, ranges) in enumerate(wanted) for offset, size in ranges]
        chunks: list[bytes] = each(lambda job: readers[job[0]].read_at(job[2], job[1]), jobs, at_once)
    finally:
        for stream in opened:
            if stream is not None:
                stream.close()
    out: list[list[bytes]] = []
    at = 0
    for _, ranges in wanted:
        out.append(chunks[at : at + len(ranges)])
        at += len(ranges)
    return out


def _local_paths(io: FileIO, paths: Sequence[str]) -> list[str] | None:
    """The local files PyArrow's FileIO would open for ``paths``, or None where it is another FileIO or
    any path is not a local file (the ranges are then read from streams)."""
    if not isinstance(io, PyArrowFileIO):
        return None
    out = []
    for path in paths:
        scheme, _, local = PyArrowFileIO.parse_location(path, io.properties)
        if scheme != "file":
            return None
        out.append(local)
    return out


def _mapped(file: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each range of the local ``file``, sliced out of a read-only mapping of it."""
    with open(file, "rb") as f:
        if not os.fstat(f.fileno()).st_size:  # an empty file cannot be mapped; it has no bytes to give
            return [b"" for _ in ranges]
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return [mapped[offset : offset + size] for offset, size in ranges]

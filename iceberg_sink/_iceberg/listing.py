"""Listing and deleting the files under a location with a table's own FileIO settings.

PyIceberg's FileIO cannot list. Its ``PyArrowFileIO`` builds one Arrow filesystem per scheme from
the table's FileIO properties (``s3.endpoint``, ``s3.access-key-id``, ``s3.region``,
``s3.path-style-access``, ...); listing goes through that same filesystem, so it reaches the store
the table's files were written to, with the same credentials. Arrow returns object-store paths
without their scheme (``bucket/key``): each listed file is given back as the location it has under
the listed location's own spelling (``<location>/<relative path>``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable

import attrs
import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from iceberg_sink.errors import UnsupportedTableError


@attrs.frozen
class ListedFile:
    """One file found under a location.

    Attributes:
        location: ``<listed location>/<path relative to it>``, in the listed location's spelling.
        mtime: last modification time (UTC), None when the store did not say.
        fs_path: the path the Arrow filesystem gave, used as is to delete exactly this file.
    """

    location: str
    mtime: dt.datetime | None
    fs_path: str = attrs.field(repr=False)


def _filesystem(io: FileIO, location: str) -> tuple[pafs.FileSystem, str]:
    if not isinstance(io, PyArrowFileIO):
        raise UnsupportedTableError(
            f"listing files needs the table's FileIO to be pyiceberg.io.pyarrow.PyArrowFileIO; received "
            f"{type(io).__module__}.{type(io).__qualname__}: set the catalog property "
            "py-io-impl=pyiceberg.io.pyarrow.PyArrowFileIO"
        )
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    return io.fs_by_scheme(scheme, netloc), path.rstrip("/")


def list_files(io: FileIO, location: str) -> tuple[ListedFile, ...]:
    """Every file under ``location`` (recursively), through ``io``'s filesystem and properties.

    Raises:
        UnsupportedTableError: ``io`` is not a PyArrowFileIO (the only FileIO whose filesystem can list).
    """
    fs, root = _filesystem(io, location)
    base = location.rstrip("/")
    result = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        if not info.path.startswith(root + "/"):
            # Never guess the location of a path outside the listed root: it could name another file.
            raise UnsupportedTableError(f"listing {location} returned {info.path!r}, which is not under {root!r}")
        mtime = info.mtime
        if mtime is not None and mtime.tzinfo is None:
            mtime = mtime.replace(tzinfo=dt.UTC)
        result.append(ListedFile(location=f"{base}/{info.path[len(root) + 1 :]}", mtime=mtime, fs_path=info.path))
    return tuple(result)


def delete_listed(io: FileIO, location: str, files: Iterable[ListedFile]) -> None:
    """Delete files :func:`list_files` returned for ``location``, by the exact path it listed
    (re-parsing a location could cut a key holding ``#`` or ``?``, and so name another file)."""
    fs, _ = _filesystem(io, location)
    for file in files:
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: the goal is reached
            fs.delete_file(file.fs_path)

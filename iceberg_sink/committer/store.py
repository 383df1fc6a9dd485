"""Durable sink state under the checkpoint location: the job id and pending committables.

Layout under ``<checkpoint_location>/iceberg_sink/``::

    job.json                       {"job_id": ..., "table": ...}: created once, never changed
    committables/<id:020d>.json    written before its commit is attempted, removed after it lands

Writes go to a temporary name and are renamed into place (atomic on local and HDFS-like file
systems; a single PUT on object stores), so a crash never leaves a half-written committable.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid

import pyarrow.fs as pafs

from iceberg_sink.committer.committable import Committable
from iceberg_sink.errors import InvalidSinkConfigError


class CheckpointStore:
    """State of one sink job under one checkpoint location."""

    def __init__(self, checkpoint_location: str) -> None:
        location = checkpoint_location
        if "://" not in location:
            location = os.path.abspath(location)
        try:
            self._fs, root = (
                pafs.FileSystem.from_uri(location)
                if "://" in location
                else (
                    pafs.LocalFileSystem(),
                    location,
                )
            )
        except Exception as e:
            raise InvalidSinkConfigError(
                f"checkpoint_location: expected a local path or a file system URI, received {checkpoint_location!r} ({e})"
            ) from e
        self.root = root.rstrip("/") + "/iceberg_sink"
        self._committables = self.root + "/committables"
        self._fs.create_dir(self._committables, recursive=True)

    def _write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, path)

    def _read(self, path: str) -> bytes | None:
        try:
            with self._fs.open_input_stream(path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None

    def job_id(self, table: str) -> str:
        """The job id of this checkpoint location, created on first use."""
        path = self.root + "/job.json"
        data = self._read(path)
        if data is not None:
            obj = json.loads(data)
            if obj.get("table") != table:
                raise InvalidSinkConfigError(
                    f"checkpoint location {self.root!r} belongs to a sink writing {obj.get('table')!r}, "
                    f"but this sink writes {table!r}; use a separate checkpoint location per table"
                )
            return str(obj["job_id"])
        job_id = uuid.uuid4().hex
        self._write(path, json.dumps({"job_id": job_id, "table": table}).encode())
        return job_id

    def _path(self, checkpoint_id: int) -> str:
        return f"{self._committables}/{checkpoint_id:020d}.json"

    def put(self, committable: Committable) -> None:
        self._write(self._path(committable.checkpoint_id), committable.encode())

    def get(self, checkpoint_id: int) -> Committable | None:
        data = self._read(self._path(checkpoint_id))
        return Committable.decode(data) if data is not None else None

    def pending_ids(self) -> list[int]:
        """The checkpoint ids of every stored committable, oldest first."""
        infos = self._fs.get_file_info(pafs.FileSelector(self._committables, allow_not_found=True))
        return sorted(
            int(i.base_name[: -len(".json")])
            for i in infos
            if i.base_name.endswith(".json") and i.base_name[: -len(".json")].isdigit()
        )

    def pending(self) -> list[Committable]:
        """Every stored committable, oldest checkpoint first."""
        result = []
        for checkpoint_id in self.pending_ids():
            committable = self.get(checkpoint_id)
            if committable is not None:
                result.append(committable)
        return result

    def delete(self, checkpoint_id: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(self._path(checkpoint_id))

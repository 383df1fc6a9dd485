"""Durable sink state under the checkpoint location: the job id and pending committables.

Layout under ``<checkpoint_location>/iceberg_sink/``::

    job.json                       {"job_id": ..., "table": ...}: created once, never changed
    committables/<id:020d>.json    written before its commit is attempted, removed after it lands
    table.json                     {"table_uuid": ...}: routed tables only (see :meth:`CheckpointStore.pin_table_uuid`)
    pending_reason.json            why checkpoints stay pending: written when a commit is deferred, removed
                                   once none is pending (:meth:`CheckpointStore.record_pending_reason`)

A routed sink (one stream, many tables: see iceberg_sink/job/routing.py) keeps one such folder per
table under ``<checkpoint_location>/iceberg_sink/tables/<table>/`` (:meth:`CheckpointStore.for_table`).

Writes go to a temporary name and are renamed into place (atomic on local and HDFS-like file
systems; a single PUT on object stores), so a crash never leaves a half-written committable.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable

import pyarrow.fs as pafs

from iceberg_sink._codec import CodecError
from iceberg_sink.committer.committable import Committable
from iceberg_sink.errors import InvalidSinkConfigError, UncommittableCheckpointError
from iceberg_sink.vocab.locations import URI, is_uri


def checkpoint_parts(checkpoint_location: str) -> tuple[str, str, str]:
    """``(scheme, authority, path)`` of a checkpoint location, read as Spark reads it.

    Spark keeps its own state there through Hadoop's ``Path``, which takes a location's path
    literally: ``file:///ck/a%20b`` is a folder named ``a%20b``, ``file:/ck`` is ``/ck``, a path
    without a scheme is local (made absolute here, scheme ``file``). PyArrow's ``FileSystem.from_uri``
    decodes ``%20`` instead (and refuses a raw space, cuts at ``?`` and ``#``), and ``file:/ck`` was
    once taken as the relative path ``./file:/ck``: the sink's state then lived in another folder than
    Spark's offsets, which the sink reads (Kafka offsets in snapshot summaries) and which are restored,
    copied and deleted together with it. Every reader of a checkpoint location goes through this.

    Raises:
        InvalidSinkConfigError: a ``file:`` URI naming a host other than ``localhost``; a location with
            a colon before its first slash that is not a URI (``ck:1``, ``file:ck``): Hadoop reads what
            precedes the colon as a scheme and Spark refuses the relative path after it.
    """
    if not is_uri(checkpoint_location):  # a local path
        head = checkpoint_location.split("/", 1)[0]
        if ":" in head:
            raise InvalidSinkConfigError(
                f"checkpoint_location: expected a path or a URI with an absolute path (/data/ck, file:/data/ck, "
                f"s3://bucket/ck), received {checkpoint_location!r}: Spark (Hadoop's Path) reads "
                f"{head.split(':', 1)[0]!r} as a scheme and refuses the relative path after it; write "
                f"'./{checkpoint_location}' for a local folder of that name"
            )
        return "file", "", os.path.normpath(os.path.abspath(checkpoint_location))
    match = URI.match(checkpoint_location)
    assert match is not None  # is_uri
    scheme, authority, path = match.group("scheme").lower(), match.group("authority") or "", match.group("path") or ""
    if scheme == "file":
        if authority not in ("", "localhost"):
            raise InvalidSinkConfigError(
                f"checkpoint_location: expected a local file URI (file:/path or file:///path), received "
                f"{checkpoint_location!r}, which names the host {authority!r}"
            )
        return "file", "", os.path.normpath(path or "/")
    return scheme, authority, path


def checkpoint_key(checkpoint_location: str) -> str:
    """One spelling per checkpoint location (see :func:`checkpoint_parts`), without a final slash."""
    scheme, authority, path = checkpoint_parts(checkpoint_location)
    return f"{scheme}://{authority}{path}".rstrip("/")


def checkpoint_filesystem(checkpoint_location: str) -> tuple[pafs.FileSystem, str]:
    """The file system and root folder of a checkpoint location (see :func:`checkpoint_parts`): only
    the scheme and authority go to PyArrow; the path is appended as it is.

    Raises:
        InvalidSinkConfigError: PyArrow has no file system for the scheme, or it cannot be reached.
    """
    scheme, authority, path = checkpoint_parts(checkpoint_location)
    if scheme == "file":
        return pafs.LocalFileSystem(), path
    try:
        fs, base = pafs.FileSystem.from_uri(f"{scheme}://{authority}/")
    except Exception as e:
        raise InvalidSinkConfigError(
            f"checkpoint_location: expected a local path or a file system URI, received {checkpoint_location!r} ({e})"
        ) from e
    return fs, base.rstrip("/") + path


#: Where ``.debezium(transactions="consistent")`` carries held source transactions, relative to the
#: checkpoint location (sources/transactions.py).
CARRY_DIR = "iceberg_sink/carry"


def write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a temporary file moved into place)."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, path)


def read_if_present(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The bytes at ``path``; None when there is no such file."""
    try:
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        return None


def committable_name(checkpoint_id: int) -> str:
    """Where the committable of a checkpoint lives, relative to the checkpoint location."""
    return f"iceberg_sink/committables/{checkpoint_id:020d}.json"


class CheckpointStore:
    """State of one sink job under one checkpoint location."""

    def __init__(self, checkpoint_location: str, _subdir: str = "iceberg_sink", create: bool = True) -> None:
        """``create=False`` opens the state read-only as it is (no folder made): for tools that only look."""
        self._fs, root = checkpoint_filesystem(checkpoint_location)
        self._location = root.rstrip("/")
        self.root = self._location + "/" + _subdir
        self._committables = self.root + "/committables"
        self._job: tuple[str, str] | None = None  # (job id, table) once known
        if create:
            self._fs.create_dir(self._committables, recursive=True)

    def _write(self, path: str, data: bytes) -> None:
        write_atomically(self._fs, path, data)

    def _read(self, path: str) -> bytes | None:
        return read_if_present(self._fs, path)

    def carry_record(self, checkpoint_id: int) -> bytes | None:
        """Checkpoint ``checkpoint_id``'s transaction carry record (sources/transactions.py); None if absent."""
        return self._read(f"{self._location}/{CARRY_DIR}/{checkpoint_id}.json")

    def spark_offset_log(self, batch_id: int) -> bytes | None:
        """Spark's offset log entry of micro-batch ``batch_id`` (``<location>/offsets/<id>``); None if absent."""
        return self._read(f"{self._location}/offsets/{batch_id}")

    def spark_initial_offsets(self, source: int) -> bytes | None:
        """Spark's entry of where source ``source`` of the query started (``<location>/sources/<i>/0``:
        a Kafka source's starting offsets, resolved); None if absent."""
        return self._read(f"{self._location}/sources/{source}/0")

    @classmethod
    def for_table(cls, checkpoint_location: str, table: str, create: bool = True) -> CheckpointStore:
        """The state of one table of a routed sink, under ``<location>/iceberg_sink/tables/<table>``."""
        return cls(checkpoint_location, f"iceberg_sink/tables/{table}", create=create)

    def table_folders(self) -> list[str]:
        """The tables a routed sink has state for under this checkpoint location, sorted."""
        infos = self._fs.get_file_info(pafs.FileSelector(self.root + "/tables", allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def pin_table_uuid(self, table: str, table_uuid: str) -> None:
        """Record the UUID of the table this state belongs to, or check it against the recorded one.

        Raises:
            UncommittableCheckpointError: the table now has another UUID (it was dropped and
                re-created under the same name since this job first wrote to it).
        """
        recorded = self.table_uuid()
        if recorded is None:
            self._write(self.root + "/table.json", json.dumps({"table_uuid": table_uuid}).encode())
        elif recorded != table_uuid:
            raise UncommittableCheckpointError(self.replaced_message(table, f"now has UUID {table_uuid}"))

    def table_uuid(self) -> str | None:
        """The table UUID recorded by :meth:`pin_table_uuid`, or None."""
        value = self._state_value(
            "table.json",
            "table_uuid",
            lambda v: isinstance(v, str) and bool(v),
            "a table_uuid string",
            "delete it to accept the table the catalog has now",
        )
        return str(value) if value is not None else None

    def sources(self) -> frozenset[str]:
        """The sources (Debezium ``db.schema.table``) recorded for this routed table's state by
        :meth:`record_sources`; empty when none was (written by an earlier release, or not Debezium)."""
        value = self._state_value(
            "sources.json",
            "sources",
            lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
            "a list of source names",
            'rewrite it as {"sources": ["<db>.<schema>.<table>"]} (the source this table holds)',
        )
        return frozenset(value) if isinstance(value, list) else frozenset()

    def _state_value(
        self, name: str, key: str, valid: Callable[[object], bool], expected: str, remedy: str
    ) -> object | None:
        """``key`` of the JSON state file ``name`` of this folder; None when the file is absent.

        Raises:
            InvalidSinkConfigError: the file is damaged, naming what was expected and how to go on.
        """
        path = f"{self.root}/{name}"
        data = self._read(path)
        if data is None:
            return None
        try:
            value = json.loads(data)[key]
            if valid(value):
                return value  # type: ignore[no-any-return]
            problem = f"expected {expected}, received {data[:200]!r}"
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            problem = f"{type(e).__name__}: {e}"
        raise InvalidSinkConfigError(
            f"the table state file {path} is damaged ({problem}); restore it from a backup of the checkpoint "
            f"location, or {remedy}"
        )

    def record_sources(self, sources: frozenset[str]) -> None:
        """Record the sources this routed table holds (job/routing.py refuses any other's events for it)."""
        self._write(self.root + "/sources.json", json.dumps({"sources": sorted(sources)}).encode())

    def replaced_message(self, table: str, now: str) -> str:
        """Why a routed table whose UUID changed is refused, and how to go on."""
        return (
            f"table {table} was written by this job with UUID {self.table_uuid()} but {now}: it was dropped "
            "(and maybe re-created) by someone else. This job's state for it is not applied to another table; "
            f"the other routed tables are not affected. To write the rows routed to {table} into the table the "
            f"catalog has now, stop the stream, delete the folder {self.root} (this table's state only) and "
            "restart: its pending checkpoints, if any, are then written again from the replayed batch."
        )

    def job_id(self, table: str, new_job_id: str | None = None) -> str:
        """The job id of this checkpoint location, created on first use (as ``new_job_id`` if given)."""
        path = self.root + "/job.json"
        data = self._read(path)
        if data is not None:
            obj = self._decode_job(path, data, table)
            if obj.get("table") != table:
                raise InvalidSinkConfigError(
                    f"checkpoint location {self.root!r} belongs to a sink writing {obj.get('table')!r}, "
                    f"but this sink writes {table!r}; use a separate checkpoint location per table"
                )
            self._job = (str(obj["job_id"]), table)
            return self._job[0]
        job_id = new_job_id or uuid.uuid4().hex
        self._write(path, json.dumps({"job_id": job_id, "table": table}).encode())
        self._job = (job_id, table)
        return job_id

    def read_job(self) -> dict[str, object] | None:
        """The job file (``job_id``, ``table``) as stored, without creating it; None when absent
        (a location no sink job has used yet). For tools that only look (``iceberg-sink inspect``)."""
        path = self.root + "/job.json"
        data = self._read(path)
        return None if data is None else self._decode_job(path, data, "<table>")

    @staticmethod
    def _decode_job(path: str, data: bytes, table: str) -> dict[str, object]:
        try:
            obj = json.loads(data)
            if isinstance(obj, dict) and isinstance(obj.get("job_id"), str) and obj["job_id"]:
                return obj
            problem = f"expected an object with a job_id, received {data[:200]!r}"
        except (ValueError, UnicodeDecodeError) as e:
            problem = f"not JSON: {e}"
        raise InvalidSinkConfigError(
            f"the job file {path} of this checkpoint location is damaged ({problem}). It holds the job id that "
            "the table's snapshots carry, which keeps the job exactly-once across restarts. Restore it from a "
            f'backup of the checkpoint location, or rewrite it as {{"job_id": "<id>", "table": "{table}"}} '
            "with the iceberg-sink.job-id found in the summaries of the table's snapshots written from this "
            "location. A new checkpoint location is a new job that does not know what this one committed."
        )

    def _path(self, checkpoint_id: int) -> str:
        # Under this store's root: a routed table's store is not the location's own (see for_table).
        return f"{self._committables}/{checkpoint_id:020d}.json"

    def put(self, committable: Committable) -> None:
        self._write(self._path(committable.checkpoint_id), committable.encode())

    def get(self, checkpoint_id: int) -> Committable | None:
        path = self._path(checkpoint_id)
        data = self._read(path)
        if data is None:
            return None
        try:
            return Committable.decode(data)
        except CodecError as e:
            raise self._unreadable(path, checkpoint_id, str(e)) from e
        except (KeyError, TypeError, ValueError) as e:
            raise self._unreadable(path, checkpoint_id, f"{type(e).__name__}: {e}") from e

    def _unreadable(self, path: str, checkpoint_id: int, problem: str) -> UncommittableCheckpointError:
        job, table = self._job or ("(unknown)", "the table")
        n = checkpoint_id
        return UncommittableCheckpointError(
            f"the committable {path} of checkpoint {n} cannot be read ({problem}). It records a checkpoint that was "
            f"written but maybe not committed, so it is not skipped. If {table} holds checkpoint {n} of job {job} (a "
            f"snapshot whose summary has iceberg-sink.job-id={job} and iceberg-sink.checkpoint-id={n}), delete this "
            "file. Otherwise its rows are not in the table: restore the file from a backup of the checkpoint "
            "location, or delete it and write the batch again (Spark re-runs a batch it did not record as finished; "
            f"for write(), call it again with checkpoint_id={n})."
        )

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

    def record_pending_reason(self, checkpoint_id: int, reason: str, error: str) -> None:
        """Record why checkpoint ``checkpoint_id`` stays pending (``reason``: errors.pending_because;
        ``error``: the last error, one line) for ``iceberg-sink inspect``, another process that only
        reads this folder. Replaces the previous record."""
        record = {"checkpoint_id": checkpoint_id, "reason": reason, "error": error, "at_ms": int(time.time() * 1000)}
        self._write(self.root + "/pending_reason.json", json.dumps(record).encode())

    def pending_reason(self) -> dict[str, object] | None:
        """The record of :meth:`record_pending_reason` (``checkpoint_id``, ``reason``, ``error``,
        ``at_ms``), or None when there is none or it cannot be read (it only explains, nothing depends
        on it)."""
        data = self._read(self.root + "/pending_reason.json")
        try:
            record = json.loads(data) if data is not None else None
        except (ValueError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("reason"), str) else None

    def clear_pending_reason(self) -> None:
        """Forget why checkpoints were pending (none is now)."""
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(self.root + "/pending_reason.json")

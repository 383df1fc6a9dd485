"""``iceberg-sink inspect TABLE``: what a table holds and what iceberg_sink jobs did to it, without Spark.

- snapshots, newest first, with the job id and checkpoint id that wrote them (vocab/summary_keys.py);
- pending checkpoints under checkpoint locations (committer/store.py): written, maybe not committed;
  a routed job's location (iceberg_sink/job/routing.py) holds them per table, under ``tables/<table>/``;
  and why they stay pending, as the job recorded it at its last deferral (``pending_reason``: an
  unreachable catalog, a SQLite catalog file another process holds locked, races lost);
- ``iceberg-sink inspect --checkpoint-location DIR`` without a table: every table of the job at DIR
  (:func:`job_tables`), with its pending checkpoints, table UUID and last committed checkpoint;
- live data and delete files of the branch head, counted and sized per partition;
- what a compaction would do now: the planner's dry plan (topology/compaction/planner.py).

Everything is read from the catalog, the table's metadata and manifests, and the checkpoint store;
nothing is written.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.fs as pafs
from pyiceberg.table import Table

from iceberg_sink import options
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.files import LiveFile, branch_head
from iceberg_sink.committer.store import CheckpointStore, checkpoint_filesystem
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.planner import CompactionPlan, plan
from iceberg_sink.vocab import summary_keys
from iceberg_sink.vocab.files import FileContent


class CheckpointLocationNotFoundError(InvalidSinkConfigError):
    """The checkpoint location holds no iceberg_sink state."""


def partition_label(table: Table, spec_id: int, partition: tuple[Any, ...]) -> str:
    """``field=value/field=value`` as Iceberg spells partition paths; ``(unpartitioned)`` when none."""
    spec = table.specs()[spec_id]
    if not spec.fields:
        return "(unpartitioned)"
    types = spec.partition_type(table.schema()).fields
    return "/".join(
        f"{f.name}={f.transform.to_human_string(types[i].field_type, partition[i])}" for i, f in enumerate(spec.fields)
    )


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def snapshots(table: Table, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's snapshots, newest first, with the sink job and checkpoint that wrote each."""
    refs: dict[int, list[str]] = defaultdict(list)
    for name, ref in table.metadata.refs.items():
        refs[ref.snapshot_id].append(name)
    ordered = sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True)
    rows = []
    for s in ordered[:limit] if limit else ordered:
        summary = s.summary.additional_properties if s.summary is not None else {}
        job = summary_keys.sink_job_of(summary)
        checkpoint = summary_keys.JobKeys(job[0]).checkpoint_of(summary, job[1]) if job is not None else None
        rows.append(
            {
                "snapshot_id": s.snapshot_id,
                "parent_id": s.parent_snapshot_id,
                "sequence_number": s.sequence_number,
                "timestamp": _iso(s.timestamp_ms),
                "operation": s.summary.operation.value if s.summary is not None else None,
                "refs": sorted(refs.get(s.snapshot_id, [])),
                "job_id": job[1] if job is not None else None,
                "checkpoint_id": checkpoint,
                "sink_operation": summary.get(summary_keys.OPERATION_KEY),
                "added_records": int(summary.get("added-records", 0)),
                "added_data_files": int(summary.get("added-data-files", 0)),
                "added_delete_files": int(summary.get("added-delete-files", 0)),
            }
        )
    return rows


def _name(table: Table) -> str:
    return ".".join(table.name()[-2:]) if len(table.name()) >= 2 else str(table.name())


def _committed_checkpoints(table: Table, job_id: str) -> set[int]:
    found = set()
    for s in table.metadata.snapshots:
        summary = s.summary.additional_properties if s.summary is not None else {}
        job = summary_keys.sink_job_of(summary)
        if job is not None and job[1] == job_id:
            checkpoint = summary_keys.JobKeys(job[0]).checkpoint_of(summary, job_id)
            if checkpoint is not None:
                found.add(checkpoint)
    return found


def _has_state(location: str) -> bool:
    fs, root = checkpoint_filesystem(location)
    return bool(fs.get_file_info(root.rstrip("/") + "/iceberg_sink").type != pafs.FileType.NotFound)


def _open(location: str) -> CheckpointStore:
    """The checkpoint store of ``location``, opened read-only.

    Raises:
        CheckpointLocationNotFoundError: no iceberg_sink state under ``location``.
    """
    if not _has_state(location):
        raise CheckpointLocationNotFoundError(
            f"checkpoint location {location} holds no iceberg_sink state (expected a folder iceberg_sink/ in it)"
        )
    return CheckpointStore(location, create=False)


def _route_of(store: CheckpointStore, job: dict[str, object] | None) -> str | None:
    """What a routed job's file names instead of a table (``<tables routed by ...>``), or None when
    the location belongs to a single-table job."""
    named = job.get("table") if job is not None else None
    if isinstance(named, str) and named.startswith("<") and named.endswith(">"):
        return named[1:-1]
    return "tables routed by (unknown)" if store.table_folders() else None


def _pending_rows(store: CheckpointStore, committed: set[int]) -> list[dict[str, Any]]:
    return [
        {
            "checkpoint_id": c.checkpoint_id,
            "table": c.table,
            "branch": c.branch,
            "records": c.summary.records,
            "data_files": c.summary.data_files,
            "delete_files": c.summary.delete_files,
            "bytes": c.summary.bytes,
            # Committed but not cleaned up yet (the driver stopped right after the commit): the
            # next start removes it without committing again.
            "committed": c.checkpoint_id in committed,
        }
        for c in store.pending()
    ]


def _pending_reason(store: CheckpointStore, pending: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Why the checkpoints not committed yet stay pending, as the job recorded it at its last deferral
    (committer/store.py): ``reason``, ``error``, ``checkpoint_id``, ``at`` (ISO time); None when every
    pending checkpoint is committed (or none is pending) or the job recorded nothing."""
    if all(p["committed"] for p in pending):
        return None
    record = store.pending_reason()
    if record is None:
        return None
    at = record.get("at_ms")
    return {
        "reason": record["reason"],
        "error": record.get("error"),
        "checkpoint_id": record.get("checkpoint_id"),
        "at": _iso(at) if isinstance(at, int) else None,
    }


def _table_state(recorded: str | None, table: Table | None) -> str:
    if table is None:
        return "missing"
    if recorded is not None and recorded != str(table.metadata.table_uuid):
        return "replaced"
    return "ok"


def pending_checkpoints(table: Table, location: str, table_name: str | None = None) -> dict[str, Any]:
    """The job of a checkpoint location and its stored committables for ``table``, each marked
    committed or not. For a routed job's location, the committables of that table's own state.

    Args:
        table_name: ``namespace.name`` as the route named it (default: from ``table``).

    Raises:
        CheckpointLocationNotFoundError: no iceberg_sink state under ``location``.
    """
    store = _open(location)
    job = store.read_job()
    job_id = str(job["job_id"]) if job is not None else None
    committed = _committed_checkpoints(table, job_id) if job_id is not None else set()
    route = _route_of(store, job)
    result: dict[str, Any] = {"checkpoint_location": location, "job_id": job_id, "route": route}
    own: CheckpointStore | None = store
    if route is None:
        result["table"] = job.get("table") if job is not None else None
        pending = _pending_rows(store, committed)
    else:
        folders = set(store.table_folders())
        names = [n for n in (table_name, _name(table), ".".join(table.name())) if n]
        name = next((n for n in names if n in folders), names[0])
        has_state = name in folders
        own = CheckpointStore.for_table(location, name, create=False) if has_state else None
        recorded = own.table_uuid() if own is not None else None
        pending = _pending_rows(own, committed) if own is not None else []
        # table_state: "ok"; "replaced" when the job wrote a table of another UUID under this name
        # (dropped and re-created by someone else: its pending checkpoints are never committed here).
        result.update(table=name, has_state=has_state, table_uuid=recorded, table_state=_table_state(recorded, table))
    result["last_committed_checkpoint"] = max(committed) if committed else None
    result["pending"] = pending
    result["pending_reason"] = _pending_reason(own, pending) if own is not None else None
    return result


def job_tables(location: str, load: Callable[[str], Table | None], atomic: bool | None = None) -> dict[str, Any]:
    """Every table of the job at a checkpoint location: its pending checkpoints, UUID and last
    committed checkpoint. A routed job's tables are those it keeps state for; a single-table job's
    is the one its job file names.

    Args:
        load: loads a table by name from the catalog, None when it does not exist.
        atomic: whether the catalog commits several tables in one transaction (job/together.py),
            reported as ``atomic_commits`` (None: not known).

    Raises:
        CheckpointLocationNotFoundError: no iceberg_sink state under ``location``.
    """
    store = _open(location)
    job = store.read_job()
    job_id = str(job["job_id"]) if job is not None else None
    route = _route_of(store, job)
    if route is not None:
        stores = [(name, CheckpointStore.for_table(location, name, create=False)) for name in store.table_folders()]
    else:
        named = job.get("table") if job is not None else None
        stores = [(str(named), store)] if named else []
    tables = []
    for name, own in stores:
        table = load(name)
        current = str(table.metadata.table_uuid) if table is not None else None
        # A routed table's state records the UUID it was written for; a single-table job's does not.
        recorded = own.table_uuid() if route is not None else None
        committed = (
            _committed_checkpoints(table, job_id)
            if table is not None and job_id is not None and _table_state(recorded, table) == "ok"
            else set()
        )
        pending = _pending_rows(own, committed)
        tables.append(
            {
                "table": name,
                "table_uuid": recorded or current,
                "catalog_table_uuid": current,
                "table_state": _table_state(recorded, table),
                "last_committed_checkpoint": max(committed) if committed else None,
                "pending_ids": [p["checkpoint_id"] for p in pending],
                "pending": pending,
                "pending_reason": _pending_reason(own, pending),
            }
        )
    return {
        "checkpoint_location": location,
        "job_id": job_id,
        "route": route,
        "tables": tables,
        "atomic_commits": atomic,
    }


def _file_stats(table: Table, data: Sequence[LiveFile], deletes: Sequence[LiveFile]) -> list[dict[str, Any]]:
    rows: dict[tuple[int, tuple[Any, ...]], dict[str, Any]] = {}

    def row(f: LiveFile) -> dict[str, Any]:
        key = (f.meta.spec_id, f.meta.partition)
        if key not in rows:
            rows[key] = {
                "partition": partition_label(table, *key),
                "spec_id": f.meta.spec_id,
                "data_files": 0,
                "data_bytes": 0,
                "data_records": 0,
                "delete_files": 0,
                "delete_bytes": 0,
                "equality_delete_files": 0,
                "position_delete_files": 0,
                "delete_records": 0,
            }
        return rows[key]

    for f in data:
        r = row(f)
        r["data_files"] += 1
        r["data_bytes"] += f.meta.file_size_in_bytes
        r["data_records"] += f.meta.record_count
    for f in deletes:
        r = row(f)
        r["delete_files"] += 1
        r["delete_bytes"] += f.meta.file_size_in_bytes
        r["delete_records"] += f.meta.record_count
        kind = "equality" if f.meta.content == FileContent.EQUALITY_DELETES else "position"
        r[f"{kind}_delete_files"] += 1
    return sorted(rows.values(), key=lambda r: (r["spec_id"], r["partition"]))


def compaction_plan(table: Table, the_plan: CompactionPlan | None, config: CompactionConfig) -> dict[str, Any]:
    """A dry compaction plan as JSON: groups per partition, files and bytes read, deletes applied."""
    target = config.target(options.resolve({}, table.properties).get(options.TARGET_FILE_SIZE_BYTES))
    result: dict[str, Any] = {
        "target_file_size_bytes": target,
        "min_file_size_bytes": config.min_size(target),
        "min_input_files": config.min_input_files,
        "groups": 0,
        "data_files": 0,
        "input_bytes": 0,
        "delete_files": 0,
        "partitions": [],
    }
    if the_plan is None:
        return result
    per: dict[tuple[int, tuple[Any, ...]], dict[str, Any]] = {}
    deletes: set[str] = set()
    for g in the_plan.groups:
        p = per.setdefault(
            g.partition,
            {"partition": partition_label(table, *g.partition), "groups": 0, "data_files": 0, "input_bytes": 0},
        )
        p["groups"] += 1
        p["data_files"] += len(g.data_files)
        p["input_bytes"] += g.input_bytes
        deletes.update(d.meta.path for d in g.delete_files)
    result.update(
        groups=len(the_plan.groups),
        data_files=sum(len(g.data_files) for g in the_plan.groups),
        input_bytes=sum(g.input_bytes for g in the_plan.groups),
        delete_files=len(deletes),
        partitions=sorted(per.values(), key=lambda p: str(p["partition"])),
    )
    return result


def inspect_table(
    table: Table,
    branch: str = "main",
    checkpoint_locations: Sequence[str] = (),
    compaction: CompactionConfig | None = None,
    limit: int | None = 20,
    table_name: str | None = None,
) -> dict[str, Any]:
    """Everything ``iceberg-sink inspect`` shows, as one JSON-ready mapping (``table_name``: the
    table's ``namespace.name``, which names its state under a routed job's checkpoint location)."""
    config = compaction or CompactionConfig()
    head = branch_head(table, branch)
    entries = ManifestEntries()
    data, deletes = live_files(table, head, entries)
    target = options.resolve({}, table.properties).get(options.TARGET_FILE_SIZE_BYTES)
    the_plan = plan(table, branch, config, target, entries=entries)
    partitions = _file_stats(table, data, deletes)
    totals = {
        k: sum(p[k] for p in partitions)
        for k in ("data_files", "data_bytes", "data_records", "delete_files", "delete_bytes", "delete_records")
    }
    history = snapshots(table, limit)
    return {
        "table": _name(table),
        "location": table.location(),
        "format_version": table.metadata.format_version,
        "table_uuid": str(table.metadata.table_uuid),
        "branch": branch,
        "branch_head": head.snapshot_id if head is not None else None,
        "refs": {name: ref.snapshot_id for name, ref in sorted(table.metadata.refs.items())},
        "snapshot_count": len(table.metadata.snapshots),
        "snapshots": history,
        "checkpoint_locations": [pending_checkpoints(table, loc, table_name) for loc in checkpoint_locations],
        "files": {"totals": totals, "partitions": partitions},
        "compaction": compaction_plan(table, the_plan, config),
    }


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(h) for h in header], *[["-" if v is None else str(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


_REPLACED = (
    "the job wrote this table with UUID {uuid}; the catalog's table under that name is another one (dropped and "
    "re-created): its pending checkpoints are not committed to it (see docs/routing.md)"
)


def _reason_line(reason: dict[str, Any]) -> str:
    """``pending because <reason> (checkpoint n at <time>: <error>)``."""
    return f"pending because {reason['reason']} (checkpoint {reason['checkpoint_id']} at {reason['at']}: {reason['error']})"


def _pending_cell(pending: Sequence[dict[str, Any]]) -> str | None:
    return ", ".join(f"{p['checkpoint_id']}{' (committed)' if p['committed'] else ''}" for p in pending) or None


def render_job_tables(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`job_tables`' report."""
    tables = report["tables"]
    route = f", {report['route']}" if report["route"] else ""
    out = [f"checkpoint location {report['checkpoint_location']}: job {report['job_id']}{route}; {len(tables)} tables"]
    out += _table(
        ["table", "table uuid", "state", "last committed", "pending"],
        [
            [
                t["table"],
                t["table_uuid"],
                {"ok": "ok", "missing": "not in the catalog", "replaced": "re-created"}[t["table_state"]],
                t["last_committed_checkpoint"],
                _pending_cell(t["pending"]),
            ]
            for t in tables
        ],
    )
    if any(p["committed"] for t in tables for p in t["pending"]):
        out.append("(committed: committed but not cleaned up yet; the next start removes it without committing again)")
    if any(t["table_state"] == "replaced" for t in tables):
        out.append("(re-created: " + _REPLACED.format(uuid="in 'table uuid'") + ")")
    out += [f"{t['table']}: {_reason_line(t['pending_reason'])}" for t in tables if t.get("pending_reason")]
    if report.get("atomic_commits") is not None and (report["route"] or len(tables) > 1):
        out.append(_ATOMIC[bool(report["atomic_commits"])])
    return "\n".join(out)


_ATOMIC = {
    True: "commits: each checkpoint's tables in one catalog transaction (a SQL catalog), unless the sink sets "
    ".atomic_commits('off')",
    False: "commits: one table at a time (this catalog cannot commit several tables in one transaction): a reader "
    "may see the tables at different checkpoints",
}


def render(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`inspect_table`'s report."""
    out = [
        f"table {report['table']} (format v{report['format_version']}) at {report['location']}",
        f"branch {report['branch']}: head {report['branch_head']}; {report['snapshot_count']} snapshots",
        "",
        f"snapshots (newest {len(report['snapshots'])}):",
    ]
    out += _table(
        ["snapshot", "time", "operation", "refs", "job", "checkpoint", "records", "data", "deletes"],
        [
            [
                s["snapshot_id"],
                s["timestamp"],
                s["sink_operation"] or s["operation"],
                ",".join(s["refs"]) or None,
                s["job_id"],
                s["checkpoint_id"],
                s["added_records"],
                s["added_data_files"],
                s["added_delete_files"],
            ]
            for s in report["snapshots"]
        ],
    )
    for loc in report["checkpoint_locations"]:
        routed = f" ({loc['route']})" if loc.get("route") else ""
        out += [
            "",
            f"checkpoint location {loc['checkpoint_location']}: job {loc['job_id']}{routed} writing {loc['table']}, "
            f"last committed checkpoint {loc['last_committed_checkpoint']}, {len(loc['pending'])} pending",
        ]
        if loc.get("route") and not loc["has_state"]:
            out.append(f"  (this job keeps no state for {loc['table']}: it has not written to it)")
        elif loc.get("table_state") == "replaced":
            out.append(f"  {_REPLACED.format(uuid=loc['table_uuid'])}")
        if loc["pending"]:
            out += _table(
                ["checkpoint", "branch", "records", "data", "deletes", "bytes", "state"],
                [
                    [
                        p["checkpoint_id"],
                        p["branch"],
                        p["records"],
                        p["data_files"],
                        p["delete_files"],
                        _size(p["bytes"]),
                        "committed (cleaned up on next start)" if p["committed"] else "not committed yet",
                    ]
                    for p in loc["pending"]
                ],
            )
        if loc.get("pending_reason"):
            out.append(f"  {_reason_line(loc['pending_reason'])}")
    files = report["files"]
    t = files["totals"]
    out += [
        "",
        f"live files of {report['branch']}: {t['data_files']} data files ({_size(t['data_bytes'])}, "
        f"{t['data_records']} rows), {t['delete_files']} delete files ({_size(t['delete_bytes'])}, "
        f"{t['delete_records']} rows)",
    ]
    out += _table(
        ["partition", "data", "data size", "rows", "eq deletes", "pos deletes", "delete size", "delete rows"],
        [
            [
                p["partition"],
                p["data_files"],
                _size(p["data_bytes"]),
                p["data_records"],
                p["equality_delete_files"],
                p["position_delete_files"],
                _size(p["delete_bytes"]),
                p["delete_records"],
            ]
            for p in files["partitions"]
        ],
    )
    c = report["compaction"]
    out += [""]
    if not c["groups"]:
        out.append(
            f"compaction now: nothing to do (files under {_size(c['min_file_size_bytes'])} are small; "
            f"a group needs {c['min_input_files']} of them or deletes to apply)"
        )
    else:
        out.append(
            f"compaction now: {c['groups']} groups would rewrite {c['data_files']} data files "
            f"({_size(c['input_bytes'])}) into ~{_size(c['target_file_size_bytes'])} files, applying "
            f"{c['delete_files']} delete files"
        )
        out += _table(
            ["partition", "groups", "files", "bytes"],
            [[p["partition"], p["groups"], p["data_files"], _size(p["input_bytes"])] for p in c["partitions"]],
        )
    return "\n".join(out)

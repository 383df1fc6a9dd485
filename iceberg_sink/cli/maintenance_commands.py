"""The table-maintenance commands, each a thin face of iceberg_sink/topology/maintenance.py or
iceberg_sink/table/versions.py: ``convert-equality-deletes``, ``expire-snapshots``,
``remove-orphans``, ``rewrite-manifests`` and ``upgrade-format-version``.

Registered with ``@command`` (commands.py) after the commands there, in the order below: the order of
``iceberg-sink --help``.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import attrs

from iceberg_sink.cli.commands import command
from iceberg_sink.cli.output import Output
from iceberg_sink.cli.where import table_loader, table_name, table_options
from iceberg_sink.topology import arguments

# ---- convert-equality-deletes --------------------------------------------------------------------


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--max-replans",
        type=arguments.MAX_REPLANS.parse,
        default=3,
        metavar="N",
        help="plans again when a concurrent commit conflicts (3)",
    )


@command(
    "convert-equality-deletes",
    "turn equality deletes into position deletes, on v3 deletion vectors (cheaper full reads)",
    _convert_arguments,
)
def _convert(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.topology import maintenance

    converted = maintenance.convert_equality_deletes(
        table_loader(args), branch=args.branch, max_replans=args.max_replans
    )
    out.say(
        f"converted {table_name(args)}: {converted.removed_equality_delete_files} equality delete files "
        f"({converted.removed_equality_deletes} rows) -> {converted.added_position_delete_files} position "
        f"delete files ({converted.added_position_deletes} rows), {converted.removed_position_delete_files} "
        f"older position delete files merged, {converted.added_dvs} deletion vectors ({converted.dv_positions} "
        f"rows, {converted.replaced_dvs} replaced), {converted.data_files_read} data files read, "
        f"{converted.replans} plans redone on conflict; snapshot {converted.snapshot_id}"
    )
    return {"table": table_name(args), **attrs.asdict(converted)}


# ---- expire-snapshots ----------------------------------------------------------------------------


def _expire_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--older-than-hours",
        type=arguments.EXPIRE_OLDER_THAN_HOURS.parse,
        default=24 * 5,
        metavar="H",
        help="expire snapshots older than H hours (120)",
    )
    p.add_argument(
        "--retain-last",
        type=arguments.RETAIN_LAST.parse,
        default=1,
        metavar="N",
        help="keep the newest N of each branch (1)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be expired and deleted; change nothing")


@command("expire-snapshots", "expire old snapshots and delete files only they used", _expire_arguments)
def _expire(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.topology import maintenance

    older = dt.datetime.now(dt.UTC) - dt.timedelta(hours=args.older_than_hours)
    expired = maintenance.expire_snapshots(
        table_loader(args), older, retain_last=args.retain_last, dry_run=args.dry_run
    )
    if args.dry_run:
        for path in expired.deleted_files:
            out.say("would delete " + path)
    verb = "would expire" if args.dry_run else "expired"
    deleted = "would delete" if args.dry_run else "deleted"
    out.say(f"{verb} {len(expired.expired_snapshot_ids)} snapshots, {deleted} {len(expired.deleted_files)} files")
    return {
        "table": table_name(args),
        "dry_run": args.dry_run,
        "expired_snapshot_ids": list(expired.expired_snapshot_ids),
        "deleted_files": list(expired.deleted_files),
    }


# ---- remove-orphans ------------------------------------------------------------------------------


def _orphans_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--older-than-hours",
        type=arguments.ORPHAN_OLDER_THAN_HOURS.parse,
        default=72,
        metavar="H",
        help="only files older than H hours, at least 1 (72)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the orphans; delete nothing")


@command("remove-orphans", "delete files nothing references, older than a safety age", _orphans_arguments)
def _orphans(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.topology import maintenance

    orphans = maintenance.remove_orphan_files(
        table_loader(args), dt.timedelta(hours=args.older_than_hours), dry_run=args.dry_run
    )
    for path in orphans.orphan_files:
        out.say(("would delete " if args.dry_run else "deleted ") + path)
    out.say(f"{len(orphans.orphan_files)} orphan files")
    return {"table": table_name(args), "dry_run": args.dry_run, "orphan_files": list(orphans.orphan_files)}


# ---- rewrite-manifests ---------------------------------------------------------------------------


def _manifests_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--entries-per-manifest",
        type=arguments.ENTRIES_PER_MANIFEST.parse,
        default=10_000,
        metavar="N",
        help="entries per merged manifest (10000)",
    )


@command("rewrite-manifests", "merge small manifests", _manifests_arguments)
def _manifests(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.topology import maintenance

    snapshot = maintenance.rewrite_manifests(
        table_loader(args), branch=args.branch, entries_per_manifest=args.entries_per_manifest
    )
    out.say("manifests already compact" if snapshot is None else f"rewrote manifests in snapshot {snapshot}")
    return {"table": table_name(args), "snapshot_id": snapshot}


# ---- upgrade-format-version ----------------------------------------------------------------------


def _upgrade_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--format-version", type=int, choices=[3], default=3, help="the format version to upgrade to (3, from 2)"
    )


@command(
    "upgrade-format-version", "upgrade a format v2 table to v3 (row lineage, deletion vectors)", _upgrade_arguments
)
def _upgrade(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.table.versions import upgrade_format_version

    load = table_loader(args)
    before = load().metadata.format_version
    table = upgrade_format_version(load, args.format_version)
    after = table.metadata.format_version
    out.say(
        f"{table_name(args)} already has format version {after}"
        if before == after
        else f"upgraded {table_name(args)} from format version {before} to {after}"
    )
    return {"table": table_name(args), "format_version_before": before, "format_version": after}

"""``iceberg-sink``: table upkeep from the command line (compact, convert deletes, expire, orphans, manifests).

iceberg-sink compact --embedded ./iceberg-sink-data --table db.events [--partition region=eu]
iceberg-sink compact --catalog prod --catalog-property uri=... --table db.events
iceberg-sink convert-equality-deletes --table db.users
iceberg-sink expire-snapshots --table db.events --older-than-hours 24 --retain-last 10
iceberg-sink remove-orphans --table db.events --older-than-hours 72 [--dry-run]
iceberg-sink rewrite-manifests --table db.events
iceberg-sink demo [--batches 10 --rows 2000]   (a streaming CDC pipeline with a live display; see demo.py)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import demo
from iceberg_sink.errors import IcebergSinkError, InvalidSinkConfigError
from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.table.catalog import load_table as load_from_catalog
from iceberg_sink.topology import maintenance
from iceberg_sink.topology.compaction import CompactionConfig, compact


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iceberg-sink", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        where = p.add_mutually_exclusive_group()
        where.add_argument("--embedded", metavar="DIR", help="the embedded default catalog under DIR")
        where.add_argument("--catalog", metavar="NAME", help="a PyIceberg catalog name (with --catalog-property)")
        p.add_argument("--catalog-property", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
        p.add_argument("--table", required=True, help="namespace.name")
        p.add_argument("--branch", default="main")

    c = sub.add_parser("compact", help="rewrite small files and apply deletes")
    common(c)
    c.add_argument(
        "--partition", action="append", default=[], metavar="FIELD=VALUE", help="only this partition (repeatable)"
    )
    c.add_argument("--target-file-size-bytes", type=int)
    c.add_argument("--min-input-files", type=int, default=2)
    c.add_argument("--master", default="local[2]", help="Spark master for the rewrite tasks")
    v = sub.add_parser(
        "convert-equality-deletes", help="turn equality deletes into position deletes (cheaper full reads)"
    )
    common(v)
    v.add_argument("--max-replans", type=int, default=3, help="plans again when a concurrent commit conflicts")
    e = sub.add_parser("expire-snapshots", help="expire old snapshots and delete files only they used")
    common(e)
    e.add_argument("--older-than-hours", type=float, default=24 * 5)
    e.add_argument("--retain-last", type=int, default=1)
    o = sub.add_parser("remove-orphans", help="delete files nothing references, older than a safety age")
    common(o)
    o.add_argument("--older-than-hours", type=float, default=72)
    o.add_argument("--dry-run", action="store_true")
    m = sub.add_parser("rewrite-manifests", help="merge small manifests")
    common(m)
    m.add_argument("--entries-per-manifest", type=int, default=10_000)
    # -- demo: listed here for --help; its options are parsed by iceberg_sink/demo.py (see main()).
    sub.add_parser("demo", help="stream generated changes into a local table with a live display, then check it")
    return parser


def _catalog(args: argparse.Namespace) -> CatalogConfig:
    if args.catalog:
        props = {}
        for item in args.catalog_property:
            key, sep, value = item.partition("=")
            if not sep:
                raise InvalidSinkConfigError(f"--catalog-property: expected KEY=VALUE, received {item!r}")
            props[key] = value
        return CatalogConfig(args.catalog, props)
    return CatalogConfig.embedded(args.embedded)


def _loader(config: CatalogConfig, identifier: str) -> Callable[[], Table]:
    catalog = config.load()

    def load() -> Table:
        table = load_from_catalog(catalog, identifier)
        if table is None:
            raise InvalidSinkConfigError(f"table {identifier} does not exist in catalog {config.name!r}")
        return table

    return load


def _partition_filter(table: Table, items: Sequence[str]) -> Callable[[int, tuple[Any, ...]], bool] | None:
    if not items:
        return None
    wanted = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidSinkConfigError(f"--partition: expected FIELD=VALUE, received {item!r}")
        wanted[name] = value
    schema = table.schema()

    def keep(spec_id: int, partition: tuple[Any, ...]) -> bool:
        spec = table.specs()[spec_id]
        types = spec.partition_type(schema).fields
        human = {
            f.name: f.transform.to_human_string(types[i].field_type, partition[i]) for i, f in enumerate(spec.fields)
        }
        return all(human.get(k) == v for k, v in wanted.items())

    return keep


def _progress(phase: str, done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stdout.write(f"\r{phase:<8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} groups")
    if done >= total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    # -- demo: dispatched before the table commands' parser, which would require --table.
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["demo"]:
        return demo.main(arguments[1:], prog="iceberg-sink demo")
    # -- end demo
    args = _parser().parse_args(argv)
    try:
        load = _loader(_catalog(args), args.table)
        if args.command == "compact":
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

            spark = (
                SparkSession.builder.master(args.master)
                .appName("iceberg-sink compact")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            config = CompactionConfig(
                target_file_size_bytes=args.target_file_size_bytes, min_input_files=args.min_input_files
            )
            result = compact(
                spark,
                load,
                config,
                branch=args.branch,
                partition_filter=_partition_filter(load(), args.partition),
                progress=_progress,
            )
            print(
                f"compacted {args.table}: {result.rewritten_data_files} data files ({result.rewritten_bytes} bytes) -> "
                f"{result.added_data_files} ({result.added_bytes} bytes), {result.removed_delete_files} delete files removed, "
                f"{result.dropped_groups} groups dropped on conflict; snapshot {result.snapshot_id}"
            )
        elif args.command == "convert-equality-deletes":
            converted = maintenance.convert_equality_deletes(load, branch=args.branch, max_replans=args.max_replans)
            print(
                f"converted {args.table}: {converted.removed_equality_delete_files} equality delete files "
                f"({converted.removed_equality_deletes} rows) -> {converted.added_position_delete_files} position "
                f"delete files ({converted.added_position_deletes} rows), {converted.removed_position_delete_files} "
                f"older position delete files merged, {converted.data_files_read} data files read, "
                f"{converted.replans} plans redone on conflict; snapshot {converted.snapshot_id}"
            )
        elif args.command == "expire-snapshots":
            older = dt.datetime.now(dt.UTC) - dt.timedelta(hours=args.older_than_hours)
            expired = maintenance.expire_snapshots(load, older, retain_last=args.retain_last)
            print(f"expired {len(expired.expired_snapshot_ids)} snapshots, deleted {len(expired.deleted_files)} files")
        elif args.command == "remove-orphans":
            orphans = maintenance.remove_orphan_files(
                load, dt.timedelta(hours=args.older_than_hours), dry_run=args.dry_run
            )
            for path in orphans.orphan_files:
                print(("would delete " if args.dry_run else "deleted ") + path)
            print(f"{len(orphans.orphan_files)} orphan files")
        else:
            snapshot = maintenance.rewrite_manifests(
                load, branch=args.branch, entries_per_manifest=args.entries_per_manifest
            )
            print("manifests already compact" if snapshot is None else f"rewrote manifests in snapshot {snapshot}")
    except IcebergSinkError as e:
        print(f"iceberg-sink: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

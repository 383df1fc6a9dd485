"""``iceberg-sink``: run a pipeline from a YAML file, inspect a table, and keep it in shape.

  iceberg-sink run pipeline.yaml [--available-now | --timeout SECONDS | --max-batches N]
  iceberg-sink inspect db.events [--checkpoint-location DIR] [--embedded DIR | --catalog NAME ...]
  iceberg-sink inspect --checkpoint-location DIR [--embedded DIR | --catalog NAME ...]   (the job's tables)
  iceberg-sink compact db.events [--partition region=eu] [--dry-run]
  iceberg-sink convert-equality-deletes db.users
  iceberg-sink expire-snapshots db.events --older-than-hours 24 --retain-last 10 [--dry-run]
  iceberg-sink remove-orphans db.events --older-than-hours 72 [--dry-run]
  iceberg-sink rewrite-manifests db.events
  iceberg-sink upgrade-format-version db.events --format-version 3
  iceberg-sink demo [--batches 10 --rows 2000]   (a streaming CDC pipeline with a live display; see demo.py)

Tables are found in the embedded default catalog (./iceberg-sink-data, or --embedded DIR) or in a
PyIceberg catalog (--catalog NAME --catalog-property uri=... ...). The table is the positional TABLE
or --table. Every command takes --json (one JSON document on stdout, nothing else there) and --debug
(stack traces on errors). See docs/cli.md.

Each subcommand is one block below: an arguments function and a run function registered with
``@command``; the run function returns the JSON document's fields and prints its human output with
``out.say``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from pyiceberg.table import Table

from iceberg_sink.cli.output import Output, StdoutClosed, detach_stdout, emit
from iceberg_sink.cli.where import (
    NotFoundError,
    UsageError,
    catalog_lookup,
    table_loader,
    table_name,
    table_options,
)
from iceberg_sink.errors import (
    CatalogUnavailableError,
    IcebergSinkError,
    InvalidInputError,
    InvalidSinkConfigError,
    MaintenanceRefusedError,
    SchemaMismatchError,
    UnsupportedTableError,
)
from iceberg_sink.topology import arguments

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 141

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    done
  {EXIT_FAILED}    the operation failed (a commit, a write, the streaming query, Spark)
  {EXIT_USAGE}    usage or configuration error (bad option, invalid config file or sink option)
  {EXIT_NOT_FOUND}    not found or unreachable: table, catalog, config file, checkpoint location
  {EXIT_REFUSED}    refused for safety, nothing deleted or committed (remove-orphans: listing and metadata
       disagree, a location shared with other tables; a rewrite that would change the live files)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
  {EXIT_STDOUT_CLOSED}  stdout was closed by its reader (`... | head`): the command stopped quietly, as on SIGPIPE
"""


Run = Callable[[argparse.Namespace, Output], dict[str, Any]]


@attrs.frozen
class Command:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Run


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[[Run], Run]:
    """Register a subcommand: ``arguments(parser)`` adds its options, the decorated function runs it."""

    def register(run: Run) -> Run:
        COMMANDS[name] = Command(name, help, arguments, run)
        return run

    return register


# ---- shared helpers ------------------------------------------------------------------------------


def spark_session(master: str, app_name: str, conf: dict[str, Any] | None = None, debug: bool = False) -> SparkSession:
    """A SparkSession without UI or console progress (progress is ours) and, unless ``debug``,
    without Spark's log (a failed query would print its JVM stack trace; the CLI prints one line)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR" if debug else "OFF")
    return spark


def _partition_filter(table: Table, items: Sequence[str]) -> Callable[[int, tuple[Any, ...]], bool] | None:
    if not items:
        return None
    wanted = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--partition: expected FIELD=VALUE, received {item!r}")
        wanted[name] = value
    from iceberg_sink.cli.inspection import partition_label

    def keep(spec_id: int, partition: tuple[Any, ...]) -> bool:
        labels = dict(
            part.split("=", 1) for part in partition_label(table, spec_id, partition).split("/") if "=" in part
        )
        return all(labels.get(k) == v for k, v in wanted.items())

    return keep


def _compaction_config(args: argparse.Namespace) -> Any:
    from iceberg_sink.topology.compaction import CompactionConfig

    return CompactionConfig(target_file_size_bytes=args.target_file_size_bytes, min_input_files=args.min_input_files)


def _planning_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target-file-size-bytes",
        type=arguments.TARGET_FILE_SIZE_BYTES.parse,
        metavar="BYTES",
        help="default: the table's write.target-file-size-bytes",
    )
    p.add_argument(
        "--min-input-files",
        type=arguments.MIN_INPUT_FILES.parse,
        default=2,
        metavar="N",
        help="files a group needs unless it applies deletes (2)",
    )


# ---- run -----------------------------------------------------------------------------------------


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG.yaml", help="the pipeline (see docs/cli.md)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument(
        "--available-now", action="store_true", help="process what the source holds now, then stop (trigger)"
    )
    stop.add_argument(
        "--timeout", type=arguments.TIMEOUT.parse, metavar="SECONDS", help="stop the stream after SECONDS"
    )
    p.add_argument("--max-batches", type=arguments.MAX_BATCHES.parse, metavar="N", help="stop after N micro-batches")
    p.add_argument("--master", help="Spark master (default: spark.master of the config, else local[2])")
    p.add_argument("--validate-only", action="store_true", help="check the config file and stop")


@command("run", "run a streaming pipeline from a YAML config file", _run_arguments)
def _run(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.cli import runconfig

    if not os.path.isfile(args.config):
        raise NotFoundError(f"config file {args.config} does not exist")
    config = runconfig.load(args.config)
    if args.validate_only:
        runconfig.validate_sink(config)
        out.say(f"{args.config}: valid")
        return {"config": args.config, "valid": True}
    spark_conf = dict(config.data.get("spark") or {})
    spark = spark_session(
        args.master or spark_conf.get("master", "local[2]"),
        spark_conf.get("app_name", "iceberg-sink run"),
        spark_conf.get("conf"),
        debug=args.debug,
    )

    def on_batch(progress: dict[str, Any]) -> None:
        if out.progress_on:
            stream = sys.stderr if out.json else sys.stdout
            emit(f"batch {progress['batchId']}: {progress['numInputRows']} rows\n", stream)

    result = runconfig.run(
        spark,
        config,
        available_now=args.available_now,
        timeout_s=args.timeout,
        max_batches=args.max_batches,
        on_batch=on_batch,
    )
    out.say(
        f"ran {result.batches} batches into {result.table}: {result.commits} commits, {result.committed_records} "
        f"rows, {result.committed_data_files} data files, {result.committed_delete_files} delete files; "
        f"stopped: {result.stopped_by}; snapshot {result.snapshot_id}"
    )
    return result.to_json()


# ---- inspect -------------------------------------------------------------------------------------


def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--checkpoint-location",
        action="append",
        default=[],
        metavar="DIR",
        help="show the pending checkpoints of the job under DIR (repeatable); without TABLE: list every table "
        "of the job (a routed job's many) with its pending checkpoints, UUID and last committed checkpoint",
    )
    p.add_argument(
        "--limit",
        type=arguments.LIMIT.parse,
        default=20,
        metavar="N",
        help="newest snapshots shown (default 20; 0: all)",
    )
    _planning_options(p)


@command(
    "inspect", "snapshots, jobs, pending checkpoints, files per partition, what compaction would do", _inspect_arguments
)
def _inspect(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    from iceberg_sink.cli import inspection

    if not (args.table or args.table_arg) and args.checkpoint_location:
        return _inspect_jobs(args, out)
    if not (args.table or args.table_arg):
        raise UsageError(
            "TABLE: required (positional, or --table namespace.name), or --checkpoint-location DIR alone to list "
            "the tables of the job under DIR"
        )
    table = table_loader(args)()
    try:
        report = inspection.inspect_table(
            table,
            args.branch,
            args.checkpoint_location,
            _compaction_config(args),
            args.limit or None,
            table_name=table_name(args),
        )
    except inspection.CheckpointLocationNotFoundError as e:
        raise NotFoundError(str(e)) from None
    out.say(inspection.render(report))
    return report


def _inspect_jobs(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """``inspect --checkpoint-location DIR`` without TABLE: the tables of the job under each DIR."""
    from iceberg_sink.cli import inspection

    lookup = catalog_lookup(args)
    jobs = []
    for location in args.checkpoint_location:
        try:
            jobs.append(inspection.job_tables(location, lookup))
        except inspection.CheckpointLocationNotFoundError as e:
            raise NotFoundError(str(e)) from None
    out.say("\n\n".join(inspection.render_job_tables(job) for job in jobs))
    return {"checkpoint_locations": jobs}


# ---- compact -------------------------------------------------------------------------------------


def _compact_arguments(p: argparse.ArgumentParser) -> None:
    table_options(p)
    p.add_argument(
        "--partition", action="append", default=[], metavar="FIELD=VALUE", help="only this partition (repeatable)"
    )
    _planning_options(p)
    p.add_argument("--master", default="local[2]", help="Spark master for the rewrite tasks (local[2])")
    p.add_argument("--dry-run", action="store_true", help="show the plan; rewrite nothing (no Spark)")


@command("compact", "rewrite small files and apply deletes", _compact_arguments)
def _compact(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    load = table_loader(args)
    table = load()
    config = _compaction_config(args)
    keep = _partition_filter(table, args.partition)
    if args.dry_run:
        from iceberg_sink import options
        from iceberg_sink.cli import inspection
        from iceberg_sink.topology.compaction.planner import plan

        target = options.resolve({}, table.properties).get(options.TARGET_FILE_SIZE_BYTES)
        dry = inspection.compaction_plan(table, plan(table, args.branch, config, target, keep), config)
        out.say(
            f"would compact {table_name(args)}: {dry['groups']} groups, {dry['data_files']} data files "
            f"({dry['input_bytes']} bytes), applying {dry['delete_files']} delete files"
        )
        for p in dry["partitions"]:
            out.say(f"  {p['partition']}: {p['groups']} groups, {p['data_files']} files, {p['input_bytes']} bytes")
        return {"table": table_name(args), "dry_run": True, "plan": dry}
    from iceberg_sink.topology.compaction import compact

    spark = spark_session(args.master, "iceberg-sink compact", debug=args.debug)
    result = compact(spark, load, config, branch=args.branch, partition_filter=keep, progress=out.progress())
    out.say(
        f"compacted {table_name(args)}: {result.rewritten_data_files} data files ({result.rewritten_bytes} bytes) "
        f"-> {result.added_data_files} ({result.added_bytes} bytes), {result.removed_delete_files} delete files "
        f"removed, {result.dropped_groups} groups dropped on conflict; snapshot {result.snapshot_id}"
    )
    return {"table": table_name(args), "dry_run": False, **attrs.asdict(result)}


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


# ---- demo ----------------------------------------------------------------------------------------
# Listed here for --help; main() hands `iceberg-sink demo ...` to iceberg_sink/cli/demo.py, which parses
# its own options.


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("demo_args", nargs=argparse.REMAINDER, metavar="...", help="see iceberg-sink demo --help")


@command("demo", "stream generated changes into a local table with a live display, then check it", _demo_arguments)
def _demo(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    raise UsageError("demo is run by main() directly")  # pragma: no cover - main() dispatches it first


# ---- main ----------------------------------------------------------------------------------------


def _global_options(p: argparse.ArgumentParser, top: bool) -> None:
    # On subcommands the defaults are suppressed so `iceberg-sink --json inspect t` and
    # `iceberg-sink inspect t --json` both work.
    default: Any = False if top else argparse.SUPPRESS
    p.add_argument("--json", action="store_true", default=default, help="one JSON document on stdout, nothing else")
    p.add_argument("--debug", action="store_true", default=default, help="stack traces on errors")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None if top else argparse.SUPPRESS,
        help="progress of long work (default: on when stdout is a terminal and without --json)",
    )


def parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    top = argparse.ArgumentParser(
        prog="iceberg-sink", description=__doc__, epilog=EXIT_CODES, formatter_class=formatter
    )
    _global_options(top, top=True)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS.values():
        p = sub.add_parser(c.name, help=c.help, description=c.help, epilog=EXIT_CODES, formatter_class=formatter)
        c.arguments(p)
        _global_options(p, top=False)
    return top


def exit_code(error: BaseException) -> int:
    """The documented exit code of an error (see EXIT_CODES)."""
    from iceberg_sink.cli import runconfig

    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, NotFoundError | CatalogUnavailableError | FileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, MaintenanceRefusedError):
        return EXIT_REFUSED
    if isinstance(error, runconfig.PipelineFailedError):
        return EXIT_FAILED
    if isinstance(
        error, UsageError | InvalidSinkConfigError | SchemaMismatchError | UnsupportedTableError | InvalidInputError
    ):
        return EXIT_USAGE
    return EXIT_FAILED


_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\s*$")


def describe(error: BaseException) -> tuple[str, str]:
    """``(type name, one line)`` of an error: our errors' message as it is; for others (Spark's carry
    JVM stack traces) the most telling line: the last ``module.XError: message`` of a Python error
    raised in a micro-batch, else the first line."""
    text = str(error).strip()
    if isinstance(error, IcebergSinkError) and "Traceback" not in text and "\tat " not in text:
        return type(error).__name__, " ".join(text.split())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    python = [
        line
        for line in lines
        if not line.startswith(("at ", "File ", "Traceback", "...", "^"))
        and ": " in line
        and line.split(": ", 1)[0].rsplit(".", 1)[-1].endswith(("Error", "Exception"))
        and " " not in line.split(": ", 1)[0]
    ]
    if python:
        kind, message = python[-1].split(": ", 1)
        kind = kind.rsplit(".", 1)[-1]
        return kind, f"{kind}: {_SQLSTATE.sub('', message)}"
    first = _SQLSTATE.sub("", lines[0]) if lines else ""
    name = type(error).__name__
    return name, first if first.startswith(name) else f"{name}: {first}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (EXIT_CODES)."""
    try:
        try:
            return _main(argv)
        finally:
            _flush(sys.stdout)  # output still buffered (argparse's --help) meets a closed pipe here
    except (StdoutClosed, BrokenPipeError):
        detach_stdout()
        return EXIT_STDOUT_CLOSED


def _flush(stream: Any) -> None:
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()


def _main(argv: Sequence[str] | None) -> int:
    # -- demo: its own options and output (iceberg_sink/cli/demo.py).
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["demo"]:
        from iceberg_sink.cli import demo

        return demo.main(arguments[1:], prog="iceberg-sink demo")
    # -- end demo
    args = parser().parse_args(argv)
    progress = args.progress if args.progress is not None else (not args.json and sys.stdout.isatty())
    out = Output(json=args.json, progress_on=progress)
    try:
        result = COMMANDS[args.command].run(args, out)
    except StdoutClosed:
        raise
    except (Exception, KeyboardInterrupt) as e:
        code = exit_code(e)
        kind, line = describe(e)
        if args.debug:
            traceback.print_exc()
        emit(f"iceberg-sink {args.command}: {line}\n", sys.stderr)
        if args.json:
            error = {"type": kind, "message": line}
            emit(json.dumps({"command": args.command, "ok": False, "exit_code": code, "error": error}) + "\n")
        return code
    if args.json:
        emit(json.dumps({"command": args.command, "ok": True, **result}, default=str) + "\n")
    return EXIT_OK

"""The subcommands' registry and the commands that move data: ``run``, ``inspect`` and ``compact``.

``@command`` registers a subcommand in COMMANDS, whose order is the order main.py's parser lists them
in (``iceberg-sink --help``); the helpers the commands share (spark_session, the compaction planning
options) are here too. The table-maintenance commands are in maintenance_commands.py.

Each subcommand is one block below: an arguments function and a run function registered with
``@command``; the run function returns the JSON document's fields and prints its human output with
``out.say``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from pyiceberg.table import Table

from iceberg_sink._driver_jvm import driver_java_options, names_class_sharing
from iceberg_sink.cli.output import Output, emit
from iceberg_sink.cli.where import (
    NotFoundError,
    UsageError,
    catalog_commits_atomically,
    catalog_lookup,
    table_loader,
    table_name,
    table_options,
)
from iceberg_sink.topology import arguments

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_OPTIONS = "spark.driver.extraJavaOptions"

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
    without Spark's log (a failed query would print its JVM stack trace; the CLI prints one line).
    Its driver JVM starts with :func:`~iceberg_sink._driver_jvm.driver_java_options`, before any
    ``spark.driver.extraJavaOptions`` of ``conf`` (whose values win)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    settings = {
        key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in (conf or {}).items()
    }
    own = settings.get(JAVA_OPTIONS, "")
    # A class data sharing archive of the user's own replaces ours (Java 17 refuses two).
    settings[JAVA_OPTIONS] = f"{driver_java_options(class_sharing=not names_class_sharing(own))} {own}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
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
    from iceberg_sink.cli import runconfig, runner

    if not os.path.isfile(args.config):
        raise NotFoundError(f"config file {args.config} does not exist")
    config = runconfig.load(args.config)
    if args.validate_only:
        runner.validate_sink(config)
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

    result = runner.run(
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
    atomic = catalog_commits_atomically(args)
    jobs = []
    for location in args.checkpoint_location:
        try:
            jobs.append(inspection.job_tables(location, lookup, atomic))
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

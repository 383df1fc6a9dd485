"""The results of the CDC benchmark (``benchmarks/cdc.py``): each system's result from its driver's
raw timings and the reader's observations, and the summary lines on stderr."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import cdc_kafka
from benchmarks.cdc_data import Dataset, compare
from benchmarks.cdc_systems import SYSTEMS


def log(message: str) -> None:
    print(f"[cdc {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def table_files(summary: dict[str, str]) -> dict[str, int]:
    """File and record totals from a snapshot summary."""
    keys = (
        "total-records",
        "total-data-files",
        "total-delete-files",
        "total-equality-deletes",
        "total-position-deletes",
    )
    return {k: int(summary[k]) for k in keys if k in summary}


def _common(raw: dict[str, Any], engine: str) -> dict[str, Any]:
    summaries: list[dict[str, str]] = raw["batch_summaries"]
    return {
        "engine": engine,
        "load_seconds": raw["load_seconds"],
        "batch_seconds": raw["batch_seconds"],
        "batch_intervals": raw["batch_intervals"],
        "load_waited_for_quiet_seconds": raw["load_waited_for_quiet_seconds"],
        "batch_waited_for_quiet_seconds": raw["batch_waited_for_quiet_seconds"],
        "batch_summaries": summaries,
        "table_files_after": table_files(summaries[-1]) if summaries else {},
    }


def system_result(
    raw: dict[str, Any], engine: str, observed: dict[str, Any], reader: str, data: Dataset, sample_ids: list[int]
) -> dict[str, Any]:
    """The common part of one system's result: latencies, checks and table files."""
    checks = compare(data.expected, observed, sample_ids)
    checks["reader"] = reader
    return {**_common(raw, engine), "table_rows_after": observed["rows"], "checks": checks}


def unread_result(raw: dict[str, Any], engine: str) -> dict[str, Any]:
    """:func:`system_result` of a run that read nothing back (``--scans 0``): its checks not run."""
    return {
        **_common(raw, engine),
        "table_rows_after": None,
        "checks": {"ok": None, "not_run": "--scans 0: the table was not read back"},
    }


def scan_point_results(recorded: list[dict[str, Any]], scanned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scan point: the sink table's delete files then, both scan medians and their ratio."""
    out = []
    for point, runs in zip(recorded, scanned, strict=True):
        sink = statistics.median(runs["sink_runs"])
        merge = statistics.median(runs["merge_runs"]) if runs.get("merge_runs") else None
        summary = point["summary"]
        out.append(
            {
                "batch": point["batch"],
                "sink_scan_seconds": sink,
                "merge_scan_seconds": merge,
                "ratio": sink / merge if merge else None,
                "sink_scan_runs": runs["sink_runs"],
                "merge_scan_runs": runs.get("merge_runs"),
                "sink_data_files": int(summary.get("total-data-files", 0)),
                "sink_delete_files": int(summary.get("total-delete-files", 0)),
                "sink_equality_deletes": int(summary.get("total-equality-deletes", 0)),
                "sink_position_deletes": int(summary.get("total-position-deletes", 0)),
            }
        )
    return out


def engine_of(name: str, raw: dict[str, Any]) -> str:
    """What wrote a system's table, for the result."""
    system = SYSTEMS[name]
    if system.driver == "sink":
        deletes = "deletion vectors" if system.format_version >= 3 else "equality deletes"
        how = (
            f", one streaming query (sink.start) of {raw['files_per_trigger']} input batch(es) per micro-batch"
            + (f", ordered by {raw['order_by']}" if raw.get("order_by") else "")
            if raw.get("mode") == "stream"
            else ""
        )
        if raw.get("mode") == "kafka":
            how = cdc_kafka.engine_suffix(raw)
        return (
            f"Spark {raw['spark_version']} + iceberg_sink (PyIceberg {raw['pyiceberg_version']}), "
            f"format v{system.format_version}, upsert with {deletes}{how}"
        )
    if system.driver == "merge":
        deletes = "deletion vectors" if system.format_version >= 3 else "position deletes"
        return (
            f"Spark {raw['spark_version']} + Apache Iceberg Java {raw['iceberg_version']}, format "
            f"v{system.format_version}, MERGE INTO merge-on-read ({deletes})"
        )
    how = (
        f"one streaming job committing every {raw['checkpoint_interval_ms']} ms checkpoint"
        if raw.get("mode") == "stream"
        else "one bounded job per batch"
    )
    if raw.get("mode") == "kafka":
        return (
            f"Apache Flink {raw['flink_version']} + Iceberg Java {raw['iceberg_version']} (iceberg-flink-runtime), "
            f"format v{system.format_version}, upsert mode with equality deletes{cdc_kafka.engine_suffix(raw)}"
        )
    return (
        f"Apache Flink {raw['flink_version']} + Iceberg Java {raw['iceberg_version']} "
        f"(iceberg-flink-runtime), upsert mode with equality deletes, {how}"
    )


def system_extras(name: str, raw: dict[str, Any], reader: dict[str, Any], jar: Path) -> dict[str, Any]:
    """The driver-specific part of one system's result."""
    system = SYSTEMS[name]
    extras: dict[str, Any] = {
        "format_version": system.format_version,
        "final_summary": raw.get("final_summary"),
        "metadata_location": raw.get("metadata_location"),
        "load_cpu_seconds": raw.get("load_cpu_seconds"),
        "batch_cpu_seconds": raw.get("batch_cpu_seconds"),
    }
    if system.driver == "sink":
        extras.update(
            spark_version=raw["spark_version"],
            pyiceberg_version=raw["pyiceberg_version"],
            batch_phases=raw["batch_phases"],
            convert_every=raw["convert_every"],
            conversion_metrics=raw["conversion_metrics"],
            scan_points=scan_point_results(raw["scan_points"], reader.get("scan_points") or []),
        )
        if raw.get("mode") in ("stream", "kafka"):
            extras.update(
                files_per_trigger=raw["files_per_trigger"],
                stream_seconds=raw["stream_seconds"],
                stream_snapshots=raw["stream_snapshots"],
                commit_changes=raw["batch_changes"],
                batch_sink_phases_ms=raw["batch_sink_phases_ms"],
                batch_spark_duration_ms=raw["batch_spark_duration_ms"],
            )
        if raw.get("mode") == "kafka":
            extras.update(cdc_kafka.extras(raw), micro_batch_changes=raw["micro_batch_changes"])
    elif system.driver == "merge":
        extras.update(
            spark_version=raw["spark_version"],
            iceberg_version=raw["iceberg_version"],
            jar=jar.name,
            table_properties=raw["table_properties"],
            merge_sql=raw["merge_sql"],
        )
    else:
        extras.update(
            flink_version=raw["flink_version"],
            iceberg_version=raw["iceberg_version"],
            jars=raw["jars"],
            parallelism=raw["parallelism"],
            table_properties=raw["table_properties"],
            java_version=raw["java_version"],
            input_csv_conversion_seconds=raw["csv_conversion_seconds"],
            batch_job_net_runtime_seconds=raw["batch_job_net_runtime_seconds"],
        )
        if raw.get("mode") in ("stream", "kafka"):
            extras.update(
                checkpoint_interval_ms=raw["checkpoint_interval_ms"],
                stream_job_seconds=raw["stream_job_seconds"],
                stream_snapshots=raw["stream_snapshots"],
                stream_submission_attempts=raw.get("stream_submission_attempts"),
                commit_changes=raw["batch_changes"],
            )
        if raw.get("mode") == "kafka":
            extras.update(cdc_kafka.extras(raw))
    return extras


def _seconds(value: float | None) -> str:
    return "not run" if value is None else f"{value:.2f}s"


def _checks(ok: bool | None) -> str:
    return "NOT RUN" if ok is None else "ok" if ok else "FAILED"


def report(result: dict[str, Any], out: Path) -> None:
    """One line per system (and per scan point) on stderr."""
    for name, system in result["systems"].items():
        steady, e2e = system["steady_state"], system["end_to_end"]
        foreign_cpu = sum(f or 0.0 for f in system["batch_foreign_cpu_seconds"])
        waited_total = sum(system["batch_waited_for_quiet_seconds"])
        cpu = steady.get("cpu_seconds_per_million_changes")
        log(
            f"{name}: load {system['load_seconds']:.1f}s, end to end {e2e['seconds']:.1f}s; steady batches "
            f"p50 {steady['median']:.2f}s p99 {steady['p99']:.2f}s, {steady.get('changes_per_second', 0):.0f} "
            f"changes/s, {'?' if cpu is None else f'{cpu:.0f}'} CPU-s per M changes; full scan "
            f"{_seconds(system['full_scan_seconds'])}; checks {_checks(system['checks']['ok'])}; other "
            f"processes used {foreign_cpu:.1f} CPU-s during its batches; waited {waited_total:.0f}s for quiet"
        )
        half = system.get("second_half")
        if half:
            half_cpu = half.get("cpu_seconds_per_million_changes")
            log(
                f"{name}, second half of the changes: {half['entries']} commits, {half['changes_per_second']:.0f} "
                f"changes/s, {half['seconds_between_commits_p50']:.2f}s between commits p50 "
                f"({half['seconds_between_commits_p99']:.2f}s p99), {'?' if half_cpu is None else f'{half_cpu:.0f}'} "
                "CPU-s per M changes"
            )
        if system.get("kafka"):
            log(f"{name} on Kafka: {cdc_kafka.report_line(system)}")
        for point in system.get("scan_points") or []:
            ratio = point["ratio"]
            log(
                f"{name} after batch {point['batch']}: full scan {point['sink_scan_seconds']:.2f}s vs MERGE "
                f"{point['merge_scan_seconds'] or float('nan'):.2f}s (ratio {ratio if ratio is None else round(ratio, 2)}), "
                f"{point['sink_delete_files']} delete files, {point['sink_equality_deletes']} equality deletes"
            )
    if result.get("v3_goals"):
        log(f"v3 goals: {result['v3_goals']}")
    log(f"total {result['timings_seconds']['total']:.0f}s; wrote {out}")

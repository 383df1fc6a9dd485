"""The systems of the CDC benchmark and the figures computed from their drivers' raw timings.

Pure logic (no Spark, no I/O), shared by ``benchmarks/cdc.py`` and its unit tests:

- ``SYSTEMS``: each name the benchmark accepts, the driver that writes its table and the table's
  format version. ``iceberg_sink`` and ``merge_into`` are the format v2 systems of the published
  figures; ``iceberg_sink_v3`` (the sink's deletion vectors) and ``merge_into_v3`` (Iceberg Java's
  MERGE INTO merge-on-read on a v3 table, which writes DVs) are issue 22's comparison;
  ``iceberg_sink_stream`` is the v2 sink as one streaming query (``sink.start``), the like of
  ``flink_stream``; ``iceberg_sink_kafka`` and ``flink_kafka`` (``_v3``: on format v3 tables) are
  the two as one streaming query / job over the same Kafka topic (``source`` "kafka",
  ``benchmarks/cdc_kafka.py``).
- ``summarize``: median (p50), p90, p99 of the steady batches.
- ``write_figures``: end to end (load and every batch) and steady state (the batches after the
  warm-up) apart, each with changes per second and CPU-seconds per million changes; a streaming
  driver's (``flink_stream``, ``iceberg_sink_stream``, the ``_kafka`` systems) entries are its
  commits, each of its own size (``batch_changes``).
- ``v3_goals``: issue 22's targets, write p50 <= 0.45 s per batch for ``iceberg_sink_v3`` and a
  full scan no slower than the ``merge_into_v3`` table's.
- ``paired_ratio``: the per-round ratio of two tables' scans (each round scans both), its median and a
  bootstrap 95 % interval of that median: what separates a real difference from this machine's noise.
"""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CdcSystem:
    """One system of the benchmark: which driver writes its table, and at which format version."""

    name: str
    driver: str  # "sink" (benchmarks/sink_driver.py), "merge" (merge_into_driver.py) or "flink"
    format_version: int
    source: str = "files"  # "kafka": one streaming query / job over the change topic (cdc_kafka.py)


SYSTEMS: dict[str, CdcSystem] = {
    s.name: s
    for s in (
        CdcSystem("iceberg_sink", "sink", 2),
        CdcSystem("iceberg_sink_v3", "sink", 3),
        CdcSystem("iceberg_sink_stream", "sink", 2),
        CdcSystem("merge_into", "merge", 2),
        CdcSystem("merge_into_v3", "merge", 3),
        CdcSystem("flink", "flink", 2),
        CdcSystem("flink_stream", "flink", 2),
        CdcSystem("iceberg_sink_kafka", "sink", 2, "kafka"),
        CdcSystem("iceberg_sink_kafka_v3", "sink", 3, "kafka"),
        CdcSystem("flink_kafka", "flink", 2, "kafka"),
        CdcSystem("flink_kafka_v3", "flink", 3, "kafka"),
    )
}
# What runs without --systems: the two systems of the published figures (the others are opt-in).
DEFAULT_SYSTEMS = ("iceberg_sink", "merge_into")
# Issue 22's targets for the v3 path.
V3_WRITE_TARGET_SECONDS = 0.45
V3_SCAN_TARGET_RATIO = 1.0


def parse_systems(text: str) -> list[str]:
    """The systems named by a comma-separated list, in its order, each once; ValueError naming the
    accepted names and the unknown ones otherwise."""
    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ValueError(f"expected a comma-separated subset of {', '.join(SYSTEMS)}, received {unknown or repr(text)}")
    return names


def percentile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values, linearly interpolated between the closest ranks."""
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(seconds: list[float], warmup: int, batch_size: int | None = None) -> dict[str, Any]:
    """Median (also as ``p50``), p90, p99 (linear interpolation), mean, min and max of the batches
    after the warm-up ones; with ``batch_size``, the steady changes per second too (changes applied /
    seconds spent)."""
    steady = seconds[warmup:] if len(seconds) > warmup else seconds
    if not steady:
        return {"batches": 0}
    ordered = sorted(steady)
    median = statistics.median(steady)
    out: dict[str, Any] = {
        "batches": len(steady),
        "skipped_warmup_batches": len(seconds) - len(steady),
        "median": median,
        "p50": median,
        "p90": percentile(ordered, 0.9),
        "p99": percentile(ordered, 0.99),
        "mean": statistics.fmean(steady),
        "min": ordered[0],
        "max": ordered[-1],
    }
    if batch_size is not None and sum(steady) > 0:
        out["changes_per_second"] = batch_size * len(steady) / sum(steady)
    return out


def entry_changes(added: list[int], bounds: list[int]) -> list[int]:
    """The changes of each entry of a streaming driver: entry i holds the commits
    ``bounds[i]`` to ``bounds[i + 1] - 1`` (indexes into ``added``, the changes of each commit in
    commit order), so a poll that saw two commits at once gives one entry of both. ValueError unless
    ``bounds`` rises strictly from 0 to ``len(added)``: a commit no entry holds would vanish."""
    if not bounds or bounds[0] != 0 or bounds[-1] != len(added) or any(b <= a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"expected entry bounds rising strictly from 0 to {len(added)}, received {bounds}")
    return [sum(added[low:high]) for low, high in itertools.pairwise(bounds)]


def _total(values: list[float | None]) -> float | None:
    """The sum, or None when any value is unknown (no /proc, or a driver that does not measure it)."""
    return None if not values or any(v is None for v in values) else float(sum(v for v in values if v is not None))


def _per_million(cpu: float | None, count: int) -> float | None:
    return cpu / count * 1e6 if cpu is not None and count > 0 else None


def write_figures(raw: dict[str, Any], warmup: int, batch_size: int, initial_rows: int) -> dict[str, Any]:
    """End to end and steady state of one system's writes, apart.

    ``raw`` is a driver's result: ``load_seconds``, ``batch_seconds`` and, where the driver measures
    them, ``load_cpu_seconds`` and ``batch_cpu_seconds`` (its whole process tree). End to end is the
    initial load plus every batch (warm-up included), in seconds of work (the waits for a quiet
    machine between batches left out); steady state is the batches after ``warmup`` (as
    ``summarize``). CPU-seconds are per million changes for the batches and per million rows for the
    load."""
    seconds: list[float] = raw["batch_seconds"]
    # A streaming driver's entries are its commits, of varying size (``batch_changes``).
    sizes: list[int] = raw.get("batch_changes") or [batch_size] * len(seconds)
    cpu: list[float | None] = raw.get("batch_cpu_seconds") or [None] * len(seconds)
    load_cpu = raw.get("load_cpu_seconds")
    batch_cpu = _total(cpu)
    changes = sum(sizes)
    end_to_end = {
        "seconds": raw["load_seconds"] + sum(seconds),
        "load_seconds": raw["load_seconds"],
        "batch_seconds": sum(seconds),
        "changes_per_second": changes / sum(seconds) if sum(seconds) > 0 else None,
        "cpu_seconds": None if load_cpu is None or batch_cpu is None else load_cpu + batch_cpu,
        "load_cpu_seconds_per_million_rows": _per_million(load_cpu, initial_rows),
        "batch_cpu_seconds_per_million_changes": _per_million(batch_cpu, changes),
    }
    steady = summarize(seconds, warmup, batch_size)
    skipped = steady.get("skipped_warmup_batches", 0)
    steady_changes = sum(sizes[skipped:])
    if raw.get("batch_changes") and sum(seconds[skipped:]) > 0:
        steady["changes_per_second"] = steady_changes / sum(seconds[skipped:])
        steady["changes_per_commit_median"] = statistics.median(sizes[skipped:]) if sizes[skipped:] else None
    steady_cpu = _total(cpu[skipped:])
    steady["cpu_seconds"] = steady_cpu
    steady["cpu_seconds_per_million_changes"] = _per_million(steady_cpu, steady_changes)
    return {"end_to_end": end_to_end, "steady_state": steady, "second_half": second_half(seconds, sizes, cpu)}


def second_half(seconds: list[float], sizes: list[int], cpu: list[float | None]) -> dict[str, Any] | None:
    """The entries that begin once half of all changes are applied, summarized as steady state is:
    a warm-up measured in changes, the same for every system whatever its commit size (the first
    ``--warmup`` entries are 20,000 changes of 10,000-change micro-batches, 50,000 of Flink's 25,000-change
    checkpoints), and long enough for a JVM's compiler to settle (a Spark driver still compiles Spark's
    code a minute into a stream). None when fewer than two entries begin there."""
    half = sum(sizes) / 2
    # Changes applied before each entry: the first entry to begin at half or later.
    first = next((i for i, done in enumerate(itertools.accumulate(sizes, initial=0)) if done >= half), len(sizes))
    if len(sizes) - first < 2 or sum(seconds[first:]) <= 0:
        return None
    spent = seconds[first:]
    changes = sum(sizes[first:])
    used = _total(cpu[first:])
    return {
        "entries": len(spent),
        "changes": changes,
        "changes_per_second": changes / sum(spent),
        "seconds_between_commits_p50": statistics.median(spent),
        "seconds_between_commits_p99": percentile(sorted(spent), 0.99),
        "changes_per_commit_median": statistics.median(sizes[first:]),
        "cpu_seconds_per_million_changes": _per_million(used, changes),
    }


def v3_goals(systems: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Issue 22's targets checked on one run: the v3 sink's steady median write latency against
    ``V3_WRITE_TARGET_SECONDS`` and its full scan against the ``merge_into_v3`` table's (ratio <=
    ``V3_SCAN_TARGET_RATIO``); None unless both systems ran."""
    sink, merge = systems.get("iceberg_sink_v3"), systems.get("merge_into_v3")
    if sink is None or merge is None:
        return None
    write = sink["steady_state"]["median"]
    scans = sink["full_scan_seconds"], merge["full_scan_seconds"]
    ratio = scans[0] / scans[1] if scans[0] is not None and scans[1] else None
    return {
        "write_p50_seconds": write,
        "write_target_seconds": V3_WRITE_TARGET_SECONDS,
        "write_met": write <= V3_WRITE_TARGET_SECONDS,
        "merge_into_v3_write_p50_seconds": merge["steady_state"]["median"],
        "scan_ratio_to_merge_into_v3": ratio,
        "scan_target_ratio": V3_SCAN_TARGET_RATIO,
        "scan_met": ratio is not None and ratio <= V3_SCAN_TARGET_RATIO,
        "scan_paired_wall": _paired(sink.get("full_scan_runs"), merge.get("full_scan_runs")),
        "scan_paired_cpu": _paired(sink.get("full_scan_cpu_runs"), merge.get("full_scan_cpu_runs")),
    }


def _paired(runs: list[float | None] | None, reference: list[float | None] | None) -> dict[str, Any] | None:
    """:func:`paired_ratio` of two tables' runs; None unless both have every run (a CPU reading is
    None without /proc)."""
    if not runs or not reference or None in runs or None in reference:
        return None
    return paired_ratio(runs, reference)  # type: ignore[arg-type]


def paired_ratio(
    runs: list[float], reference_runs: list[float], resamples: int = 4000, seed: int = 22
) -> dict[str, Any]:
    """Round ``i``'s ratio ``runs[i] / reference_runs[i]`` (both tables scanned in the same round, the
    order rotated), the median and mean of those ratios, and a percentile bootstrap 95 % interval of
    the median (``resamples`` resamples of the rounds, seeded: the same runs give the same interval).
    ``slower`` / ``faster``: the interval lies wholly above / below 1.0, i.e. the difference is more than
    the rounds' spread; neither means the two tables scan alike within what the runs can separate."""
    if len(runs) != len(reference_runs) or not runs:
        raise ValueError(
            f"paired runs need the same number of rounds, at least one; got {len(runs)} and {len(reference_runs)}"
        )
    if min(reference_runs) <= 0:
        raise ValueError(f"reference runs must be positive, got {min(reference_runs)}")
    ratios = [a / b for a, b in zip(runs, reference_runs, strict=True)]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return {
        "rounds": len(ratios),
        "median": statistics.median(ratios),
        "mean": statistics.fmean(ratios),
        "ci95": [low, high],
        "slower": low > 1.0,
        "faster": high < 1.0,
    }

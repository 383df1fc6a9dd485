"""Where a Spark JVM's CPU went: a Java Flight Recorder recording split by thread and Spark phase.

Record with the driver JVM's options (``spark.driver.extraJavaOptions``; local mode runs the
executors in the same JVM), e.g. ``benchmarks.debezium_wide --jfr PATH`` or
``benchmarks.cdc --sink-spark-conf spark.driver.extraJavaOptions=...`` with :data:`JFR_OPTIONS`.
Then::

    python -m benchmarks.jvm_profile PATH.jfr [--json]

Each execution sample is put in one row: the thread that ran it (``driver-call``: a call the
Python driver made through Py4J, on its own thread or, inside ``foreachBatch``, on the stream's
thread; ``executor``: a task; ``other``: Spark's schedulers, listeners, AQE's stage threads) and
the first phase, in :data:`PHASES` order, whose frames are on its stack (serialization before
parsing before code generation before analysis...: a phase called from inside another counts as
the inner one). For driver calls it also names the Dataset method Python called (``select``,
``collectToPython``...), so a phase can be traced to the step of the sink that pays it. Stacks are
recorded 2048 frames deep (:data:`JFR_OPTIONS`): Catalyst's tree walks are deeper than JFR's
default 64, which would cut off the frames that say which phase a sample belongs to.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
from pathlib import Path
from typing import Any

#: Options for the JVM to record with (``{path}``: where the recording goes).
JFR_OPTIONS = "-XX:FlightRecorderOptions:stackdepth=2048 -XX:StartFlightRecording=filename={path},settings=profile"

#: (phase, a regular expression one of the sample's frames matches), first match wins.
PHASES: tuple[tuple[str, str], ...] = (
    ("serialize", r"ObjectOutputStream|writeObject"),
    ("deserialize", r"ObjectInputStream|readObject"),
    ("parse SQL text", r"AbstractParser\.parse|SqlBaseParser"),
    (
        "generate a projection (per task)",
        r"GenerateUnsafeProjection|GenerateMutableProjection|GenerateSafeProjection|GeneratePredicate"
        r"|GenerateOrdering",
    ),
    ("whole-stage code generation", r"WholeStageCodegenExec|CodeGenerator"),
    ("analysis", r"Analyzer\.execute|CheckAnalysis|lazyAnalyzed|Analyzer\$"),
    ("optimizer", r"lazyOptimizedPlan|Optimizer|optimizedPlan"),
    ("physical planning", r"QueryPlanner\.plan|lazySparkPlan|lazyExecutedPlan|prepareForExecution|AdaptiveSparkPlan"),
    ("Python workers and Arrow", r"[Pp]ython|[Aa]rrow"),
)

_SAMPLE = "jdk.ExecutionSample"
_FRAME = re.compile(r"^\s+([\w$.<>]+)\(", re.M)
_THREAD = re.compile(r'sampledThread = "([^"]*)"')


def samples(recording: Path) -> list[tuple[str, list[str]]]:
    """(thread name, frames innermost first) of each execution sample (``jfr print``, from the JDK)."""
    text = subprocess.run(
        ["jfr", "print", "--events", _SAMPLE, "--stack-depth", "2048", str(recording)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out = []
    for event in text.split(_SAMPLE)[1:]:
        frames = _FRAME.findall(event)
        thread = _THREAD.search(event)
        if frames:
            out.append((thread.group(1) if thread else "?", frames))
    return out


def _thread_kind(thread: str, frames: list[str]) -> str:
    if thread.startswith("Executor task launch"):
        return "executor"
    if "py4j.Gateway.invoke" in frames or "py4j.commands.AbstractCommand.invokeMethod" in frames:
        return "driver-call"
    return "other"


def _entry(frames: list[str]) -> str:
    """The Spark method a Py4J call entered (the frame Java's reflection called)."""
    calls = [i for i, f in enumerate(frames) if f == "java.lang.reflect.Method.invoke"]
    if not calls:
        return "?"
    i = calls[-1] - 1
    while i > 0 and ("reflect" in frames[i] or "GeneratedMethodAccessor" in frames[i]):
        i -= 1
    return frames[i].rsplit(".", 1)[-1]


def profile(recording: Path) -> dict[str, Any]:
    phases: collections.Counter[tuple[str, str]] = collections.Counter()
    entries: collections.Counter[tuple[str, str]] = collections.Counter()
    taken = samples(recording)
    for thread, frames in taken:
        stack = "\n".join(frames)
        phase = next((name for name, pattern in PHASES if re.search(pattern, stack)), "other")
        kind = _thread_kind(thread, frames)
        phases[(kind, phase)] += 1
        if kind == "driver-call":
            entries[(_entry(frames), phase)] += 1
    total = len(taken) or 1
    return {
        "samples": len(taken),
        "by_thread_and_phase": [
            {"thread": k, "phase": p, "samples": n, "share": round(n / total, 3)} for (k, p), n in phases.most_common()
        ],
        "driver_calls": [
            {"method": m, "phase": p, "samples": n, "share": round(n / total, 3)}
            for (m, p), n in entries.most_common(20)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = profile(args.recording)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['samples']} samples")
    for row in result["by_thread_and_phase"]:
        if row["share"] >= 0.01:
            print(f"{row['share']:6.1%}  {row['thread']:<12} {row['phase']}")
    print("driver calls (Dataset method: phase):")
    for row in result["driver_calls"]:
        if row["share"] >= 0.01:
            print(f"{row['share']:6.1%}  {row['method']}: {row['phase']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

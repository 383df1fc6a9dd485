"""CDC checkpoints against a table larger than the driver's key index: the driver index against the
partitioned one (issue 43).

    .venv/bin/python -m benchmarks.key_index_scale [--rows 1000000 10000000] [--keys long uuid]
        [--formats 3] [--layouts driver partitioned] [--checkpoints 12] [--changes 10000]
        [--driver-rows 1000000] [--bound 67108864] [--rounds 1] [--restarts 1] [--restart-warmup 2]
        [--out result.json]

For each row count, key kind (a long, or a UUID string; random: key bounds prune nothing), format
and layout, in fresh processes:

1. **setup** (untimed, the same for both layouts): a table of N rows (key, a 40-byte payload, an
   lsn), written with PyIceberg in files of 1M rows, keys in random order, on format v2 (PyIceberg
   writes no v3), then upgraded to v3 by the sink (``sink.upgrade_format_version``); or left on v2,
   with the sink's equality-delete conversion after every commit (``--formats 2``);
2. **steady** (one process): a sink with the key index bound at ``--bound`` bytes (so 10M rows do not
   fit) and the layout's options runs ``--checkpoints`` bounded ``write()`` checkpoints of
   ``--changes`` updates of random existing keys; the first checkpoint indexes the table (both
   layouts read every file's keys then), the rest are steady;
   ``--rounds R``: R such processes per case, each a new driver on the same table (the first one's
   first checkpoint indexes it); every size's tables are set up first and round r of each size runs
   before round r + 1 of any (in alternating order), so a slow stretch of the machine falls on every
   size alike: ``steady_round_p50s`` holds each round's p50, ``steady_p50_seconds`` the p50 of all of
   them pooled; the layouts' cases of one key and format share the rounds (``--driver-rows``: the
   row counts the driver layout runs at, all of them by default), so the driver index at 1M is an
   anchor from the same run;
3. **restart** (a second process, the same table): three more checkpoints by a new driver; the first
   one's time is the restart cost (``--restarts N``: N such processes one after another, the median
   of their first checkpoints; ``--restart-warmup N``: each first warms Spark up with N checkpoints
   instead of two, so that its JVM is as warm as the steady phase's: what is left is the table's
   and the index's restart cost).

Every driver starts with the ``--driver-jvm`` options (benchmarks/driver_options.py: by default the
sink's ``driver_java_options()``, a class data sharing archive and later C2 compilation; ``none``:
Spark's defaults).

Each process first warms Spark up the same way (two checkpoints like the timed ones, to a table of
its own, by a sink built the same way: the same key index layout, the v2 conversion; the second
updates the first's keys, so its deletes resolve through the index; before session 50 the warm-up
sink had the driver layout and no conversion, and wrote new keys only), so a first checkpoint's
time is the table's and its key index's, not the JVM's and the Python workers' first jobs'.

Printed as JSON: per checkpoint wall seconds, the driver process's resident memory after each one
(the index lives there in the driver layout), the index's size (partitioned: bytes and entries of its
runs, bytes per covered row) and the CPU seconds other processes used meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from benchmarks import driver_options
from benchmarks.cpu_monitor import ForeignCpuMonitor
from iceberg_sink.keyindex.runs import mix  # splitmix64's finalizer: a bijection, so keys stay distinct

ROWS_PER_FILE = 1_000_000


def keys_of(kind: str, ids: np.ndarray) -> Any:
    """The key of each row number in ``ids``: the long itself, or a UUID string derived from it."""
    import pyarrow as pa

    if kind == "long":
        return pa.array(ids.astype(np.int64))
    high, low = mix(ids), mix(ids ^ np.int64(0x5DEECE66D))
    text = [f"{h:016x}{lo:016x}" for h, lo in zip(high.tolist(), low.tolist(), strict=True)]
    return pa.array([f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}" for t in text])


def setup(spec: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    root = Path(spec["work"])
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=(root / "wh").as_uri())
    catalog.create_namespace_if_not_exists("db")
    key_type = LongType() if spec["key"] == "long" else StringType()
    schema = Schema(
        NestedField(1, "id", key_type, required=True),
        NestedField(2, "payload", StringType(), required=False),
        NestedField(3, "lsn", LongType(), required=False),
        identifier_field_ids=[1],
    )
    table = catalog.create_table(
        "db.t", schema, partition_spec=UNPARTITIONED_PARTITION_SPEC, properties={"format-version": "2"}
    )
    started = time.monotonic()
    order = np.random.default_rng(spec["seed"]).permutation(spec["rows"])
    arrow = table.schema().as_arrow()
    for start in range(0, spec["rows"], ROWS_PER_FILE):
        ids = order[start : start + ROWS_PER_FILE]
        batch = pa.table(
            {
                "id": keys_of(spec["key"], ids),
                "payload": pa.array(np.char.add("p" * 32, ids.astype(str)).tolist()),
                "lsn": pa.array(np.zeros(len(ids), np.int64)),
            }
        ).cast(arrow)
        table.append(batch)
    return {"setup_seconds": time.monotonic() - started}


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _changes(spec: dict[str, Any], ids: np.ndarray, lsn: int, payload: str) -> Any:
    """Updates of the rows ``ids`` (as Arrow): what every checkpoint, warm-up included, writes."""
    import pyarrow as pa

    return pa.table(
        {
            "id": keys_of(spec["key"], ids),
            "payload": pa.array([payload] * len(ids)),
            "lsn": pa.array(np.arange(lsn, lsn + len(ids), dtype=np.int64)),
            "op": pa.array(["U"] * len(ids)),
        }
    )


def _builder(spec: dict[str, Any], root: Path, table: str) -> Any:
    """The sink of a case (its key index's bound and layout; on v2 the conversion after every commit)."""
    from iceberg_sink import IcebergSink

    builder = (
        IcebergSink.builder()
        .catalog("bench", type="sql", uri=f"sqlite:///{root}/catalog.db", warehouse=(root / "wh").as_uri())
        .table(table)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .write_option("iceberg-sink.conversion.key-index-max-bytes", spec["bound"])
    )
    if spec["format"] == 2:
        builder = builder.convert_equality_deletes(every_n_commits=1, background=False)
    if spec["layout"] == "partitioned":
        builder = builder.write_option("iceberg-sink.key-index.mode", "partitioned")
    return builder


def checkpoints(spec: dict[str, Any], count: int, first_id: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    root = Path(spec["work"])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    java_options = driver_options.java_options(spec.get("driver_jvm", "none"), root)
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # Warm-up, the same in every process: Spark's first jobs, the Python workers' imports and the key
    # index's code (a sink built as the measured one: the same layout, the v2 conversion; its second
    # checkpoint updates the first's keys, so their deletes resolve through the index), on a table of
    # its own, so that the first checkpoint's time is the table's and its key index's, not the JVM's.
    warm = _builder(spec, root, f"db.warm_{first_id}").create_if_missing(format_version=spec["format"]).build()
    for n in range(spec.get("warmup", 2)):
        ids = np.arange(spec["changes"])
        warm.write(spark.createDataFrame(_changes(spec, ids, n * 1_000_000, f"w{n}").to_pandas()))
    warm.close()
    sink = _builder(spec, root, "db.t").build()
    sink.upgrade_format_version(3) if spec["format"] == 3 else None  # PyIceberg appends only to v2 (setup)
    rng = np.random.default_rng(spec["seed"] + first_id)
    ckpt = str(root / "ckpt")
    monitor = ForeignCpuMonitor().start()
    seconds, rss, foreign, phases = [], [], [], []
    for n in range(count):
        ids = rng.choice(spec["rows"], spec["changes"], replace=False)
        lsn = (first_id + n + 1) * 1_000_000
        frame = spark.createDataFrame(_changes(spec, ids, lsn, f"u{first_id + n}").to_pandas())
        started = time.monotonic()
        sink.write(frame, checkpoint_location=ckpt, checkpoint_id=first_id + n)
        ended = time.monotonic()
        seconds.append(ended - started)
        phases.append((sink.last_progress() or {}).get("phases_ms"))
        rss.append(_rss())
        foreign.append(monitor.between(started, ended))
    monitor.stop()
    index = (
        sink._committer_index
        if spec["format"] == 3
        else next((i for i in sink._key_indexes if i is not sink._committer_index), None)
    )
    stats: dict[str, Any] = {"driver_index_bytes": index.nbytes if index is not None else 0}
    if index is not None and index.partitioned is not None:
        from iceberg_sink.keyindex.manifest import IndexKey

        key = IndexKey.of(sink.load_table().schema(), (1,))
        if key is not None:
            stats |= index.partitioned.stats(key)
            stats["bytes_per_row"] = stats["bytes"] / max(1, stats["covered_rows"])
            stats["counters"] = attrs.asdict(index.partitioned.counters)
    sink.close()
    spark.stop()
    return {"seconds": seconds, "phases_ms": phases, "rss_bytes": rss, "foreign_cpu_seconds": foreign, "index": stats}


def _child(spec: dict[str, Any], phase: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.key_index_scale", "--child", phase, json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{phase} of {spec} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _steady_spec(spec: dict[str, Any], checkpoints_count: int, round_: int) -> dict[str, Any]:
    """Steady process ``round_`` of a case: checkpoint ids after the previous rounds' (they must grow
    per table); round 0's first checkpoint indexes the table."""
    return {**spec, "count": checkpoints_count, "first_id": round_ * checkpoints_count}


def _steady_tail(seconds: list[float], round_: int) -> list[float]:
    """The steady checkpoints of round ``round_``'s process: round 0's without its first two (the
    first build and the one after it)."""
    return (seconds[2:] or seconds) if round_ == 0 else seconds


def _summary(
    spec: dict[str, Any], steadies: list[dict[str, Any]], restart: list[dict[str, Any]], setup_out: dict[str, Any]
) -> dict[str, Any]:
    """A case's figures: the steady p50 of every round (round 0 without its first two checkpoints, the
    first build and the one after it) and of all its checkpoints pooled, the restarts' first checkpoints."""
    result: dict[str, Any] = {k: v for k, v in spec.items() if k != "work"} | setup_out
    tails = [_steady_tail(s["seconds"], round_) for round_, s in enumerate(steadies)]
    pooled = [x for t in tails for x in t]
    firsts = [r["seconds"][0] for r in restart]
    result |= {
        "steady": steadies[0],
        "steady_rounds": steadies[1:],
        "restart": restart[0] if len(restart) == 1 else restart,
        "first_checkpoint_seconds": steadies[0]["seconds"][0],
        "steady_p50_seconds": float(np.percentile(pooled, 50)),
        "steady_p90_seconds": float(np.percentile(pooled, 90)),
        "steady_round_p50s": [float(np.percentile(t, 50)) for t in tails],
        "restart_first_seconds": float(np.median(firsts)) if firsts else None,
        "restart_firsts_seconds": firsts,
        "driver_rss_max_bytes": max(max(s["rss_bytes"]) for s in steadies),
    }
    return result


def _group(
    specs: list[dict[str, Any]], checkpoints_count: int, rounds: int, restarts: int, restart_warmup: int
) -> list[dict[str, Any]]:
    """The cases of ``specs`` (one per layout and row count, same key and format), their steady rounds
    interleaved: every table is set up and indexed, then round r of each case runs, in turn, before
    round r + 1 of any; so a slow stretch of the machine falls on every size and layout, not on one.
    Then each case's restarts."""
    setups = [_child(spec, "setup") for spec in specs]
    steadies: list[list[dict[str, Any]]] = [[] for _ in specs]
    for round_ in range(rounds):
        order = list(range(len(specs)))
        for i in order if round_ % 2 == 0 else order[::-1]:
            steadies[i].append(_child(_steady_spec(specs[i], checkpoints_count, round_), "run"))
            r = steadies[i][-1]["seconds"]
            print(
                f"[key_index_scale]   {specs[i]['layout']} {specs[i]['rows']:,} rows round {round_}: first {r[0]:.2f} s, "
                f"p50 {float(np.percentile(_steady_tail(r, round_), 50)):.3f} s",
                file=sys.stderr,
                flush=True,
            )
    results = []
    for i, spec in enumerate(specs):
        # Each restart a new process of three checkpoints; its first one is the restart's cost.
        restart = [
            _child(
                {**spec, "count": 3, "first_id": rounds * checkpoints_count + 3 * n, "warmup": restart_warmup}, "run"
            )
            for n in range(restarts)
        ]
        results.append(_summary(spec, steadies[i], restart, setups[i]))
    return results


def _ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case's steady p50 over the smallest row count's of the same key, format and layout: pooled,
    and round by round (the rounds that ran side by side)."""
    out = []
    for r in results:
        base = min(
            (b for b in results if (b["key"], b["format"], b["layout"]) == (r["key"], r["format"], r["layout"])),
            key=lambda b: b["rows"],
        )
        if base is r:
            continue
        out.append(
            {
                "key": r["key"],
                "format": r["format"],
                "layout": r["layout"],
                "rows": r["rows"],
                "over_rows": base["rows"],
                "steady_p50_ratio": r["steady_p50_seconds"] / base["steady_p50_seconds"],
                "round_ratios": [a / b for a, b in zip(r["steady_round_p50s"], base["steady_round_p50s"], strict=True)],
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--keys", nargs="+", default=["long", "uuid"], choices=["long", "uuid"])
    parser.add_argument("--formats", type=int, nargs="+", default=[3], choices=[2, 3])
    parser.add_argument("--layouts", nargs="+", default=["driver", "partitioned"], choices=["driver", "partitioned"])
    parser.add_argument(
        "--driver-rows",
        type=int,
        nargs="+",
        default=None,
        help="the row counts the driver layout runs at (default: every --rows); its rounds interleave with the other layout's",
    )
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument(
        "--rounds", type=int, default=1, help="steady processes per case, interleaved across the row counts"
    )
    parser.add_argument("--restarts", type=int, default=1, help="restart processes (the median first checkpoint)")
    parser.add_argument(
        "--restart-warmup", type=int, default=2, help="warm-up checkpoints of a restart process (its own table)"
    )
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--bound", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--note", default="")
    driver_options.add_argument(parser)
    parser.add_argument("--child", nargs=2, metavar=("PHASE", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        phase, spec = args.child[0], json.loads(args.child[1])
        out = setup(spec) if phase == "setup" else checkpoints(spec, spec["count"], spec["first_id"])
        print(json.dumps(out))
        return
    results = []
    for key in args.keys:
        for fmt in args.formats:
            # Every layout's cases of one key and format in one group, so the driver index's rounds
            # run between the partitioned index's (a same-run anchor, not one run after the other).
            cases = [
                (layout, rows)
                for layout in args.layouts
                for rows in args.rows
                if layout != "driver" or args.driver_rows is None or rows in args.driver_rows
            ]
            with contextlib.ExitStack() as stack:
                specs = [
                    {
                        "rows": rows,
                        "key": key,
                        "format": fmt,
                        "layout": layout,
                        "changes": args.changes,
                        "bound": args.bound,
                        "seed": args.seed,
                        "driver_jvm": args.driver_jvm,
                        "work": stack.enter_context(
                            tempfile.TemporaryDirectory(dir=args.work_dir, prefix="key-index-scale-")
                        ),
                    }
                    for layout, rows in cases
                ]
                print(
                    f"[key_index_scale] {time.strftime('%H:%M:%S')} {key} v{fmt} {cases}", file=sys.stderr, flush=True
                )
                group = _group(specs, args.checkpoints, args.rounds, args.restarts, args.restart_warmup)
            results += group
            for r in group:
                print(
                    f"[key_index_scale]   {r['layout']} {r['rows']:,} rows: first {r['first_checkpoint_seconds']:.2f} s, "
                    f"steady p50 {r['steady_p50_seconds']:.3f} s (rounds {r['steady_round_p50s']}), "
                    f"restart {r['restart_first_seconds']} s, rss {r['driver_rss_max_bytes'] / 2**20:.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
    output = {
        "note": args.note,
        "machine": os.uname().machine,
        "cpus": os.cpu_count(),
        "ratios": _ratios(results),
        "results": results,
    }
    text = json.dumps(output, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

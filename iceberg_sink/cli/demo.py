"""The demo pipeline: ``iceberg-sink demo`` (also ``python -m iceberg_sink.cli.demo``, ``./scripts/demo.sh``).

Generates account change events (inserts, updates and deletes of accounts, keyed by ``account_id``)
into Parquet files, streams them through Spark into an Iceberg table on the embedded default (local
Spark, SQLite catalog, local warehouse), upserting each micro-batch as one snapshot (CDC on a format
v3 table, the default for CDC: deletion vectors plus new rows) with compaction after every few
commits, while a live display shows checkpoints, rows, files, commit latency and compactions. It ends
with a summary and a check: the table, read back by an independent reader (DuckDB's Iceberg
extension, or PyIceberg), must equal the accounts the generator's own model holds. The exit status is
0 when it does, 1 when it does not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TABLE = "demo.accounts"
DDL = "account_id long, name string, plan string, balance_cents long, updated_at timestamp, seq long, op string"
PLANS = ("free", "pro", "team", "enterprise")
_SCHEMA = pa.schema(
    [
        ("account_id", pa.int64()),
        ("name", pa.string()),
        ("plan", pa.string()),
        ("balance_cents", pa.int64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
        ("seq", pa.int64()),
    ]
)


class Generator:
    """Change events valid against the accounts they describe, and the model they lead to."""

    def __init__(self, seed: int, keys: int) -> None:
        self._rng = random.Random(seed)
        self._keys = keys
        self._seq = 0
        self._clock = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)
        self.model: dict[int, dict[str, Any]] = {}
        self.counts = {"insert": 0, "update": 0, "delete": 0}

    def batch(self, n: int) -> pa.Table:
        rows = []
        for _ in range(n):
            key = self._rng.randrange(self._keys)
            self._seq += 1
            self._clock += dt.timedelta(milliseconds=self._rng.randrange(1, 900))
            current = self.model.get(key)
            if current is not None and self._rng.random() < 0.25:
                rows.append({**current, "seq": self._seq, "updated_at": self._clock, "op": "D"})
                del self.model[key]
                self.counts["delete"] += 1
                continue
            row = {
                "account_id": key,
                "name": current["name"] if current else f"account-{key}",
                "plan": self._rng.choice(PLANS),
                "balance_cents": self._rng.randrange(0, 10_000_000),
                "updated_at": self._clock,
                "seq": self._seq,
            }
            self.model[key] = row
            rows.append({**row, "op": "U" if current else "I"})
            self.counts["update" if current else "insert"] += 1
        return pa.Table.from_pylist(rows, schema=_SCHEMA.append(pa.field("op", pa.string())))

    def expected(self) -> pa.Table:
        return pa.Table.from_pylist(list(self.model.values()), schema=_SCHEMA)


# -- reading the table back -------------------------------------------------------------------------


def duckdb_available() -> bool:
    return all(find_spec(m) is not None for m in ("duckdb", *(f"duckdb_extension_{e}" for e in _DUCKDB_EXTENSIONS)))


_DUCKDB_EXTENSIONS = ("parquet", "avro", "iceberg")  # load order: iceberg needs the other two


def read_with_duckdb(metadata_location: str) -> pa.Table:
    """The table as DuckDB's Iceberg extension reads it (extensions from their PyPI packages)."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    try:
        for name in _DUCKDB_EXTENSIONS:
            spec = find_spec(f"duckdb_extension_{name}")
            assert spec is not None and spec.submodule_search_locations
            found = [
                p
                for loc in spec.submodule_search_locations
                for p in Path(loc).glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
            ]
            if not found:
                raise RuntimeError(f"duckdb-extension-{name} has no build for DuckDB {duckdb.__version__}")
            con.load_extension(str(found[0]))
        path = metadata_location.removeprefix("file://").replace("'", "''")
        return con.sql(f"select * from iceberg_scan('{path}')").to_arrow_table()
    finally:
        con.close()


def comparable(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples; timestamps as microseconds since the epoch (readers differ in zones)."""
    columns = []
    for field in _SCHEMA:
        column = table.column(field.name)
        if pa.types.is_timestamp(column.type):
            column = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        else:
            column = pc.cast(column, field.type)
        columns.append(column.to_pylist())
    return sorted(zip(*columns, strict=True))


def differences(actual: pa.Table, expected: pa.Table) -> list[str]:
    """What differs between the table read back and the model, by key (empty: equal)."""
    got = {row[0]: row for row in comparable(actual)}
    want = {row[0]: row for row in comparable(expected)}
    problems = []
    if actual.num_rows != len(got):
        problems.append(f"{actual.num_rows - len(got)} duplicate rows of one key")
    missing = sorted(want.keys() - got.keys())
    unexpected = sorted(got.keys() - want.keys())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    for what, keys in (("missing", missing), ("not expected", unexpected), ("with other values", changed)):
        if keys:
            problems.append(f"{len(keys)} accounts {what} (e.g. account_id {keys[:5]})")
    return problems


# -- display ----------------------------------------------------------------------------------------


class PlainDisplay:
    """One line per micro-batch, for logs and pipes."""

    def __init__(self) -> None:
        self._shown = 0

    def update(self, sink: Any, total_batches: int, sent: int) -> None:
        records = sink.progress()
        for p in records[self._shown :]:
            m = sink.metrics()
            print(
                f"checkpoint {p['checkpoint_id'] + 1}/{total_batches} {p['status']}: {p['rows']} rows, "
                f"{p['data_files']} data + {p['delete_files']} delete files, commit {p['commit_ms'] or 0:.0f} ms, "
                f"compactions {m.compactions_succeeded}",
                flush=True,
            )
        self._shown = len(records)

    def close(self) -> None:
        pass


class LiveDisplay:
    """A live panel (rich) redrawn while the stream runs."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(console=Console(), refresh_per_second=4, transient=False)
        self._live.start()
        self._started = time.monotonic()

    def update(self, sink: Any, total_batches: int, sent: int) -> None:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        records = sink.progress()
        m = sink.metrics()
        committed = [p for p in records if p["status"] == "committed"]
        latencies = [p["commit_ms"] for p in committed if p["commit_ms"] is not None]
        stats = Table.grid(padding=(0, 2))
        stats.add_column(style="bold cyan")
        stats.add_column()
        stats.add_row("checkpoints", ProgressBar(total=total_batches, completed=len(records), width=30))
        stats.add_row("", f"{len(records)}/{total_batches} micro-batches, {len(committed)} snapshots committed")
        stats.add_row(
            "rows",
            f"{sum(p['rows'] for p in records):,} rows written from {sent:,} change events (deletes write no rows)",
        )
        stats.add_row("files", f"{m.flushed_data_files} data, {m.flushed_delete_files} delete files written")
        if latencies:
            stats.add_row(
                "commit latency",
                f"last {latencies[-1]:.0f} ms, mean {sum(latencies) / len(latencies):.0f} ms, max {max(latencies):.0f} ms",
            )
        stats.add_row(
            "compactions",
            f"{m.compactions_succeeded} done of {m.compactions_triggered} triggered, "
            f"{m.compaction_rewritten_files} files rewritten into {m.compaction_added_files}",
        )
        stats.add_row("elapsed", f"{time.monotonic() - self._started:.1f} s")
        recent = Table(title="newest micro-batches", title_justify="left", expand=False)
        for name in ("checkpoint", "status", "rows", "data files", "delete files", "write ms", "commit ms"):
            recent.add_column(name, justify="right")
        for p in records[-5:]:
            recent.add_row(
                str(p["checkpoint_id"]),
                p["status"],
                f"{p['rows']:,}",
                str(p["data_files"]),
                str(p["delete_files"]),
                f"{p['write_ms'] or 0:.0f}",
                f"{p['commit_ms'] or 0:.0f}",
            )
        grid = Table.grid()
        grid.add_row(stats)
        grid.add_row(recent)
        self._live.update(grid, refresh=True)

    def close(self) -> None:
        self._live.stop()


def make_display(plain: bool) -> PlainDisplay | LiveDisplay:
    if not plain and sys.stdout.isatty() and find_spec("rich") is not None:
        return LiveDisplay()
    return PlainDisplay()


# -- the pipeline -----------------------------------------------------------------------------------


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", default="demo-output", help="folder for catalog, warehouse, source and checkpoints")
    parser.add_argument("--batches", type=int, default=10, help="micro-batches to stream")
    parser.add_argument("--rows", type=int, default=2000, help="change events per micro-batch")
    parser.add_argument("--keys", type=int, default=3000, help="distinct accounts the events touch")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--compact-every", type=int, default=3, help="compact after this many commits")
    parser.add_argument("--reader", choices=("auto", "duckdb", "pyiceberg"), default="auto", help="reader of the check")
    parser.add_argument("--plain", action="store_true", help="plain lines instead of the live display")
    parser.add_argument("--prometheus-port", type=int, help="also serve the metrics to Prometheus on this port")
    # Tests only: change the table behind the model's back, to show that the check fails.
    parser.add_argument("--tamper", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    for name in ("batches", "rows", "keys", "compact_every"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')}: expected at least 1, received {getattr(args, name)}", file=sys.stderr)
            return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink, driver_java_options

    root = Path(args.root).absolute()
    shutil.rmtree(root, ignore_errors=True)
    source = root / "source"
    source.mkdir(parents=True)
    generator = Generator(args.seed, args.keys)
    for b in range(args.batches):
        pq.write_table(generator.batch(args.rows), source / f"changes-{b:05d}.parquet")
    sent = args.batches * args.rows
    print(
        f"iceberg_sink demo: {sent:,} change events ({generator.counts['insert']:,} inserts, "
        f"{generator.counts['update']:,} updates, {generator.counts['delete']:,} deletes) of {args.keys:,} accounts "
        f"in {args.batches} micro-batches -> {TABLE} under {root}",
        flush=True,
    )
    print("starting Spark (local[2])...", flush=True)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("iceberg_sink demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", driver_java_options())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    builder = (
        IcebergSink.builder()
        .embedded(root / "lake")
        .table(TABLE)
        .create_if_missing(partition_by=["bucket(4, account_id)"])
        .cdc(op_column="op", key=["account_id"], order_by="seq")
        .compaction(every_n_commits=args.compact_every)
    )
    if args.prometheus_port is not None:
        builder = builder.prometheus(port=args.prometheus_port)
    sink = builder.build()
    try:
        if sink.prometheus_url:
            print(f"Prometheus metrics at {sink.prometheus_url}", flush=True)
        stream = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
        started = time.monotonic()
        query = sink.start(stream, str(root / "checkpoint"), trigger={"availableNow": True})
        display = make_display(args.plain)
        try:
            while not query.awaitTermination(0.25):  # type: ignore[arg-type]  # PySpark takes seconds as any number
                display.update(sink, args.batches, sent)
            display.update(sink, args.batches, sent)
        finally:
            display.close()
        if query.exception() is not None:
            print(f"streaming query failed: {query.exception()}", file=sys.stderr)
            return 1
        elapsed = time.monotonic() - started
        if args.tamper:
            tamper(spark, sink)
        ok = summarize_and_check(sink, generator, args.reader, elapsed, sent)
    finally:
        sink.close()
        spark.stop()
    return 0 if ok else 1


def tamper(spark: Any, sink: Any) -> None:
    """Upsert an account the generator never sent (tests: the check must catch it)."""
    row = [(10**9, "intruder", "free", 1, dt.datetime(2026, 1, 1), 10**9, "I")]
    sink.write(spark.createDataFrame(row, DDL))


def summarize_and_check(sink: Any, generator: Generator, reader: str, elapsed: float, sent: int) -> bool:
    table = sink.load_table()
    metrics = sink.metrics()
    flink = metrics.flink()
    committer = flink["IcebergFilesCommitter"]
    operations: dict[str, int] = {}
    for s in table.snapshots():
        operation = s.summary.operation.value if s.summary is not None else "?"
        operations[operation] = operations.get(operation, 0) + 1
    current = table.current_snapshot()
    totals = current.summary if current is not None and current.summary is not None else {}
    progress = sink.progress()
    latencies = [p["commit_ms"] for p in progress if p["commit_ms"] is not None]
    print("\nsummary")
    lines = [
        ("table", f"{TABLE} at {table.metadata_location}"),
        ("stream", f"{len(progress)} micro-batches in {elapsed:.1f} s ({sent / elapsed:,.0f} change events/s)"),
        ("snapshots", ", ".join(f"{n} {op}" for op, n in sorted(operations.items()))),
        (
            "committed",
            f"{committer['committedDataFilesCount']} data files ({committer['committedDataFilesRecordCount']:,} rows), "
            f"{committer['committedDeleteFilesCount']} delete files ({committer['committedDeleteFilesRecordCount']:,} deletes)",
        ),
        (
            "commit latency",
            f"mean {sum(latencies) / max(len(latencies), 1):.0f} ms, max {max(latencies, default=0):.0f} ms",
        ),
        (
            "compactions",
            f"{metrics.compactions_succeeded} of {metrics.compactions_triggered} triggered: "
            f"{metrics.compaction_rewritten_files} data files rewritten into {metrics.compaction_added_files}",
        ),
        (
            "table now",
            f"{totals.get('total-data-files', 0)} data files, {totals.get('total-delete-files', 0)} delete files, "
            f"{totals.get('total-records', 0)} stored rows before deletes",
        ),
    ]
    for name, text in lines:
        print(f"  {name:<15} {text}")
    read, how = choose_reader(reader, sink)
    actual = read(sink.load_table().metadata_location)
    problems = differences(actual, generator.expected())
    if problems:
        print(f"\nCHECK FAILED: the table read by {how} differs from what was sent: " + "; ".join(problems))
        return False
    print(f"\nCHECK PASSED: the table read by {how} holds exactly the {actual.num_rows:,} accounts the events leave")
    return True


def choose_reader(reader: str, sink: Any) -> tuple[Callable[[str], pa.Table], str]:
    if reader == "duckdb" or (reader == "auto" and duckdb_available()):
        return read_with_duckdb, "DuckDB's Iceberg extension"

    def read_with_pyiceberg(_: str) -> pa.Table:
        # The table is format v3 (the default for CDC): PyIceberg reads its deletion vectors as they are.
        return sink.load_table().scan().to_arrow()

    return read_with_pyiceberg, "PyIceberg"


if __name__ == "__main__":
    sys.exit(main())

"""The demo pipeline: ``python -m iceberg_sink.demo``.

Streams generated click events from Parquet files through Spark into a partitioned Iceberg table on
the embedded default (local Spark, SQLite catalog, local warehouse), one snapshot per micro-batch,
then appends a bounded DataFrame, and prints what it wrote.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from iceberg_sink.committer.summary_keys import JobKeys


def _events(start: int, n: int) -> pa.Table:
    base = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    ids = range(start, start + n)
    return pa.table(
        {
            "event_id": pa.array(ids, pa.int64()),
            "user_id": pa.array([(i * 7919) % 50 for i in ids], pa.int64()),
            "ts": pa.array([base + dt.timedelta(minutes=7 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "page": [("/home", "/cart", "/checkout", "/search")[i % 4] for i in ids],
            "amount": [round((i % 97) * 1.25, 2) for i in ids],
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="demo-output", help="folder for catalog, warehouse, source and checkpoints")
    parser.add_argument("--batches", type=int, default=3, help="micro-batches to stream")
    parser.add_argument("--rows", type=int, default=1000, help="rows per micro-batch")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink

    root = Path(args.root).absolute()
    shutil.rmtree(root, ignore_errors=True)
    source = root / "source"
    source.mkdir(parents=True)
    for b in range(args.batches):
        pq.write_table(_events(b * args.rows, args.rows), source / f"events-{b:04d}.parquet")

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("iceberg_sink demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = (
        IcebergSink.builder()
        .embedded(root / "lake")
        .table("demo.events")
        .create_if_missing(partition_by=["day(ts)", "bucket(4, user_id)"])
        .distribution_mode("hash")
        .build()
    )
    print(f"iceberg_sink demo: streaming {args.batches} micro-batches of {args.rows} events into demo.events")
    stream = (
        spark.readStream.schema("event_id long, user_id long, ts timestamp, page string, amount double")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    query = sink.start(stream, str(root / "checkpoint"), trigger={"availableNow": True})
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"streaming query failed: {query.exception()}")

    print("appending a bounded DataFrame (one more checkpoint, same code path)")
    sink.write(spark.createDataFrame(_events(args.batches * args.rows, 5).to_pandas()))

    table = sink.load_table()
    print(f"\ntable demo.events at {table.metadata_location}")
    print(
        f"partitioned by {', '.join(f'{f.transform}({table.schema().find_column_name(f.source_id)})' for f in table.spec().fields)}"
    )
    print("\nsnapshots:")
    print(
        f"  {'snapshot id':>20}  {'operation':<9}  {'job id':<32}  {'checkpoint':>10}  {'added rows':>10}  {'total rows':>10}"
    )
    keys = JobKeys()  # the demo writes with the default prefix
    for s in table.snapshots():
        summary = s.summary
        assert summary is not None
        print(
            f"  {s.snapshot_id:>20}  {summary.operation.value:<9}  {summary[keys.job_id]:<32}  "
            f"{summary[keys.checkpoint_id]:>10}  {summary['added-records']:>10}  {summary['total-records']:>10}"
        )
    rows = table.scan().to_arrow().sort_by("event_id")
    files = table.inspect.files()
    print(f"\n{rows.num_rows} rows in {files.num_rows} data files; first and last rows:")
    for row in rows.slice(0, 5).to_pylist() + rows.slice(rows.num_rows - 3).to_pylist():
        print(f"  {row}")
    by_page = rows.group_by("page").aggregate([("event_id", "count"), ("amount", "sum")]).sort_by("page")
    print("\nrows per page:")
    for row in by_page.to_pylist():
        print(f"  {row['page']:<10} {row['event_id_count']:>6} events  {row['amount_sum']:>10.2f} total amount")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Profile equality-delete conversions on an existing CDC table, without Spark.

    .venv/bin/python -m benchmarks.conversion_profile --lake DIR [--table bench.cdc] [--rounds 10]
        [--keys 5000] [--profile out.prof] [--out result.json]

``DIR`` is the embedded catalog root of a table the CDC benchmark built (``benchmarks.cdc ...
--systems iceberg_sink --work-dir W --keep`` leaves it in ``W/sink/lake``, or wherever
``sink_driver-spec.json`` says). Each round commits one CDC-like batch straight through the sink's
snapshot producer (one data file of ``--keys`` new versions of random existing ids and one equality
delete file of those ids), then runs one conversion, as the post-commit trigger does (one
``KeyIndex`` across rounds). Printed per round: the conversion's wall time, data files read and
position delete files written, and the index's size; with ``--profile`` the conversions from round
``--profile-from`` on (default 2, the steady state: round 1 fills the index), not the batches, run
under cProfile and the top functions by cumulative time are printed. ``cpu_seconds`` is the
process's CPU time (all threads), the measure to trust on a busy machine.

The table is changed (each round adds a batch and a conversion): run it on a copy or a scratch
table. The batches only touch the ``id`` range the table's data files bound.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import Table

from iceberg_sink._iceberg import producer, row_delta
from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink._iceberg.metrics import footer_metrics
from iceberg_sink._iceberg.projection import key_schema
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.topology.conversion import job
from iceberg_sink.vocab.files import DataFileMeta, FileContent


def _write(table: Table, rows: pa.Table, content: FileContent, equality_ids: tuple[int, ...] | None) -> DataFileMeta:
    schema = table.schema() if equality_ids is None else key_schema(table.schema(), equality_ids)
    path = table.location_provider().new_data_location(f"profile-{uuid.uuid4().hex}.parquet")
    rows = rows.cast(arrow_schema(schema))
    with table.io.new_output(path).create(overwrite=False) as stream:
        writer = pq.ParquetWriter(cast(IO[Any], stream), schema=rows.schema, compression="zstd")
        writer.write_table(rows)
        writer.close()
        size = stream.tell()
    metrics = footer_metrics(writer.writer.metadata, schema, {})  # type: ignore[attr-defined]
    fields = ("column_sizes", "value_counts", "null_value_counts", "lower_bounds", "upper_bounds", "split_offsets")
    return DataFileMeta(
        content=content,
        path=path,
        spec_id=table.spec().spec_id,
        partition=(),
        record_count=rows.num_rows,
        file_size_in_bytes=size,
        equality_ids=equality_ids,
        **{k: metrics[k] for k in fields if metrics.get(k) is not None},
    )


def commit_batch(table: Table, rng: np.random.Generator, keys: int, high: int, version: int) -> None:
    """One upsert batch of ``keys`` random existing ids below ``high``: new rows plus their deletes."""
    ids = np.sort(rng.choice(high, size=keys, replace=False)).astype(np.int64)
    rows = pa.table(
        {
            "id": ids,
            "name": pa.array([f"user-{i}-v{version}" for i in ids.tolist()]),
            "version": np.full(keys, version, np.int64),
            "amount": rng.random(keys),
            "ts": pa.array(np.full(keys, 1_767_571_200_000_000, np.int64)).cast(pa.timestamp("us")),
        }
    )
    data = _write(table, rows, FileContent.DATA, None)
    delete = _write(table, pa.table({"id": ids}), FileContent.EQUALITY_DELETES, (1,))
    prepared = row_delta.RowDelta(
        table, "main", row_delta.SnapshotChanges(data_files=(data,), delete_files=(delete,)), {}
    ).prepare()
    producer.commit_prepared(table, prepared)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conversion_profile", description=__doc__)
    parser.add_argument("--lake", type=Path, required=True, help="embedded catalog root holding the table")
    parser.add_argument("--table", default="bench.cdc")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--keys", type=int, default=5000, help="updated ids per batch (default 5000)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", type=Path, default=None, help="write the cProfile stats here")
    parser.add_argument(
        "--profile-from", type=int, default=2, help="first profiled round (default 2: round 1 fills the index)"
    )
    parser.add_argument("--top", type=int, default=35, help="functions printed from the profile")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    catalog = CatalogConfig.embedded(args.lake).load()

    def load() -> Table:
        return catalog.load_table(args.table)

    index = KeyIndex()
    rng = np.random.default_rng(args.seed)
    high = int(load().current_snapshot().summary["total-records"])  # type: ignore[union-attr,index]
    profiler = cProfile.Profile() if args.profile else None
    rounds: list[dict[str, Any]] = []
    # Round 0 converts whatever the table holds (cold index); the others one batch each.
    for r in range(args.rounds + 1):
        if r > 0:
            commit_batch(load(), rng, args.keys, high, 1000 + r)
        started = time.perf_counter()
        cpu = time.process_time()
        profiled = profiler is not None and r >= args.profile_from
        if profiled:
            profiler.enable()
        result = job.convert_equality_deletes(load, "main", index=index)
        if profiled:
            profiler.disable()
        row = {
            "round": r,
            "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu,
            "data_files_read": result.data_files_read,
            "position_delete_files_written": result.added_position_delete_files,
            "equality_delete_files_removed": result.removed_equality_delete_files,
            "index_bytes": getattr(index, "nbytes", None),
        }
        rounds.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    steady = rounds[args.profile_from :] or rounds[1:]
    summary = {
        "rounds": rounds,
        "from_round": args.profile_from,
        "median_seconds": statistics.median(r["seconds"] for r in steady) if steady else None,
        "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in steady) if steady else None,
    }
    if profiler is not None:
        profiler.dump_stats(str(args.profile))
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.top)
        print(text.getvalue(), file=sys.stderr)
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

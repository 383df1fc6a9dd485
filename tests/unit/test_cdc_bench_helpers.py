"""Pure helpers of the CDC benchmark: the steady-state summary and the Flink driver's CSV input.

Nothing here is timed: these check the arithmetic and the conversion the benchmark relies on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.csv as pcsv
import pytest

from benchmarks.cdc import percentile, summarize
from benchmarks.cdc_data import _rows
from benchmarks.flink_driver import parquet_to_csv


def test_percentile_interpolates_between_ranks() -> None:
    ordered = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(ordered, 0.5) == 3.0
    assert percentile(ordered, 0.9) == pytest.approx(4.6)
    assert percentile(ordered, 0.99) == pytest.approx(4.96)
    assert percentile([7.0], 0.99) == 7.0


def test_summarize_skips_warmup_and_reports_changes_per_second() -> None:
    out = summarize([10.0, 9.0, 1.0, 2.0, 1.0], warmup=2, batch_size=1000)
    assert out["batches"] == 3
    assert out["skipped_warmup_batches"] == 2
    assert out["median"] == 1.0
    assert out["max"] == 2.0
    assert out["p99"] == pytest.approx(1.98)
    assert out["changes_per_second"] == pytest.approx(3000 / 4.0)
    assert "changes_per_second" not in summarize([1.0], warmup=0)


def test_parquet_to_csv_keeps_every_value(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    ids = np.array([3, 1], dtype=np.int64)
    ts = np.array([1_700_000_000_123_456, 1_700_000_000_000_001], dtype=np.int64)
    source = tmp_path / "b.parquet"
    pq.write_table(_rows(ids, np.array([2, 0]), np.array([12.34, 0.1]), ts), source)
    target = tmp_path / "b.csv"
    assert parquet_to_csv(source, target) == 2
    table = pcsv.read_csv(
        target,
        read_options=pcsv.ReadOptions(column_names=["id", "name", "version", "amount", "ts"]),
        convert_options=pcsv.ConvertOptions(column_types={"ts": "string"}),
    )
    assert table.column("id").to_pylist() == [3, 1]
    assert table.column("name").to_pylist() == ["user-3-v2", "user-1-v0"]
    assert table.column("amount").to_pylist() == [12.34, 0.1]
    # Flink's CSV format reads TIMESTAMP(6) as 'yyyy-MM-dd HH:mm:ss.SSSSSS' (UTC here).
    assert table.column("ts").to_pylist() == ["2023-11-14 22:13:20.123456", "2023-11-14 22:13:20.000001"]

"""Pure helpers of the CDC benchmark: the steady-state summary, the system variants, the end to end
and steady figures, issue 22's v3 goals, the model checksums and the Flink driver's CSV input.

Nothing here is timed: these check the arithmetic and the conversion the benchmark relies on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.csv as pcsv
import pytest

from benchmarks.cdc import percentile, summarize
from benchmarks.cdc_data import CHECKSUM_SQL, _digits, _rows, compare, generate
from benchmarks.cdc_results import report, unread_result
from benchmarks.cdc_systems import (
    SYSTEMS,
    entry_changes,
    paired_ratio,
    parse_systems,
    second_half,
    v3_goals,
    write_figures,
)
from benchmarks.flink_driver import parquet_to_csv
from benchmarks.merge_into_driver import scan_order


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


def test_parse_systems_keeps_order_and_names_unknown_ones() -> None:
    assert parse_systems("merge_into_v3, iceberg_sink_v3,iceberg_sink,merge_into_v3") == [
        "merge_into_v3",
        "iceberg_sink_v3",
        "iceberg_sink",
    ]
    assert (SYSTEMS["iceberg_sink_v3"].driver, SYSTEMS["iceberg_sink_v3"].format_version) == ("sink", 3)
    assert (SYSTEMS["merge_into_v3"].driver, SYSTEMS["merge_into_v3"].format_version) == ("merge", 3)
    with pytest.raises(
        ValueError, match=r"expected a comma-separated subset of .*merge_into_v3.*received \['sink_v3'\]"
    ):
        parse_systems("iceberg_sink,sink_v3")
    with pytest.raises(ValueError, match="received ' , '"):
        parse_systems(" , ")


def test_write_figures_separates_end_to_end_from_steady_state() -> None:
    raw = {
        "load_seconds": 4.0,
        "load_cpu_seconds": 6.0,
        "batch_seconds": [3.0, 1.0, 0.5, 0.5, 1.0],
        "batch_cpu_seconds": [5.0, 2.0, 1.0, 1.0, 2.0],
    }
    out = write_figures(raw, warmup=1, batch_size=1000, initial_rows=2_000_000)
    e2e, steady = out["end_to_end"], out["steady_state"]
    assert e2e["seconds"] == 10.0 and e2e["batch_seconds"] == 6.0
    assert e2e["changes_per_second"] == pytest.approx(5000 / 6.0)
    assert e2e["cpu_seconds"] == 17.0
    assert e2e["load_cpu_seconds_per_million_rows"] == pytest.approx(3.0)
    assert e2e["batch_cpu_seconds_per_million_changes"] == pytest.approx(11.0 / 5000 * 1e6)
    assert steady["batches"] == 4 and steady["p50"] == steady["median"] == 0.75
    assert steady["cpu_seconds"] == 6.0
    assert steady["cpu_seconds_per_million_changes"] == pytest.approx(6.0 / 4000 * 1e6)
    # A driver that does not measure CPU (Flink's), or a batch without /proc: no CPU figure, not a wrong one.
    unknown = write_figures({**raw, "batch_cpu_seconds": [5.0, None, 1.0, 1.0, 2.0]}, 1, 1000, 2_000_000)
    assert unknown["end_to_end"]["cpu_seconds"] is None
    assert unknown["steady_state"]["cpu_seconds_per_million_changes"] is None
    no_cpu = write_figures({"load_seconds": 1.0, "batch_seconds": [1.0, 1.0]}, 0, 10, 10)
    assert no_cpu["end_to_end"]["load_cpu_seconds_per_million_rows"] is None


def test_write_figures_of_a_streaming_driver_count_each_commits_own_changes() -> None:
    # flink_stream: one entry per commit, each of its own size (the commit's added records).
    raw = {
        "load_seconds": 2.0,
        "batch_seconds": [3.0, 0.5, 0.5, 0.25],
        "batch_changes": [100, 4000, 6000, 1000],
        "batch_cpu_seconds": [4.0, 1.0, 1.5, 0.5],
    }
    out = write_figures(raw, warmup=1, batch_size=10_000, initial_rows=1_000)
    e2e, steady = out["end_to_end"], out["steady_state"]
    assert e2e["changes_per_second"] == pytest.approx(11_100 / 4.25)
    assert e2e["batch_cpu_seconds_per_million_changes"] == pytest.approx(7.0 / 11_100 * 1e6)
    assert steady["changes_per_second"] == pytest.approx(11_000 / 1.25)
    assert steady["changes_per_commit_median"] == 4000
    assert steady["cpu_seconds_per_million_changes"] == pytest.approx(3.0 / 11_000 * 1e6)
    assert SYSTEMS["flink_stream"].driver == "flink" and SYSTEMS["flink_stream"].format_version == 2
    # Half of the 11,100 changes are applied during the third entry: only the fourth begins after it.
    assert out["second_half"] is None


def test_second_half_starts_where_half_of_the_changes_are_applied_whatever_the_commit_size() -> None:
    small = second_half([1.0] * 10, [10] * 10, [0.5] * 10)
    assert small is not None and small["entries"] == 5 and small["changes"] == 50
    large = second_half([2.0] * 4, [25] * 4, [None] * 4)
    assert large is not None and large["entries"] == 2 and large["cpu_seconds_per_million_changes"] is None
    assert second_half([1.0, 1.0], [90, 10], [1.0, 1.0]) is None  # one entry after the half: no median


def test_v3_goals_compare_the_v3_sink_with_the_v3_merge_table() -> None:
    def system(median: float, scan: float) -> dict[str, Any]:
        return {"steady_state": {"median": median}, "full_scan_seconds": scan}

    assert v3_goals({"iceberg_sink": system(0.3, 1.0), "merge_into_v3": system(2.0, 1.0)}) is None
    met = v3_goals({"iceberg_sink_v3": system(0.45, 1.0), "merge_into_v3": system(2.0, 1.25)})
    assert met is not None and met["write_met"] and met["scan_met"]
    assert met["scan_ratio_to_merge_into_v3"] == pytest.approx(0.8)
    missed = v3_goals({"iceberg_sink_v3": system(0.46, 1.3), "merge_into_v3": system(2.0, 1.25)})
    assert missed is not None and not missed["write_met"] and not missed["scan_met"]
    assert missed["scan_paired_wall"] is None and missed["scan_paired_cpu"] is None  # no per-round runs
    runs = {
        "iceberg_sink_v3": {**system(0.4, 1.1), "full_scan_runs": [1.1, 1.2], "full_scan_cpu_runs": [2.0, None]},
        "merge_into_v3": {**system(2.0, 1.0), "full_scan_runs": [1.0, 1.0], "full_scan_cpu_runs": [2.0, 2.0]},
    }
    paired = v3_goals(runs)
    assert paired is not None and paired["scan_paired_wall"]["median"] == pytest.approx(1.15)
    assert paired["scan_paired_cpu"] is None  # a CPU reading missing: no CPU ratio at all


def test_paired_ratio_tells_a_real_difference_from_the_rounds_spread() -> None:
    import random

    rng = random.Random(1)
    reference = [1.0 + rng.uniform(-0.1, 0.1) for _ in range(31)]
    # The same table scanned twice: each round's ratio scatters around 1.0 by the machine's noise.
    alike = paired_ratio([r * (1.0 + rng.uniform(-0.05, 0.05)) for r in reference], reference)
    assert alike["rounds"] == 31 and not alike["slower"] and not alike["faster"]
    low, high = alike["ci95"]
    assert low <= alike["median"] <= high and low < 1.0 < high
    # 10 % slower every round, same noise: the interval lies wholly above 1.0.
    slower = paired_ratio([r * (1.1 + rng.uniform(-0.05, 0.05)) for r in reference], reference)
    assert slower["slower"] and not slower["faster"] and slower["ci95"][0] > 1.0
    faster = paired_ratio([r * 0.9 for r in reference], reference)
    assert faster["faster"] and faster["median"] == pytest.approx(0.9)
    # Seeded: the same runs give the same interval.
    assert paired_ratio([1.1, 0.9, 1.0], [1.0, 1.0, 1.0]) == paired_ratio([1.1, 0.9, 1.0], [1.0, 1.0, 1.0])
    for bad in (([1.0], [1.0, 1.0]), ([], []), ([1.0], [0.0])):
        with pytest.raises(ValueError, match=r"paired runs|must be positive"):
            paired_ratio(*bad)


def test_model_checksums_cover_every_row_and_a_wrong_row_fails_the_check(tmp_path: Path) -> None:
    data = generate(tmp_path, rows=50, batches=3, batch_size=10, seed=7)
    expected = data.expected
    ids = np.flatnonzero(expected.alive)
    # The same sums computed row by row from the rows themselves (what the Spark SQL of CHECKSUM_SQL does).
    rows = [expected.row(int(i)) for i in ids]
    assert expected.checksums() == {
        "id_times_version": sum(r["id"] * r["version"] for r in rows),
        "amount_cents": sum(round(r["amount"] * 100) for r in rows),
        "ts_seconds": sum(r["ts_micros"] // 1_000_000 for r in rows),
        "name_length": sum(len(r["name"]) for r in rows),
    }
    assert set(CHECKSUM_SQL) == set(expected.checksums())
    assert [int(d) for d in _digits(np.array([0, 9, 10, 99, 100, 10**12 - 1, 10**12]))] == [1, 1, 2, 2, 3, 12, 13]
    sample = expected.sample_ids(7)
    observed = {
        "rows": expected.rows,
        "distinct_ids": expected.rows,
        "version_sum": expected.version_sum(),
        "sample": [expected.row(i) for i in sample],
        "checksums": expected.checksums(),
    }
    assert compare(expected, observed, sample)["ok"]
    # One row outside the sample with a wrong amount: row count, ids, versions and sample all agree.
    wrong = {**expected.checksums(), "amount_cents": expected.checksums()["amount_cents"] + 1}
    checks = compare(expected, {**observed, "checksums": wrong}, sample)
    assert not checks["ok"] and checks["checksums"]["equal"] is False


def test_entry_changes_group_the_commits_each_poll_saw() -> None:
    added = [10, 20, 30, 40]
    assert entry_changes(added, [0, 1, 2, 3, 4]) == [10, 20, 30, 40]
    assert entry_changes(added, [0, 1, 3, 4]) == [10, 50, 40]  # one poll saw the 2nd and 3rd commit
    for bad in ([0, 1, 3], [1, 2, 4], [0, 2, 2, 4], []):  # a commit left out, or an empty entry
        with pytest.raises(ValueError, match="rising strictly from 0 to 4"):
            entry_changes(added, bad)


def test_timed_scans_rotate_the_order_so_each_table_takes_each_position_equally() -> None:
    names = ["iceberg_sink_v3", "merge_into_v3", "third"]
    rounds = [scan_order(names, r) for r in range(6)]
    assert all(sorted(r) == sorted(names) for r in rounds)
    for position in range(3):
        firsts = [r[position] for r in rounds]
        assert {n: firsts.count(n) for n in names} == {n: 2 for n in names}
    assert scan_order([], 3) == []


def test_a_run_read_back_by_nothing_says_its_checks_were_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    raw = {
        "load_seconds": 1.0,
        "batch_seconds": [0.5, 0.5],
        "batch_intervals": [[0.0, 0.5], [0.5, 1.0]],
        "load_waited_for_quiet_seconds": 0.0,
        "batch_waited_for_quiet_seconds": [0.0, 0.0],
        "batch_summaries": [{"total-data-files": "1"}, {"total-data-files": "2"}],
    }
    system = {
        **unread_result(raw, "an engine"),
        "full_scan_seconds": None,
        "batch_foreign_cpu_seconds": [0.0, 0.0],
        **write_figures(raw, warmup=0, batch_size=10, initial_rows=10),
    }
    assert system["checks"]["ok"] is None and system["table_rows_after"] is None
    assert system["table_files_after"]["total-data-files"] == 2
    report({"systems": {"iceberg_sink_kafka": system}, "timings_seconds": {"total": 1.0}}, Path("out.json"))
    err = capsys.readouterr().err
    assert "checks NOT RUN" in err and "full scan not run" in err

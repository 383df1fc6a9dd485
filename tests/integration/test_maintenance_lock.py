"""One maintenance lock per table (topology/background.py): a background compaction and a background
equality-delete conversion of one table never run at the same time; a trigger that fires while the
other job runs is kept, goes first at the next commit, and the table reads back equal to the model."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, _faults
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


def test_compaction_and_conversion_of_one_table_take_turns(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .table("db.lock")
        .create_if_missing(format_version=2)  # equality deletes for the conversion
        .upsert(key=["id"])
        .compaction(every_n_commits=1, background=True, min_input_files=1, delete_file_threshold=1)
        .convert_equality_deletes(every_n_commits=1, background=True)
        .build()
    )
    running: list[str] = []  # kinds running now
    overlaps: list[list[str]] = []
    started: list[str] = []
    compaction_started = threading.Event()
    release = threading.Event()
    guard = threading.Lock()
    real_runs: dict[str, Any] = {}

    def on_point(point: str, checkpoint: int) -> None:
        if point != _faults.MAINTENANCE_START:
            return
        kind = "compaction" if "compaction" in threading.current_thread().name else "conversion"
        with guard:
            started.append(kind)
        if kind == "compaction" and not compaction_started.is_set():
            compaction_started.set()
            assert release.wait(120), "the test never released the first compaction"

    # Record which jobs run at once: wrap the two jobs' execute() of this sink's job.
    def track(kind: str, execute: Any) -> Any:
        def run() -> Any:
            with guard:
                running.append(kind)
                if len(running) > 1:
                    overlaps.append(list(running))
            try:
                return execute()
            finally:
                with guard:
                    running.remove(kind)

        return run

    model: dict[int, str] = {}

    def write(rows: list[tuple[int, str]]) -> None:
        model.update(dict(rows))
        sink.write(spark.createDataFrame(rows, "id long, v string"), checkpoint_location=str(tmp_path / "ck"))
        triggers = ((sink._compaction, "compaction"), (sink._conversion, "conversion"))
        for trigger, kind in triggers:
            if trigger is not None and kind not in real_runs:
                real_runs[kind] = trigger.execute
                trigger.execute = track(kind, trigger.execute)  # type: ignore[method-assign]

    _faults.install(on_point)
    try:
        write([(i, "a") for i in range(20)])  # inserts: a compaction starts and is held
        assert compaction_started.wait(120)
        write([(i, "b") for i in range(0, 20, 2)])  # updates: equality deletes, conversion fires
        metrics = sink.metrics()
        # The conversion fired while the compaction held the table: it waits (trigger kept).
        assert metrics.conversions_triggered == 0, started
        assert started == ["compaction"]
        release.set()
        sink.await_compactions(120)
        write([(i, "c") for i in range(1, 20, 4)])  # the conversion goes first; the compaction yields once
        sink.await_conversions(120)
        sink.await_compactions(120)
        metrics = sink.metrics()
        assert metrics.conversions_triggered == 1 and metrics.conversions_succeeded == 1
        assert metrics.compactions_triggered == 1
        assert started == ["compaction", "conversion"]
        write([(i, "d") for i in range(3, 20, 5)])  # the compaction's turn again
        sink.await_conversions(120)
        sink.await_compactions(120)
        assert sink.metrics().compactions_triggered == 2
    finally:
        release.set()
        _faults.clear()
        sink.await_compactions(120)
        sink.await_conversions(120)
    assert overlaps == []
    expected = [{"id": k, "v": v} for k, v in sorted(model.items())]
    table = sink.load_table()
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected

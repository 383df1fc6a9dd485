"""Test helpers that build real sink pieces around a real catalog (no Spark needed)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pyarrow as pa
from py4j.java_gateway import JavaPackage
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.table import Table

from iceberg_sink import options
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import TaskWriter


def writer_spec(table: Table, job_id: str = "job", checkpoint_id: int = 0, **overrides: Any) -> WriterSpec:
    resolved = options.resolve({}, table.properties)
    values: dict[str, Any] = {
        "table_name": "test",
        "location": table.location(),
        "schema_json": table.schema().model_dump_json(),
        "spec_json": table.spec().model_dump_json(),
        "io_properties": dict(table.io.properties),
        "writer_properties": {**table.properties, **resolved.writer_properties()},
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "target_file_size": resolved.get(options.TARGET_FILE_SIZE_BYTES),
        "buffer_bytes": resolved.get(options.WRITER_BUFFER_BYTES),
        "max_open_files": resolved.get(options.WRITER_MAX_OPEN_FILES),
        "row_group_limit": resolved.get(options.PARQUET_ROW_GROUP_LIMIT),
        "compression": resolved.get(options.PARQUET_COMPRESSION),
        "compression_level": -1,
    }
    values.update(overrides)
    return WriterSpec(**values)


def write_batches(spec: WriterSpec, *batches: pa.Table, task_id: int = 0) -> WriteResult:
    writer = TaskWriter(spec, task_id=task_id, attempt_id=1)
    for batch in batches:
        writer.write(batch)
    return writer.complete()


class LosingCatalog(SqlCatalog):
    """A real SQLite catalog whose next N commits land but answer 'state unknown' (a lost response)."""

    lose_next = 0

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> Any:
        response = super().commit_table(table, requirements, updates)
        if self.lose_next:
            self.lose_next -= 1
            raise CommitStateUnknownException("connection reset after the commit was sent")
        return response


def count_key_bounds_reads(monkeypatch: Any) -> list[str]:
    """The manifest paths the key-bounds cache (table/key_bounds.py) reads from now on, in order."""
    from iceberg_sink.table import key_bounds

    reads: list[str] = []
    real = key_bounds.fetch_entries

    def counting(io: Any, manifest: Any, discard_deleted: bool = True) -> Any:
        reads.append(manifest.manifest_path)
        return real(io, manifest, discard_deleted=discard_deleted)

    monkeypatch.setattr(key_bounds, "fetch_entries", counting)
    return reads


def driver_env(pythonpath: str | None = None) -> dict[str, str]:
    """The environment of a driver the tests start in a subprocess: this one without pytest's own
    variables, ``PYTHONPATH`` set to ``pythonpath`` (default: this process's ``sys.path``, so the
    driver imports what the tests import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = pythonpath if pythonpath is not None else os.pathsep.join(p for p in sys.path if p)
    return env


def query_stages(spark: Any, run_id: str) -> list[list[int]]:
    """The task count of each stage of each Spark job a streaming query (run ``run_id``) ran, the
    jobs and their stages in the order Spark numbered them."""
    tracker = spark.sparkContext.statusTracker()
    jobs = []
    for job in sorted(tracker.getJobIdsForGroup(run_id)):
        info = tracker.getJobInfo(job)
        stages = [tracker.getStageInfo(stage) for stage in sorted(info.stageIds)] if info is not None else []
        jobs.append([stage.numTasks for stage in stages if stage is not None])
    return jobs


def package_lookups(monkeypatch: Any) -> list[str]:
    """The names py4j's ``JavaPackage`` is asked for from now on (``jvm.org.apache...`` chains: each
    dotted prefix a failed class lookup over every jar of the class path), recorded through
    ``monkeypatch`` (pytest's), so a test can check that code names its Java classes in full."""
    asked: list[str] = []
    original = JavaPackage.__getattr__

    def counted(self: JavaPackage, name: str) -> object:
        asked.append(name)
        return original(self, name)

    monkeypatch.setattr(JavaPackage, "__getattr__", counted)
    return asked

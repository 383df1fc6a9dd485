"""The CommitAggregator folds any mix of task results into one committable that loses no file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink._iceberg import manifests
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.vocab.files import FileContent
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    identifier_field_ids=[1, 2],
)
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("agg")
    cat = SqlCatalog("agg", uri=f"sqlite:///{tmp}/c.db", warehouse=(tmp / "wh").as_uri())
    (tmp / "wh").mkdir()
    cat.create_namespace("db")
    return cat.create_table("db.t", schema=SCHEMA, partition_spec=SPEC, properties={"format-version": "2"})


changes = st.lists(
    st.tuples(st.integers(0, 50), st.sampled_from(["eu", "us", "a/b"]), st.sampled_from(["I", "U", "D"])),
    min_size=1,
    max_size=30,
    unique_by=lambda c: (c[0], c[1]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(changes, min_size=1, max_size=4))
def test_every_file_of_every_task_is_in_the_staged_manifests(table, tasks: list[list[tuple[int, str, str]]]) -> None:  # type: ignore[no-untyped-def]
    spec = writer_spec(table, op_column="op", equality_field_ids=(1, 2))
    results = []
    for task_id, rows in enumerate(tasks):
        batch = pa.table(
            {
                "k": pa.array([r[0] for r in rows], pa.int64()),
                "region": [r[1] for r in rows],
                "op": [r[2] for r in rows],
            }
        )
        results.append(write_batches(spec, batch, task_id=task_id))
    committable = CommitAggregator("db.t", "main", "job").aggregate(table, table.io, 3, results)
    assert committable is not None
    data = [f for r in results for f in r.data_files]
    deletes = [f for r in results for f in r.delete_files]
    staged_data = manifests.read_staged_manifest(table.io, committable.manifests.data_manifest) if data else []
    staged_deletes = manifests.read_staged_manifest(table.io, committable.manifests.delete_manifest)  # type: ignore[arg-type]
    assert sorted(f.path for f in staged_data) == sorted(f.path for f in data)
    assert sorted(staged_deletes, key=lambda f: f.path) == sorted(deletes, key=lambda f: f.path)
    summary = committable.summary
    assert summary.records == sum(1 for rows in tasks for r in rows if r[2] != "D")
    assert summary.equality_deletes == sum(len(rows) for rows in tasks)
    assert summary.delete_files == len(deletes) and summary.data_files == len(data)
    assert all(f.content == FileContent.EQUALITY_DELETES and f.equality_ids == (1, 2) for f in staged_deletes)
    for path in committable.manifests.paths:
        Path(path.removeprefix("file://")).unlink()


def test_nothing_written_means_no_committable(table) -> None:  # type: ignore[no-untyped-def]
    assert CommitAggregator("db.t", "main", "job").aggregate(table, table.io, 0, []) is None

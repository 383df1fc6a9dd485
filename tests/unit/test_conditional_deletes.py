"""Keys proven new: writers put their deletes in conditional files; the committer commits those
only when the proof fails. Real SQLite catalog, real Parquet files."""

from __future__ import annotations

from pathlib import Path

import attrs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import UncommittableCheckpointError
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committer import IcebergCommitter, RetryPolicy
from iceberg_sink.table.key_bounds import KeyBoundsCache
from iceberg_sink.vocab.files import FileContent
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()), identifier_field_ids=[1]
)


@pytest.fixture
def cat(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA, properties={"format-version": "2"})
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}, schema=SCHEMA.as_arrow()))
    return catalog


def test_deletes_of_keys_proven_new_go_to_conditional_files_with_key_columns_only(cat: SqlCatalog) -> None:
    table = cat.load_table("db.t")
    proof = KeyBoundsCache([1]).bounds(table, table.current_snapshot())
    spec = writer_spec(table, op_column="op", equality_field_ids=(1,), new_key_proof=proof)
    batch = pa.table({"id": pa.array([2, 50, 60], pa.int64()), "v": ["x", None, "y"], "op": ["U", "D", "I"]})
    result = write_batches(spec, batch)
    assert result.skipped_deletes == 2
    [delete] = result.delete_files
    [conditional] = result.conditional_delete_files
    assert pq.read_table(delete.path.removeprefix("file://")).to_pydict() == {"id": [2]}
    assert pq.read_table(conditional.path.removeprefix("file://")).to_pydict() == {"id": [50, 60]}
    assert conditional.content == FileContent.EQUALITY_DELETES and conditional.equality_ids == (1,)
    assert sorted(
        r for f in result.data_files for r in pq.read_table(f.path.removeprefix("file://"))["id"].to_pylist()
    ) == [
        2,
        60,
    ]


def test_committable_staged_by_an_older_version_with_a_broken_proof_is_refused(cat: SqlCatalog) -> None:
    """Version-2 committables skipped deletes without writing them; if rows were added since the
    proof, committing one could keep stale rows, so it is refused with what to do."""
    table = cat.load_table("db.t")
    proof_snapshot = table.current_snapshot()
    assert proof_snapshot is not None
    batch = pa.table({"id": pa.array([50], pa.int64()), "v": ["ours"], "op": ["I"]})
    result = write_batches(writer_spec(table, op_column="op", equality_field_ids=(1,)), batch)
    committable = CommitAggregator("db.t", "main", "job").aggregate(table, table.io, 0, [result])
    assert committable is not None
    legacy = attrs.evolve(committable, skipped_deletes=1, proof_snapshot_id=proof_snapshot.snapshot_id)
    table.append(pa.table({"id": pa.array([50], pa.int64()), "v": ["theirs"]}, schema=SCHEMA.as_arrow()))
    committer = IcebergCommitter(lambda: cat.load_table("db.t"), "main", "job", RetryPolicy(num_retries=0))
    with pytest.raises(UncommittableCheckpointError, match="older iceberg_sink that skipped 1 equality deletes"):
        committer.commit(legacy)
    assert len(cat.load_table("db.t").snapshots()) == 2

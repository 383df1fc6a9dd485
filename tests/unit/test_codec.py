"""Round trips of the versioned wire forms (task → driver, driver → checkpoint directory)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iceberg_sink._codec import CodecError
from iceberg_sink._iceberg.manifests import StagedManifest
from iceberg_sink.committer.committable import CommitSummary, Committable, DeltaManifests
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from iceberg_sink.writer.result import WriteResult

partition_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(),
    st.binary(max_size=20),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9),
    st.floats(allow_nan=False),
)
int_maps = st.dictionaries(st.integers(1, 10_000), st.integers(0, 2**40), max_size=5)
bytes_maps = st.dictionaries(st.integers(1, 10_000), st.binary(max_size=16), max_size=5)

data_files = st.builds(
    DataFileMeta,
    content=st.sampled_from(list(FileContent)),
    path=st.text(min_size=1),
    spec_id=st.integers(0, 10),
    partition=st.lists(partition_values, max_size=4).map(tuple),
    record_count=st.integers(0, 2**40),
    file_size_in_bytes=st.integers(0, 2**40),
    column_sizes=int_maps,
    value_counts=int_maps,
    null_value_counts=int_maps,
    nan_value_counts=int_maps,
    lower_bounds=bytes_maps,
    upper_bounds=bytes_maps,
    split_offsets=st.lists(st.integers(0, 2**40), max_size=4),
    equality_ids=st.one_of(st.none(), st.lists(st.integers(1, 100), min_size=1, max_size=3).map(tuple)),
    sort_order_id=st.one_of(st.none(), st.integers(0, 5)),
)


@given(st.lists(data_files, max_size=4), st.lists(data_files, max_size=3), st.integers(0, 1000), st.integers(0, 2**40))
def test_write_result_round_trips(
    data: list[DataFileMeta], deletes: list[DataFileMeta], task: int, attempt: int
) -> None:
    result = WriteResult(data_files=tuple(data), delete_files=tuple(deletes), task_id=task, attempt_id=attempt)
    assert WriteResult.decode(result.encode()) == result


def test_partition_value_types_survive() -> None:
    meta = DataFileMeta(
        content=FileContent.DATA,
        path="s3://b/t/data/x.parquet",
        spec_id=0,
        partition=(Decimal("1.50"), b"\x00\xff", None, 19_000, "a/b", float("nan")),
        record_count=1,
        file_size_in_bytes=10,
    )
    decoded = WriteResult.decode(WriteResult(data_files=(meta,)).encode()).data_files[0]
    assert decoded.partition[:5] == (Decimal("1.50"), b"\x00\xff", None, 19_000, "a/b")
    assert isinstance(decoded.partition[0], Decimal)
    assert decoded.partition[5] != decoded.partition[5]  # NaN stays NaN


manifests = st.builds(
    StagedManifest,
    path=st.text(min_size=1),
    length=st.integers(1, 2**40),
    spec_id=st.integers(0, 5),
    content=st.sampled_from([0, 1]),
)


@given(
    st.text(min_size=1),
    st.integers(0, 2**40),
    st.one_of(st.none(), manifests),
    st.one_of(st.none(), manifests),
    st.one_of(st.none(), manifests),
    st.integers(0, 10**6),
    st.one_of(st.none(), st.uuids().map(str)),
)
def test_committable_round_trips(
    job: str,
    checkpoint: int,
    data: StagedManifest | None,
    deletes: StagedManifest | None,
    conditional: StagedManifest | None,
    records: int,
    table_uuid: str | None,
) -> None:
    committable = Committable(
        job_id=job,
        checkpoint_id=checkpoint,
        table="db.t",
        branch="main",
        manifests=DeltaManifests(data, deletes, conditional),
        summary=CommitSummary(checkpoint_id=checkpoint, data_files=2, records=records),
        proof_snapshot_id=checkpoint if conditional else None,
        skipped_deletes=3 if conditional else 0,
        table_uuid=table_uuid,
    )
    assert Committable.decode(committable.encode()) == committable


def test_version_2_committables_still_decode() -> None:
    """A committable persisted by the previous release (no conditional deletes, no table UUID)."""
    body = {
        "job_id": "j",
        "checkpoint_id": 4,
        "table": "db.t",
        "branch": "main",
        "data_manifest": {"path": "m.avro", "length": 10, "spec_id": 0, "content": 0},
        "delete_manifest": None,
        "summary": {"checkpoint_id": 4, "data_files": 1},
        "proof_snapshot_id": 7,
        "skipped_deletes": 2,
    }
    decoded = Committable.decode(json.dumps({"kind": "committable", "version": 2, **body}).encode())
    assert decoded.manifests.conditional_delete_manifest is None and decoded.table_uuid is None
    assert decoded.skipped_deletes == 2 and decoded.proof_snapshot_id == 7


@given(st.lists(data_files, max_size=3), st.integers(0, 100))
def test_write_result_conditional_deletes_round_trip(conditional: list[DataFileMeta], skipped: int) -> None:
    result = WriteResult(conditional_delete_files=tuple(conditional), skipped_deletes=skipped)
    assert WriteResult.decode(result.encode()) == result


@given(st.integers(0, 10**9))
def test_write_result_row_width_round_trips_and_an_older_result_reads_as_unmeasured(row_bytes: int) -> None:
    result = WriteResult(task_id=3, arrow_row_bytes=row_bytes)
    assert WriteResult.decode(result.encode()) == result
    older = json.loads(result.encode())
    older["version"] = 4
    del older["arrow_row_bytes"]
    assert WriteResult.decode(json.dumps(older).encode()) == WriteResult(task_id=3)


def test_unknown_version_is_refused_with_a_clear_message() -> None:
    encoded = json.loads(WriteResult().encode())
    encoded["version"] = 99
    with pytest.raises(CodecError, match=r"version 99.*reads versions"):
        WriteResult.decode(json.dumps(encoded).encode())


def test_wrong_kind_is_refused() -> None:
    with pytest.raises(CodecError, match="expected a serialized committable"):
        Committable.decode(WriteResult().encode())
    with pytest.raises(CodecError, match="undecodable"):
        Committable.decode(b"\xff\x00not json")

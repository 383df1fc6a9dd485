"""Location normalisation and orphan selection of remove-orphans; summary-key recognition of expiry."""

from __future__ import annotations

import datetime as dt

import pytest

from iceberg_sink import MaintenanceRefusedError
from iceberg_sink._iceberg.listing import ListedFile
from iceberg_sink.topology.maintenance import location_parts, normalise_location, select_orphans
from iceberg_sink.vocab.summary_keys import JobKeys, sink_job_of

OLD = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
CUTOFF = dt.datetime(2021, 1, 1, tzinfo=dt.UTC)


def listed(location: str, mtime: dt.datetime | None = OLD) -> ListedFile:
    return ListedFile(location=location, mtime=mtime, fs_path=location)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("s3a://b/wh/t/data/x.parquet", "s3://b/wh/t/data/x.parquet"),
        ("s3n://b/wh/t/data/x.parquet", "s3://b/wh/t/data/x.parquet"),
        ("S3://b/wh/x", "s3://b/wh/x"),
        ("file:/tmp/wh/x.parquet", "file:///tmp/wh/x.parquet"),
        ("/tmp/wh/x.parquet", "file:///tmp/wh/x.parquet"),
        ("file://localhost/tmp/wh/x.parquet", "/tmp/wh/x.parquet"),
        ("s3://b/wh/a%20b/x%3D1.parquet", "s3://b/wh/a b/x=1.parquet"),
        ("/tmp/wh/p=a%2Fb/x", "file:/tmp/wh/p=a%2Fb/x"),
    ],
)
def test_spellings_of_one_file_normalise_equal(a: str, b: str) -> None:
    assert normalise_location(a) == normalise_location(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("s3://b/wh/x", "s3://other/wh/x"),  # another bucket
        ("s3://b/wh/x", "gs://b/wh/x"),  # another store
        ("s3://b/wh/x", "b/wh/x"),  # what pyarrow lists: no scheme is a local path, not the object
        ("s3://b/wh/x", "s3://b/wh//x"),  # another S3 key
        ("hdfs://nn1/wh/x", "hdfs://nn2/wh/x"),
    ],
)
def test_different_files_stay_different(a: str, b: str) -> None:
    assert normalise_location(a) != normalise_location(b)


def test_query_and_fragment_characters_stay_in_the_path() -> None:
    assert location_parts("s3://b/wh/x?y#z.parquet") == ("s3", "b", "/wh/x?y#z.parquet")


def test_schemeless_listing_of_an_s3_table_is_refused_not_deleted() -> None:
    # The spelling pyarrow's S3 filesystem lists (bucket/key) against what the metadata references.
    refs = ["s3://b/wh/t/metadata/00001.metadata.json", "s3://b/wh/t/data/a.parquet"]
    files = [listed("b/wh/t/metadata/00001.metadata.json"), listed("b/wh/t/data/a.parquet")]
    with pytest.raises(MaintenanceRefusedError, match="none of them is referenced"):
        select_orphans(files, refs, [], CUTOFF, "test")


def test_a_staged_manifest_alone_is_no_proof_the_listing_matches() -> None:
    files = [listed("b/wh/t/metadata/iceberg-sink-j-000001-a-data.avro"), listed("b/wh/t/data/a.parquet")]
    with pytest.raises(MaintenanceRefusedError):
        select_orphans(
            files, ["s3://b/wh/t/data/a.parquet"], ["b/wh/t/metadata/iceberg-sink-j-000001-a-data.avro"], CUTOFF, "t"
        )


def test_a_path_referenced_under_another_authority_is_refused() -> None:
    refs = ["s3://b/wh/t/data/a.parquet", "s3://b/wh/t/data/b.parquet"]
    files = [listed("s3://b/wh/t/data/a.parquet"), listed("s3://mirror/wh/t/data/b.parquet")]
    with pytest.raises(MaintenanceRefusedError, match="another scheme or authority"):
        select_orphans(files, refs, [], CUTOFF, "test")


def test_orphans_are_unreferenced_unpending_and_old() -> None:
    refs = ["s3://b/wh/t/metadata/v1.metadata.json", "s3a://b/wh/t/data/live%20file.parquet"]
    pending = ["s3://b/wh/t/metadata/iceberg-sink-j-000003-a-data.avro", "s3://b/wh/t/data/staged.parquet"]
    files = [
        listed("s3://b/wh/t/metadata/v1.metadata.json"),
        listed("s3://b/wh/t/data/live file.parquet"),
        listed("s3://b/wh/t/metadata/iceberg-sink-j-000003-a-data.avro"),
        listed("s3a://b/wh/t/data/staged.parquet"),
        listed("s3://b/wh/t/data/orphan.parquet"),
        listed("s3://b/wh/t/data/young.parquet", mtime=CUTOFF),
        listed("s3://b/wh/t/data/unknown-age.parquet", mtime=None),
        listed("s3://b/wh/t/metadata/version-hint.text"),
    ]
    orphans = select_orphans(files, refs, pending, CUTOFF, "test")
    assert [f.location for f in orphans] == ["s3://b/wh/t/data/orphan.parquet"]


def test_nothing_listed_is_nothing_to_do() -> None:
    assert select_orphans([], ["s3://b/x"], [], CUTOFF, "test") == []


def test_sink_snapshots_are_recognised_whatever_their_prefix() -> None:
    custom = JobKeys("acme.ingest").properties("job-1", 7)
    assert custom == {
        "iceberg-sink.summary-prefix": "acme.ingest",
        "acme.ingest.job-id": "job-1",
        "acme.ingest.checkpoint-id": "7",
    }
    assert sink_job_of({**custom, "added-records": "3"}) == ("acme.ingest", "job-1")
    assert sink_job_of(JobKeys().properties("job-2", 0)) == ("iceberg-sink", "job-2")
    # Written before the marker existed: recognised by the job-id / checkpoint-id pair.
    assert sink_job_of({"acme.job-id": "job-3", "acme.checkpoint-id": "4"}) == ("acme", "job-3")
    # Other writers and the sink's own compactions are no jobs.
    assert sink_job_of({"flink.job-id": "f", "flink.max-committed-checkpoint-id": "9"}) is None
    assert sink_job_of({"iceberg-sink.operation": "compaction"}) is None
    assert JobKeys("acme").checkpoint_of(custom, "job-1") is None
    assert JobKeys("acme.ingest").checkpoint_of(custom, "job-1") == 7


@pytest.mark.parametrize("prefix", ["", " acme", "acme "])
def test_a_blank_or_padded_prefix_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="expected a non-empty string"):
        JobKeys(prefix)

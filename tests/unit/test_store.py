"""The checkpoint store refuses damaged state with an error naming the file, never a decode error."""

from __future__ import annotations

from pathlib import Path

import pytest

from iceberg_sink.committer import store as store_module
from iceberg_sink.committer.committable import CommitSummary, Committable, DeltaManifests
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import InvalidSinkConfigError, UncommittableCheckpointError


@pytest.mark.parametrize("content", [b"", b'{"job_id": "ab', b"[1, 2]", b'{"table": "db.t"}'])
def test_a_damaged_job_file_is_named(tmp_path: Path, content: bytes) -> None:
    CheckpointStore(str(tmp_path)).job_id("db.t")
    job_file = tmp_path / "iceberg_sink" / "job.json"
    job_file.write_bytes(content)
    with pytest.raises(InvalidSinkConfigError) as failed:
        CheckpointStore(str(tmp_path)).job_id("db.t")
    message = str(failed.value)
    assert str(job_file) in message, message
    assert "iceberg-sink.job-id" in message, message
    assert job_file.read_bytes() == content  # left for the user to restore


def test_a_damaged_committable_is_named_with_the_job(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    job = store.job_id("db.t")
    path = tmp_path / "iceberg_sink" / "committables" / f"{7:020d}.json"
    path.write_bytes(b'{"kind": "committable", "version": 3')
    for read in (lambda: store.get(7), store.pending):
        with pytest.raises(UncommittableCheckpointError) as failed:
            read()
        message = str(failed.value)
        assert str(path) in message and f"iceberg-sink.job-id={job}" in message, message
        assert "iceberg-sink.checkpoint-id=7" in message, message


def _committable(checkpoint_id: int, table: str) -> Committable:
    return Committable(
        job_id="job",
        checkpoint_id=checkpoint_id,
        table=table,
        branch="main",
        manifests=DeltaManifests(),
        summary=CommitSummary(checkpoint_id=checkpoint_id),
    )


def test_routed_tables_keep_their_committables_apart(tmp_path: Path) -> None:
    root = CheckpointStore(str(tmp_path))
    root.job_id("<routed>")
    stores = {t: CheckpointStore.for_table(str(tmp_path), t) for t in ("ns.a", "ns.b")}
    assert stores["ns.a"].job_id("ns.a", "job") == "job" == stores["ns.b"].job_id("ns.b", "job")
    stores["ns.a"].put(_committable(3, "ns.a"))
    stores["ns.b"].put(_committable(3, "ns.b"))
    stores["ns.b"].put(_committable(4, "ns.b"))
    stores["ns.a"].delete(3)
    assert stores["ns.a"].pending_ids() == [] and root.pending_ids() == []
    assert [(c.table, c.checkpoint_id) for c in stores["ns.b"].pending()] == [("ns.b", 3), ("ns.b", 4)]
    assert root.table_folders() == ["ns.a", "ns.b"]


def test_a_routed_table_remembers_its_uuid(tmp_path: Path) -> None:
    store = CheckpointStore.for_table(str(tmp_path), "ns.a")
    assert store.table_uuid() is None
    store.pin_table_uuid("ns.a", "u-1")
    store.pin_table_uuid("ns.a", "u-1")
    with pytest.raises(
        UncommittableCheckpointError, match=r"table ns\.a was written by this job with UUID u-1 but now has UUID u-2"
    ):
        store.pin_table_uuid("ns.a", "u-2")
    (Path(store.root) / "table.json").write_text("[]")
    with pytest.raises(InvalidSinkConfigError, match=r"table\.json is damaged"):
        store.table_uuid()
    # The routed table's recorded source (job/source_ledger.py): absent, kept, or named when damaged.
    assert store.sources() == frozenset()
    store.record_sources(frozenset({"shop.public.customers"}))
    assert store.sources() == frozenset({"shop.public.customers"})
    (Path(store.root) / "sources.json").write_text('{"sources": "shop.public.customers"}')
    with pytest.raises(InvalidSinkConfigError, match=r"sources\.json is damaged \(expected a list of source names"):
        store.sources()


def test_read_job_only_looks(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.read_job() is None
    assert not (tmp_path / "iceberg_sink" / "job.json").exists()  # job_id() would have created it
    job_id = store.job_id("db.t")
    assert CheckpointStore(str(tmp_path)).read_job() == {"job_id": job_id, "table": "db.t"}


def test_a_store_opened_without_create_makes_no_folder(tmp_path: Path) -> None:
    # iceberg-sink inspect opens every store so: looking at a table the routed job never wrote
    # must not give the job state for it (a routed job starts a SinkJob per table folder).
    store = CheckpointStore(str(tmp_path), create=False)
    assert store.read_job() is None and store.pending_ids() == [] and store.table_folders() == []
    other = CheckpointStore.for_table(str(tmp_path), "db.t", create=False)
    assert other.pending_ids() == [] and other.table_uuid() is None
    assert not (tmp_path / "iceberg_sink").exists()


@pytest.mark.parametrize(
    ("location", "parts"),
    [
        ("file:///ck/a%20b", ("file", "", "/ck/a%20b")),  # literal, as Hadoop's Path: no decoding
        ("file:/ck", ("file", "", "/ck")),  # Spark's own spelling of a local location
        ("file://localhost/ck/", ("file", "", "/ck")),
        ("/ck/x?y#z", ("file", "", "/ck/x?y#z")),
        ("hdfs://nn:8020/ck/a%20b?x", ("hdfs", "nn:8020", "/ck/a%20b?x")),
        ("s3a://bucket/ck", ("s3a", "bucket", "/ck")),
    ],
)
def test_checkpoint_locations_are_read_as_spark_reads_them(location: str, parts: tuple[str, str, str]) -> None:
    assert store_module.checkpoint_parts(location) == parts


def test_a_relative_location_is_local_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert store_module.checkpoint_parts("ck") == ("file", "", str(tmp_path / "ck"))
    assert store_module.checkpoint_parts("./ck:1") == ("file", "", str(tmp_path / "ck:1"))
    assert store_module.checkpoint_parts("ck/a:b") == ("file", "", str(tmp_path / "ck" / "a:b"))


@pytest.mark.parametrize("location", ["ck:1", "file:ck", "a b:c/d", ":ck", "s3:bucket/ck"])
def test_a_colon_before_the_first_slash_is_refused_as_spark_refuses_it(
    location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hadoop's Path takes what precedes such a colon as a scheme, and Spark fails the query ("Relative
    path in absolute URI"); the sink refuses the location before creating anything, for bounded writes
    too, so a location means the same to both."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidSinkConfigError, match=r"expected a path or a URI with an absolute path.*received"):
        store_module.checkpoint_parts(location)
    assert list(tmp_path.iterdir()) == []


def test_spellings_of_one_location_share_one_key(tmp_path: Path) -> None:
    spellings = [
        str(tmp_path / "ck"),
        f"file:{tmp_path}/ck",
        f"file://{tmp_path}/ck/",
        f"file://localhost{tmp_path}/ck",
    ]
    assert len({store_module.checkpoint_key(s) for s in spellings}) == 1
    assert store_module.checkpoint_key(f"file://{tmp_path}/ck%20x") != store_module.checkpoint_key(f"{tmp_path}/ck x")


def test_a_file_uri_naming_another_host_is_refused() -> None:
    with pytest.raises(InvalidSinkConfigError, match="names the host 'otherhost'"):
        CheckpointStore("file://otherhost/ck")


def test_an_escaped_file_uri_keeps_its_state_in_the_literal_folder(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/a%20b")
    store.job_id("db.t")
    assert (tmp_path / "a%20b" / "iceberg_sink" / "job.json").is_file()
    assert not (tmp_path / "a b").exists()

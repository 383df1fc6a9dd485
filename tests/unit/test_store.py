"""The checkpoint store refuses damaged state with an error naming the file, never a decode error."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_read_job_only_looks(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert store.read_job() is None
    assert not (tmp_path / "iceberg_sink" / "job.json").exists()  # job_id() would have created it
    job_id = store.job_id("db.t")
    assert CheckpointStore(str(tmp_path)).read_job() == {"job_id": job_id, "table": "db.t"}

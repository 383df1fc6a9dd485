"""The snapshot summary keys iceberg_sink writes and reads, named in one place.

A sink snapshot names its job and checkpoint under a prefix (option
``iceberg-sink.snapshot-property-prefix``, default ``iceberg-sink``): ``<prefix>.job-id`` and
``<prefix>.checkpoint-id``. The committer finds a job's last checkpoint by them. Every sink snapshot
also records the prefix it used under :data:`PREFIX_MARKER_KEY`, a key that never depends on the
option: snapshot expiry, which does not know which prefix each job chose, recognises every job's
snapshots by it (expiring a job's newest snapshot would let a replayed checkpoint commit twice).

The other keys (ephemeral-job marker, operation of compaction and manifest rewrites) are fixed.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from iceberg_sink.errors import InvalidSinkConfigError

DEFAULT_PREFIX = "iceberg-sink"
PREFIX_MARKER_KEY = "iceberg-sink.summary-prefix"
"""Fixed key holding the prefix of the job-id / checkpoint-id keys of the same snapshot."""
EPHEMERAL_JOB_KEY = "iceberg-sink.ephemeral-job"
"""``"true"`` on snapshots of a job whose checkpoint location is thrown away (it cannot resume)."""
OPERATION_KEY = "iceberg-sink.operation"
OPERATION_COMPACTION = "compaction"
OPERATION_REWRITE_MANIFESTS = "rewrite-manifests"
COMPACTION_READ_SNAPSHOT_KEY = "iceberg-sink.compaction.read-snapshot-id"
OPERATION_CONVERT_EQUALITY_DELETES = "convert-equality-deletes"
CONVERSION_READ_SNAPSHOT_KEY = "iceberg-sink.conversion.read-snapshot-id"

_JOB_ID_SUFFIX = ".job-id"
_CHECKPOINT_ID_SUFFIX = ".checkpoint-id"


def _check_prefix(_: object, __: object, prefix: str) -> None:
    if not isinstance(prefix, str) or not prefix.strip() or prefix != prefix.strip():
        raise InvalidSinkConfigError(
            f"snapshot property prefix: expected a non-empty string without surrounding spaces, received {prefix!r}"
        )


@attrs.frozen
class JobKeys:
    """The job-id and checkpoint-id keys of one prefix.

    Attributes:
        prefix: the ``iceberg-sink.snapshot-property-prefix`` the job writes with.
    """

    prefix: str = attrs.field(default=DEFAULT_PREFIX, validator=_check_prefix)

    @property
    def job_id(self) -> str:
        return self.prefix + _JOB_ID_SUFFIX

    @property
    def checkpoint_id(self) -> str:
        return self.prefix + _CHECKPOINT_ID_SUFFIX

    def properties(self, job_id: str, checkpoint_id: int) -> dict[str, str]:
        """The summary properties of one checkpoint's snapshot, prefix marker included."""
        return {PREFIX_MARKER_KEY: self.prefix, self.job_id: job_id, self.checkpoint_id: str(checkpoint_id)}

    def checkpoint_of(self, summary: Mapping[str, str], job_id: str) -> int | None:
        """The checkpoint id of a snapshot of ``job_id`` under this prefix; None for any other snapshot."""
        if summary.get(self.job_id) != job_id:
            return None
        value = summary.get(self.checkpoint_id)
        return int(value) if value else -1


def sink_job_of(summary: Mapping[str, str]) -> tuple[str, str] | None:
    """``(prefix, job id)`` of a snapshot written by an iceberg_sink job, whatever its prefix.

    Snapshots carry the prefix under :data:`PREFIX_MARKER_KEY`. Snapshots written before that key
    existed are recognised by a ``<p>.job-id`` key next to a ``<p>.checkpoint-id`` key: when in
    doubt, a snapshot counts as a job's (expiry then keeps one snapshot too many, never one too few).

    Returns:
        The prefix and job id, or None for snapshots of other writers, compactions, rewrites.
    """
    prefix = summary.get(PREFIX_MARKER_KEY)
    if prefix is not None:
        job = summary.get(prefix + _JOB_ID_SUFFIX)
        if job:
            return prefix, job
    for key, value in summary.items():
        if key.endswith(_JOB_ID_SUFFIX) and value:
            candidate = key.removesuffix(_JOB_ID_SUFFIX)
            if candidate + _CHECKPOINT_ID_SUFFIX in summary:
                return candidate, value
    return None


def is_ephemeral(summary: Mapping[str, str]) -> bool:
    """Whether the snapshot's job cannot be resumed (its checkpoint location was temporary)."""
    return summary.get(EPHEMERAL_JOB_KEY) == "true"

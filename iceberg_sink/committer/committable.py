"""The committable: one checkpoint's DeltaManifests plus what the committer needs to commit it."""

from __future__ import annotations

from typing import Any

import attrs

from iceberg_sink import _codec
from iceberg_sink._iceberg.manifests import StagedManifest


@attrs.frozen
class DeltaManifests:
    """The staged manifests of one checkpoint: data files, and delete files (CDC modes)."""

    data_manifest: StagedManifest | None = None
    delete_manifest: StagedManifest | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(m.path for m in (self.data_manifest, self.delete_manifest) if m is not None)


@attrs.frozen
class CommitSummary:
    """Counts of one checkpoint, shown to pre-commit hooks and in logs."""

    checkpoint_id: int
    data_files: int = 0
    delete_files: int = 0
    records: int = 0
    bytes: int = 0
    equality_deletes: int = 0
    position_deletes: int = 0

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Committable:
    """What the aggregator hands to the committer for one checkpoint; persisted before committing.

    Attributes:
        job_id: the sink's job id (stable per checkpoint location).
        checkpoint_id: the micro-batch id.
        table: the table identifier, for checks on restore.
        branch: the target branch.
        manifests: the staged manifests holding the checkpoint's files.
        summary: counts for hooks and metrics.
        proof_snapshot_id: the snapshot the writers' "key is new" proof was made on (-1: empty branch).
        skipped_deletes: how many equality deletes the writers skipped on that proof.
    """

    job_id: str
    checkpoint_id: int
    table: str
    branch: str
    manifests: DeltaManifests
    summary: CommitSummary
    proof_snapshot_id: int | None = None
    skipped_deletes: int = 0

    CODEC_VERSION = 2

    def encode(self) -> bytes:
        return _codec.dumps(
            "committable",
            self.CODEC_VERSION,
            {
                "job_id": self.job_id,
                "checkpoint_id": self.checkpoint_id,
                "table": self.table,
                "branch": self.branch,
                "data_manifest": self.manifests.data_manifest.to_json() if self.manifests.data_manifest else None,
                "delete_manifest": (
                    self.manifests.delete_manifest.to_json() if self.manifests.delete_manifest else None
                ),
                "summary": self.summary.to_json(),
                "proof_snapshot_id": self.proof_snapshot_id,
                "skipped_deletes": self.skipped_deletes,
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> Committable:
        obj = _codec.loads(data, "committable", (1, 2))
        return cls(
            job_id=obj["job_id"],
            checkpoint_id=obj["checkpoint_id"],
            table=obj["table"],
            branch=obj["branch"],
            manifests=DeltaManifests(
                data_manifest=StagedManifest.from_json(obj["data_manifest"]) if obj["data_manifest"] else None,
                delete_manifest=(StagedManifest.from_json(obj["delete_manifest"]) if obj["delete_manifest"] else None),
            ),
            summary=CommitSummary(**obj["summary"]),
            proof_snapshot_id=obj.get("proof_snapshot_id"),
            skipped_deletes=obj.get("skipped_deletes", 0),
        )

"""The committable: one checkpoint's DeltaManifests plus what the committer needs to commit it."""

from __future__ import annotations

from typing import Any

import attrs

from iceberg_sink import _codec
from iceberg_sink._iceberg.manifests import StagedManifest


@attrs.frozen
class DeltaManifests:
    """The staged manifests of one checkpoint: data files, and delete files (CDC modes).

    ``conditional_delete_manifest`` lists the equality deletes of keys the writers proved new; the
    committer commits them only if that proof no longer holds (see table/key_bounds.py).
    """

    data_manifest: StagedManifest | None = None
    delete_manifest: StagedManifest | None = None
    conditional_delete_manifest: StagedManifest | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        staged = (self.data_manifest, self.delete_manifest, self.conditional_delete_manifest)
        return tuple(m.path for m in staged if m is not None)


@attrs.frozen
class CommitSummary:
    """Counts of one checkpoint, shown to pre-commit hooks and in logs; ``table`` names the table
    (a routed sink's hooks see every table's checkpoints; empty in committables stored before it)."""

    checkpoint_id: int
    data_files: int = 0
    delete_files: int = 0
    records: int = 0
    bytes: int = 0
    equality_deletes: int = 0
    position_deletes: int = 0
    table: str = ""

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
        skipped_deletes: how many equality deletes the writers made conditional on that proof.
        table_uuid: the UUID of the table the files were written for (None: written by a version
            that did not record it). A table dropped and re-created under the same name has another.
        schema_id: the id of the table schema the files were written with (None: written by a
            version that did not record it). The committer refuses to commit them into a schema
            that dropped or incompatibly changed a column they hold.
        truncated: the checkpoint holds a truncate (topology/changes.py): its snapshot removes every
            data and delete file live on the branch head it is committed on, then adds its own files.
    """

    job_id: str
    checkpoint_id: int
    table: str
    branch: str
    manifests: DeltaManifests
    summary: CommitSummary
    proof_snapshot_id: int | None = None
    skipped_deletes: int = 0
    table_uuid: str | None = None
    schema_id: int | None = None
    truncated: bool = False

    # 3: conditional_delete_manifest and table_uuid. Versions 1 and 2 decode without them (a v2
    # committable's skipped deletes were not written at all: see IcebergCommitter). 4: schema_id.
    # 5: truncated.
    CODEC_VERSION = 5

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
                "conditional_delete_manifest": (
                    self.manifests.conditional_delete_manifest.to_json()
                    if self.manifests.conditional_delete_manifest
                    else None
                ),
                "table_uuid": self.table_uuid,
                "schema_id": self.schema_id,
                "truncated": self.truncated,
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> Committable:
        obj = _codec.loads(data, "committable", (1, 2, 3, 4, 5))
        conditional = obj.get("conditional_delete_manifest")
        return cls(
            job_id=obj["job_id"],
            checkpoint_id=obj["checkpoint_id"],
            table=obj["table"],
            branch=obj["branch"],
            manifests=DeltaManifests(
                data_manifest=StagedManifest.from_json(obj["data_manifest"]) if obj["data_manifest"] else None,
                delete_manifest=(StagedManifest.from_json(obj["delete_manifest"]) if obj["delete_manifest"] else None),
                conditional_delete_manifest=StagedManifest.from_json(conditional) if conditional else None,
            ),
            summary=CommitSummary(**obj["summary"]),
            proof_snapshot_id=obj.get("proof_snapshot_id"),
            skipped_deletes=obj.get("skipped_deletes", 0),
            table_uuid=obj.get("table_uuid"),
            schema_id=obj.get("schema_id"),
            truncated=obj.get("truncated", False),
        )

"""CommitAggregator: the single driver-side step between the writers and the committer.

    writer tasks ──WriteResult──▶ CommitAggregator ──Committable (DeltaManifests)──▶ IcebergCommitter

For each checkpoint it folds every task's WriteResult into one staged data manifest (and one staged
delete manifest when deletes were written, and one of conditional deletes when writers proved keys
new) in the table's metadata folder, and returns a
:class:`Committable` that the sink persists under the checkpoint location before any commit. It
assumes one checkpoint at a time (Spark runs micro-batches one after another).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.table import Table

from iceberg_sink._iceberg import manifests
from iceberg_sink.committer.committable import CommitSummary, Committable, DeltaManifests
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from iceberg_sink.writer.result import WriteResult


class CommitAggregator:
    """Folds one checkpoint's write results into one committable."""

    def __init__(self, table_name: str, branch: str, job_id: str) -> None:
        self._table_name = table_name
        self._branch = branch
        self._job_id = job_id

    def aggregate(
        self,
        table: Table,
        io: FileIO,
        checkpoint_id: int,
        results: Iterable[WriteResult],
        proof_snapshot_id: int | None = None,
    ) -> Committable | None:
        """Return the committable of ``checkpoint_id``, or None when nothing was written."""
        data: list[DataFileMeta] = []
        deletes: list[DataFileMeta] = []
        conditional: list[DataFileMeta] = []
        skipped = 0
        truncated = False
        for result in results:
            truncated = truncated or result.truncated
            data.extend(result.data_files)
            deletes.extend(result.delete_files)
            conditional.extend(result.conditional_delete_files)
            skipped += result.skipped_deletes
        # A checkpoint of conditional deletes only (deletes of keys proven new) is still committed
        # when the proof fails at commit time; when it holds the committer commits nothing.
        if not data and not deletes and not conditional and not truncated:
            return None
        metadata = table.metadata
        attempt = uuid.uuid4().hex[:12]

        def staged(files: list[DataFileMeta], kind: str) -> manifests.StagedManifest | None:
            if not files:
                return None
            spec_ids = {f.spec_id for f in files}
            if len(spec_ids) != 1:
                raise ValueError(f"one checkpoint wrote files of several partition specs: {sorted(spec_ids)}")
            spec = metadata.specs()[spec_ids.pop()]
            path = table.location_provider().new_metadata_location(
                f"iceberg-sink-{self._job_id}-{checkpoint_id:06d}-{attempt}-{kind}.avro"
            )
            return manifests.write_staged_manifest(io, path, spec, metadata.schema(), files, deletes=kind != "data")

        summary = CommitSummary(
            checkpoint_id=checkpoint_id,
            data_files=len(data),
            delete_files=len(deletes),
            records=sum(f.record_count for f in data),
            bytes=sum(f.file_size_in_bytes for f in data) + sum(f.file_size_in_bytes for f in deletes),
            equality_deletes=sum(f.record_count for f in deletes if f.content == FileContent.EQUALITY_DELETES),
            position_deletes=sum(f.record_count for f in deletes if f.content == FileContent.POSITION_DELETES),
            table=self._table_name,
        )
        return Committable(
            job_id=self._job_id,
            checkpoint_id=checkpoint_id,
            table=self._table_name,
            branch=self._branch,
            manifests=DeltaManifests(
                data_manifest=staged(data, "data"),
                delete_manifest=staged(deletes, "deletes"),
                conditional_delete_manifest=staged(conditional, "conditional-deletes"),
            ),
            summary=summary,
            proof_snapshot_id=proof_snapshot_id if skipped else None,
            skipped_deletes=skipped,
            table_uuid=str(metadata.table_uuid),
            schema_id=metadata.current_schema_id,
            truncated=truncated,
        )

"""Partition specs a commit needs: which specs hold a snapshot's live data, and the table's
unpartitioned spec (added, without becoming the default, when the table has none).

An equality delete written under a spec with no partition fields is *global*: Iceberg applies it to
data files of every partition of every spec (spec, "Scan Planning"; Java's DeleteFileIndex keeps
such deletes in its global index). A partitioned one reaches only data files of its own spec and
partition, so after partition spec evolution it misses rows written under the older spec.
"""

from __future__ import annotations

from pyiceberg.manifest import ManifestContent
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AssertDefaultSpecId,
    AssertLastAssignedPartitionId,
    AssertTableUUID,
)

from iceberg_sink._iceberg.manifests import has_live_files
from iceberg_sink._iceberg.producer import commit_metadata


def unpartitioned_spec_id(table: Table) -> int | None:
    """The id of a spec of ``table`` without partition fields (the lowest), or None."""
    ids = [spec.spec_id for spec in table.metadata.partition_specs if not spec.fields]
    return min(ids) if ids else None


def live_data_spec_ids(table: Table, snapshot: Snapshot | None) -> frozenset[int]:
    """The specs of the data manifests of ``snapshot`` that still list live files.

    Read from the manifest list only (each manifest has one spec and counts its live entries), so
    it costs one small file per call, whatever the size of the table.
    """
    if snapshot is None:
        return frozenset()
    return frozenset(
        manifest.partition_spec_id
        for manifest in snapshot.manifests(table.io)
        if manifest.content == ManifestContent.DATA and has_live_files(manifest)
    )


def with_unpartitioned_spec(table: Table) -> Table:
    """``table`` with an unpartitioned spec in its metadata, adding one if it has none.

    The added spec does not become the default: writers keep partitioning data as configured. It
    is a metadata-only commit (no snapshot), guarded by the table's UUID, its last assigned
    partition field id and its default spec id, so a concurrent spec change fails it rather than
    being overwritten; the caller retries on the reloaded table.

    Raises:
        CommitFailedException: the table's specs changed concurrently; reload and call again.
    """
    if unpartitioned_spec_id(table) is not None:
        return table
    metadata = table.metadata
    spec_id = max(spec.spec_id for spec in metadata.partition_specs) + 1
    requirements = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertLastAssignedPartitionId(last_assigned_partition_id=metadata.last_partition_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=metadata.default_spec_id),  # type: ignore[call-arg]
    )
    return commit_metadata(table, requirements, (AddPartitionSpecUpdate(spec=PartitionSpec(spec_id=spec_id)),))

"""Planning on the driver: which files to rewrite, in which groups.

Per partition, a data file is a candidate when it is smaller than the minimum size or when at least
``delete_file_threshold`` delete files apply to it: those of its own partition and the *global*
equality deletes (written under an unpartitioned spec, they apply to every partition of every spec;
see _iceberg/deletes.py). Candidates are bin-packed (largest first) into
groups of at most ``max_group_bytes``; a group is kept when it has at least ``min_input_files`` files
or deletes to apply. Which delete files the rewrite removes is decided at commit time, against the
branch head (topology/compaction/job.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import attrs
from pyiceberg.table import Table

from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.files import LiveFile, branch_head
from iceberg_sink.topology.compaction.config import CompactionConfig

PartitionKey = tuple[int, tuple[Any, ...]]


@attrs.frozen
class RewriteGroup:
    """Files of one partition rewritten by one task, with the delete files that apply to them."""

    partition: PartitionKey
    data_files: tuple[LiveFile, ...]
    delete_files: tuple[LiveFile, ...]

    @property
    def input_bytes(self) -> int:
        return sum(f.meta.file_size_in_bytes for f in self.data_files)


@attrs.frozen
class CompactionPlan:
    """What one compaction rewrites, read from ``snapshot_id`` (sequence ``sequence_number``).

    ``rules`` says which delete applies to which data file in this table (its unpartitioned specs).
    """

    snapshot_id: int
    sequence_number: int
    groups: tuple[RewriteGroup, ...]
    rules: DeleteRules


def plan(
    table: Table,
    branch: str,
    config: CompactionConfig,
    table_target: int,
    partition_filter: Callable[[int, tuple[Any, ...]], bool] | None = None,
    entries: ManifestEntries | None = None,
) -> CompactionPlan | None:
    """Plan a compaction of ``branch``; None when the branch has no snapshot or nothing to do.
    ``entries`` keeps the manifests read, for the commit attempts that follow."""
    snapshot = branch_head(table, branch)
    if snapshot is None:
        return None
    rules = DeleteRules.from_specs(table.specs())
    data, deletes = live_files(table, snapshot, entries)
    by_partition: dict[PartitionKey, list[LiveFile]] = defaultdict(list)
    deletes_by_partition: dict[PartitionKey, list[LiveFile]] = defaultdict(list)
    global_deletes: list[LiveFile] = []
    for f in data:
        by_partition[(f.meta.spec_id, f.meta.partition)].append(f)
    for d in deletes:
        if rules.is_global(d):
            global_deletes.append(d)
        else:
            deletes_by_partition[(d.meta.spec_id, d.meta.partition)].append(d)

    min_size = config.min_size(table_target)
    groups: list[RewriteGroup] = []
    for key, files in by_partition.items():
        if partition_filter is not None and not partition_filter(*key):
            continue
        # Global deletes may remove rows of any partition: rewriting a file without them would
        # bring those rows back once the deletes are removed.
        partition_deletes = deletes_by_partition.get(key, []) + global_deletes
        candidates = []
        for f in files:
            applying = [d for d in partition_deletes if rules.applies(d, f)]
            if f.meta.file_size_in_bytes < min_size or len(applying) >= config.delete_file_threshold:
                candidates.append((f, applying))
        for bin_ in _bin_pack(candidates, config.max_group_bytes):
            group_deletes = {d.meta.path: d for _, applying in bin_ for d in applying}
            if len(bin_) < config.min_input_files and not group_deletes:
                continue
            groups.append(
                RewriteGroup(
                    key, tuple(f for f, _ in bin_), tuple(sorted(group_deletes.values(), key=lambda d: d.meta.path))
                )
            )
    if not groups:
        return None
    return CompactionPlan(
        snapshot_id=snapshot.snapshot_id,
        sequence_number=snapshot.sequence_number or 0,
        groups=tuple(groups),
        rules=rules,
    )


def _bin_pack(
    items: list[tuple[LiveFile, list[LiveFile]]], max_bytes: int
) -> list[list[tuple[LiveFile, list[LiveFile]]]]:
    """First-fit decreasing by file size; every item lands in exactly one bin."""
    bins: list[list[tuple[LiveFile, list[LiveFile]]]] = []
    sizes: list[int] = []
    for item in sorted(items, key=lambda i: (-i[0].meta.file_size_in_bytes, i[0].meta.path)):
        size = item[0].meta.file_size_in_bytes
        for i, used in enumerate(sizes):
            if used + size <= max_bytes:
                bins[i].append(item)
                sizes[i] += size
                break
        else:
            bins.append([item])
            sizes.append(size)
    return bins

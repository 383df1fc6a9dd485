"""Compaction planning: bin-packing properties and Iceberg's delete-applicability rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform, VoidTransform

from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.topology.compaction.planner import _bin_pack
from iceberg_sink.vocab.files import DataFileMeta, FileContent


def live(
    path: str,
    size: int = 10,
    seq: int = 1,
    content: FileContent = FileContent.DATA,
    spec_id: int = 0,
    partition: tuple[object, ...] = (),
) -> LiveFile:
    meta = DataFileMeta(
        content=content, path=path, spec_id=spec_id, partition=partition, record_count=1, file_size_in_bytes=size
    )
    return LiveFile(meta, seq, "m.avro")


@given(st.lists(st.integers(1, 1000), max_size=40), st.integers(1, 3000))
def test_bin_packing_places_every_file_once_within_the_limit(sizes: list[int], limit: int) -> None:
    items = [(live(f"f{i}", size), []) for i, size in enumerate(sizes)]
    bins = _bin_pack(items, limit)
    placed = [f.meta.path for b in bins for f, _ in b]
    assert sorted(placed) == sorted(f"f{i}" for i in range(len(sizes)))
    for b in bins:
        total = sum(f.meta.file_size_in_bytes for f, _ in b)
        assert total <= limit or len(b) == 1  # only a file larger than the limit gets a bin of its own
    # First-fit decreasing never leaves two bins that would fit together as one.
    totals = sorted(sum(f.meta.file_size_in_bytes for f, _ in b) for b in bins)
    if len(totals) >= 2:
        assert totals[0] + totals[1] > limit or any(
            len(b) == 1 and sum(f.meta.file_size_in_bytes for f, _ in b) > limit for b in bins
        )


def test_equality_deletes_apply_only_to_strictly_older_data() -> None:
    rules = DeleteRules([0])
    data = live("d", seq=5)
    assert rules.applies(live("e", seq=6, content=FileContent.EQUALITY_DELETES), data)
    assert not rules.applies(live("e", seq=5, content=FileContent.EQUALITY_DELETES), data)
    assert rules.applies(live("p", seq=5, content=FileContent.POSITION_DELETES), data)
    assert not rules.applies(live("p", seq=4, content=FileContent.POSITION_DELETES), data)


def test_only_equality_deletes_of_an_unpartitioned_spec_are_global() -> None:
    rules = DeleteRules.from_specs(
        {
            0: PartitionSpec(),
            1: PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "region")),
            2: PartitionSpec(PartitionField(1, 1000, VoidTransform(), "region")),  # v1: a dropped field
        }
    )
    assert rules.unpartitioned_spec_ids == {0, 2}
    data = live("d", seq=5, spec_id=1, partition=("eu",))
    for spec_id, partition in ((0, ()), (2, (None,))):
        assert rules.applies(
            live("e", seq=6, content=FileContent.EQUALITY_DELETES, spec_id=spec_id, partition=partition), data
        )
        # Position deletes are never global (Iceberg spec; Java's DeleteFileIndex).
        assert not rules.applies(
            live("p", seq=6, content=FileContent.POSITION_DELETES, spec_id=spec_id, partition=partition), data
        )
    assert rules.applies(live("e", seq=6, content=FileContent.EQUALITY_DELETES, spec_id=1, partition=("eu",)), data)
    assert not rules.applies(live("e", seq=6, content=FileContent.EQUALITY_DELETES, spec_id=1, partition=("us",)), data)
    assert not rules.applies(live("e", seq=5, content=FileContent.EQUALITY_DELETES, spec_id=0), data)

"""Compaction planning: bin-packing properties and Iceberg's delete-applicability rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from iceberg_sink._iceberg.deletes import applies
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.topology.compaction.planner import _bin_pack
from iceberg_sink.writer.result import DataFileMeta, FileContent


def live(path: str, size: int = 10, seq: int = 1, content: FileContent = FileContent.DATA) -> LiveFile:
    meta = DataFileMeta(content=content, path=path, spec_id=0, partition=(), record_count=1, file_size_in_bytes=size)
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
    data = live("d", seq=5)
    assert applies(live("e", seq=6, content=FileContent.EQUALITY_DELETES), data)
    assert not applies(live("e", seq=5, content=FileContent.EQUALITY_DELETES), data)
    assert applies(live("p", seq=5, content=FileContent.POSITION_DELETES), data)
    assert not applies(live("p", seq=4, content=FileContent.POSITION_DELETES), data)

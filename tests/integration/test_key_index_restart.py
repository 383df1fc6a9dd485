"""The key index survives a driver restart (keyindex/persisted.py): a v3 CDC stream, then
a new sink on the same checkpoint location resolves its first checkpoint's deletes to DVs without
reading a data file; with the persisted entries deleted, the next new sink rebuilds them from the
data files. Before the restart, after it and after the rebuild, Iceberg Java 1.9.2, the newest Iceberg Java and
DuckDB read the model."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.keyindex.persisted import index_location
from tests.integration.test_cdc import apply, expected, frame
from tests.interop.readers import JavaIcebergReader, assert_readers_agree

pytestmark = pytest.mark.interop

KEYS = {"one long (sorted form)": ["id"], "long and string (arrow form)": ["id", "region"]}


def changes(ids: Iterable[int], lsn: int, op: str) -> list[dict[str, Any]]:
    return [
        {"id": i, "region": f"r{i % 3}", "v": f"v{lsn}-{i}", "n": i, "lsn": lsn + n, "op": op}
        for n, i in enumerate(ids)
    ]


class Checkpoints:
    """Bounded ``write()``s of change batches under one checkpoint location, applied to a model too."""

    def __init__(self, spark: SparkSession, readers: tuple[JavaIcebergReader, ...], location: str) -> None:
        self.spark, self.readers, self.location = spark, readers, location
        self.model: dict[int, dict[str, Any]] = {}
        self.checkpoint = self.lsn = 0

    def write(self, sink: Any, ids: range, op: str, check: bool = False) -> Any:
        """One checkpoint of ``op`` changes of ``ids``; with ``check``, the readers must read the
        model after it (only after the checkpoints that matter: each read costs CI seconds)."""
        batch = changes(ids, self.lsn, op)
        self.lsn += 1000
        outcome = sink.write(frame(self.spark, batch), checkpoint_location=self.location, checkpoint_id=self.checkpoint)
        self.checkpoint += 1
        apply(self.model, batch)
        if check:
            assert_readers_agree(self.readers, sink.load_table().metadata_location, expected(self.model), ["id"])
        return outcome


@pytest.mark.parametrize("kind", list(KEYS))
def test_a_restarted_sink_loads_the_key_index_and_rebuilds_it_when_deleted(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, kind: str
) -> None:
    def build() -> Any:
        return (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.users")
            .create_if_missing(format_version=3)
            .cdc(op_column="op", key=KEYS[kind], order_by="lsn")
            .build()
        )

    steps = Checkpoints(spark, java_readers, str(tmp_path / "ckpt"))
    write, model = steps.write, steps.model

    # Each checkpoint's deletes reach (by key bounds) the files of the checkpoints before it that
    # hold its keys: those files are read and indexed. The last one before the restart inserts keys
    # no earlier file holds, so every file the first checkpoint after it reaches is indexed.
    sink = build()
    write(sink, range(100), "I")  # files A: keys 0..99
    write(sink, range(50), "U")  # reaches A (read); files B: 0..49
    write(sink, range(10), "U")  # reaches A and B (B read); files C: 0..9
    write(sink, range(200, 210), "I", check=True)  # reaches nothing; files D: 200..209
    sink.close()  # waits for the background index writes, as a clean shutdown does
    indexed = sink.metrics().key_index_data_files_read
    assert indexed >= 2

    restarted = build()  # a new driver: a cold in-memory index, the same checkpoint location
    outcome = write(restarted, range(20, 50), "U", check=True)  # reaches A and B only
    assert outcome.key_index_data_files_read == 0
    assert outcome.key_index_entries_loaded == indexed
    assert restarted.metrics().key_index_entries_loaded == indexed

    # The persisted entries are lost: the next new driver reads the data files again, and is right.
    folder = Path(index_location(restarted.load_table()).removeprefix("file://"))
    assert len(list(folder.iterdir())) >= indexed
    for entry in folder.iterdir():
        entry.unlink()
    rebuilt = build()
    outcome = write(rebuilt, range(50, 100), "D", check=True)  # reaches A only
    assert outcome.key_index_data_files_read > 0 and outcome.key_index_entries_loaded == 0
    rebuilt.close()
    assert len(list(folder.iterdir())) == outcome.key_index_data_files_read
    assert len(model) == 50 + 10


def test_bounded_writes_of_one_sink_share_the_key_index_in_memory(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """Each bounded write() is a job of its own; the sink hands its v3 committer's key index on, so
    the keys read by one write are not read (or loaded from table storage) again by the next."""
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(format_version=3)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .write_option("iceberg-sink.conversion.key-index-persist", False)
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    model: dict[int, dict[str, Any]] = {}
    outcomes = []
    for checkpoint, (ids, op) in enumerate([(range(100), "I"), (range(50), "U"), (range(20, 40), "U")]):
        batch = changes(ids, checkpoint * 1000, op)
        outcomes.append(sink.write(frame(spark, batch), checkpoint_location=ckpt, checkpoint_id=checkpoint))
        apply(model, batch)
    # The second write read the first one's file; the third reaches the same file (and the second's)
    # and reads only the second's, from memory for the first.
    assert outcomes[1].key_index_data_files_read >= 1
    assert outcomes[2].key_index_data_files_read <= 1
    assert outcomes[2].key_index_entries_loaded == 0  # nothing persisted, nothing loaded
    assert sink.metrics().key_index_data_files_read == outcomes[1].key_index_data_files_read + (
        outcomes[2].key_index_data_files_read
    )
    assert_readers_agree(java_readers, sink.load_table().metadata_location, expected(model), ["id"])

"""How the sink lays a commit's deletion vectors out in Puffin files, read back by Iceberg Java 1.9.2,
the newest Iceberg Java and DuckDB 1.5.5 (real task writers, aggregator, committer, SQLite catalog).

DuckDB's iceberg extension 1.5.5 reads each DV through its external file cache and takes the start
of the cached range that holds it, not the blob's offset within that range. Reading a blob, it
widens the read up to the next range it has cached (the Puffin footer's last 12 bytes, read before
every blob, or another blob) when that gap is no longer than the read: a large DV followed by a
smaller one and the footer swallows the smaller one, which is then read as the large one, so rows
of the smaller DV's data file come back wrong. The default layout (``iceberg-sink.deletion-vectors.files
= one-per-commit-spaced``) writes a commit's DVs to one file with zero bytes after each DV, one more
than its own size, so that no read widens over another DV; ``one-per-vector`` writes a file per DV
(nothing to swallow, a file per data file touched); ``one-per-commit`` packs them side by side as
Iceberg Java's writers do, and this test pins that DuckDB 1.5.5 misreads that layout and reads it
right with its external file cache off. Found in session 34 through an S3 test whose outcome hung on
the Spark task numbers in the data file names, which decide the order of the blobs in the file.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

from iceberg_sink.table.catalog import create_table
from tests.helpers import LosingCatalog
from tests.interop.readers import (
    JavaIcebergReader,
    assert_readers_agree,
    duckdb_read,
    duckdb_read_many,
    normalize,
)
from tests.unit.test_v3_upserts import SCHEMA, committable, committer, live_deletes, model, rows_in

pytestmark = pytest.mark.interop

Rows = list[tuple[int, str | None, str]]
FIRST: Rows = [(i, f"a{i}", "I") for i in range(3000)]
SECOND: Rows = [(i, f"b{i}", "I") for i in range(3000, 4500)]


@pytest.mark.parametrize("layout", ["one-per-commit-spaced", "one-per-vector", "one-per-commit"])
def test_a_large_dv_before_a_small_one(
    tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...], layout: str
) -> None:
    (tmp_path / "wh").mkdir()
    catalog = LosingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    properties = {"format-version": "3"}
    if layout != "one-per-commit-spaced":  # the default is not set: what a table gets without a word
        properties["iceberg-sink.deletion-vectors.files"] = layout
    create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, properties)
    c = committer(catalog)
    batches = [FIRST, SECOND]
    for n, batch in enumerate(batches):
        c.commit(committable(catalog.load_table("db.t"), n, batch))
    table = catalog.load_table("db.t")
    files = table.inspect.files()
    rows_of = dict(zip(files["file_path"].to_pylist(), files["record_count"].to_pylist(), strict=True))
    first, second = sorted(rows_of)
    # Blobs go in data file path order; the file that sorts first gets the large DV.
    leading, trailing = (FIRST, SECOND) if rows_of[first] == len(FIRST) else (SECOND, FIRST)
    large = [(k, None, "D") for k, _, _ in leading[::2]]  # every other row: a DV of thousands of bytes
    small = [(k, None, "D") for k, _, _ in trailing[:10]]
    batches.append(large + small)
    c.commit(committable(table, 2, batches[-1]))

    table = catalog.load_table("db.t")
    vectors = {v.referenced_data_file: v for v in live_deletes(table)}
    assert sorted(vectors) == [first, second]
    assert vectors[first].content_size_in_bytes > 10 * vectors[second].content_size_in_bytes  # type: ignore[operator]
    want = [{"id": k, "v": v} for k, v in sorted(model(batches).items())]
    assert rows_in(table) == model(batches)  # PyIceberg
    location = table.metadata_location
    puffins = {v.path for v in vectors.values()}
    if layout == "one-per-vector":
        assert len(puffins) == 2 and all(v.content_offset == 4 for v in vectors.values())
        assert_readers_agree(java_readers, location, want, ["id"])  # both Javas and DuckDB
        return
    if layout == "one-per-commit-spaced":
        big = vectors[first].content_size_in_bytes
        assert len(puffins) == 1 and big is not None
        assert vectors[second].content_offset == 4 + big + big + 1  # the large DV, then its gap
        assert_readers_agree(java_readers, location, want, ["id"])  # DuckDB with its file cache on
        return
    assert len(puffins) == 1
    # Right with DuckDB's external file cache turned off: the cache is what misreads.
    assert_readers_agree(java_readers, location, want, ["id"], duckdb_file_cache=False)
    got = normalize(duckdb_read(location), ["id"])
    assert got != normalize(pa.Table.from_pylist(want), ["id"]), (
        "DuckDB reads a Puffin file holding a large DV before a small one right: its cache bug is fixed "
        "in this version, so 'one-per-commit' could be the default again (docs/format-v3.md)"
    )


@pytest.mark.parametrize("layout", ["one-per-commit-spaced", "one-per-commit"])
def test_many_dvs_of_many_sizes_in_one_file(
    tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...], layout: str
) -> None:
    """Twelve data files of 8,000 rows, then one commit deleting from each a share drawn at random
    (a DV of a few bytes to 8 KB each), so one Puffin file holds twelve DVs of many sizes in
    data-file-path order. The file that sorts second to last loses every other row (the largest
    DV) and the last one row, so that side by side the large DV's read widens over the small one to
    the footer (the two-DV case above, inside a larger file). Spaced, every reader reads the model,
    DuckDB with its file cache on, three times over one file cache; side by side (the control)
    DuckDB misreads the file: a test that can fail."""
    rng = random.Random(56)
    (tmp_path / "wh").mkdir()
    catalog = LosingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    properties = {"format-version": "3", "iceberg-sink.deletion-vectors.files": layout}
    create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, properties)
    c = committer(catalog)
    batches: list[Rows] = [[(k, f"v{k}", "I") for k in range(n * 8000, (n + 1) * 8000)] for n in range(12)]
    for n, batch in enumerate(batches):
        c.commit(committable(catalog.load_table("db.t"), n, batch))
    files = catalog.load_table("db.t").inspect.files()
    first_key = {path: key for path, key in zip(files["file_path"].to_pylist(), _first_keys(files), strict=True)}
    by_path = [batches[first_key[path] // 8000] for path in sorted(first_key)]
    deletes: Rows = []
    for place, batch in enumerate(by_path):
        if place == len(by_path) - 2:
            chosen = batch[::2]
        elif place == len(by_path) - 1:
            chosen = batch[:1]
        else:
            share = rng.choice([0.001, 0.02, 0.2, 0.5])
            chosen = [row for row in batch if rng.random() < share] or batch[:1]
        deletes += [(k, None, "D") for k, _, _ in chosen]
    batches.append(deletes)
    c.commit(committable(catalog.load_table("db.t"), len(batches) - 1, deletes))
    table = catalog.load_table("db.t")
    vectors = sorted(live_deletes(table), key=lambda v: v.content_offset or 0)
    assert len(vectors) == 12 and len({v.path for v in vectors}) == 1
    sizes = [v.content_size_in_bytes or 0 for v in vectors]
    assert sizes[-2] > 20 * sizes[-1] and max(sizes) > 20 * min(sizes), sizes  # DVs of many sizes
    want = [{"id": k, "v": v} for k, v in sorted(model(batches).items())]
    assert rows_in(table) == model(batches)  # PyIceberg
    location = table.metadata_location
    expected = normalize(pa.Table.from_pylist(want), ["id"])
    if layout == "one-per-commit-spaced":
        assert_readers_agree(java_readers, location, want, ["id"])
        # One database, so its file cache holds the ranges of the reads before each read.
        for got in duckdb_read_many([location] * 3):
            assert normalize(got, ["id"]) == expected
        return
    assert_readers_agree(java_readers, location, want, ["id"], duckdb_file_cache=False)
    assert normalize(duckdb_read(location), ["id"]) != expected, (
        "DuckDB reads twelve DVs side by side right: its cache bug is fixed in this version (docs/format-v3.md)"
    )


def _first_keys(files: pa.Table) -> list[int]:
    """Each data file's smallest id, from its lower bounds (field id 1)."""
    return [int.from_bytes(dict(bounds)[1], "little", signed=True) for bounds in files["lower_bounds"].to_pylist()]

"""The SQL catalog's parsed-metadata reuse (_iceberg/metadata_cache.py): a load parses the metadata
file only when the table's metadata location moved; another writer's commit is seen by the next
load; what the sink commits is reused without a parse. Real SQLite catalogs, two processes' worth
of catalog objects on one database."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from iceberg_sink._iceberg import metadata_cache
from iceberg_sink._iceberg.commit import commit_metadata
from iceberg_sink.table.catalog import CatalogConfig

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})


def test_a_load_reuses_the_parsed_metadata_until_another_writer_moves_the_table(tmp_path: Path) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    ours = config.load()
    assert isinstance(ours, metadata_cache._CachingSqlCatalog)
    ours.create_namespace("db.x")  # a namespace with a dot: identifiers are split the same both ways
    created = ours.create_table("db.x.events", schema=ROWS.schema)
    first = ours.load_table("db.x.events")
    again = ours.load_table("db.x.events")
    assert again.metadata is first.metadata  # not parsed again
    assert again.metadata_location == created.metadata_location

    # Another writer (a plain PyIceberg catalog on the same database) commits.
    props = dict(config.properties)
    other = SqlCatalog(config.name, **{k: v for k, v in props.items() if k != "type"})
    assert type(other) is SqlCatalog
    other.load_table("db.x.events").append(ROWS)
    moved = ours.load_table("db.x.events")
    assert moved.metadata_location != first.metadata_location
    assert moved.current_snapshot() is not None and moved.metadata is not first.metadata
    assert ours.load_table("db.x.events").metadata is moved.metadata


def test_what_the_sink_commits_is_reused_without_a_parse(tmp_path: Path) -> None:
    ours = CatalogConfig.embedded(tmp_path / "lake").load()
    ours.create_namespace("db")
    table = ours.create_table("db.events", schema=ROWS.schema)
    committed = commit_metadata(table, (), ())  # an empty update: the catalog answers with the metadata
    assert ours.load_table("db.events").metadata is committed.metadata
    with table.transaction() as tx:
        tx.set_properties({"owner": "test"})
    after = commit_metadata(ours.load_table("db.events"), (), ())
    assert after.metadata.properties.get("owner") == "test"
    assert ours.load_table("db.events").metadata is after.metadata


def test_other_catalogs_are_left_alone(tmp_path: Path) -> None:
    plain = SqlCatalog("plain", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "w").as_uri())

    class Custom(SqlCatalog):
        pass

    custom = Custom("custom", uri=f"sqlite:///{tmp_path}/d.db", warehouse=(tmp_path / "w2").as_uri())
    assert type(metadata_cache.caching(custom)) is Custom
    plain.create_namespace("db")
    table = plain.create_table("db.events", schema=ROWS.schema)
    metadata_cache.remember(plain, table.name(), table.metadata_location, table.metadata)
    assert metadata_cache.lookup(plain, table.name(), table.metadata_location) is None

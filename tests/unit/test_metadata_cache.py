"""The SQL catalog's parsed-metadata reuse (_iceberg/metadata_cache.py): a load parses the metadata
file only when the table's metadata location moved; another writer's commit is seen by the next
load; what the sink commits is reused without a parse; a snapshot the sink prepared is committed as
a compare-and-swap on the location it was prepared on, without another load. Real SQLite catalogs,
two processes' worth of catalog objects on one database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, NoSuchTableError

from iceberg_sink._iceberg import metadata_cache, row_delta
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


def _snapshot_commit(table: Any, rows: pa.Table) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A real snapshot of ``rows`` prepared on ``table`` by the sink's producer (its requirements
    name the branch head)."""
    from tests.helpers import write_batches, writer_spec

    result = write_batches(writer_spec(table), rows)
    prepared = row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(result.data_files, ()), {}).prepare()
    return prepared.requirements, prepared.updates


def _v2_events_table(tmp_path: Path) -> tuple[CatalogConfig, Any, Any]:
    """An embedded catalog (its config, the caching catalog) and its new v2 table ``db.events``, loaded."""
    config = CatalogConfig.embedded(tmp_path / "lake")
    ours = config.load()
    ours.create_namespace("db")
    ours.create_table("db.events", schema=ROWS.schema, properties={"format-version": "2"})
    return config, ours, ours.load_table("db.events")


def test_a_snapshot_commit_is_a_compare_and_swap_on_the_location_it_was_prepared_on(tmp_path: Path) -> None:
    config, ours, base = _v2_events_table(tmp_path)
    requirements, updates = _snapshot_commit(base, ROWS)
    committed = commit_metadata(base, requirements, updates, on_base=True)
    assert committed.metadata_location != base.metadata_location
    assert ours.load_table("db.events").metadata_location == committed.metadata_location
    assert ours.load_table("db.events").scan().to_arrow().to_pydict() == ROWS.to_pydict()

    # Another writer moves the table after our load: ours fails as a conflict, theirs stays.
    stale = ours.load_table("db.events")
    other = SqlCatalog(config.name, **{k: v for k, v in dict(config.properties).items() if k != "type"})
    with other.load_table("db.events").transaction() as tx:
        tx.set_properties({"owner": "someone"})  # not a snapshot: PyIceberg's own commit would rebase ours
    theirs = ours.load_table("db.events").metadata_location
    requirements, updates = _snapshot_commit(stale, ROWS)
    with pytest.raises(CommitFailedException, match="updated by another process"):
        commit_metadata(stale, requirements, updates, on_base=True)
    now = ours.load_table("db.events")
    assert now.metadata_location == theirs and now.properties["owner"] == "someone"
    assert len(now.metadata.snapshots) == 1

    # Prepared again on the table as it is now, it lands; both changes are in the table.
    requirements, updates = _snapshot_commit(now, ROWS)
    commit_metadata(now, requirements, updates, on_base=True)
    final = other.load_table("db.events")
    assert final.properties["owner"] == "someone" and len(final.metadata.snapshots) == 2
    assert final.scan().to_arrow().num_rows == 2 * ROWS.num_rows


def test_a_snapshot_commit_on_another_catalog_goes_through_its_commit_table(tmp_path: Path) -> None:
    from tests.helpers import LosingCatalog

    catalog = LosingCatalog("losing", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "w").as_uri())
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=ROWS.schema, properties={"format-version": "2"})
    requirements, updates = _snapshot_commit(table, ROWS)
    assert metadata_cache.commit_on_base(table, requirements, updates) is None
    catalog.lose_next = 1  # its own commit_table runs: the commit lands and answers "unknown"
    with pytest.raises(CommitStateUnknownException):
        commit_metadata(table, requirements, updates, on_base=True)
    assert catalog.load_table("db.events").current_snapshot() is not None


# Names data can choose: quotes, SQL and URL specials, a control character, non-ASCII, a long one.
ODD_NAMES = ("o'brien; drop table iceberg_tables --", 'q"u%25?#&=', "tab\tline", "ünï ✓", "n" * 200)


@pytest.mark.parametrize("name", ODD_NAMES, ids=range(len(ODD_NAMES)))
def test_a_load_finds_what_pyiceberg_finds_and_refuses_what_it_refuses(tmp_path: Path, name: str) -> None:
    config = CatalogConfig.embedded(tmp_path / "lake")
    ours = config.load()
    plain = SqlCatalog(config.name, **{k: v for k, v in dict(config.properties).items() if k != "type"})
    ours.create_namespace("db")
    created = ours.create_table(("db", name), schema=ROWS.schema)
    assert ours.load_table(("db", name)).metadata_location == created.metadata_location
    assert ours.load_table(("db", name)).name() == plain.load_table(("db", name)).name() == ("db", name)
    # A name differing by its case, its last character or a LIKE wildcard is another table.
    for missing in (name.upper() if name.upper() != name else name + "x", name[:-1], name[:-1] + "_", "%"):
        with pytest.raises(NoSuchTableError) as theirs:
            plain.load_table(("db", missing))
        with pytest.raises(NoSuchTableError) as raised:
            ours.load_table(("db", missing))
        assert str(raised.value) == str(theirs.value) == f"Table does not exist: db.{missing}"


def test_a_load_does_not_take_a_view_for_a_table(tmp_path: Path) -> None:
    """A view row (iceberg_type VIEW, written by Iceberg Java or Rust into the same catalog table) of
    the same name is not a table, as in PyIceberg's own lookup."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import insert

    ours = CatalogConfig.embedded(tmp_path / "lake").load()
    assert isinstance(ours, metadata_cache._CachingSqlCatalog)
    ours.create_namespace("db")
    table = ours.create_table("db.events", schema=ROWS.schema)
    with ours.engine.begin() as connection:
        connection.execute(
            insert(IcebergTables).values(
                catalog_name=ours.name,
                table_namespace="db",
                table_name="view",
                metadata_location=table.metadata_location,
                iceberg_type="VIEW",
            )
        )
    with pytest.raises(NoSuchTableError, match=r"Table does not exist: db\.view"):
        ours.load_table("db.view")
    assert ours.load_table("db.events").metadata_location == table.metadata_location


def test_a_commit_on_base_writes_what_pyiceberg_would_have_written(tmp_path: Path) -> None:
    """The same metadata as PyIceberg's commit_table (its update_table_metadata, the metadata log,
    the next version's file name), written as its serializer writes it, read back equal."""
    from pyiceberg.catalog import MetastoreCatalog
    from pyiceberg.serializers import FromInputFile

    _, ours, base = _v2_events_table(tmp_path)
    requirements, updates = _snapshot_commit(base, ROWS)
    theirs = MetastoreCatalog._update_and_stage_table(ours, base, base.name(), requirements, updates)  # type: ignore[arg-type]
    committed = commit_metadata(base, requirements, updates, on_base=True)

    assert committed.metadata.model_copy(update={"last_updated_ms": 0}) == theirs.metadata.model_copy(
        update={"last_updated_ms": 0}
    )
    assert committed.metadata.metadata_log[-1].metadata_file == base.metadata_location
    version = int(Path(committed.metadata_location).name.split("-")[0])
    assert version == int(Path(base.metadata_location).name.split("-")[0]) + 1
    assert Path(committed.metadata_location).parent == Path(theirs.metadata_location).parent
    read_back = FromInputFile.table_metadata(base.io.new_input(committed.metadata_location))
    assert read_back == committed.metadata
    # The base the commit was prepared on is left as it was (nothing changed in place).
    assert base.metadata.current_snapshot_id is None and len(base.metadata.snapshots) == 0

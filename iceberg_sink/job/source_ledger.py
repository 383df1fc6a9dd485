"""One source per routed table: a routed Debezium job's record of which source each table holds.

``.debezium(...).route(table_column="source_table", ...)`` names each event's table from its source
(sources/source_names.py). The rule is injective within a database, but the ``orders`` tables of two
databases (one MySQL connector can read several) meet in one name, in one batch or in two, and a new release or another
``table_fields`` could route the sources a checkpoint wrote to new tables, silently starting them
empty beside the old ones. So each routed table's checkpoint state records the source it holds
(:meth:`CheckpointStore.record_sources`), and this module

- at start, refuses a job whose naming rule no longer names the tables its checkpoint wrote,
  naming both (:meth:`SourceLedger.check_start`); tables of a checkpoint from before sources were
  recorded are read back with the previous release's default rule when the rule is the default;
- in each batch, refuses the rows of a source another source's table already holds
  (:meth:`SourceLedger.foreign`): into the dead-letter table, or failing the batch, naming both.
"""

from __future__ import annotations

from collections.abc import Iterable

from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.config import RouteConfig
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.sources.source_names import earlier_default_source, name_of

FIX = (
    'give each source its own name with .debezium(table_fields=["db", "schema", "table"]) '
    "(docs/cdc.md, Routed table names)"
)


def qualified(name: str, namespace: str | None) -> str:
    """``name`` in the route's namespace unless it names one (job/routing.py's rule)."""
    return name if "." in name or namespace is None else f"{namespace}.{name}"


class SourceLedger:
    """The sources each routed table of one checkpoint location holds."""

    def __init__(self, location: str, route: RouteConfig) -> None:
        self._location = location
        self._route = route
        self._held: dict[str, frozenset[str]] = {}

    def _store(self, table: str) -> CheckpointStore:
        return CheckpointStore.for_table(self._location, table, create=False)

    def held(self, table: str) -> frozenset[str]:
        """The sources ``table`` holds (recorded, read once)."""
        sources = self._held.get(table)
        if sources is None:
            sources = self._held[table] = self._store(table).sources()
        return sources

    def check_start(self, tables: Iterable[str]) -> None:
        """Refuse to start when the naming rule routes a source some table of the checkpoint holds to
        another table.

        Raises:
            InvalidSinkConfigError: naming each such table, its source and the table it would go to now.
        """
        route = self._route
        moved = []
        for table in tables:
            sources = self.held(table)
            if not sources and route.table_fields is None:
                earlier = earlier_default_source(table.rpartition(".")[2])
                sources = frozenset([earlier]) if earlier is not None else frozenset()
            for source in sorted(sources):
                name = name_of(source, route.table_fields)
                if name is not None and qualified(name, route.namespace) != table:
                    moved.append(f"{table} (source {source}) would now go to {qualified(name, route.namespace)}")
        if moved:
            rule = "the default" if route.table_fields is None else f"table_fields={list(route.table_fields)!r}"
            raise InvalidSinkConfigError(
                f"checkpoint location {self._location!r} wrote tables whose sources this sink's naming rule "
                f"({rule}; sources/source_names.py) now routes to other tables: " + "; ".join(moved[:10]) + ". "
                "Starting would create those tables empty beside the ones holding the rows. To keep "
                "writing the tables the checkpoint wrote, pass the rule that named them (the release before "
                'this one named tables <db>_s_<schema>_s_<table>: .debezium(table_fields=["db", "schema", '
                '"table"]), the one before it <table>: table_fields=["table"]); to start the new names, '
                "use a new checkpoint location (and load the old tables' rows into the new ones yourself)."
            )

    def foreign(self, sources: dict[str, set[str]]) -> dict[tuple[str, str], str]:
        """The (table, source) pairs of a batch (``sources``: each table's sources in it) whose source
        is not the one the table holds, each with the reason its rows are refused. A table holding
        no source yet takes the batch's, recorded; two sources meeting in a new table are both refused."""
        refused: dict[tuple[str, str], str] = {}
        for table, batch in sources.items():
            held = self.held(table)
            if not held and len(batch) > 1:
                named = " and ".join(sorted(batch)[:5])
                for source in batch:
                    refused[(table, source)] = (
                        f"routed table name '{table}' is the name of two sources in this batch ({named}): {FIX}"
                    )
                continue
            if not held:
                self._held[table] = frozenset(batch)
                CheckpointStore.for_table(self._location, table).record_sources(frozenset(batch))
                continue
            for source in sorted(batch - held):
                refused[(table, source)] = (
                    f"routed table '{table}' holds the rows of source {sorted(held)[0]} (this checkpoint's "
                    f"record); source {source} maps to the same name: {FIX}"
                )
        return refused

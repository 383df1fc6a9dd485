"""The immutable configuration that ``IcebergSink.builder().build()`` produces."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.table.partitioning import PartitionTerm


def _freeze(value: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(dict(value).items()))


#: The format version of a table created for upserts and CDC when none is given: v3, whose deletion
#: vectors PyIceberg, DuckDB and Iceberg Java read (PyIceberg 0.12 cannot read v2's equality deletes).
CHANGES_FORMAT_VERSION = 3
#: The format version of a table created for appends when none is given: v2, which more engines read
#: and write than v3 (PyIceberg 0.12 cannot commit to a v3 table), while v3 would add only row lineage.
APPENDS_FORMAT_VERSION = 2
#: How a checkpoint's tables commit (``.atomic_commits``): see :class:`SinkConfig`.
ATOMIC_COMMIT_MODES = ("auto", "required", "off")


@attrs.frozen
class CreateOptions:
    """How to create the table when it does not exist.

    Attributes:
        partition_by: parsed partition terms.
        properties: table properties for the new table.
        format_version: Iceberg format version of the new table; None for the mode's default
            (:meth:`version_for`).
        identifier_fields: whether an upsert/CDC table gets its key as identifier fields (False:
            the key then comes from the builder on every run; see ``create_if_missing``).
    """

    partition_by: tuple[PartitionTerm, ...] = ()
    properties: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_freeze)
    format_version: int | None = None
    identifier_fields: bool = True

    def version_for(self, changes: bool) -> int:
        """The format version to create the table with: the one given, else
        :data:`CHANGES_FORMAT_VERSION` for an upsert/CDC sink (``changes``) and
        :data:`APPENDS_FORMAT_VERSION` for an append sink."""
        if self.format_version is not None:
            return self.format_version
        return CHANGES_FORMAT_VERSION if changes else APPENDS_FORMAT_VERSION


@attrs.frozen
class ChangeConfig:
    """Upsert or CDC mode.

    Attributes:
        key: the key columns (the table's identifier fields). Empty when the key comes from the
            table (its identifier fields) or, for a routed sink, from ``key_column``.
        op_column: the column holding each row's operation; None in upsert mode (every row is the
            new state of its key).
        order_by: the column ordering the changes (upsert: the rows) of one key within a checkpoint;
            None for arrival order within the source partition.
        key_column: routed sinks: the column naming each row's key columns (a string ``"a,b"`` or an
            array of names), giving each table its own key; not stored. See iceberg_sink/table/keys.py.
    """

    key: tuple[str, ...]
    op_column: str | None = None
    order_by: str | None = None
    key_column: str | None = None

    @property
    def is_upsert(self) -> bool:
        return self.op_column is None


@attrs.frozen
class RouteConfig:
    """Routing of one stream to many tables (see iceberg_sink/job/routing.py).

    Attributes:
        table_column: the input column naming each row's table (not written to the tables).
        fn: a function of a row (a :class:`pyspark.sql.Row` of every input column) returning the
            row's table name; exactly one of ``table_column`` and ``fn`` is set.
        namespace: the namespace of table names given without one; without ``allow``, the only
            namespace the route may write (table/names.py).
        allow: table names and glob patterns (``*`` within one part, ``?`` one character) of the
            tables the route may write instead of its namespace's; entries without a dot are in
            ``namespace``. A row naming another table is refused (sources/rejects.py).
        debezium_sources: the route's table column is the one ``.debezium(...)`` fills from each
            event's source: the routed job holds each table to one source and checks at start that
            the rule below still names the tables its checkpoint wrote (job/routing.py).
        table_fields: ``.debezium(table_fields=...)``, the naming rule (sources/source_names.py).
    """

    table_column: str | None = None
    fn: Callable[[Any], Any] | None = None
    namespace: str | None = None
    allow: tuple[str, ...] = ()
    debezium_sources: bool = False
    table_fields: tuple[str, ...] | None = None

    def describe(self) -> str:
        how = f"column {self.table_column!r}" if self.table_column is not None else f"function {self.fn!r}"
        return f"tables routed by {how}" + (f" (namespace {self.namespace!r})" if self.namespace else "")


@attrs.frozen
class SinkConfig:
    """Everything the sink was built with; validated by ``build()``.

    Attributes:
        catalog: the catalog to use (the embedded default when none was given).
        table: table identifier, ``namespace.name`` (empty for a routed sink: see ``route``).
        create: table creation options, or None to require an existing table.
        branch: the branch commits go to.
        distribution_mode: ``none``, ``hash``, ``range`` or None (table property, then default).
        write_options: builder-given options, already parsed.
        changes: upsert/CDC configuration, or None for append-only writes.
        pre_commit_hooks: called before each commit, in order (see topology/hooks.py).
        post_commit_hooks: called after each commit, in order.
        compaction: post-commit compaction settings (topology/compaction), or None.
        conversion: post-commit equality-delete conversion settings (topology/conversion), or None.
        map_batches: functions applied, in order, to every micro-batch before anything else
            (``.map_batches``, ``.debezium``).
        prometheus: where to serve the metrics to Prometheus (iceberg_sink/observe/prometheus.py), or None.
        route: how rows are routed to many tables, or None for a single-table sink. Each routed
            table is written with this configuration with ``table`` set to it and ``route`` None.
        dead_letter: the table refused rows go to (``.dead_letter("ns.errors")``), or None to fail
            the batch on the first refused row (see iceberg_sink/job/dead_letter.py).
        atomic_commits: how a checkpoint's tables (a routed sink's, a dead-letter table) commit
            (``.atomic_commits(...)``, job/together.py): ``"auto"`` in one catalog transaction where
            the catalog can (SQL catalogs), ``"required"`` likewise and refused at build() where it
            cannot, ``"off"`` one table at a time.
        carries_transactions: ``.debezium(transactions="consistent")``: micro-batches carry incomplete
            source transactions into the next under the checkpoint location (sources/transactions.py).
        reads_debezium: ``.debezium(...)``: a micro-batch is read as Debezium envelopes, whose
            statistics are counted in a Spark job before the batch is written.
    """

    catalog: CatalogConfig
    table: str
    create: CreateOptions | None
    branch: str
    distribution_mode: str | None
    write_options: tuple[tuple[str, Any], ...] = attrs.field(converter=_freeze)
    changes: ChangeConfig | None = None
    pre_commit_hooks: tuple[Callable[..., Any], ...] = ()
    post_commit_hooks: tuple[Callable[..., Any], ...] = ()
    compaction: Any = None
    conversion: Any = None
    map_batches: tuple[Callable[..., Any], ...] = ()
    prometheus: Any = None
    route: RouteConfig | None = None
    dead_letter: str | None = None
    atomic_commits: str = "auto"
    carries_transactions: bool = False
    reads_debezium: bool = False

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.write_options)


def change_config(
    changes: Sequence[tuple[str, Mapping[str, Any]]], routed: bool, problems: list[str]
) -> ChangeConfig | None:
    """The builder's ``upsert()``/``cdc()`` call checked (``routed``: the sink has ``.route(...)``): the
    mode, or None with each problem appended to ``problems``."""
    if not changes:
        return None
    if len(changes) > 1:
        problems.append(
            f"upsert()/cdc(): expected one of them, once; received {', '.join(m + '()' for m, _ in changes)}"
        )
        return None
    mode, args = changes[0]
    raw_key, key_column = args["key"], args["key_column"]
    key: tuple[str, ...] | None = ()
    if raw_key is not None:
        key = (raw_key,) if isinstance(raw_key, str) else tuple(raw_key) if isinstance(raw_key, Sequence) else None
        if not key or not all(isinstance(k, str) and k for k in key) or len(set(key)) != len(key):
            problems.append(f"{mode}(key): expected a non-empty list of distinct column names, received {raw_key!r}")
            return None
    assert key is not None
    if key_column is not None:
        if not isinstance(key_column, str) or not key_column or key_column in key:
            problems.append(
                f"{mode}(key_column): expected a column name that is not a key column, received {key_column!r}"
            )
            return None
        if not routed:
            problems.append(
                f"{mode}(key_column): a per-row key needs .route(...) (each routed table gets its own key); a "
                f"single-table sink's key is key=[...] or the table's identifier fields, received "
                f"key_column={key_column!r}"
            )
            return None
    order_by = args["order_by"]
    op_column = args["op_column"] if mode == "cdc" else None
    if mode == "cdc" and (
        not isinstance(op_column, str) or not op_column or op_column in key or op_column == key_column
    ):
        problems.append(
            f"cdc(op_column): expected a column name that is not a key column or the key_column, received {op_column!r}"
        )
        return None
    if order_by is not None and (not isinstance(order_by, str) or not order_by or order_by in (op_column, key_column)):
        others = "the op column and the key_column" if mode == "cdc" else "the key_column"
        problems.append(f"{mode}(order_by): expected None or a column name other than {others}, received {order_by!r}")
        return None
    return ChangeConfig(key=key, op_column=op_column, order_by=order_by, key_column=key_column)

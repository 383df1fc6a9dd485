"""``IcebergSink.builder()``: records options; ``build()`` validates them all at once."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Self, TypeVar

import attrs
from pyspark.sql import DataFrame

from iceberg_sink import options
from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink.builder import checks
from iceberg_sink.config import CreateOptions, SinkConfig, change_config
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.job.dead_letter import check_target
from iceberg_sink.observe.prometheus import (
    DEFAULT_ADDR,
    DEFAULT_MAX_TABLES,
)
from iceberg_sink.table import names
from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.table.partitioning import field_name, parse_terms
from iceberg_sink.table.schema import partition_problem
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.conversion.config import ConversionConfig
from iceberg_sink.topology.hooks import PostCommitHook, PreCommitHook
from iceberg_sink.vocab.distribution import DistributionMode

_UNSET: Any = object()


#: What ``build()`` returns: ``IcebergSink.builder()`` passes the sink's class, which lives a layer up.
SinkT = TypeVar("SinkT")


class IcebergSinkBuilder(Generic[SinkT]):
    """Fluent configuration of an :class:`IcebergSink`. Each method returns the builder.

    Args:
        make: what ``build()`` makes of the checked configuration (``IcebergSink.builder()`` passes the
            sink's class; the builder never imports the sink it builds).
    """

    def __init__(self, make: Callable[[SinkConfig], SinkT]) -> None:
        self._make = make
        self._catalog: CatalogConfig | None = None
        self._catalog_error: str | None = None
        self._embedded_root: str | None = None
        self._table: Any = _UNSET
        self._create: dict[str, Any] | None = None
        self._distribution: Any = None
        self._branch: Any = "main"
        self._write_options: dict[str, Any] = {}
        self._changes: list[tuple[str, dict[str, Any]]] = []
        self._pre_hooks: list[Any] = []
        self._compaction: dict[str, Any] | None = None
        self._conversion: dict[str, Any] | None = None
        self._post_hooks: list[Any] = []
        self._map_batches: list[Any] = []
        self._prometheus: dict[str, Any] | None = None
        self._routes: list[dict[str, Any]] = []
        self._dead_letter: Any = None
        self._atomic_commits: Any = "auto"
        self._debezium_names: tuple[str, tuple[str, ...] | None] | None = None  # (table column, table_fields)
        self._transactions = "ignore"  # .debezium(transactions=...)
        self._reads_debezium = False

    def catalog(self, name: str, **properties: Any) -> Self:
        """Use a PyIceberg catalog: ``name`` and any PyIceberg catalog properties (type, uri, ...)."""
        if not isinstance(name, str) or not name:
            self._catalog_error = f"catalog: expected a non-empty name, received {name!r}"
        else:
            self._catalog = CatalogConfig(name, {k: str(v) for k, v in properties.items()})
        return self

    def embedded(self, root: str | os.PathLike[str]) -> Self:
        """Use the embedded default catalog (SQLite + local warehouse) under ``root``."""
        self._embedded_root = os.fspath(root)
        return self

    def table(self, identifier: str) -> Self:
        """The target table, ``namespace.name``."""
        self._table = identifier
        return self

    def route(
        self,
        fn: Callable[[Any], str] | None = None,
        *,
        table_column: str | None = None,
        namespace: str | None = None,
        allow: Sequence[str] | None = None,
    ) -> Self:
        """Write one stream to many tables: each row goes to the table its route names.

        Give either ``table_column`` (a string column naming each row's table; it is not written to
        the tables) or ``fn``, a function of one row (a :class:`pyspark.sql.Row` holding every input
        column) returning the table name; it runs as an Arrow-optimized Python UDF, batched, one call
        per row. A name without a namespace (no dot) gets ``namespace``. Excludes :meth:`table`.

        The route writes only tables of ``namespace`` (not its child namespaces), or, given
        ``allow``, only the tables it lists: table names or glob patterns (``"cdc.*"``,
        ``"audit.orders_?"``; ``*`` never matches a dot), an entry without a dot being in
        ``namespace``. One of the two is required. A row naming a table outside them, or a name
        breaking the table-name rule (table/names.py: ``A-Z a-z 0-9 _ -`` per part, length limits),
        is refused with its table named (the batch fails before anything is committed).

        Each table is created when first seen (with :meth:`create_if_missing`'s settings) or checked
        like a single sink's table; each checkpoint commits one snapshot to each table it touched,
        idempotently per table. See docs/routing.md.
        """
        self._routes.append({"fn": fn, "table_column": table_column, "namespace": namespace, "allow": allow})
        return self

    def create_if_missing(
        self,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        format_version: int | None = None,
        *,
        identifier_fields: bool = True,
    ) -> Self:
        """Create the table from the DataFrame's schema when it does not exist.

        Args:
            partition_by: transforms such as ``"day(ts)"``, ``"bucket(16, user_id)"``, ``"region"``.
            properties: table properties of the new table.
            format_version: 1, 2 or 3; by default 3 for :meth:`upsert` and :meth:`cdc` (Debezium
                too), whose changes v3 commits as deletion vectors that PyIceberg, DuckDB and
                Iceberg Java read (v2's equality deletes PyIceberg cannot), and 2 for appends (read
                and written by more engines; v3 would add only row lineage). Give 2 to keep
                upserts/CDC on equality deletes; upserts, CDC and delete conversion need 2 or more
                (docs/format-v3.md).
            identifier_fields: upserts/CDC: whether the table's key columns become its identifier
                fields (the default; they are required either way). ``False`` creates the table
                without them, for tables Iceberg Java 1.6 to 1.9 must run merge-on-read ``DELETE``,
                ``UPDATE`` or ``MERGE`` on (apache/iceberg #11709: "Cannot add fieldId 1 as an
                identifier field"); the key then comes from ``.upsert/.cdc(key=[...])``, which every
                run must give, and not from the rows (``key_column``). See docs/troubleshooting.md.
        """
        self._create = {
            "partition_by": partition_by,
            "properties": dict(properties or {}),
            "format_version": format_version,
            "identifier_fields": identifier_fields,
        }
        return self

    def distribution_mode(self, mode: str) -> Self:
        """``"none"``, ``"hash"`` (by partition) or ``"range"`` (by partition and sort order)."""
        self._distribution = mode
        return self

    def branch(self, name: str) -> Self:
        """Commit to this branch (created from main's head on the first commit if missing)."""
        self._branch = name
        return self

    def write_option(self, key: str, value: Any) -> Self:
        """Set one option (see docs/options.md); overrides the table property of the same key."""
        self._write_options[key] = value
        return self

    def max_pending_checkpoints(self, limit: int) -> Self:
        """Streams: how many checkpoints may be written and kept pending while the catalog is
        unreachable, or after other writers won every attempt of their commits, before the stream
        fails (``iceberg-sink.commit.max-pending-checkpoints``)."""
        return self.write_option("iceberg-sink.commit.max-pending-checkpoints", limit)

    def schema_evolution(self, mode: str) -> Self:
        """Let the sink change the table's schema for a micro-batch that needs it (option
        ``iceberg-sink.schema-evolution``; see docs/schema-evolution.md).

        Args:
            mode: ``"off"`` (default: extra columns are a SchemaMismatchError), ``"add-columns"``
                (add the batch's new columns, optional, nested struct fields too) or
                ``"add-and-widen"`` (also widen int to long, float to double, decimal precision).
        """
        return self.write_option("iceberg-sink.schema-evolution", mode)

    def map_batches(self, fn: Callable[[DataFrame], DataFrame]) -> Self:
        """Apply ``fn`` to every micro-batch (and to ``write()``'s DataFrame) before anything else.

        For readers whose output schema is known only per batch, such as
        :func:`iceberg_sink.sources.debezium.read_envelope` and :func:`iceberg_sink.sources.readers.read_json`: the
        table is created or checked against ``fn``'s output at each batch, not when the stream starts.
        """
        self._map_batches.append(fn)
        return self

    def dead_letter(self, table: str) -> Self:
        """Write refused rows to the Iceberg table ``table`` (``namespace.name``, created when
        missing) instead of failing the batch: Kafka Connect's ``errors.tolerance=all`` with a
        dead-letter queue.

        A row is refused by a source (a Debezium event that is not JSON, a value that does not fit
        its declared type), a key or operation rule (a null key column, an unknown operation code),
        a routing rule, a ``map_batches`` function calling ``reject_where`` (sources/rejects.py),
        or the table (a null in a required column). Each refused row becomes one row of ``table``
        (reason, error class, source table, the raw value, its Kafka coordinates, the job id,
        checkpoint id and time), committed in the same checkpoint as the good rows, exactly once
        across restarts. Without it (the default) the first refused row fails the batch before
        anything is committed. See docs/dead-letter.md and iceberg_sink/job/dead_letter.py.
        """
        self._dead_letter = table
        return self

    def atomic_commits(self, mode: str = "auto") -> Self:
        """How the tables of one checkpoint commit: a routed sink's tables and the dead-letter table
        (``.dead_letter``), or a single table and its dead-letter table. See docs/transactions.md.

        ``"auto"`` (the default): in one catalog transaction where the catalog can (SQL catalogs:
        SQLite, PostgreSQL, MySQL), so a reader sees every table at the same checkpoint; one table
        at a time on catalogs without transactions (Glue, Hive, REST without transactions/commit), said once in the log and by each outcome's
        ``atomic=False``. ``"required"``: like ``"auto"``, and ``build()`` refuses a catalog that
        cannot. ``"off"``: one table at a time everywhere (each still exactly once).
        """
        self._atomic_commits = mode
        return self

    def debezium(
        self, value_column: str = "value", *, truncate: str = "fail", transactions: str = "ignore", **kwargs: Any
    ) -> Self:
        """Read each micro-batch as Debezium JSON envelopes: shorthand for
        ``.map_batches(lambda b: read_envelope(b, value_column, truncate=truncate, **kwargs))`` (see
        iceberg_sink/sources/debezium.py and docs/cdc.md). Combine with ``.cdc(op_column="op", key=[...], order_by="lsn")``.

        ``truncate``: what a truncate event (op ``t``) does: ``"fail"`` (default: refused, naming the op),
        ``"skip"`` (ignored) or ``"apply"`` (the table is emptied at that point of the change order; see
        docs/cdc.md).

        ``transactions``: ``"ignore"`` (default: events as they arrive; a source transaction may span two
        checkpoints) or ``"consistent"``: with the connector's ``provide.transaction.metadata=true`` and
        its transaction topic subscribed, every checkpoint holds whole source transactions, in commit
        order; the rest is carried under the checkpoint location into the next micro-batch
        (sources/transactions.py, docs/transactions.md).
        """
        read, names = checks.debezium_reader(value_column, truncate, transactions, kwargs)
        if names is not None:
            self._debezium_names = names
        self._transactions = transactions
        self._reads_debezium = True
        return self.map_batches(read)

    def pre_commit_hook(self, fn: PreCommitHook) -> Self:
        """Call ``fn(summary)`` on the driver before each commit (see topology/hooks.py).

        ``fn`` may return a mapping of snapshot properties to add, or raise to veto the commit (the
        checkpoint stays pending and nothing is lost). Hooks run in registration order.
        """
        self._pre_hooks.append(fn)
        return self

    def post_commit_hook(self, fn: PostCommitHook) -> Self:
        """Call ``fn(result)`` after each successful commit, in registration order.

        A failing hook is logged and counted (``sink.metrics().post_commit_hook_failures``) and never
        undoes the commit; set ``iceberg-sink.post-commit.fail-on-error`` to stop the stream on it.
        """
        self._post_hooks.append(fn)
        return self

    def compaction(
        self,
        every_n_commits: int | None = None,
        small_files_per_partition: int | None = None,
        small_files_bytes: int | None = None,
        every_seconds: float | None = None,
        background: bool = False,
        delete_files: int | None = None,
        delete_records: int | None = None,
        **planning: Any,
    ) -> Self:
        """Compact small files (and apply deletes) after commits; see topology/compaction.

        Any trigger starts a compaction: ``every_n_commits`` commits, a partition receiving more than
        ``small_files_per_partition`` small files, ``small_files_bytes`` of small files, or
        ``every_seconds`` seconds since the last one, more than ``delete_files`` live delete files or
        ``delete_records`` live delete rows on the branch. ``background=True`` runs it on a thread of the
        same SparkSession without blocking the stream. ``planning`` takes the other CompactionConfig
        fields (target_file_size_bytes, min_file_size_bytes, max_group_bytes, min_input_files,
        delete_file_threshold, max_replans).
        """
        self._compaction = {
            "every_n_commits": every_n_commits,
            "small_files_per_partition": small_files_per_partition,
            "small_files_bytes": small_files_bytes,
            "every_seconds": every_seconds,
            "delete_files": delete_files,
            "delete_records": delete_records,
            "background": background,
            **planning,
        }
        return self

    def convert_equality_deletes(
        self,
        every_n_commits: int | None = None,
        equality_delete_records: int | None = None,
        delete_files: int | None = None,
        background: bool = True,
        max_replans: int = 3,
    ) -> Self:
        """Convert the stream's equality deletes into position deletes after commits, so that full
        reads cost about what a merge-on-read table's do; see topology/conversion and docs/cdc.md.

        Any trigger starts a conversion: ``every_n_commits`` commits, more than
        ``equality_delete_records`` live equality-delete rows, or more than ``delete_files`` live
        delete files on the branch. ``background=True`` (default) runs it on a driver thread without
        blocking the stream's commits; one conversion per table runs at a time; a failure is logged
        and counted in ``sink.metrics()``, never stops the stream. Needs format version 2 or more; a
        v3 table's checkpoints commit deletion vectors, so there it converts only other writers' and
        pre-upgrade equality deletes (into deletion vectors).
        """
        self._conversion = {
            "every_n_commits": every_n_commits,
            "equality_delete_records": equality_delete_records,
            "delete_files": delete_files,
            "background": background,
            "max_replans": max_replans,
        }
        return self

    def prometheus(
        self,
        port: int = 0,
        addr: str = DEFAULT_ADDR,
        job: str | None = None,
        max_tables: int = DEFAULT_MAX_TABLES,
    ) -> Self:
        """Serve the sink's metrics to Prometheus over HTTP from ``build()`` on (docs/metrics.md).

        Args:
            port: TCP port; 0 picks a free one (read it from ``sink.prometheus_port``).
            addr: address to bind: ``"127.0.0.1"`` (default) serves this machine only; give
                ``"0.0.0.0"`` (every interface) or the host's address for a Prometheus elsewhere.
            job: value of the ``job`` label on every sample (default: the table name).
            max_tables: routed sinks: the most active tables get their own ``iceberg_sink_table_*``
                series, the others share one ``table="other"`` series (default 20).

        Needs the ``metrics`` extra (prometheus-client). ``sink.close()`` stops the endpoint.
        """
        self._prometheus = {"port": port, "addr": addr, "job": job, "max_tables": max_tables}
        return self

    def upsert(
        self, key: Sequence[str] | None = None, *, key_column: str | None = None, order_by: str | None = None
    ) -> Self:
        """Every row is the new state of its key: it replaces the row with the same key, or is inserted.

        Args:
            key: the key columns. They must include the source column of every partition field. When
                the sink creates the table they become its required identifier fields. May be omitted
                for an existing table with identifier fields (its key), and for a routed sink whose
                tables get their key from ``key_column`` or their identifier fields.
            key_column: routed sinks: a column naming each row's key columns (``"a,b"`` or an array of
                names), so each table has its own key; not stored. See iceberg_sink/table/keys.py.
            order_by: the column ordering the rows of one key within a checkpoint (an update time, a
                version, a log sequence number): the row that sorts last wins, as in :meth:`cdc`; by
                default, arrival order within the source partition. Give it when a micro-batch reads
                several files or partitions (Spark does not read a micro-batch's files in name order).
        """
        self._changes.append(("upsert", {"key": key, "key_column": key_column, "order_by": order_by}))
        return self

    def cdc(
        self,
        op_column: str,
        key: Sequence[str] | None = None,
        order_by: str | None = None,
        *,
        key_column: str | None = None,
    ) -> Self:
        """Rows carry an operation (insert, update, update-before, delete) in ``op_column``.

        Args:
            op_column: the column holding the operation code (see topology/changes.py); not stored.
            key: the key columns, as for :meth:`upsert` (which says when it may be omitted).
            order_by: the column ordering the changes of one key within a checkpoint (for example a log
                sequence number); by default, arrival order within the source partition.
            key_column: routed sinks: the column naming each row's key columns, as for :meth:`upsert`.
        """
        self._changes.append(
            ("cdc", {"op_column": op_column, "key": key, "order_by": order_by, "key_column": key_column})
        )
        return self

    def validate(self) -> None:
        """Run every check of :meth:`build` that needs neither the catalog nor Spark, and create nothing.

        ``iceberg-sink run --validate-only`` calls it, so a config it calls valid is refused by
        :meth:`build` only for what the catalog holds (a missing table, a key the table contradicts).

        Raises:
            InvalidSinkConfigError: as :meth:`build` does, naming each option that is wrong.
        """
        self._checked()

    def _checked(self) -> checks.Checked:
        """The options parsed and checked without a catalog; raises naming every problem at once."""
        problems: list[str] = []
        if self._catalog_error:
            problems.append(self._catalog_error)
        route = checks.route_config(self._routes, problems)
        if self._routes and self._table is not _UNSET:
            problems.append(
                f"table/route: a sink writes either one table (.table) or the tables its rows are routed to "
                f"(.route), not both; received .table({self._table!r}) and .route(...)"
            )
        elif self._routes:
            pass
        elif self._table is _UNSET:
            problems.append("table: required; call .table('namespace.name') (or .route(...) for many tables)")
        elif (problem := names.table_name_problem(self._table)) is not None:
            problems.append(f"table: {problem}")
        if not isinstance(self._branch, str) or not self._branch:
            problems.append(f"branch: expected a non-empty branch name, received {self._branch!r}")
        distribution = None
        if self._distribution is not None:
            allowed = [m.value for m in DistributionMode]
            if self._distribution not in allowed:
                problems.append(
                    f"distribution_mode: expected one of {', '.join(allowed)}, received {self._distribution!r}"
                )
            else:
                distribution = str(self._distribution)
        parsed_options: dict[str, Any] = {}
        try:
            parsed_options = options.validate_builder_options(self._write_options)
        except InvalidSinkConfigError as e:
            problems.append(str(e))
        create = None
        if self._create is not None:
            try:
                terms = parse_terms(list(self._create["partition_by"]))
                fv = self._create["format_version"]
                ids = self._create["identifier_fields"]
                if fv is not None and fv not in SUPPORTED_FORMAT_VERSIONS:
                    problems.append(f"create_if_missing(format_version): expected 1, 2 or 3, received {fv!r}")
                elif not isinstance(ids, bool):
                    problems.append(f"create_if_missing(identifier_fields): expected True or False, received {ids!r}")
                else:
                    create = CreateOptions(terms, self._create["properties"], fv, ids)
            except InvalidSinkConfigError as e:
                problems.append(str(e))
        for kind, hooks in (
            ("pre_commit_hook", self._pre_hooks),
            ("post_commit_hook", self._post_hooks),
            ("map_batches", self._map_batches),
        ):
            problems.extend(f"{kind}: expected a callable, received {h!r}" for h in hooks if not callable(h))
        changes = change_config(self._changes, bool(self._routes), problems)
        version = 0  # of the table create_if_missing creates (0: it creates none)
        if create is not None:  # the mode is known now: upserts/CDC default to v3, appends to v2
            version = create.version_for(changes is not None)
            create = attrs.evolve(create, format_version=version)
        compaction = None
        if self._compaction is not None:
            try:
                compaction = CompactionConfig(**self._compaction)
                if not compaction.has_trigger:
                    problems.append(
                        "compaction: expected at least one trigger (every_n_commits, small_files_per_partition, "
                        "small_files_bytes, every_seconds, delete_files or delete_records), received none"
                    )
            except TypeError as e:
                problems.append(f"compaction: {e}; see CompactionConfig for the accepted settings")
            except InvalidSinkConfigError as e:
                problems.append(str(e))
        conversion = None
        if self._conversion is not None:
            try:
                conversion = ConversionConfig(**self._conversion)
                if not conversion.has_trigger:
                    problems.append(
                        "convert_equality_deletes: expected at least one trigger (every_n_commits, "
                        "equality_delete_records or delete_files), received none"
                    )
            except InvalidSinkConfigError as e:
                problems.append(str(e))
            if create is not None and version < 2:
                problems.append(
                    "convert_equality_deletes: position deletes need format version 2; create_if_missing("
                    f"format_version) received {version}"
                )
        if changes is not None and create is not None:
            if version < 2:
                problems.append(
                    f"create_if_missing(format_version): upsert/CDC write equality deletes, which need format "
                    f"version 2; received {version}"
                )
            if not create.identifier_fields and (not changes.key or changes.key_column is not None):
                # A table without identifier fields keeps no key: only the builder can give it, every run.
                problems.append(
                    "create_if_missing(identifier_fields=False): a table created without identifier fields takes "
                    "its key from the builder on every run; expected .upsert/.cdc(key=[...]) without key_column, "
                    f"received key={list(changes.key) or None}, key_column={changes.key_column!r}"
                )
            # A key named by the rows is checked against the partitioning when its table is created.
            if changes.key and changes.key_column is None:
                try:
                    partition_problem(
                        "every routed table" if self._routes else str(self._table),
                        [(field_name(t), str(t.transform), t.column) for t in create.partition_by],
                        changes.key,
                    )
                except InvalidSinkConfigError as e:
                    problems.append(str(e))
        prometheus = checks.prometheus_config(self._prometheus, problems)
        dead_letter = None
        if self._dead_letter is not None:
            problem = check_target(self._dead_letter, self._table if isinstance(self._table, str) else "")
            if problem is not None:
                problems.append(problem)
            else:
                dead_letter = self._dead_letter.strip().strip(".")
        atomic = checks.atomic_mode(self._atomic_commits, problems)
        if problems:
            raise InvalidSinkConfigError("invalid sink configuration: " + "; ".join(problems))
        found = (route, distribution, parsed_options, create, changes, compaction, conversion, prometheus)
        return checks.Checked(*found, dead_letter, atomic)

    def build(self) -> SinkT:
        """Validate every option at once and return the sink.

        Raises:
            InvalidSinkConfigError: naming each option that is wrong, what it received and what is allowed.
        """
        checked = self._checked()
        route, distribution, parsed_options, create = (
            checked.route,
            checked.distribution,
            checked.write_options,
            checked.create,
        )
        changes, compaction, conversion, prometheus = (
            checked.changes,
            checked.compaction,
            checked.conversion,
            checked.prometheus,
        )
        dead_letter = checked.dead_letter
        catalog = self._catalog or CatalogConfig.embedded(self._embedded_root)

        def sink_config(table: str) -> SinkConfig:
            return SinkConfig(
                catalog=catalog,
                table=table,
                create=create,
                branch=self._branch,
                distribution_mode=distribution,
                write_options=parsed_options,
                changes=changes,
                pre_commit_hooks=tuple(self._pre_hooks),
                post_commit_hooks=tuple(self._post_hooks),
                compaction=compaction,
                conversion=conversion,
                map_batches=tuple(self._map_batches),
                prometheus=prometheus,
                route=route,
                dead_letter=dead_letter,
                atomic_commits=checked.atomic_commits,
                carries_transactions=self._transactions == "consistent",
                reads_debezium=self._reads_debezium,
            )

        if route is not None and self._debezium_names is not None and self._debezium_names[0] == route.table_column:
            route = attrs.evolve(route, debezium_sources=True, table_fields=self._debezium_names[1])
        if checked.atomic_commits == "required":
            checks.atomic_catalog(catalog)
        if route is not None:
            # The tables are known only from the rows; each is checked when first seen.
            return self._make(sink_config(""))
        changes = checks.against_catalog(catalog, self._table, create, parsed_options, changes)
        return self._make(sink_config(self._table))

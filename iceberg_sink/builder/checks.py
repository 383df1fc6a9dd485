"""The checks of ``IcebergSinkBuilder.build()`` that are not one option's: a route, the Prometheus
endpoint, and the table as the catalog holds it. Each appends what is wrong to ``problems`` (or
raises naming it), so ``build()`` reports every problem at once."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import DataFrame

from iceberg_sink import options
from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink.config import ATOMIC_COMMIT_MODES, ChangeConfig, CreateOptions, RouteConfig
from iceberg_sink.errors import (
    AtomicCommitsUnavailableError,
    InvalidInputError,
    InvalidSinkConfigError,
    UnsupportedTableError,
)
from iceberg_sink.observe.prometheus import PrometheusConfig, require_prometheus_client
from iceberg_sink.sources.debezium import TRUNCATE_POLICIES, read_envelope
from iceberg_sink.sources.envelope import LastCounts
from iceberg_sink.sources.event_order import order_paths
from iceberg_sink.sources.transactions import TRANSACTION_MODES, consistent_cut
from iceberg_sink.table import names
from iceberg_sink.table.catalog import CatalogConfig, commits_atomically, describe_catalog, load_table, scrub
from iceberg_sink.table.keys import resolve_key
from iceberg_sink.table.schema import check_changes_table
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.conversion.config import ConversionConfig


@attrs.frozen
class Checked:
    """What ``IcebergSinkBuilder.validate`` checked: the options parsed, before any catalog."""

    route: RouteConfig | None
    distribution: str | None
    write_options: dict[str, Any]
    create: CreateOptions | None
    changes: ChangeConfig | None
    compaction: CompactionConfig | None
    conversion: ConversionConfig | None
    prometheus: PrometheusConfig | None
    dead_letter: str | None = None
    atomic_commits: str = "auto"


def route_config(routes: Sequence[Mapping[str, Any]], problems: list[str]) -> RouteConfig | None:
    """The ``.route(...)`` calls checked: the route, or None with each problem appended to ``problems``."""
    if not routes:
        return None
    if len(routes) > 1:
        problems.append(f"route: expected one call, received {len(routes)}")
        return None
    fn, column, namespace = (routes[0][k] for k in ("fn", "table_column", "namespace"))
    if (fn is None) == (column is None):
        problems.append(
            "route: expected exactly one of fn (a function of a row) and table_column (a column name), "
            f"received fn={fn!r}, table_column={column!r}"
        )
        return None
    if fn is not None and not callable(fn):
        problems.append(f"route(fn): expected a callable returning a table name, received {fn!r}")
        return None
    if column is not None and (not isinstance(column, str) or not column):
        problems.append(f"route(table_column): expected a column name, received {column!r}")
        return None
    if namespace is not None:
        problem = names.namespace_problem(namespace.strip(".") if isinstance(namespace, str) else namespace)
        if problem is not None:
            problems.append(f"route(namespace): {problem}")
            return None
        namespace = namespace.strip(".")
    allow = routes[0]["allow"]
    if allow is not None and (isinstance(allow, str) or not all(isinstance(a, str) for a in allow) or not allow):
        problems.append(f"route(allow): expected a non-empty list of table names or glob patterns, received {allow!r}")
        return None
    allowed = tuple(allow or ())
    for entry in allowed:
        try:
            names.allow_pattern(entry, namespace)
        except InvalidSinkConfigError as e:
            problems.append(str(e))
            return None
    if namespace is None and not allowed:
        problems.append(
            "route: expected namespace= (the only namespace the route may write) or allow=[...] (the tables "
            "or patterns it may write), received neither: a routed row could otherwise name any table"
        )
        return None
    return RouteConfig(table_column=column, fn=fn, namespace=namespace, allow=allowed)


def prometheus_config(given: Mapping[str, Any] | None, problems: list[str]) -> PrometheusConfig | None:
    """The ``.prometheus(...)`` call checked, problems appended to ``problems``."""
    if given is None:
        return None
    port, addr, job = given["port"], given["addr"], given["job"]
    max_tables = given["max_tables"]
    if isinstance(max_tables, bool) or not isinstance(max_tables, int) or max_tables < 1:
        problems.append(
            f"prometheus(max_tables): expected a positive integer (tables with their own series), "
            f"received {max_tables!r}"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        problems.append(f"prometheus(port): expected an integer from 0 to 65535 (0: any free port), received {port!r}")
    if not isinstance(addr, str):
        problems.append(f"prometheus(addr): expected an address string such as '127.0.0.1', received {addr!r}")
    if job is not None and (not isinstance(job, str) or not job):
        problems.append(f"prometheus(job): expected a non-empty string or None, received {job!r}")
    try:
        require_prometheus_client()
    except InvalidSinkConfigError as e:
        problems.append(str(e))
    return PrometheusConfig(port=port, addr=addr, job=job, max_tables=max_tables)


def atomic_mode(mode: object, problems: list[str]) -> str:
    """``.atomic_commits(mode)`` checked: the mode, or ``"auto"`` with the problem appended."""
    if mode in ATOMIC_COMMIT_MODES:
        return str(mode)
    problems.append(
        f"atomic_commits: expected one of {', '.join(repr(m) for m in ATOMIC_COMMIT_MODES)}, received {mode!r}"
    )
    return "auto"


def atomic_catalog(catalog: CatalogConfig) -> None:
    """``.atomic_commits("required")``: refuse a catalog that cannot commit several tables in one transaction."""
    if not commits_atomically(catalog.load()):  # CatalogLoadError (an InvalidSinkConfigError) shows no secret
        raise AtomicCommitsUnavailableError(
            f"atomic_commits: expected a catalog that commits several tables in one transaction (a SQL catalog: "
            "SQLite, PostgreSQL, MySQL, or a REST catalog serving transactions/commit) for atomic_commits('required'), "
            "received "
            f"{describe_catalog(catalog.name, dict(catalog.properties))}, which commits one table at a time; use a "
            "SQL catalog, or atomic_commits('auto') to commit one table at a time there (docs/transactions.md)"
        )


def against_catalog(
    catalog: CatalogConfig,
    table: str,
    create: CreateOptions | None,
    parsed_options: Mapping[str, Any],
    changes: ChangeConfig | None,
) -> ChangeConfig | None:
    """The checks of ``build()`` that need the catalog: ``table`` exists or may be created, its format
    version and properties are the sink's, and its identifier fields fit the upsert/CDC mode. Returns
    the mode with its key settled (a table's identifier fields when no key was given)."""
    secret_props = dict(catalog.properties)
    loaded = catalog.load()  # CatalogLoadError (an InvalidSinkConfigError) shows no secret
    try:
        existing = load_table(loaded, table)
    except NoSuchTableError:
        existing = None
    except InvalidSinkConfigError:
        raise  # the sink's own refusal (a name or location rule), already naming the table
    except Exception as e:
        raise InvalidSinkConfigError(
            f"table {table!r}: could not be loaded from catalog {catalog.name!r}: "
            f"{type(e).__name__}: {scrub(str(e), secret_props)}"
        ) from None
    if existing is None and create is None:
        raise InvalidSinkConfigError(
            f"table {table} does not exist in catalog {catalog.name!r}; create it first or call "
            ".create_if_missing(partition_by=[...])"
        )
    if existing is not None and existing.metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise InvalidSinkConfigError(
            f"table {table} has format version {existing.metadata.format_version}; "
            f"this sink writes format versions {SUPPORTED_FORMAT_VERSIONS}"
        )
    if existing is not None:
        # Table properties must parse too; raises naming the property.
        options.resolve(parsed_options, existing.properties)
        if changes is not None:
            # No key=[...]: the table's identifier fields are the key (table/keys.py).
            key = resolve_key(
                table,
                existing,
                (),
                changes.key,
                key_column=None,
                op_column=changes.op_column,
                prefer_table=False,
            )
            if changes.op_column in key:
                raise InvalidSinkConfigError(
                    f"table {table}: its identifier fields {list(key)} include the op column "
                    f"{changes.op_column!r} given to .cdc(op_column=...)"
                )
            changes = attrs.evolve(changes, key=key)
            try:
                check_changes_table(table, existing, changes.key)
            except UnsupportedTableError as e:
                raise InvalidSinkConfigError(str(e)) from e
    elif changes is not None and not changes.key:
        raise InvalidSinkConfigError(
            f"table {table} does not exist: .cdc/.upsert need key=[...] to create it (an existing "
            "table's identifier fields would be its key)"
        )
    return changes


def debezium_reader(
    value_column: str, truncate: str, transactions: str, kwargs: Mapping[str, Any]
) -> tuple[Callable[[DataFrame], DataFrame], tuple[str, tuple[str, ...] | None] | None]:
    """``.debezium(...)`` checked now, not at the first batch (an unknown argument, an order that is not
    a path or a list, an unknown mode): the micro-batch function, and the route's table column with
    its naming rule (None when the reader names no source table).

    Raises:
        InvalidSinkConfigError: naming the argument, what was expected and what was received.
    """
    if truncate not in TRUNCATE_POLICIES:
        raise InvalidSinkConfigError(
            f"debezium(truncate=...): expected one of {TRUNCATE_POLICIES}, received {truncate!r}"
        )
    if transactions not in TRANSACTION_MODES:
        raise InvalidSinkConfigError(
            f"debezium(transactions=...): expected one of {TRANSACTION_MODES}, received {transactions!r}"
        )
    parameters = inspect.signature(read_envelope).parameters
    accepted = [
        name
        for name, parameter in parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("rejects", "last_counts")
    ]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise InvalidSinkConfigError(
            f"debezium(...): expected arguments among value_column, transactions, {', '.join(accepted)}; "
            f"received {unknown}"
        )
    try:
        order = {name: kwargs.get(name, parameters[name].default) for name in ("order_by", "order_type")}
        order_paths(order["order_by"], order["order_type"], "debezium")
    except InvalidInputError as e:
        raise InvalidSinkConfigError(str(e)) from e
    names = None
    table_column, table_fields = kwargs.get("table_column", "source_table"), kwargs.get("table_fields")
    if table_column is not None:
        fields = tuple(table_fields) if table_fields is not None and not isinstance(table_fields, str) else None
        names = (table_column, fields)
    consistent = transactions == "consistent"
    # A batch may be planned on the statistics of the one before (sources/envelope.py): not one whose
    # events were cut at transaction boundaries, whose reading carries events to later checkpoints.
    last_counts = None if consistent else LastCounts()

    def read(batch: DataFrame) -> DataFrame:
        if consistent:  # whole source transactions only; the rest carried (sources/transactions.py)
            batch = consistent_cut(batch, value_column)
        # Marked, not failed here: the job fails the batch on a refused event or dead-letters it.
        return read_envelope(batch, value_column, truncate=truncate, rejects="mark", last_counts=last_counts, **kwargs)

    return read, names

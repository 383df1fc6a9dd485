"""Binding one sink job to its table: create or check it, evolve its schema, settle its key.

    input struct ─▶ TableBinding.ensure ─▶ (create | check + evolve) ─▶ Table ─▶ writer_spec

A :class:`TableBinding` is the table side of one job (job/pipeline.py): it loads the table, creates
it when configured to, records a routed table's UUID so a table dropped and re-created by someone
else is refused, resolves the key an upsert/CDC micro-batch is written with (table/keys.py), takes a
routed table's own columns (table/carried.py), checks the input against the table and commits the
schema change the input needs (table/evolution.py) before any file is written with it. It knows
nothing of checkpoints or commits and never calls back into the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

import attrs
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql.types import StructType

from iceberg_sink import options
from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.config import SinkConfig
from iceberg_sink.errors import (
    InvalidSinkConfigError,
    SchemaMismatchError,
    UncommittableCheckpointError,
    UnsupportedTableError,
)
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table import evolution, names
from iceberg_sink.table.carried import project as project_carried
from iceberg_sink.table.keys import resolve_key
from iceberg_sink.table.partitioning import build_spec, field_name
from iceberg_sink.table.schema import (
    check_changes_table,
    check_compatible,
    check_key_columns,
    checked_key,
    partition_problem,
    spark_to_iceberg,
)
from iceberg_sink.vocab.columns import OP_COLUMN
from iceberg_sink.vocab.distribution import DistributionMode
from iceberg_sink.writer.spec import WriterSpec

logger = logging.getLogger("iceberg_sink")


class NoRowsNoTable(Exception):
    """The table does not exist and the batch has no row to create it for: nothing to do."""


class TableBinding:
    """The table of one job: what it is now, and whether a given input may be written to it.

    ``config`` is the job's configuration with the key this micro-batch is written with (a routed
    table's key may come from its rows or identifier fields: :meth:`use_key` updates it).
    """

    def __init__(
        self,
        config: SinkConfig,
        catalog: Catalog,
        store: CheckpointStore,
        retry: RetryPolicy,
        evolution_mode: str,
        pin_table_uuid: bool = False,
        loaded: Table | None = None,
    ) -> None:
        self.config = config
        self._catalog = catalog
        self._store = store
        self._retry = retry
        self._evolution = evolution_mode
        # Routed tables (routing.py): the table's UUID is recorded in the store on first use and a
        # table dropped or re-created by someone else since is refused instead of written anew.
        self._pin_table_uuid = pin_table_uuid
        self._checked_schemas: set[tuple[str, int]] = set()
        # The builder's key; a routed table's key may come from its rows or identifier fields instead.
        self._default_key = config.changes.key if config.changes is not None else ()
        #: The table as this job loaded it last (None before the first load).
        self.table: Table | None = None
        # ``loaded``: the table as the job building this binding just loaded it. The first ensure()
        # uses it instead of loading the table again, unless a refresh() came first (a routed
        # checkpoint builds a table's job right before ensuring it: one catalog load, not two).
        self._handed = loaded
        #: Set when this binding's schema evolution changed the table (cleared by the job).
        self.schema_changed = False
        #: A null in a required column is refused per row (a dead-letter table takes it) instead of
        #: by the schema check (set by the job).
        self.required_nulls_per_row = False
        #: Set when :meth:`use_key` changed the key (the job drops what it derived from the old one).
        self.key_changed = False
        #: Whether the micro-batch being written holds no row for this table, at most truncates (set
        #: by the job, asked only when the input does not fit the table: such a batch may have no row
        #: columns, and has no row to check).
        self.no_rows: Callable[[], bool] | None = None

    @property
    def name(self) -> str:
        return self.config.table

    def refresh(self) -> Table:
        self._handed = None
        table = catalogs.load_table(self._catalog, self.config.table)
        if table is None:
            raise InvalidSinkConfigError(f"table {self.config.table} does not exist (was it dropped?)")
        self.table = table
        return table

    def ensure(
        self,
        struct: StructType,
        carried: Collection[str | tuple[str, ...]] | None = None,
        named_keys: Collection[tuple[str, ...]] = (),
    ) -> Table:
        """Create or check the table for input ``struct``, evolving its schema if configured.

        ``carried`` (routed tables): the columns and nested field paths of ``struct`` holding a value
        in at least one of the table's rows; only those, the table's own and the sink's
        key/op/order/partition columns are the table's input (see :meth:`own_columns`).
        ``named_keys`` (routed tables): the keys its rows name in the sink's key column (see
        :meth:`use_key`)."""
        names.check_columns(self.config.table, struct)  # before anything is created or evolved
        table, self._handed = self._handed, None
        if table is None:
            table = catalogs.load_table(self._catalog, self.config.table)
        self.use_key(table, named_keys)
        struct = self.own_columns(struct, table, carried)
        if table is None and self._pin_table_uuid and self._store.table_uuid() is not None:
            raise UncommittableCheckpointError(self._store.replaced_message(self.config.table, "no longer exists"))
        if table is None:
            try:
                table = self._create(struct)
            except SchemaMismatchError:
                # A batch without rows (a Debezium batch of message events and tombstones) may lack
                # the columns to create the table from: there is nothing to create it for.
                if self.no_rows is not None and self.no_rows():
                    raise NoRowsNoTable(self.config.table) from None
                raise
        if table.metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedTableError(
                f"table {self.config.table} has format version {table.metadata.format_version}; "
                f"this sink writes format versions {SUPPORTED_FORMAT_VERSIONS}"
            )
        if self._pin_table_uuid:
            self._store.pin_table_uuid(self.config.table, str(table.metadata.table_uuid))
        table = self.check_input(table, struct)
        self.table = table
        return table

    def _create(self, struct: StructType) -> Table:
        create = self.config.create
        if create is None:
            raise InvalidSinkConfigError(
                f"table {self.config.table} does not exist; create it or call .create_if_missing() on the builder"
            )
        schema = self._create_schema(struct)
        if self.config.changes is not None:  # before creating: a key named by the rows is checked here
            partition_problem(
                self.config.table,
                [(field_name(t), str(t.transform), t.column) for t in create.partition_by],
                self.config.changes.key,
            )
        spec = build_spec(create.partition_by, schema)
        version = create.version_for(self.config.changes is not None)  # unset: the mode's (config.py)
        props = {"format-version": str(version), **dict(create.properties)}
        props.setdefault(options.PARQUET_COMPRESSION.key, options.PARQUET_COMPRESSION.default)
        table = catalogs.create_table(self._catalog, self.config.table, schema, spec, props)
        logger.info("created table %s (partitioned by %s)", self.config.table, spec)
        return table

    # -- the key of an upsert/CDC table (table/keys.py) ------------------------------------------

    @property
    def key(self) -> tuple[str, ...]:
        """The key the current micro-batch is written with (empty for appends)."""
        return self.config.changes.key if self.config.changes is not None else ()

    def use_key(self, table: Table | None, named_keys: Collection[tuple[str, ...]] = ()) -> None:
        """Settle the key this micro-batch is written with: the key the rows name (routed tables),
        else the table's identifier fields (routed tables, or no key given), else the builder's."""
        changes = self.config.changes
        if changes is None:
            return
        key = resolve_key(
            self.config.table,
            table,
            named_keys,
            self._default_key,
            key_column=changes.key_column,
            op_column=changes.op_column,
            prefer_table=self._pin_table_uuid or not self._default_key,
        )
        if key != changes.key:
            self.config = attrs.evolve(self.config, changes=attrs.evolve(changes, key=key))
            self.key_changed = True
            self._checked_schemas.clear()  # the key's columns are checked with the schema

    # -- routed tables: the input columns of one table (routing.py) ----------------------------

    def own_columns(
        self, struct: StructType, table: Table | None, carried: Collection[str | tuple[str, ...]] | None
    ) -> StructType:
        """The columns of ``struct`` that are this table's input: all of them (``carried`` None), or
        for a routed table those on ``carried`` paths (non-null in at least one of its rows of the
        batch, down into structs: table/carried.py), those the table has, and the key, op, order and
        partition source columns. So a column or nested field of another routed table, null in every
        row of this one, is neither created nor added by schema evolution here (it is added once a
        row of this table carries a value).

        Without schema evolution a table is created with all of ``struct``: it could never get a
        column later, so a column its first rows happen to leave null (deletes) must be there."""
        if carried is None or (table is None and self._evolution == evolution.OFF):
            return struct
        named: list[str] = []
        changes = self.config.changes
        if changes is not None:
            named += [c for c in (*changes.key, changes.op_column, changes.order_by) if c is not None]
        if self.config.create is not None:
            named += [term.column for term in self.config.create.partition_by]
        required = [p for c in named for p in ((c,), tuple(c.split(".")))]
        return project_carried(struct, carried, table.schema().fields if table is not None else (), required)

    # -- the input against the table, and schema evolution (table/evolution.py) -----------------

    def check_input(self, table: Table, struct: StructType) -> Table:
        """Check ``struct`` against ``table``; returns the table, with its schema evolved if needed."""
        changes = self.config.changes
        if changes is not None:
            check_changes_table(self.config.table, table, changes.key)
        # Keyed by the table's schema id too: another writer renaming or dropping a column must
        # bring the check (and schema evolution) back, or the column's values would be dropped.
        key = checked_key(struct, table)
        if key not in self._checked_schemas:
            runtime_checked = changes.key if changes is not None else ()
            if self.required_nulls_per_row:
                runtime_checked = (*runtime_checked, *(f.name for f in table.schema().fields if f.required))
            try:
                table = self._check(table, struct, runtime_checked)
            except SchemaMismatchError:
                if self.no_rows is not None and self.no_rows():
                    return table  # not remembered as checked: the next batch with rows is checked
                raise
            self._checked_schemas.update({key, checked_key(struct, table)})
        return table

    def _check(self, table: Table, struct: StructType, runtime_checked: tuple[str, ...]) -> Table:
        """Evolve the schema if configured, then check ``struct`` against it; returns the table."""
        # Committed before this batch's files are written.
        if self._evolution != evolution.OFF:
            before = table.schema().schema_id
            table = evolution.evolve(
                self.config.table,
                table,
                self._table_columns(struct),
                self._evolution,
                load_table=self.refresh,
                retry=self._retry,
                runtime_checked=runtime_checked,
            )
            self.schema_changed = self.schema_changed or table.schema().schema_id != before
        check_compatible(self.config.table, table.schema(), self._table_columns(struct), runtime_checked)
        return table

    def _table_columns(self, struct: StructType) -> StructType:
        """The part of the input stored in the table (the op column of CDC input is not)."""
        changes = self.config.changes
        if changes is None or changes.op_column is None:
            return struct
        names = [f.name for f in struct.fields]
        if changes.op_column not in names:
            raise SchemaMismatchError(
                self.config.table,
                [
                    f"{changes.op_column}: the operation column given to .cdc(op_column=...) is missing from the DataFrame"
                ],
            )
        return StructType([f for f in struct.fields if f.name != changes.op_column])

    def _create_schema(self, struct: StructType) -> Schema:
        changes = self.config.changes
        if changes is None:
            return spark_to_iceberg(struct, table_name=self.config.table)
        table_struct = self._table_columns(struct)
        schema = spark_to_iceberg(table_struct, required=changes.key, table_name=self.config.table)
        missing = [k for k in changes.key if k not in schema.column_names]
        if missing:
            raise SchemaMismatchError(
                self.config.table, [f"{k}: key column is missing from the DataFrame" for k in missing]
            )
        # Before the table is created: a key Iceberg forbids (float, under an optional struct) is refused.
        check_key_columns(self.config.table, schema, changes.key)
        # Key columns become the table's identifier fields (required), whatever Spark says of nulls;
        # without identifier fields (create_if_missing(identifier_fields=False)) they stay required
        # and the builder's key is the key (table/keys.py).
        create = self.config.create
        if create is not None and not create.identifier_fields:
            return schema
        ids = [schema.find_field(k).field_id for k in changes.key]
        try:
            return Schema(*schema.fields, identifier_field_ids=ids)
        except ValueError as e:  # PyIceberg's own identifier-field rules (e.g. a nullable nested key)
            raise InvalidSinkConfigError(f"upsert/CDC key {list(changes.key)} of table {self.config.table}: {e}") from e

    # -- how the writers write to it ------------------------------------------------------------

    def distribution_mode(self, table: Table, resolved: options.ResolvedOptions) -> DistributionMode:
        if self.config.distribution_mode:
            return DistributionMode(self.config.distribution_mode)
        configured = resolved.get(options.DISTRIBUTION_MODE)
        if configured:
            return DistributionMode(configured)
        # For upserts/CDC the reduction already shuffled rows by key; clustering by partition on top
        # keeps one file per partition and writer.
        return DistributionMode.HASH if table.spec().fields else DistributionMode.NONE

    def writer_spec(self, table: Table, job_id: str, checkpoint_id: int, proof: Any = None) -> WriterSpec:
        """What a writer task needs to write ``checkpoint_id`` into ``table`` (no catalog, no state)."""
        resolved = options.resolve(self.config.options, table.properties)
        props: dict[str, Any] = {**table.properties, **resolved.writer_properties()}
        return WriterSpec(
            table_name=self.config.table,
            location=table.location(),
            schema_json=table.schema().model_dump_json(),
            spec_json=table.spec().model_dump_json(),
            io_properties=catalogs.file_io_properties(table.io.properties),
            writer_properties=props,
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            target_file_size=resolved.get(options.TARGET_FILE_SIZE_BYTES),
            buffer_bytes=resolved.get(options.WRITER_BUFFER_BYTES),
            max_open_files=resolved.get(options.WRITER_MAX_OPEN_FILES),
            row_group_limit=resolved.get(options.PARQUET_ROW_GROUP_LIMIT),
            compression=resolved.get(options.PARQUET_COMPRESSION),
            compression_level=resolved.get(options.PARQUET_COMPRESSION_LEVEL),
            equality_field_ids=self.equality_ids(table),
            op_column=OP_COLUMN if self.config.changes is not None else None,
            new_key_proof=proof,
        )

    def equality_ids(self, table: Table) -> tuple[int, ...]:
        if self.config.changes is None:
            return ()
        return tuple(table.schema().find_field(k).field_id for k in self.config.changes.key)

"""The immutable configuration that ``IcebergSink.builder().build()`` produces."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.table.partitioning import PartitionTerm


def _freeze(value: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(dict(value).items()))


@attrs.frozen
class CreateOptions:
    """How to create the table when it does not exist.

    Attributes:
        partition_by: parsed partition terms.
        properties: table properties for the new table.
        format_version: Iceberg format version of the new table.
    """

    partition_by: tuple[PartitionTerm, ...] = ()
    properties: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_freeze)
    format_version: int = 2


@attrs.frozen
class ChangeConfig:
    """Upsert or CDC mode.

    Attributes:
        key: the key columns (the table's identifier fields).
        op_column: the column holding each row's operation; None in upsert mode (every row is the
            new state of its key).
        order_by: the column ordering the changes of one key within a checkpoint; None for arrival
            order within the source partition.
    """

    key: tuple[str, ...]
    op_column: str | None = None
    order_by: str | None = None

    @property
    def is_upsert(self) -> bool:
        return self.op_column is None


@attrs.frozen
class SinkConfig:
    """Everything the sink was built with; validated by ``build()``.

    Attributes:
        catalog: the catalog to use (the embedded default when none was given).
        table: table identifier, ``namespace.name``.
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
        prometheus: where to serve the metrics to Prometheus (iceberg_sink/prometheus.py), or None.
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

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.write_options)

    def read_batch(self, df: Any) -> Any:
        """``df`` after the ``map_batches`` functions (the DataFrame the sink writes)."""
        for fn in self.map_batches:
            df = fn(df)
        return df

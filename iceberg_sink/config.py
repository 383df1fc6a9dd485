"""The immutable configuration that ``IcebergSink.builder().build()`` produces."""

from __future__ import annotations

from collections.abc import Mapping
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
class SinkConfig:
    """Everything the sink was built with; validated by ``build()``.

    Attributes:
        catalog: the catalog to use (the embedded default when none was given).
        table: table identifier, ``namespace.name``.
        create: table creation options, or None to require an existing table.
        branch: the branch commits go to.
        distribution_mode: ``none``, ``hash``, ``range`` or None (table property, then default).
        write_options: builder-given options, already parsed.
    """

    catalog: CatalogConfig
    table: str
    create: CreateOptions | None
    branch: str
    distribution_mode: str | None
    write_options: tuple[tuple[str, Any], ...] = attrs.field(converter=_freeze)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.write_options)

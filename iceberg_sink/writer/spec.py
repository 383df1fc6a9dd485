"""The picklable description of a write that travels to Spark tasks.

No catalog, table object or connection is shipped: only the table's schema, partition spec and
location as JSON, the FileIO properties, and the resolved writer options. Each task opens its own
FileIO from these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property

import attrs
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.locations import LocationProvider, load_location_provider

from iceberg_sink.options import WRITER_MAX_OPEN_FILES
from iceberg_sink.table.key_bounds import KeyBounds


def _frozen_dict(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    # Pairs too: attrs.evolve passes the converted (tuple) form of the fields it keeps.
    return tuple(sorted((str(k), str(v)) for k, v in dict(value).items()))


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen(cache_hash=True)
class WriterSpec:
    """Everything a writer task needs to write files for one checkpoint.

    Attributes:
        table_name: for error messages only.
        location: the table's base location.
        schema_json: the table schema (Iceberg JSON).
        spec_json: the default partition spec (Iceberg JSON).
        io_properties: FileIO properties (may hold credentials: never logged).
        writer_properties: resolved options and table properties that steer the writer.
        job_id: the sink's job id; part of every file name.
        checkpoint_id: the checkpoint (micro-batch) id; part of every file name.
        target_file_size: roll files at about this many bytes.
        buffer_bytes: flush a file's buffered rows at about this many bytes.
        row_group_limit: max rows per Parquet row group.
        compression: Parquet codec name; compression_level: -1 for default.
        equality_field_ids: key field ids in upsert/CDC modes (empty for appends).
        op_column: the normalised operation column in upsert/CDC modes ("I", "U", "D"; "T" marks a truncate).
        new_key_proof: the table's key bounds when the checkpoint began (see table/key_bounds.py):
            the equality deletes of rows whose key is outside them go to conditional delete files,
            committed only if the proof fails at commit. None: every delete is unconditional.
        max_open_files: files a task keeps open at once; past it the least recently used one is
            closed (see TaskWriter), which bounds a task's memory however many partitions it sees.
    """

    table_name: str
    location: str
    schema_json: str
    spec_json: str
    io_properties: tuple[tuple[str, str], ...] = attrs.field(converter=_frozen_dict, repr=False)
    writer_properties: tuple[tuple[str, str], ...] = attrs.field(converter=_frozen_dict)
    job_id: str
    checkpoint_id: int
    target_file_size: int
    buffer_bytes: int
    row_group_limit: int
    compression: str
    compression_level: int
    equality_field_ids: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    op_column: str | None = None
    new_key_proof: KeyBounds | None = None
    max_open_files: int = WRITER_MAX_OPEN_FILES.default

    @cached_property
    def schema(self) -> Schema:
        return Schema.model_validate_json(self.schema_json)

    @cached_property
    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec.model_validate_json(self.spec_json)

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.writer_properties)

    def file_io(self) -> FileIO:
        return load_file_io(dict(self.io_properties), self.location)

    def location_provider(self) -> LocationProvider:
        return load_location_provider(self.location, self.properties)

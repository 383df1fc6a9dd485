"""The writer that runs inside one Spark task.

It receives Arrow batches, routes each row to the file of its Iceberg partition (fanout: several
partitions may be open at once), buffers rows per file and flushes them as Parquet row groups, rolls
a file when it reaches the target size, and on completion returns a :class:`WriteResult` listing
every file with its column metrics.

Memory is bounded by the number of open files, not by how many rows or partitions a task sees: at
most ``spec.max_open_files`` Parquet files are open, and opening one more first closes the one
whose partition was least recently written to (its rows so far become a complete data file; a later
flush of that partition starts a new file). Each open file costs its output stream's buffer and
Parquet writer state. Rows waiting for their first flush only cost their buffer, and all buffered
rows together stay under ``_TOTAL_BUFFER_FACTOR`` x ``spec.buffer_bytes`` plus one incoming batch
(docs/benchmarks-memory.md measures this). It holds no state beyond the task: if the task fails, the files
it wrote are deleted (best effort) and never reach the driver; leftovers are orphan files that no
snapshot references.
"""

from __future__ import annotations

import enum
import logging
import math
import struct
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table.locations import LocationProvider
from pyiceberg.types import PrimitiveType

from iceberg_sink import options
from iceberg_sink._iceberg import files
from iceberg_sink._iceberg.encoding import dictionary_columns
from iceberg_sink._iceberg.metrics import ColumnValueStats, parquet_metrics
from iceberg_sink.vocab.columns import TRUNCATE_OP
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from iceberg_sink.writer.conform import conform_batch, write_defaults
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec

logger = logging.getLogger(__name__)

# Flush the largest open file's buffer when all buffers together pass this many times the
# per-file buffer: bounds memory when one task sees many partitions.
_TOTAL_BUFFER_FACTOR = 4
# What one buffered slice costs beyond its Arrow buffers, per column (C++ array objects and Python
# wrappers, about 750 bytes measured with pyarrow 26): counted in buffered_bytes, so that many tiny
# slices (a batch spread over many partitions) cannot hide their size from the bounds above.
_SLICE_OVERHEAD_PER_COLUMN = 1024
# A writer's run of this many small slices (below _SMALL_SLICE_BYTES on average) is combined into one.
_SLICES_TO_COMBINE = 16
_SMALL_SLICE_BYTES = 64 * 1024


def _bound_scalar(value: Any, arrow_type: pa.DataType) -> pa.Scalar | None:
    """An Arrow scalar of ``arrow_type`` for a bound in Iceberg's internal representation."""
    try:
        if pa.types.is_date32(arrow_type) and isinstance(value, int):
            return pa.scalar(value, pa.int32()).cast(arrow_type)
        if (pa.types.is_timestamp(arrow_type) or pa.types.is_time64(arrow_type)) and isinstance(value, int):
            return pa.scalar(value, pa.int64()).cast(arrow_type)
        return pa.scalar(value, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        return None  # a type the proof does not handle: that column proves nothing


class RollingParquetWriter:
    """Writes the rows of one partition, rolling to a new file at the target size."""

    def __init__(
        self,
        spec: WriterSpec,
        io: FileIO,
        schema: Schema,
        new_path: Callable[[], str],
        partition: tuple[Any, ...],
        content: FileContent = FileContent.DATA,
        equality_ids: tuple[int, ...] | None = None,
        before_open: Callable[[], None] = lambda: None,
    ) -> None:
        self._spec = spec
        self._io = io
        self._iceberg_schema = schema
        self._schema = files.arrow_schema(schema)
        self._new_path = new_path
        self._partition = partition
        self._content = content
        self._equality_ids = equality_ids
        self._before_open = before_open
        self._buffer: list[pa.Table] = []
        self._uncombined = 0  # slices at the end of _buffer not combined yet
        self.buffered_bytes = 0
        self._path: str | None = None
        self._stream: Any = None
        self._writer: pq.ParquetWriter | None = None
        self._values = ColumnValueStats(schema, spec.properties)
        self.completed: list[DataFileMeta] = []

    def write(self, table: pa.Table) -> None:
        overhead = _SLICE_OVERHEAD_PER_COLUMN * table.num_columns
        self._buffer.append(table)
        self.buffered_bytes += table.nbytes + overhead
        self._uncombined += 1
        if self.buffered_bytes >= self._spec.buffer_bytes:
            self.flush()
        elif self._uncombined >= _SLICES_TO_COMBINE:
            self._combine_tail(overhead)

    def _combine_tail(self, overhead: int) -> None:
        """Copy a run of tiny slices into one table: their per-slice objects outweigh the copy."""
        tail = self._buffer[-self._uncombined :]
        size = sum(t.nbytes for t in tail)
        if size < _SMALL_SLICE_BYTES * len(tail):
            combined = pa.concat_tables(tail).combine_chunks()
            self._buffer[-self._uncombined :] = [combined]
            self.buffered_bytes += combined.nbytes - size - overhead * (len(tail) - 1)
        self._uncombined = 0

    def flush(self) -> None:
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        self._buffer = []
        self._uncombined = 0
        self.buffered_bytes = 0
        if self._writer is None:
            self._open(table)
        assert self._writer is not None
        # Bounds come from the values themselves, not the footer (see _iceberg/metrics.py).
        self._values.update(table)
        self._writer.write_table(table, row_group_size=self._spec.row_group_limit)
        if self._stream.tell() >= self._spec.target_file_size:
            self._close_file()

    @property
    def is_open(self) -> bool:
        """Whether a Parquet file is open (it holds an output stream and writer state)."""
        return self._writer is not None

    def _open(self, first: pa.Table) -> None:
        self._before_open()
        self._path = self._new_path()
        self._stream = self._io.new_output(self._path).create(overwrite=False)
        codec = self._spec.compression
        self._writer = pq.ParquetWriter(
            cast(IO[Any], self._stream),
            schema=self._schema,
            compression=options.parquet_codec(codec),
            compression_level=None if self._spec.compression_level < 0 else self._spec.compression_level,
            store_decimal_as_integer=True,
            write_statistics=True,
            use_dictionary=dictionary_columns(first),
        )
        self._values = ColumnValueStats(self._iceberg_schema, self._spec.properties)

    def _close_file(self) -> None:
        assert self._writer is not None and self._path is not None
        self._writer.close()
        metadata = self._writer.writer.metadata  # type: ignore[attr-defined]
        size = self._stream.tell()
        self._stream.close()
        metrics = parquet_metrics(metadata, self._iceberg_schema, self._spec.properties)
        self.completed.append(
            DataFileMeta(
                content=self._content,
                path=self._path,
                spec_id=self._spec.partition_spec.spec_id,
                partition=self._partition,
                record_count=metadata.num_rows,
                file_size_in_bytes=size,
                column_sizes=metrics["column_sizes"],
                value_counts=metrics["value_counts"],
                null_value_counts=metrics["null_value_counts"],
                nan_value_counts=self._values.nan_value_counts(),
                lower_bounds=self._values.lower_bounds(),
                upper_bounds=self._values.upper_bounds(),
                split_offsets=metrics["split_offsets"],
                equality_ids=self._equality_ids,
            )
        )
        self._writer = None
        self._stream = None
        self._path = None

    def close(self) -> list[DataFileMeta]:
        self.flush()
        if self._writer is not None:
            self._close_file()
        return self.completed

    def abort(self) -> None:
        """Close without recording; the caller deletes the files its ``new_path`` named."""
        try:
            if self._writer is not None:
                self._writer.close()
            if self._stream is not None:
                self._stream.close()
        except Exception:
            logger.debug("ignoring error while aborting writer", exc_info=True)


def _sign_bit(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Whether each float's sign bit is set (true for -0.0, which compares equal to 0.0)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    bits = values.view(pa.int64() if values.type.bit_width == 64 else pa.int32())
    return pc.less(bits, 0)


def _slot(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A dict key for partition values: -0.0 and 0.0 differ, and every NaN is the same."""
    return tuple(
        ("float", "nan" if math.isnan(v) else struct.pack(">d", v)) if isinstance(v, float) else v for v in values
    )


class _Output(enum.Enum):
    """Where a row goes: a data file, an equality delete file, or a conditional one."""

    DATA = "data"
    DELETES = "deletes"
    # Equality deletes of keys the new-key proof says no existing row has. They are only committed
    # if the proof fails at commit time (another writer added rows since), so they never get lost.
    CONDITIONAL_DELETES = "conditional-deletes"


class TaskWriter:
    """Partitioned (fanout) writer for one task and one checkpoint.

    In upsert/CDC modes (``spec.op_column`` set) each incoming row is the last change of its key in
    this checkpoint (see topology/changes.py): every row adds an equality delete of its key, and
    rows that are not deletes add their new image as a data row. The delete of a key that
    ``spec.new_key_proof`` proves new goes to a separate conditional delete file (key columns
    only), which the committer adds to the snapshot only if the proof no longer holds.
    """

    def __init__(self, spec: WriterSpec, task_id: int, attempt_id: int) -> None:
        self._spec = spec
        self._task_id = task_id
        self._attempt_id = attempt_id
        self._io = spec.file_io()
        self._locations: LocationProvider = spec.location_provider()
        self._schema = spec.schema
        self._partition_spec = spec.partition_spec
        self._arrow_schema = files.arrow_schema(self._schema)
        self._defaults = write_defaults(self._schema)
        # Live writers (an open file, buffered rows or both), least recently written to first.
        # Writers closed early leave their files in _written.
        self._writers: OrderedDict[tuple[_Output, tuple[Any, ...]], RollingParquetWriter] = OrderedDict()
        self._written: dict[_Output, list[DataFileMeta]] = {output: [] for output in _Output}
        self._created_paths: list[str] = []  # every file this attempt created, for abort
        self.peak_open_files = 0
        self.evicted_files = 0  # files closed early to stay within spec.max_open_files
        # Called before each file opens, after the writer made room for it within its own limit:
        # a multi-table writer (writer/multi.py) makes room within the task's limit across tables.
        self.before_open: Callable[[], None] | None = None
        self._transforms = [
            (f, self._schema.find_field(f.source_id), self._schema.find_column_name(f.source_id))
            for f in self._partition_spec.fields
        ]
        self._equality_ids = tuple(spec.equality_field_ids)
        self._delete_schema: Schema | None = None
        self._delete_input_schema: pa.Schema | None = None
        if self._equality_ids:
            key_names = [self._schema.find_column_name(i) for i in self._equality_ids]
            self._delete_schema = self._schema.select(*[n for n in key_names if n is not None])
            # The columns a delete row needs: the key, and the sources of partition fields (to find
            # the partition the delete applies to).
            needed = {n.split(".")[0] for n in key_names if n} | {n.split(".")[0] for _, _, n in self._transforms if n}
            self._delete_input_schema = pa.schema(
                [
                    f if f.name in {k.split(".")[0] for k in key_names if k} else f.with_nullable(True)
                    for f in self._arrow_schema
                    if f.name in needed
                ]
            )
        self._skipped_deletes = 0
        self._truncated = False
        self._file_seq = 0
        # One random component per task attempt: retries and restarts never reuse a name.
        self._attempt_uuid = uuid.uuid4().hex[:12]

    def _new_path(self, key: files.PartitionPath | None, output: _Output) -> str:
        self._file_seq += 1
        kind = {_Output.DATA: "", _Output.DELETES: "-eq-deletes", _Output.CONDITIONAL_DELETES: "-cond-eq-deletes"}[
            output
        ]
        name = (
            f"{self._task_id:05d}-{self._attempt_id}-{self._spec.job_id}-{self._spec.checkpoint_id:06d}-"
            f"{self._attempt_uuid}-{self._file_seq:05d}{kind}.parquet"
        )
        # Delete files go outside the partition folders (``data/<name>``; Iceberg names every file by
        # its full path, so any folder is valid). DuckDB (1.5.5) reads a folder's ``key=value`` as a
        # column of an equality delete file, decoded as Hive does, not as Iceberg (and Java) encode
        # it: ``p=a+b`` gave 'a+b' for the value 'a b', so DuckDB applied none of those deletes.
        folder = key if output is _Output.DATA else None
        path = self._locations.new_data_location(data_file_name=name, partition_key=folder)  # type: ignore[arg-type]
        self._created_paths.append(path)
        return path

    @property
    def open_files(self) -> int:
        """Parquet files open now."""
        return sum(1 for writer in self._writers.values() if writer.is_open)

    def _make_room(self) -> None:
        """Called before a writer opens a file: close the least recently used open one if at the limit."""
        open_now = self.open_files
        if open_now >= self._spec.max_open_files:
            key = next(k for k, w in self._writers.items() if w.is_open)
            self._close(key)
            self.evicted_files += 1
            open_now -= 1
        self.peak_open_files = max(self.peak_open_files, open_now + 1)
        if self.before_open is not None:
            self.before_open()

    def _writer_for(self, output: _Output, values: tuple[Any, ...]) -> RollingParquetWriter:
        slot = (output, _slot(values))
        writer = self._writers.get(slot)
        if writer is not None:
            self._writers.move_to_end(slot)
        else:
            partition = files.partition_values(self._partition_spec, self._schema, values)
            key = files.PartitionPath(self._partition_spec, self._schema, partition) if partition else None
            deletes = output != _Output.DATA
            schema = self._delete_schema if deletes and self._delete_schema is not None else self._schema
            writer = RollingParquetWriter(
                self._spec,
                self._io,
                schema,
                lambda: self._new_path(key, output),
                partition,
                content=FileContent.EQUALITY_DELETES if deletes else FileContent.DATA,
                equality_ids=self._equality_ids if deletes else None,
                before_open=self._make_room,
            )
            self._writers[slot] = writer
        return writer

    def _close(self, key: tuple[_Output, tuple[Any, ...]]) -> None:
        """Complete the files of one writer and forget it; the partition's next row starts a new one."""
        # Closed before it leaves _writers, so that abort() still closes it if closing fails.
        self._written[key[0]].extend(self._writers[key].close())
        del self._writers[key]

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        op_column = self._spec.op_column
        if op_column is None:
            self._write_rows(_Output.DATA, conform_batch(batch, self._arrow_schema, self._defaults))
        else:
            ops = batch.column(op_column)
            truncate = pc.fill_null(pc.equal(ops, TRUNCATE_OP), False)
            if pc.any(truncate).as_py():
                # The truncate marker is no row: the committable records it (committer/committer.py).
                self._truncated = True
                batch = batch.filter(pc.invert(truncate))
                ops = batch.column(op_column)
                if batch.num_rows == 0:
                    return
            assert self._delete_input_schema is not None and self._delete_schema is not None
            # Every row's key is deleted first (an equality delete only removes rows of earlier
            # checkpoints), then the rows that are not deletes are inserted.
            deletes = conform_batch(batch, self._delete_input_schema, self._defaults)
            key_names = self._delete_schema.column_names
            new = self._provably_new(deletes)
            if new is not None:
                # A key outside the table's key bounds matched no row when the checkpoint began, so
                # its delete is only needed if another writer adds the key before our commit: the
                # committer decides. Deletes (``D``) of such keys go the same way, never dropped.
                new = pc.fill_null(new, False)
                conditional = deletes.filter(new)
                if conditional.num_rows:
                    self._skipped_deletes += conditional.num_rows
                    self._write_rows(_Output.CONDITIONAL_DELETES, conditional, project=key_names)
                deletes = deletes.filter(pc.invert(new))
            if deletes.num_rows:
                self._write_rows(_Output.DELETES, deletes, project=key_names)
            inserts = batch.filter(pc.not_equal(ops, "D"))
            if inserts.num_rows:
                self._write_rows(_Output.DATA, conform_batch(inserts, self._arrow_schema, self._defaults))
        self._bound_memory()

    def _provably_new(self, rows: pa.Table) -> pa.ChunkedArray | pa.Array | None:
        """True for rows whose key no existing row can have; None when nothing can be proven."""
        proof = self._spec.new_key_proof
        if proof is None:
            return None
        if proof.empty:
            return pa.array([True] * rows.num_rows, pa.bool_())
        mask = None
        for field_id, lower, upper in proof.fields:
            name = self._schema.find_column_name(field_id)
            if lower is None or upper is None or name is None or name not in rows.column_names:
                continue
            column = rows.column(name)
            field_type = self._schema.find_field(field_id).field_type
            if not isinstance(field_type, PrimitiveType):
                continue
            lo = _bound_scalar(from_bytes(field_type, lower), column.type)
            hi = _bound_scalar(from_bytes(field_type, upper), column.type)
            if lo is None or hi is None:
                continue
            outside = pc.or_(pc.less(column, lo), pc.greater(column, hi))
            mask = outside if mask is None else pc.or_(mask, outside)
        return mask

    def _write_rows(self, output: _Output, table: pa.Table, project: list[str] | None = None) -> None:
        for values, rows in self._split(table):
            self._writer_for(output, values).write(rows.select(project) if project is not None else rows)

    def _split(self, table: pa.Table) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
        if not self._transforms:
            yield (), table
            return
        keys = {}
        for i, (field, source, name) in enumerate(self._transforms):
            assert name is not None
            column = files.column_by_path(table, name)
            keys[f"p{i}"] = field.transform.pyarrow_transform(source.field_type)(column)
        values_names = list(keys)
        for name in values_names:
            if pa.types.is_floating(keys[name].type):
                # Arrow groups -0.0 with 0.0, but they are distinct partitions (as in Iceberg Java).
                keys[f"{name}_sign"] = _sign_bit(keys[name])
        names = list(keys)
        keys["__row"] = pa.array(range(table.num_rows), pa.int64())
        groups = pa.table(keys).group_by(names, use_threads=False).aggregate([("__row", "list")])
        group_keys = [groups.column(n).to_pylist() for n in values_names]
        for g, rows in enumerate(groups.column("__row_list").to_pylist()):
            values = tuple(column[g] for column in group_keys)
            yield values, table.take(pa.array(rows, pa.int64())) if len(rows) != table.num_rows else table

    @property
    def buffered_bytes(self) -> int:
        """Bytes of rows buffered and not yet flushed to a file."""
        return sum(w.buffered_bytes for w in self._writers.values())

    def flush_largest(self) -> None:
        """Flush the writer holding the most buffered rows (a multi-table writer bounds memory so)."""
        if self._writers:
            max(self._writers.values(), key=lambda w: w.buffered_bytes).flush()

    def close_oldest_file(self) -> bool:
        """Close the least recently written open file (its rows so far become a complete file).

        Returns:
            False when no file is open.
        """
        key = next((k for k, w in self._writers.items() if w.is_open), None)
        if key is None:
            return False
        self._close(key)
        self.evicted_files += 1
        return True

    def _bound_memory(self) -> None:
        # Summed again after each flush: opening a file may close another, which flushes it too.
        while sum(w.buffered_bytes for w in self._writers.values()) > self._spec.buffer_bytes * _TOTAL_BUFFER_FACTOR:
            max(self._writers.values(), key=lambda w: w.buffered_bytes).flush()

    def complete(self) -> WriteResult:
        while self._writers:
            # One at a time: a writer that only buffered rows opens its file here, within the limit.
            self._close(next(iter(self._writers)))
        written = self._written
        return WriteResult(
            data_files=tuple(written[_Output.DATA]),
            delete_files=tuple(written[_Output.DELETES]),
            task_id=self._task_id,
            attempt_id=self._attempt_id,
            skipped_deletes=self._skipped_deletes,
            truncated=self._truncated,
            conditional_delete_files=tuple(written[_Output.CONDITIONAL_DELETES]),
        )

    def abort(self) -> None:
        """Close the open files and delete every file this attempt created, closed ones included."""
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()
        for path in self._created_paths:
            try:
                self._io.delete(path)
            except Exception:
                logger.warning("could not delete %s after a failed write", path)

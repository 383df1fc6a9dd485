"""The writer of a routed sink's Spark task: one stream, many tables, in one write pass.

Each row carries its target table in a route column. The task groups each incoming Arrow batch by
that column and hands each group to the :class:`TaskWriter` of its table, which fans out by partition
as for a single table; so one Spark job writes every table of a micro-batch, however many there are.

Memory stays bounded with many tables: the limits a single-table writer keeps per task hold across
all the tables of the task. At most ``max_open_files`` Parquet files are open at once (past it the
least recently written table closes its oldest file), and the buffered rows of all tables together
stay under ``_TOTAL_BUFFER_FACTOR`` x ``buffer_bytes`` (the largest buffer is flushed first). A table
whose rows are few never opens a file before :meth:`MultiTableTaskWriter.complete`, which closes each
table's files before opening the next table's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from iceberg_sink.table.carried import ELEMENT, VALUE, FieldTree, Path, display, table_tree
from iceberg_sink.writer.conform import list_elements
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import _TOTAL_BUFFER_FACTOR, TaskWriter

#: Marks a row routed to a table the driver did not plan for (the input changed between two reads).
UNPLANNED_TABLE = "iceberg_sink routed row to an unplanned table:"
#: Marks a value in a column the driver found null in all of a table's rows (and left out of it).
UNPLANNED_COLUMN = "iceberg_sink routed value in an unplanned column:"


def split_by_column(batch: pa.RecordBatch | pa.Table, column: str) -> Iterator[tuple[str | None, pa.Table]]:
    """The rows of ``batch`` grouped by the value of ``column`` (in value order, nulls last); each
    group keeps its rows' order. Arrow kernels only: no per-row Python work."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    if table.num_rows == 0:
        return
    values = table.column(column).combine_chunks()
    first = values[0].as_py()
    if first is not None and values.null_count == 0 and pc.all(pc.equal(values, first)).as_py():
        yield first, table  # the usual case: hash distribution sends one table's rows to a task
        return
    grouped = table.take(pc.sort_indices(values))  # a stable sort
    runs = pc.run_end_encode(grouped.column(column).combine_chunks())
    start = 0
    for name, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
        yield name, grouped.slice(start, end - start)
        start = end


def _inside(t: pa.DataType) -> tuple[str, pa.DataType] | None:
    """The segment and type of a list's element struct or a map's value struct (None: not such)."""
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type):
        return (ELEMENT, t.value_type) if t.value_type.num_fields else None
    if pa.types.is_map(t) and pa.types.is_struct(t.item_type):
        return (VALUE, t.item_type) if t.item_type.num_fields else None
    return None


def _covers(own: FieldTree, name: str, arrow_type: pa.DataType) -> bool:
    """Whether ``own`` has field ``name`` and every field below it that ``arrow_type`` has."""
    if name not in own:
        return False
    inner = own[name]
    if not inner:  # a leaf of the table (check_compatible judged its type)
        return True
    if pa.types.is_struct(arrow_type):
        return all(_covers(inner, f.name, f.type) for f in arrow_type)
    inside = _inside(arrow_type)
    return inside is None or _covers(inner, *inside)


def _values_outside(
    array: pa.Array, name: str, own: FieldTree, valid: pa.Array | None, path: Path = ()
) -> Iterator[Path]:
    """The paths of ``array`` (field ``name`` of a struct whose fields are ``own``, under the rows
    ``valid`` where its enclosing structs are set; None: every row) that hold a value in a field the
    table lacks. As the driver counts them (table/carried.py): a value is a non-null leaf whose
    enclosing structs (and list or map) are all set."""
    path = (*path, name)
    if name not in own:
        if _holds_value(array, valid):
            yield path
        return
    inner = own[name]
    if not inner:
        return  # a leaf the table has: conform.py casts it
    set_here = array.is_valid() if valid is None else pc.and_(valid, array.is_valid())
    if pa.types.is_struct(array.type):
        for i in range(array.type.num_fields):
            child = pc.struct_field(array, [i])  # without the parent's nulls: set_here has them
            yield from _values_outside(child, array.type.field(i).name, inner, set_here, path)
        return
    inside = _inside(array.type)
    if inside is not None:
        elements, elements_set = list_elements(array, set_here)
        yield from _values_outside(elements, inside[0], inner, elements_set, path)


def _holds_value(array: pa.Array, valid: pa.Array | None) -> bool:
    """Whether a leaf of ``array`` (through structs, lists and maps of structs) is set in a row of
    ``valid`` (None: any row)."""
    set_here = array.is_valid() if valid is None else pc.and_(valid, array.is_valid())
    if pa.types.is_struct(array.type) and array.type.num_fields:
        return any(_holds_value(pc.struct_field(array, [i]), set_here) for i in range(array.type.num_fields))
    if _inside(array.type) is not None:
        return _holds_value(*list_elements(array, set_here))
    return bool(pc.any(set_here).as_py())


class MultiTableTaskWriter:
    """The writers of every table one task receives rows for, within shared memory limits."""

    def __init__(
        self,
        specs: Mapping[str, WriterSpec],
        route_column: str,
        task_id: int,
        attempt_id: int,
        max_open_files: int,
        buffer_bytes: int,
    ) -> None:
        self._specs = specs
        self._route_column = route_column
        self._task_id = task_id
        self._attempt_id = attempt_id
        self._max_open_files = max_open_files
        self._buffer_bytes = buffer_bytes
        # Least recently written table first.
        self._writers: OrderedDict[str, TaskWriter] = OrderedDict()
        self._columns: dict[str, FieldTree] = {}  # per table: the fields it may be given values in
        self.peak_open_files = 0
        # Each table's buffered bytes and their sum, refreshed for the tables a write, flush or file
        # eviction changed: summing every table's buffers after every write made a task's work grow
        # with the square of its tables (500 tables and 250,000 rows a task: 6.6 s, now 3.0 s).
        self._buffered: dict[str, int] = {}
        self._buffered_total = 0
        self._evicted: set[str] = set()
        # The tables that may hold an open file, least recently written first: the open-file limit is
        # kept by looking at these (at most about max_open_files), not at every table of the task.
        self._open_tables: OrderedDict[str, None] = OrderedDict()

    @property
    def open_files(self) -> int:
        return sum(w.open_files for w in self._writers.values())

    def _writer(self, table: str | None) -> TaskWriter:
        name = table or ""
        writer = self._writers.get(name)
        if writer is not None:
            self._writers.move_to_end(name)
            if name in self._open_tables:
                self._open_tables.move_to_end(name)
            return writer
        spec = self._specs.get(table or "")
        if spec is None:
            raise ValueError(
                f"{UNPLANNED_TABLE} {table!r}: the driver planned {len(self._specs)} tables for this checkpoint "
                "from the same input; is the routing function deterministic?"
            )
        writer = TaskWriter(spec, task_id=self._task_id, attempt_id=self._attempt_id)
        writer.before_open = lambda: self._make_room(name)
        self._writers[name] = writer
        return writer

    def _make_room(self, opening: str) -> None:
        """Called before table ``opening``'s writer opens a file: keep the task within ``max_open_files``."""
        # Forget the tables whose files all closed (completed at their target size or evicted).
        for name in [n for n in self._open_tables if not self._writers[n].open_files]:
            del self._open_tables[name]
        open_now = sum(self._writers[n].open_files for n in self._open_tables)
        while open_now >= self._max_open_files:
            # The least recently written table that has a file open closes its oldest one.
            name = next(n for n in self._open_tables if self._writers[n].open_files)
            self._writers[name].close_oldest_file()  # which flushes that table's rows buffered for the file
            self._evicted.add(name)
            open_now -= 1
        self._open_tables[opening] = None
        self._open_tables.move_to_end(opening)
        self.peak_open_files = max(self.peak_open_files, open_now + 1)

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        for table, rows in split_by_column(batch, self._route_column):
            writer = self._writer(table)
            self._check_left_out(table, rows)
            writer.write(rows)
            self._refresh(table or "")
            self._bound()

    def _check_left_out(self, table: str | None, rows: pa.Table) -> None:
        """The input columns and nested struct fields a table's schema lacks were null in all of its
        rows when the driver planned it (routing.carried_columns, table/carried.py): they are left
        out, never a value dropped."""
        own = self._columns.get(table or "")
        if own is None:
            spec = self._specs[table or ""]
            own = table_tree(spec.schema.fields)
            for name in (self._route_column, spec.op_column):
                if name is not None:
                    own[name] = {}  # a leaf: route and op columns are the writer's, never checked
            self._columns[table or ""] = own
        for name, field in zip(rows.column_names, rows.schema, strict=True):
            if _covers(own, name, field.type):
                continue  # the table has every field of the column: nothing to look at
            for path in _values_outside(rows.column(name).combine_chunks(), name, own, None):
                raise ValueError(
                    f"{UNPLANNED_COLUMN} {display(path)!r} of table {table!r} holds values, but the driver found it null in "
                    "all of the table's rows of this checkpoint and left it out of the table; is the input "
                    "deterministic?"
                )

    def _refresh(self, table: str) -> None:
        """Re-read the buffered bytes of ``table`` and of the tables whose files were closed since."""
        for name in {table, *self._evicted}:
            size = self._writers[name].buffered_bytes
            self._buffered_total += size - self._buffered.get(name, 0)
            self._buffered[name] = size
        self._evicted.clear()

    def _bound(self) -> None:
        limit = self._buffer_bytes * _TOTAL_BUFFER_FACTOR
        while self._buffered_total > limit:
            # A flush may open a file: _make_room keeps that within the open-file limit.
            largest = max(self._buffered, key=self._buffered.__getitem__)
            self._writers[largest].flush_largest()
            self._refresh(largest)

    def complete(self) -> dict[str, WriteResult]:
        """Close every table's files, one table at a time; the results of tables that wrote files."""
        results = {}
        for table, writer in self._writers.items():
            result = writer.complete()
            if not result.is_empty:
                results[table] = result
        return results

    def abort(self) -> None:
        """Delete every file this task attempt created, for every table."""
        for writer in self._writers.values():
            writer.abort()

"""Position delete files (format v2): writing file-scoped ones and reading their rows.

A position delete file holds ``(file_path, pos)`` rows (reserved field ids 2147483546 and
2147483545), sorted by path then position, as the spec requires. The files written here name one
data file each and carry exact (``full`` mode) lower and upper bounds for both columns, as Iceberg
Java's ``MetricsConfig.forPositionDelete`` does: a reader sees ``lower(file_path) ==
upper(file_path)`` and knows the file is *file-scoped* (Java's ``ContentFileUtil.referencedDataFile``),
so it applies it to that data file alone instead of to every file of its partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from iceberg_sink.writer.result import DataFileMeta, FileContent

FILE_PATH_ID = 2147483546
POS_ID = 2147483545

_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)


def referenced_data_file(meta: DataFileMeta) -> str | None:
    """The one data file a position delete file names, when its bounds say so; else None."""
    if meta.content != FileContent.POSITION_DELETES:
        return None
    lower = dict(meta.lower_bounds).get(FILE_PATH_ID)
    upper = dict(meta.upper_bounds).get(FILE_PATH_ID)
    if lower is None or lower != upper:
        return None
    return lower.decode("utf-8")


def read_positions(io: FileIO, path: str, data_path: str) -> pa.Array:
    """The positions (int64) that the position delete file at ``path`` deletes in ``data_path``."""
    with io.new_input(path).open(seekable=True) as stream:
        table = pq.read_table(stream, columns=["file_path", "pos"])
    mask = pc.equal(table.column("file_path"), data_path)
    return table.column("pos").filter(mask).combine_chunks().cast(pa.int64())


def write_position_deletes(
    io: FileIO,
    path: str,
    data_file: DataFileMeta,
    positions: Iterable[pa.Array],
    compression: str = "zstd",
) -> DataFileMeta:
    """Write the file-scoped position delete file ``path`` deleting ``positions`` of ``data_file``.

    Positions are deduplicated and sorted; the file takes the data file's spec and partition (a
    position delete applies only within them). Raises ValueError when there is no position.
    """
    arrays = [p.cast(pa.int64()) for p in positions]
    merged = pa.concat_arrays(arrays) if arrays else pa.array([], pa.int64())
    unique = pc.unique(merged)
    pos = pc.take(unique, pc.sort_indices(unique))
    if not len(pos):
        raise ValueError(f"no position to delete in {data_file.path}")
    paths = pa.array([data_file.path], pa.string()).take(np.zeros(len(pos), np.int32))  # no Python list
    rows = pa.table([paths, pos], schema=_SCHEMA)
    stream = io.new_output(path).create(overwrite=False)
    try:
        writer = pq.ParquetWriter(cast(IO[Any], stream), schema=_SCHEMA, compression=compression)
        writer.write_table(rows)
        writer.close()
        metadata = writer.writer.metadata  # type: ignore[attr-defined]
        size = stream.tell()
    finally:
        stream.close()
    column_sizes = {FILE_PATH_ID: 0, POS_ID: 0}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c, field_id in enumerate((FILE_PATH_ID, POS_ID)):
            column_sizes[field_id] += group.column(c).total_compressed_size
    path_bound = data_file.path.encode("utf-8")
    return DataFileMeta(
        content=FileContent.POSITION_DELETES,
        path=path,
        spec_id=data_file.spec_id,
        partition=data_file.partition,
        record_count=len(pos),
        file_size_in_bytes=size,
        column_sizes=column_sizes,
        value_counts={FILE_PATH_ID: len(pos), POS_ID: len(pos)},
        null_value_counts={FILE_PATH_ID: 0, POS_ID: 0},
        lower_bounds={FILE_PATH_ID: path_bound, POS_ID: int(pos[0].as_py()).to_bytes(8, "little", signed=True)},
        upper_bounds={FILE_PATH_ID: path_bound, POS_ID: int(pos[-1].as_py()).to_bytes(8, "little", signed=True)},
    )

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

from iceberg_sink._arrays import distinct
from iceberg_sink.vocab.files import DataFileMeta, FileContent

FILE_PATH_ID = 2147483546
POS_ID = 2147483545

_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)
_DICTIONARY_SCHEMA = _SCHEMA.set(0, _SCHEMA.field(0).with_type(pa.dictionary(pa.int32(), pa.string())))


def referenced_data_file(meta: DataFileMeta) -> str | None:
    """The one data file a position delete file names: a deletion vector's ``referenced_data_file``,
    or a position delete file's when its bounds say so; else None."""
    if meta.content != FileContent.POSITION_DELETES:
        return None
    if meta.referenced_data_file is not None:
        return meta.referenced_data_file
    lower = dict(meta.lower_bounds).get(FILE_PATH_ID)
    upper = dict(meta.upper_bounds).get(FILE_PATH_ID)
    if lower is None or lower != upper:
        return None
    return lower.decode("utf-8")


def read_positions(io: FileIO, path: str, data_path: str) -> pa.Array:
    """The positions (int64) that the position delete file at ``path`` deletes in ``data_path``.

    The paths are read as a dictionary (a file names few data files, each on many rows) and matched
    once per distinct path: a file-scoped file of 30,000 positions read in 2 ms, against 5 with the
    paths read as strings and 8-15 through ``pq.read_table`` (the files of a checkpoint's data files
    are read again after every restart)."""
    with io.new_input(path).open(seekable=True) as stream:
        table = pq.ParquetFile(stream, read_dictionary=["file_path"]).read(columns=["file_path", "pos"])
    paths, pos = table.column("file_path"), table.column("pos")
    masks = []
    for chunk in paths.chunks:
        named = pc.equal(chunk.dictionary, pa.scalar(data_path, chunk.dictionary.type))
        masks.append(pc.take(named, chunk.indices))
    return pos.filter(pa.chunked_array(masks, pa.bool_())).combine_chunks().cast(pa.int64())


def sorted_positions(positions: Iterable[pa.Array | np.ndarray]) -> np.ndarray:
    """``positions`` merged, deduplicated and sorted, as int64.

    A stable sort merges already sorted runs (a data file's earlier positions and the new ones) in
    linear time; input that is already sorted and distinct is returned as is.
    """
    arrays = [np.asarray(p.cast(pa.int64()) if isinstance(p, pa.Array) else p, dtype=np.int64) for p in positions]
    merged = arrays[0] if len(arrays) == 1 else np.concatenate(arrays) if arrays else np.empty(0, np.int64)
    if len(merged) > 1 and not bool(np.all(merged[1:] > merged[:-1])):
        merged = distinct(merged, kind="stable")
    return merged


def write_position_deletes(
    io: FileIO,
    path: str,
    data_file: DataFileMeta,
    positions: Iterable[pa.Array | np.ndarray],
    compression: str = "zstd",
) -> DataFileMeta:
    """Write the file-scoped position delete file ``path`` deleting ``positions`` of ``data_file``.

    Positions are deduplicated and sorted; the file takes the data file's spec and partition (a
    position delete applies only within them). Raises ValueError when there is no position.
    """
    pos = sorted_positions(positions)
    if not len(pos):
        raise ValueError(f"no position to delete in {data_file.path}")
    # The one path, dictionary-encoded in memory too (not a copy per row); the file's column is a
    # plain string column (no Arrow schema is stored), as every other writer's.
    paths = pa.DictionaryArray.from_arrays(np.zeros(len(pos), np.int32), pa.array([data_file.path], pa.string()))
    rows = pa.table([paths, pa.array(pos)], schema=_DICTIONARY_SCHEMA)
    stream = io.new_output(path).create(overwrite=False)
    try:
        # The writers' one dictionary rule (_iceberg/encoding.py), whose outcome here is known: the
        # one path gets a dictionary once it repeats, the positions (distinct: a dictionary of n
        # distinct values and their indices outweigh n plain values) are written plain. Weighing
        # them hashed up to 20,000 positions per file, 15 % of a conversion's writes
        # (tests/unit/test_conversion_units.py checks the outcome against the rule).
        writer = pq.ParquetWriter(
            cast(IO[Any], stream),
            schema=_DICTIONARY_SCHEMA,
            compression=compression,
            store_schema=False,
            use_dictionary=["file_path"] if len(pos) > 1 else [],
        )
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
        lower_bounds={FILE_PATH_ID: path_bound, POS_ID: int(pos[0]).to_bytes(8, "little", signed=True)},
        upper_bounds={FILE_PATH_ID: path_bound, POS_ID: int(pos[-1]).to_bytes(8, "little", signed=True)},
    )

"""The live deletion vectors of a format v3 snapshot, by the data file each one references.

PyIceberg 0.12 reads delete manifests with its v2 schema, which has no ``referenced_data_file``,
``content_offset`` or ``content_size_in_bytes`` (fields 143-145): a DV then looks like a
partition-wide position delete file whose blob cannot be found. Rewrites of v3 tables read the delete
manifests here, with the v3 schema (``lineage.read_entries``). One Puffin file may hold the DVs of
many data files, each its own manifest entry, so a DV is named by its Puffin path *and* its data file.
"""

from __future__ import annotations

import attrs
import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION, read_entries, read_manifests
from iceberg_sink._iceberg.manifests import V3_DATA_FILE_FIELDS

_REFERENCED_DATA_FILE = 17
"""Position of ``referenced_data_file`` (field 143) in a v3 ``data_file`` record; ``content_offset``
and ``content_size_in_bytes`` follow."""


def is_deletion_vector(data_file: DataFile) -> bool:
    """Whether ``data_file`` (a delete manifest's entry) is a DV: a Puffin position delete."""
    return str(data_file.file_format.value).upper() == "PUFFIN"


def vector_target(data_file: DataFile) -> str | None:
    """The data file a DV (a v3-shaped record) references; None for anything else."""
    if not is_deletion_vector(data_file) or len(data_file) != V3_DATA_FILE_FIELDS:
        return None
    target = data_file[_REFERENCED_DATA_FILE]
    return str(target) if target is not None else None


@attrs.frozen
class VectorRef:
    """Where one live DV's blob is, and how many positions it holds."""

    path: str
    content_offset: int
    content_size_in_bytes: int
    cardinality: int

    def read(self, io: FileIO) -> np.ndarray:
        """The deleted positions this DV holds (its blob checked against ``cardinality``)."""
        return read_deletion_vector(io, self.path, self.content_offset, self.content_size_in_bytes, self.cardinality)

    def to_json(self) -> list[object]:
        return [self.path, self.content_offset, self.content_size_in_bytes, self.cardinality]

    @classmethod
    def from_json(cls, value: list[object]) -> VectorRef:
        path, offset, size, cardinality = value
        return cls(str(path), int(str(offset)), int(str(size)), int(str(cardinality)))


def live_vectors(io: FileIO, snapshot: Snapshot) -> dict[str, VectorRef]:
    """Each data file with a live DV in v3 ``snapshot`` -> that DV (the spec allows at most one).

    Raises:
        ValueError: a DV without its blob location, or two DVs for one data file.
    """
    result: dict[str, VectorRef] = {}
    for manifest in read_manifests(io, snapshot, ROW_LINEAGE_FORMAT_VERSION):
        if manifest.content != ManifestContent.DELETES:
            continue
        for entry in read_entries(io, manifest):
            data_file = entry.data_file
            if not is_deletion_vector(data_file):
                continue
            target = vector_target(data_file)
            offset, size = data_file[_REFERENCED_DATA_FILE + 1], data_file[_REFERENCED_DATA_FILE + 2]
            if target is None or offset is None or size is None:
                raise ValueError(
                    f"deletion vector in {data_file.file_path}: expected referenced_data_file, content_offset and "
                    "content_size_in_bytes, received none"
                )
            if target in result:
                raise ValueError(f"data file {target} has two live deletion vectors; expected at most one (the spec)")
            result[target] = VectorRef(data_file.file_path, int(offset), int(size), int(data_file.record_count))
    return result

"""The one rule for which delete file applies to which data file (Iceberg spec, "Scan Planning").

Used by everything that reasons about deletes: compaction planning, rewriting and removability,
and the new-key proof. A delete file applies to a data file when

- it is an *equality* delete with a strictly higher data sequence number than the data file, and
  either its partition spec is unpartitioned (a *global* delete: it applies to every partition of
  every spec) or it has the data file's spec id and partition;
- it is a *position* delete with a data sequence number at least the data file's, and the same spec
  id and partition (or a global spec); it then removes only rows of the file it names.
"""

from __future__ import annotations

from collections.abc import Collection

from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.writer.result import FileContent


def is_global(delete: LiveFile, unpartitioned_spec_ids: Collection[int]) -> bool:
    """Whether ``delete`` was written under a spec without partition fields (applies everywhere)."""
    return delete.meta.spec_id in unpartitioned_spec_ids


def applies(delete: LiveFile, data: LiveFile, unpartitioned_spec_ids: Collection[int] = ()) -> bool:
    """Whether ``delete`` removes rows of ``data`` (see the module docstring)."""
    if delete.meta.content == FileContent.EQUALITY_DELETES:
        if delete.data_sequence_number <= data.data_sequence_number:
            return False
    elif delete.data_sequence_number < data.data_sequence_number:
        return False
    if is_global(delete, unpartitioned_spec_ids):
        return True
    return delete.meta.spec_id == data.meta.spec_id and delete.meta.partition == data.meta.partition

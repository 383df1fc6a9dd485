"""The one rule for which delete file applies to which data file (Iceberg spec, "Scan Planning").

Used by everything that reasons about deletes: compaction planning, rewriting and removability.
A delete file applies to a data file when

- it is an *equality* delete with a strictly higher data sequence number than the data file, and
  either its partition spec is unpartitioned (a *global* delete: it applies to every partition of
  every spec) or it has the data file's spec id and partition;
- it is a *position* delete with a data sequence number at least the data file's, and the same spec
  id and partition; it then removes only rows of the file it names. Position deletes are never
  global, even under an unpartitioned spec (the spec says so, and Iceberg Java's DeleteFileIndex
  only indexes equality deletes as global).

A spec is unpartitioned when it has no fields or only ``void`` ones (Iceberg Java's
``PartitionSpec.isUnpartitioned``: v1 tables keep dropped partition fields as ``void``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import VoidTransform

from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.writer.result import FileContent


def _spec_ids(value: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in value)


@attrs.frozen
class DeleteRules:
    """Which delete files apply to which data files in one table.

    The only table fact the rule needs is which partition specs are unpartitioned, so this value is
    small and picklable: it travels to the Spark tasks that rewrite files.

    Attributes:
        unpartitioned_spec_ids: ids of the table's specs without (non-void) partition fields.
    """

    unpartitioned_spec_ids: frozenset[int] = attrs.field(converter=_spec_ids)

    @classmethod
    def from_specs(cls, specs: Mapping[int, PartitionSpec]) -> DeleteRules:
        """The rules of a table whose partition specs are ``specs`` (``table.specs()``)."""
        return cls(
            spec_id
            for spec_id, spec in specs.items()
            if all(isinstance(f.transform, VoidTransform) for f in spec.fields)
        )

    def is_global(self, delete: LiveFile) -> bool:
        """Whether ``delete`` applies to data files of every spec and partition."""
        return (
            delete.meta.content == FileContent.EQUALITY_DELETES and delete.meta.spec_id in self.unpartitioned_spec_ids
        )

    def applies(self, delete: LiveFile, data: LiveFile) -> bool:
        """Whether ``delete`` removes rows of ``data`` (see the module docstring)."""
        if delete.meta.content == FileContent.EQUALITY_DELETES:
            if delete.data_sequence_number <= data.data_sequence_number:
                return False
        elif delete.data_sequence_number < data.data_sequence_number:
            return False
        if self.is_global(delete):
            return True
        return delete.meta.spec_id == data.meta.spec_id and delete.meta.partition == data.meta.partition

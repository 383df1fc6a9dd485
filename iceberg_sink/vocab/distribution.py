"""The distribution modes of rows to writer tasks (Iceberg's ``write.distribution-mode``): named by
options, the table binding, the writers and the pre-write topology that applies them
(topology/distribution.py)."""

from __future__ import annotations

from enum import StrEnum


class DistributionMode(StrEnum):
    """Distribution of rows to writers (Iceberg's ``write.distribution-mode``)."""

    NONE = "none"
    HASH = "hash"
    RANGE = "range"

"""iceberg_sink: exactly-once streaming from Apache Spark into Apache Iceberg tables.

    pre-write topology ─▶ writers ─▶ CommitAggregator ─▶ committer ─▶ post-commit topology
    (topology/)           (writer/)   (committer/)        (committer/)  (topology/)

Start with :meth:`IcebergSink.builder`.
"""

import importlib
from typing import TYPE_CHECKING, Any

# First: fails with one clear line when PySpark is missing (see _requires.py).
import iceberg_sink._requires  # noqa: F401

if TYPE_CHECKING:
    from iceberg_sink._driver_jvm import driver_java_options
    from iceberg_sink.builder import IcebergSinkBuilder
    from iceberg_sink.committer.committable import CommitSummary
    from iceberg_sink.committer.committer import CommitOutcome
    from iceberg_sink.committer.routed import RoutedOutcome
    from iceberg_sink.errors import (
        CatalogUnavailableError,
        CheckpointRewoundError,
        CommitRetriesExhaustedError,
        CommitStateUnknownError,
        CommitVetoedError,
        CorruptFileError,
        IcebergSinkError,
        InvalidInputError,
        InvalidSinkConfigError,
        MaintenanceRefusedError,
        PendingCheckpointsLimitError,
        SchemaMismatchError,
        UncommittableCheckpointError,
        UnsupportedTableError,
        WorkerEnvironmentError,
        WriteFailedError,
    )
    from iceberg_sink.observe.metrics import MetricsSnapshot
    from iceberg_sink.sink import IcebergSink
    from iceberg_sink.topology.compaction import CompactionConfig, CompactionResult
    from iceberg_sink.topology.conversion import ConversionConfig, ConversionResult
    from iceberg_sink.topology.hooks import CommitResult, PostCommitHookError
    from iceberg_sink.vocab.distribution import DistributionMode

# The public names are imported on first use (PEP 562), not with the package: Spark's Python
# workers import ``iceberg_sink.writer...`` for every task process they start, and the package's
# __init__ runs first. Importing the builder, the catalogs and the maintenance jobs there cost each
# worker process about 1.5 s of CPU (docs/benchmarks-append.md, start-up); the writers need none of it.
_LAZY = {
    "CatalogUnavailableError": "iceberg_sink.errors",
    "CheckpointRewoundError": "iceberg_sink.errors",
    "CommitOutcome": "iceberg_sink.committer.committer",
    "CommitResult": "iceberg_sink.topology.hooks",
    "CommitRetriesExhaustedError": "iceberg_sink.errors",
    "CommitStateUnknownError": "iceberg_sink.errors",
    "CommitSummary": "iceberg_sink.committer.committable",
    "CommitVetoedError": "iceberg_sink.errors",
    "CompactionConfig": "iceberg_sink.topology.compaction",
    "CompactionResult": "iceberg_sink.topology.compaction",
    "ConversionConfig": "iceberg_sink.topology.conversion",
    "ConversionResult": "iceberg_sink.topology.conversion",
    "CorruptFileError": "iceberg_sink.errors",
    "DistributionMode": "iceberg_sink.vocab.distribution",
    "IcebergSink": "iceberg_sink.sink",
    "IcebergSinkBuilder": "iceberg_sink.builder",
    "IcebergSinkError": "iceberg_sink.errors",
    "InvalidInputError": "iceberg_sink.errors",
    "InvalidSinkConfigError": "iceberg_sink.errors",
    "MaintenanceRefusedError": "iceberg_sink.errors",
    "MetricsSnapshot": "iceberg_sink.observe.metrics",
    "PendingCheckpointsLimitError": "iceberg_sink.errors",
    "PostCommitHookError": "iceberg_sink.topology.hooks",
    "RoutedOutcome": "iceberg_sink.committer.routed",
    "SchemaMismatchError": "iceberg_sink.errors",
    "UncommittableCheckpointError": "iceberg_sink.errors",
    "UnsupportedTableError": "iceberg_sink.errors",
    "WorkerEnvironmentError": "iceberg_sink.errors",
    "WriteFailedError": "iceberg_sink.errors",
    "driver_java_options": "iceberg_sink._driver_jvm",
}

__all__ = [
    "CatalogUnavailableError",
    "CheckpointRewoundError",
    "CommitOutcome",
    "CommitResult",
    "CommitRetriesExhaustedError",
    "CommitStateUnknownError",
    "CommitSummary",
    "CommitVetoedError",
    "CompactionConfig",
    "CompactionResult",
    "ConversionConfig",
    "ConversionResult",
    "CorruptFileError",
    "DistributionMode",
    "IcebergSink",
    "IcebergSinkBuilder",
    "IcebergSinkError",
    "InvalidInputError",
    "InvalidSinkConfigError",
    "MaintenanceRefusedError",
    "MetricsSnapshot",
    "PendingCheckpointsLimitError",
    "PostCommitHookError",
    "RoutedOutcome",
    "SchemaMismatchError",
    "UncommittableCheckpointError",
    "UnsupportedTableError",
    "WorkerEnvironmentError",
    "WriteFailedError",
    "driver_java_options",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'iceberg_sink' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

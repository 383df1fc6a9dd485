"""iceberg_sink: exactly-once streaming from Apache Spark into Apache Iceberg tables.

    pre-write topology ─▶ writers ─▶ CommitAggregator ─▶ committer ─▶ post-commit topology
    (topology/)           (writer/)   (committer/)        (committer/)  (topology/)

Start with :meth:`IcebergSink.builder`.
"""

# First: fails with one clear line when PySpark is missing (see _requires.py).
import iceberg_sink._requires  # noqa: F401
from iceberg_sink.builder import IcebergSinkBuilder
from iceberg_sink.committer.committable import CommitSummary
from iceberg_sink.committer.committer import CommitOutcome, RoutedOutcome
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
from iceberg_sink.topology.distribution import DistributionMode
from iceberg_sink.topology.hooks import CommitResult, PostCommitHookError

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
]

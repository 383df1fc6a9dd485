"""Committing on the driver: the CommitAggregator folds a checkpoint's WriteResults into staged
manifests and one committable (persisted under the checkpoint location); the IcebergCommitter turns
each committable into exactly one snapshot, in checkpoint order, idempotently.
"""

"""Committing on the driver: the CommitAggregator folds a checkpoint's WriteResults into staged
manifests and one committable (persisted under the checkpoint location, store.py); the
IcebergCommitter turns each committable into exactly one snapshot, in checkpoint order,
idempotently, a format v3 checkpoint's deletes resolved into deletion vectors (vectors.py). A job's
commit step (commit now, or keep the committable pending through a catalog outage and commit it, in
order, later) is job/pending.py.
"""

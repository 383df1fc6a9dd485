"""The plans the road of a micro-batch (road.py) carries from stage to stage.

:class:`CheckpointPlan` is one table's checkpoint between :meth:`SinkJob.begin` and
:meth:`SinkJob.commit_planned` (job/pipeline.py); :class:`BatchPlan` is a whole micro-batch: every
table it writes (one, a routed sink's many, and the dead-letter table), each with its plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
from pyiceberg.table import Table
from pyspark.sql import DataFrame

from iceberg_sink import options
from iceberg_sink._spark_schema import schema_of
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.config import ChangeConfig
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.table.key_bounds import KeyBounds
from iceberg_sink.topology import toast
from iceberg_sink.vocab.distribution import DistributionMode
from iceberg_sink.writer import jvm
from iceberg_sink.writer.spec import WriterSpec

if TYPE_CHECKING:  # the jobs run the road; the road only calls them
    from iceberg_sink.job.dead_letter import DeadLetterTable
    from iceberg_sink.job.pipeline import SinkJob
    from iceberg_sink.job.together import Together

__all__ = ["BatchPlan", "CheckpointPlan", "Sizes"]

logger = logging.getLogger(__name__)


@attrs.frozen
class Sizes:
    """Up to which size a batch is a small one: its change reduction runs in one task
    (``single_task_max_bytes``, topology/changes.py); 0: never. (Whether its jobs run without
    generated code is chosen as it is read: job/codegen.py.) ``reduce_in_writers``: where its changes
    are reduced (``iceberg-sink.changes.reduce-in-writers``: auto, always or never; job/reduction.py)."""

    single_task_max_bytes: int = 0
    reduce_in_writers: str = "never"

    @classmethod
    def of(cls, resolved: options.ResolvedOptions) -> Sizes:
        """The sizes the sink's write options (``resolved``) set."""
        return cls(
            single_task_max_bytes=resolved.get(options.SINGLE_TASK_MAX_BYTES),
            reduce_in_writers=resolved.get(options.REDUCE_IN_WRITERS),
        )


@attrs.define
class CheckpointPlan:
    """One table's checkpoint between :meth:`SinkJob.begin` and :meth:`SinkJob.commit_planned`.

    Attributes:
        checkpoint_id: the checkpoint.
        table: the table as loaded for it (maybe stale while ``deferred`` is set).
        deferred: why this checkpoint's commit waits (job/pending.py ``defers``: the catalog
            is unreachable, or an earlier checkpoint lost every commit race), or None.
        done: set when the table already holds the checkpoint: nothing to write or commit.
        stored: the persisted committable to commit (stored before a crash, or by :meth:`SinkJob.stage`).
        resolved, proof, spec, mode, sort_columns: how to write it (set when it must be written).
    """

    checkpoint_id: int
    table: Table
    deferred: BaseException | None = None
    done: CommitOutcome | None = None
    stored: Committable | None = None
    resolved: options.ResolvedOptions = attrs.field(factory=lambda: options.resolve({}, {}))
    proof: KeyBounds | None = None
    spec: WriterSpec | None = None
    mode: DistributionMode = DistributionMode.NONE
    sort_columns: list[str] = attrs.field(factory=list)

    @property
    def needs_write(self) -> bool:
        """Whether the checkpoint must be written: the table neither holds it nor has it stored."""
        return self.done is None and self.stored is None


@attrs.define
class BatchPlan:
    """One micro-batch on its road: the tables it writes, each with its :class:`CheckpointPlan`.

    A single-table sink's batch has one table and no ``route_column``; a routed sink's has the
    tables its rows name, each row's in ``route_column``. With ``.dead_letter(...)``, ``dead`` and
    ``dead_plan`` are the dead-letter table's: refused rows go there in the same write.

    Attributes:
        checkpoint_id: the checkpoint (micro-batch id).
        job_id: the sink's job id (the checkpoint location's), shared by every table.
        jobs: each table's job (pipeline.SinkJob), by name.
        plans: each table's plan, by name: the tables of the batch's rows.
        changes: the sink's upsert/CDC mode (each table's key is its job's), or None for appends.
        describe: what errors name: ``table db.t``, or the route.
        route_column: the column naming each row's table (a routed sink), or None.
        dead: the dead-letter table, or None (a refused row fails the batch).
        dead_plan: the dead-letter table's plan for this checkpoint.
        distribution_mode: a routed sink's ``.distribution_mode`` (None: hash); a single table's is its plan's.
        sizes: up to which size the batch is a small one (:class:`Sizes`).
        commit_threads: how many tables commit at once (a routed sink's ``route.commit-threads``).
        progress: the single-table job's progress record of this batch (dead-letter rows counted in it).
        metrics: where the write's peak of open files is recorded (a routed sink's metrics), or None.
        together: how the job's tables commit (job/together.py: atomically, or one at a time);
            None: one at a time.
    """

    checkpoint_id: int
    job_id: str
    jobs: Mapping[str, SinkJob]
    plans: dict[str, CheckpointPlan]
    changes: ChangeConfig | None
    describe: str
    route_column: str | None = None
    dead: DeadLetterTable | None = None
    dead_plan: CheckpointPlan | None = None
    distribution_mode: str | None = None
    sizes: Sizes = attrs.field(factory=Sizes)
    commit_threads: int = 1
    progress: dict[str, Any] = attrs.field(factory=dict)
    metrics: SinkMetrics | None = None
    together: Together | None = None
    #: Whether the reduction (job/reduction.py) left the batch's changes to its writer tasks
    #: (writer/key_runs.py): then the distribution moves nothing and the write reduces.
    reduced_in_writers: bool = attrs.field(default=False, init=False)
    #: :meth:`jvm_appends`' answer, once asked (the distribution and the write both ask it).
    _jvm_appends: bool | None = attrs.field(default=None, init=False)

    def to_write(self) -> dict[str, CheckpointPlan]:
        """The tables whose checkpoint is written by this batch (neither held nor stored)."""
        return {t: p for t, p in self.plans.items() if p.needs_write}

    @property
    def dead_to_write(self) -> bool:
        """Whether the dead-letter table's checkpoint is written by this batch."""
        return self.dead_plan is not None and self.dead_plan.needs_write

    def rows_of(self) -> dict[str, CheckpointPlan]:
        """The tables whose rows the write reads: those written, or every table when the dead-letter
        table is (their refused rows are rewritten; a stored table's good rows are dropped in the task)."""
        return self.plans if self.dead_to_write else self.to_write()

    def jvm_appends(self, df: DataFrame) -> bool:
        """Whether Spark's own Parquet writer writes the batch ``df`` (writer/jvm.py): one table,
        appends, no dead-letter table, ``iceberg-sink.write.jvm-parquet-writer`` on, and rows it
        provably writes as the Arrow writers would (``jvm.unsupported``; only then is ``df``'s
        schema asked for: a round trip to Spark's analyzer). Decided once per batch."""
        if self._jvm_appends is None:
            self._jvm_appends = self._jvm_takes(df)
        return self._jvm_appends

    def _jvm_takes(self, df: DataFrame) -> bool:
        if self.route_column is not None or self.changes is not None or self.dead is not None:
            return False
        plan = next(iter(self.to_write().values()), None)
        if plan is None or plan.spec is None or not plan.resolved.get(options.JVM_PARQUET_WRITER):
            return False
        reason = jvm.unsupported(plan.spec, schema_of(df), plan.mode)
        if reason is not None:
            logger.debug("appends of %s use the Arrow writer: %s", plan.spec.table_name, reason)
        return reason is None

    def stored_tables(self) -> dict[str | None, toast.StoredTable] | None:
        """Where unchanged TOASTed columns find their stored values (topology/toast.py), by table
        (None: a single table); None without a key."""
        if self.changes is None:
            return None
        tables = self.rows_of()
        return {
            (t if self.route_column is not None else None): toast.StoredTable(
                p.table,
                self.jobs[t].binding.config.branch,
                self.jobs[t].key,
                p.deferred,
                partial(_settle, self.jobs[t], p),
            )
            for t, p in tables.items()
        }


def _settle(job: Any, plan: CheckpointPlan) -> tuple[Table, BaseException | None]:
    """``plan``'s table with the commit on ``job``'s commit lane landed (job/lane.py), and why its
    commit is deferred: stored values are read after the previous checkpoint's rows are in."""
    held, deferred = job.commits.settle()
    if held and deferred is None:
        try:
            plan.table = job.binding.refresh()
        except Exception as e:
            if not job.commits.is_outage(e):
                raise
            plan.deferred = e
    elif held:
        plan.deferred = deferred
    return plan.table, plan.deferred

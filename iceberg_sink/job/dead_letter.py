"""The dead-letter table: where refused rows go, written in the same Spark job as the good rows.

Which rows are refused, and when a refused row fails the batch instead, is decided by refusal.py.
With ``.dead_letter("ns.errors")`` each writer task splits the rows it receives
(writer/split.py): good rows go to the table's writer, refused rows (and rows whose value
does not fit the table, found by the task) to a second writer of the dead-letter table, in the same
Spark job. No extra Spark job runs when no row is refused.

Exactly once. The dead-letter table is one more table of the checkpoint, driven by its own
:class:`~iceberg_sink.job.pipeline.SinkJob` (state under ``<checkpoint>/iceberg_sink/dead_letter``,
or a routed sink's ``iceberg_sink/tables/<errors table>``), sharing the sink's job id. Its
committable is persisted with the others before any table is committed, and each table's commit is
idempotent (its snapshots name the job id and checkpoint id). After a crash, a replay of checkpoint N:

* commits whatever committable of N is stored (the good table's, the dead-letter table's, both);
* skips a table that already holds N;
* writes again only the tables that neither hold N nor have it stored. A table whose committable was
  stored is never written again: the good rows are dropped in the task when only the dead-letter
  rows are missing, and the refused rows when only the good ones are.

So a kill before, between or after the two commits ends with each good row in its table and each
refused row in the dead-letter table exactly once. On a SQL catalog the two commits are one database
transaction (job/together.py): no reader sees one without the other.

The dead-letter table (created when missing, format version 2, partitioned by ``day(dead_lettered_at)``):

=================  ==============  ==================================================================
column             type            what
=================  ==============  ==================================================================
reason             string          why the row was refused
error_class        string          which check refused it (``NullKeyError``, ``DebeziumEventError``...)
source_table       string          the table the row was meant for (a routed sink: the row's table)
event              string          the Kafka coordinates, else the value's first 200 characters
raw                string          the value as received (Debezium: the event; else the row as JSON)
kafka_topic        string          Kafka topic, when the batch has Kafka's columns
kafka_partition    int             Kafka partition
kafka_offset       long            Kafka offset
job_id             string          the sink's job id (the checkpoint location's)
checkpoint_id      long            the checkpoint (micro-batch) that refused it
dead_lettered_at   timestamptz     when the checkpoint began writing, on the driver
=================  ==============  ==================================================================
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import attrs
from pyspark.sql import types as T

from iceberg_sink.config import CreateOptions, SinkConfig
from iceberg_sink.job.plan import CheckpointPlan
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.table.partitioning import parse_terms
from iceberg_sink.writer.result import Written
from iceberg_sink.writer.split import DeadLetterTask

if TYPE_CHECKING:  # the dead-letter table's job is a SinkJob (pipeline.py makes it)
    from iceberg_sink.job.pipeline import SinkJob

logger = logging.getLogger("iceberg_sink")

#: The columns of a dead-letter table (see the module docstring), as the writers receive them.
DEAD_LETTER_STRUCT = T.StructType(
    [
        T.StructField("reason", T.StringType(), True),
        T.StructField("error_class", T.StringType(), True),
        T.StructField("source_table", T.StringType(), True),
        T.StructField("event", T.StringType(), True),
        T.StructField("raw", T.StringType(), True),
        T.StructField("kafka_topic", T.StringType(), True),
        T.StructField("kafka_partition", T.IntegerType(), True),
        T.StructField("kafka_offset", T.LongType(), True),
        T.StructField("job_id", T.StringType(), True),
        T.StructField("checkpoint_id", T.LongType(), True),
        T.StructField("dead_lettered_at", T.TimestampType(), True),
    ]
)
#: How a dead-letter table is partitioned when the sink creates it.
DEAD_LETTER_PARTITION_BY = ("day(dead_lettered_at)",)
#: Where a single-table sink keeps the dead-letter table's state under its checkpoint location.
DEAD_LETTER_STATE = "iceberg_sink/dead_letter"


def check_target(dead_letter: str, target: str) -> str | None:
    """Why ``dead_letter`` cannot be the dead-letter table of a sink writing ``target`` (None: it can)."""
    if not isinstance(dead_letter, str) or "." not in dead_letter.strip(".") or not dead_letter.strip():
        return f"dead_letter: expected a table name 'namespace.name', received {dead_letter!r}"
    if target and _same(dead_letter, target):
        return (
            f"dead_letter: the dead-letter table must not be the sink's table; received {dead_letter!r} for a sink "
            f"writing {target!r} (give another table, such as '{target.rsplit('.', 1)[0]}.errors')"
        )
    return None


def _same(a: str, b: str) -> bool:
    return a.strip().strip(".").lower() == b.strip().strip(".").lower()


def dead_letter_config(config: SinkConfig) -> SinkConfig:
    """The configuration the dead-letter table is written with: append-only, created when missing."""
    assert config.dead_letter is not None
    return attrs.evolve(
        config,
        table=config.dead_letter,
        create=CreateOptions(parse_terms(DEAD_LETTER_PARTITION_BY), {}, 2),
        distribution_mode="none",
        changes=None,
        pre_commit_hooks=(),
        post_commit_hooks=(),
        compaction=None,
        conversion=None,
        map_batches=(),
        route=None,
        dead_letter=None,
    )


class DeadLetterTable:
    """The dead-letter table of one job (one checkpoint location), driven by its own SinkJob."""

    def __init__(self, job: SinkJob, metrics: SinkMetrics) -> None:
        self.job = job
        self.name = job._config.table
        self._metrics = metrics

    def begin(self, checkpoint_id: int) -> CheckpointPlan:
        return self.job.begin(DEAD_LETTER_STRUCT, checkpoint_id)

    def task(
        self,
        plan: CheckpointPlan,
        job_id: str,
        source_table: str | None = None,
        route_column: str | None = None,
        tables: frozenset[str] | None = None,
    ) -> DeadLetterTask:
        return DeadLetterTask(
            spec=plan.spec if plan.needs_write else None,
            job_id=job_id,
            checkpoint_id=plan.checkpoint_id,
            at_micros=int(time.time() * 1_000_000),
            source_table=source_table,
            route_column=route_column,
            tables=tables,
        )

    def staged(self, plan: CheckpointPlan, out: Written, progress: dict[str, Any]) -> None:
        """Persist the dead-letter rows of ``plan``'s checkpoint (before any table is committed) and count them."""
        self.job.flushed(out.dead, out.write_ms)
        committable = self.job.stage(plan, out.dead)
        records = committable.summary.records if committable is not None else 0
        progress["dead_letter_records"] = records
        if records:
            self._metrics.dead_lettered(out.counts)
            logger.warning(
                "checkpoint %s: %s rows refused and written to the dead-letter table %s (%s)",
                plan.checkpoint_id,
                records,
                self.name,
                ", ".join(f"{t}: {n}" for t, n in sorted(out.counts.items())),
            )

    # The single-table job's bookkeeping includes the dead-letter table's (sink.py asks through these).

    def has_pending(self) -> bool:
        return self.job.has_pending()

    def commit_pending(self) -> None:
        self.job.commit_pending()

    def next_checkpoint_id(self) -> int:
        self.job.ensure_table(DEAD_LETTER_STRUCT)  # created when missing
        return self.job.next_checkpoint_id()

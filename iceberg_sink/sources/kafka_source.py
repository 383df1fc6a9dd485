"""The options of Spark's Kafka source that cost a streaming sink time, and the hint that names them.

**The fetch wait.** Spark's Kafka source reads each partition of a micro-batch in a task of its own.
Its consumer's poll returns the records and, before returning, sends the next fetch, past the batch's
end offset. At the end of the topic there is nothing to fetch yet, so the broker holds that fetch for
up to the consumer's ``fetch.max.wait.ms``: 500 ms by default. The task then asks the broker for the
partition's offset range, on the same connection, and that request waits behind the held fetch. So
every task that reads a partition to its end waits about half a second, and so does every Spark job
that reads the micro-batch from Kafka. That is every micro-batch of a live stream, and the first one
of any stream that starts from ``earliest`` (``docs/benchmarks.md``, issue 41: the Kafka guide's
micro-batch at the topics' end took 1.17-1.52 s with the default and 0.89-0.95 s with 10 ms).
``kafka.fetch.max.wait.ms`` at 10 makes the broker answer that fetch at once. Spark's tasks only read
offsets that exist, so nothing else changes.

**The records per poll.** The task asks the broker for the partition's offset range (two
``ListOffsets`` requests) after every poll of its consumer, and a poll returns at most the consumer's
``max.poll.records``: 500 by default. A stream reading a backlog, or large micro-batches, makes a round
trip the task waits on, and work for the broker, every 500 records: 20,180 offset requests against
564 fetches for 4.8M changes in the CDC race (``docs/benchmarks.md``, session 60), the broker at
10-11 CPU-s against Flink's connector's 3.6-3.9. ``kafka.max.poll.records`` at 20,000 lets a poll
return what one fetch brought (a fetch is at most 1 MiB a partition by default): 1,197 offset
requests, the broker at 4.7 CPU-s. The records a micro-batch reads do not change.

The sink cannot set either itself: they are the source's, fixed when the stream is loaded.
:func:`lacking_sources` finds the Kafka sources of a streaming DataFrame without them, and
``sink.start`` says so in its log (:func:`options_hint`); ``iceberg-sink run`` sets both
(:data:`RECOMMENDED`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

FETCH_WAIT_OPTION = "kafka.fetch.max.wait.ms"
"""The Kafka consumer setting, as a Kafka source option (Spark passes ``kafka.``-prefixed options on)."""

POLL_RECORDS_OPTION = "kafka.max.poll.records"
"""The Kafka consumer's records per poll, as a Kafka source option."""


@dataclass(frozen=True)
class _Option:
    recommended: str
    kafka_default: str
    why: str  # what a source without it pays


_OPTIONS = {
    FETCH_WAIT_OPTION: _Option(
        "10",
        "500",
        "every micro-batch that reads a partition to its end (each one of a live stream) waits up to the "
        "consumer's default 500 ms in each Spark job reading it",
    ),
    POLL_RECORDS_OPTION: _Option(
        "20000",
        "500",
        "the source sends two offset requests to the broker after every poll of at most the consumer's "
        "default 500 records, each a round trip its task waits on (a backlog of 1M changes: about 4,000)",
    ),
}

RECOMMENDED: dict[str, str] = {name: option.recommended for name, option in _OPTIONS.items()}
"""What the guides and ``iceberg-sink run`` set, in the order the hint names them."""

HINT_START = "iceberg_sink: Spark's Kafka source ("
"""How :func:`options_hint`'s line starts (tests look for it in a stream's log)."""

# Options naming what a Kafka source reads, in the order one is looked for.
_TOPIC_OPTIONS = ("subscribe", "subscribePattern", "assign")


def lacking_sources(streaming_df: DataFrame) -> list[tuple[str, tuple[str, ...]]]:
    """The Kafka sources of ``streaming_df``'s plan without one of :data:`RECOMMENDED`'s options:
    each named by its ``subscribe``, ``subscribePattern`` or ``assign`` option, with the options it
    lacks; empty when there are none or the plan cannot be read (a Spark whose classes differ: the
    hint is then left out). Spark's reader options are case-insensitive, and so is the check."""
    try:
        leaves = streaming_df._jdf.logicalPlan().collectLeaves().iterator()
        found: list[tuple[str, tuple[str, ...]]] = []
        while leaves.hasNext():
            leaf = leaves.next()
            if str(leaf.nodeName()) != "StreamingRelationV2" or str(leaf.sourceName()).lower() != "kafka":
                continue
            options = leaf.extraOptions()
            missing = tuple(name for name in RECOMMENDED if not options.containsKey(name))
            if missing:
                found.append((_named(options), missing))
        return found
    except Exception as e:  # a plan this Spark does not shape so: no hint
        logger.debug("iceberg_sink: the stream's Kafka sources could not be read from its plan: %s", e)
        return []


def _named(options: Any) -> str:
    for name in _TOPIC_OPTIONS:
        if options.containsKey(name):
            return f"{name}={options.get(name)}"
    return "a Kafka source"


def options_hint(lacking: list[tuple[str, tuple[str, ...]]]) -> str:
    """The log line for :func:`lacking_sources`' result (not empty): each source and what it lacks,
    why each option matters, and the lines that set them."""
    missing = [name for name in RECOMMENDED if any(name in lacks for _, lacks in lacking)]
    sources = "; ".join(f"{source} without {', '.join(lacks)}" for source, lacks in lacking)
    why = "; ".join(f"without {name}, {_OPTIONS[name].why}" for name in missing)
    sets = "".join(f'.option("{name}", "{_OPTIONS[name].recommended}")' for name in missing)
    defaults = ", ".join(f"{name} to {_OPTIONS[name].kafka_default}" for name in missing)
    return (
        f"{HINT_START}{sources}): {why}. Set {sets} on "
        'spark.readStream.format("kafka") (docs/troubleshooting.md); set '
        f"{defaults} to keep Kafka's {'defaults' if len(missing) > 1 else 'default'} without this message."
    )

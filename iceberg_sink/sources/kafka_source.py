"""The option of Spark's Kafka source that a micro-batch at the end of its topics waits on.

Spark's Kafka source reads each partition of a micro-batch in a task of its own. Its consumer's poll
returns the records and, before returning, sends the next fetch, past the batch's end offset. At the
end of the topic there is nothing to fetch yet, so the broker holds that fetch for up to the
consumer's ``fetch.max.wait.ms``: 500 ms by default. The task then asks the broker for the partition's
offset range, on the same connection, and that request waits behind the held fetch. So every task
that reads a partition to its end waits about half a second, and so does every Spark job that reads
the micro-batch from Kafka. That is every micro-batch of a live stream, and the first one of any
stream that starts from ``earliest`` (``docs/benchmarks.md``, issue 41: the Kafka guide's micro-batch
at the topics' end took 1.17-1.52 s with the default and 0.89-0.95 s with 10 ms).

``kafka.fetch.max.wait.ms`` on the source (``.option("kafka.fetch.max.wait.ms", "10")``) makes the
broker answer that fetch at once. Spark's tasks only read offsets that exist, so nothing else changes.
The sink cannot set the option itself: it is the source's, fixed when the stream is loaded.
:func:`waiting_sources` finds the Kafka sources of a streaming DataFrame that lack it, and ``sink.start``
says so in its log.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

FETCH_WAIT_OPTION = "kafka.fetch.max.wait.ms"
"""The Kafka consumer setting, as a Kafka source option (Spark passes ``kafka.``-prefixed options on)."""

RECOMMENDED_FETCH_WAIT_MS = 10
"""What the guides set: the broker answers the fetch past a batch's end after 10 ms, not 500."""

# Options naming what a Kafka source reads, in the order one is looked for.
_TOPIC_OPTIONS = ("subscribe", "subscribePattern", "assign")


def waiting_sources(streaming_df: DataFrame) -> list[str]:
    """The Kafka sources of ``streaming_df``'s plan without ``kafka.fetch.max.wait.ms``, each
    named by its ``subscribe``, ``subscribePattern`` or ``assign`` option; empty when there are none
    or the plan cannot be read (a Spark whose classes differ: the hint is then left out)."""
    try:
        leaves = streaming_df._jdf.logicalPlan().collectLeaves().iterator()
        found: list[str] = []
        while leaves.hasNext():
            leaf = leaves.next()
            if str(leaf.nodeName()) != "StreamingRelationV2" or str(leaf.sourceName()).lower() != "kafka":
                continue
            options = leaf.extraOptions()
            if options.containsKey(FETCH_WAIT_OPTION):
                continue
            found.append(_named(options))
        return found
    except Exception as e:  # a plan this Spark does not shape so: no hint
        logger.debug("iceberg_sink: the stream's Kafka sources could not be read from its plan: %s", e)
        return []


def _named(options: Any) -> str:
    for name in _TOPIC_OPTIONS:
        if options.containsKey(name):
            return f"{name}={options.get(name)}"
    return "a Kafka source"


def fetch_wait_hint(sources: list[str]) -> str:
    """The log line for :func:`waiting_sources`' result (not empty)."""
    return (
        f"iceberg_sink: Spark's Kafka source ({'; '.join(sources)}) has no {FETCH_WAIT_OPTION}: every "
        "micro-batch that reads a partition to its end (each one of a live stream) waits up to the "
        "consumer's default 500 ms in each Spark job reading it. Set "
        f'.option("{FETCH_WAIT_OPTION}", "{RECOMMENDED_FETCH_WAIT_MS}") on spark.readStream.format("kafka") '
        "(docs/troubleshooting.md); set it to 500 to keep the default without this message."
    )

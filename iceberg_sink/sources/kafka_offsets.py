"""How far each Kafka partition is in a table: Spark's end offsets of a checkpoint in its snapshot.

Spark's streaming engine writes, before it runs micro-batch N, the end offset of every source of N
to ``<checkpoint_location>/offsets/N`` (``v1``, a metadata line, then one JSON line per source). A
Kafka source's line maps topics to ``{"<partition>": <offset>}``; that offset is the partition's
*next* record after the batch (exclusive end). The sink's checkpoint id is the micro-batch id, so
the commit of checkpoint N adds to its snapshot summary::

    kafka.offsets.<topic>.<partition> = <end offset>

for every Kafka partition the batch read (a routed stream: to every table's snapshot of that
checkpoint, each table being as far as the stream). Every record of a partition before that offset
is in the table (or was filtered out), except where ``.debezium(transactions="consistent")`` held
events back for a later checkpoint (sources/transactions.py): there the offset recorded is the first
held event's; a checkpoint committed later (after a catalog outage) still
gets its own batch's offsets. Other sources' lines (files, rate) add nothing, nor does a batch
whose offset log entry Spark already purged (it keeps the last ``minBatchesToRetain``, 100).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = "kafka.offsets."
"""Snapshot summary key prefix: ``kafka.offsets.<topic>.<partition>`` (the topic may hold dots; the
partition is the part after the last one)."""


def summary_key(topic: str, partition: int) -> str:
    return f"{SUMMARY_PREFIX}{topic}.{partition}"


def parse_summary(summary: dict[str, str]) -> dict[str, dict[int, int]]:
    """The ``{topic: {partition: end offset}}`` a snapshot summary records (empty: none)."""
    out: dict[str, dict[int, int]] = {}
    for key, value in summary.items():
        if key.startswith(SUMMARY_PREFIX):
            topic, _, partition = key[len(SUMMARY_PREFIX) :].rpartition(".")
            if topic and partition.isdigit():
                out.setdefault(topic, {})[int(partition)] = int(value)
    return out


def _kafka_offsets(line: str) -> dict[str, dict[str, int]] | None:
    """A source's offset line when it is a Kafka source's (``{topic: {partition: offset}}``)."""
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not parsed:
        return None
    for partitions in parsed.values():
        if not isinstance(partitions, dict) or not partitions:
            return None
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or not isinstance(offset, int) or isinstance(offset, bool):
                return None
    return parsed


def _sources(offset_log: bytes) -> list[dict[str, dict[str, int]] | None] | None:
    """Each source's line of one offset log entry: its Kafka offsets, or None for another source;
    None when the entry does not start with a version line."""
    lines = offset_log.decode("utf-8", errors="replace").splitlines()
    if not lines or not lines[0].startswith("v"):
        return None
    return [_kafka_offsets(line.strip()) for line in lines[2:]]


def end_offsets(offset_log: bytes | None) -> dict[tuple[str, int], int] | None:
    """``{(topic, partition): end offset}`` of the Kafka sources of one offset log entry; None when it
    is absent, unreadable or names no Kafka source."""
    sources = _sources(offset_log) if offset_log is not None else None
    ends = {
        (topic, int(partition)): offset
        for kafka in sources or []
        for topic, partitions in (kafka or {}).items()
        for partition, offset in partitions.items()
    }
    return ends or None


def summary_properties(offset_log: bytes | None, held: Mapping[str, Mapping[int, int]] | None = None) -> dict[str, str]:
    """The summary keys of one offset log entry (``<checkpoint>/offsets/<batch id>``; None: absent).

    ``held``: ``{topic: {partition: offset}}`` of the first events the checkpoint held back for a later
    one (``.debezium(transactions="consistent")``, sources/transactions.py): such a partition's offset
    is that event's, since every record before it, and no record from it on, is sure to be in the table."""
    if offset_log is None:
        return {}
    if _sources(offset_log) is None:
        logger.warning("Spark offset log entry does not start with a version line; Kafka offsets not recorded")
        return {}
    properties: dict[str, str] = {}
    for (topic, partition), offset in (end_offsets(offset_log) or {}).items():
        low = (held or {}).get(topic, {}).get(partition)
        properties[summary_key(topic, partition)] = str(offset if low is None else min(offset, low))
    return properties


def records_between(previous: bytes | None, current: bytes | None) -> int | None:
    """How many Kafka records micro-batch N reads at most, from the offset log entries of N-1
    (``previous``) and N (``current``): the sum of each partition's end offset minus its end in N-1.
    An upper bound (a compacted topic's gaps and transaction markers hold no record); None when it
    cannot be known: a source that is not Kafka (its rows are not counted), or a partition N-1 does
    not name (the first micro-batch reads from offsets its log does not hold)."""
    sources = _sources(current) if current is not None else None
    if not sources or any(kafka is None for kafka in sources):
        return None
    now, before = end_offsets(current), end_offsets(previous)
    if now is None or before is None or any(part not in before for part in now):
        return None
    return sum(max(0, end - before[part]) for part, end in now.items())


def initial_offsets(entry: bytes | None) -> str | None:
    """The offsets line of a Kafka source's starting offsets, as Spark keeps them for a query's first
    micro-batch (``<checkpoint>/sources/<source>/0``: a zero byte, a version line, then
    ``{topic: {partition: offset}}``); None when absent, not a Kafka source's, or holding a sentinel
    (a negative offset: earliest or latest, not resolved)."""
    if entry is None:
        return None
    lines = entry.lstrip(b"\0").decode("utf-8", errors="replace").splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        return None
    parsed = _kafka_offsets(lines[1].strip())
    if parsed is None or any(offset < 0 for partitions in parsed.values() for offset in partitions.values()):
        return None
    return lines[1].strip()


def starting_entry(current: bytes | None, initial: Callable[[int], bytes | None]) -> bytes | None:
    """The entry before a query's first micro-batch (``current``: its offset log entry), which Spark
    does not write: each source's starting offsets (``initial(i)``: the ``sources/<i>/0`` entry of
    source ``i``) as one offset log entry, for :func:`records_between`. None when a source's cannot
    be read."""
    sources = _sources(current) if current is not None else None
    if not sources:
        return None
    starts = [initial_offsets(initial(i)) for i in range(len(sources))]
    if any(start is None for start in starts):
        return None
    return "\n".join(["v1", "{}", *(s for s in starts if s is not None)]).encode()

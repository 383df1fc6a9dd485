"""Whether a streaming query's source had more records waiting than its current micro-batch took.

A stream's commit may run beside its next micro-batch (job/lane.py) only when a next micro-batch is
sure to follow at once and take the commit's result. Spark's sources that support admission control
(Kafka's, among others) report the newest offset they saw when the micro-batch was planned, before
``maxOffsetsPerTrigger`` and the like cut it to the micro-batch's end: when the two differ, Spark's
next trigger has records to read. The micro-batch's plan (the query's last execution, while its
``foreachBatch`` function runs) holds both, for each source read through Spark's V2 streaming API.
A plan this Spark shapes otherwise, or a source that reports nothing, counts as no backlog.
"""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger(__name__)

_SCAN = "StreamingDataSourceV2ScanRelation"


def source_backlog(query: Any) -> bool:
    """Whether a source of ``query`` (a running StreamingQuery, asked from inside its ``foreachBatch``
    function) had records past the end of the micro-batch being processed."""
    try:
        execution = query._jsq.streamingQuery().lastExecution()
        if execution is None:
            return False
        leaves = execution.logical().collectLeaves().iterator()
        while leaves.hasNext():
            leaf = leaves.next()
            if str(leaf.nodeName()) != _SCAN:
                continue
            end, latest = leaf.endOffset(), leaf.stream().reportLatestOffset()
            if latest is None or not end.isDefined():
                continue
            if json.loads(str(latest.json())) != json.loads(str(end.get().json())):
                return True
        return False
    except Exception as e:  # a plan this Spark does not shape so: no overlap
        logger.debug("iceberg_sink: the stream's source offsets could not be read from its plan: %s", e)
        return False

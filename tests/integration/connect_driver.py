"""Hands the sink objects of a real Spark Connect session (the test's process has a classic one).

    python -m tests.integration.connect_driver WORK_DIR

Starts a local Spark Connect server and its client session (``SparkSession.builder.remote``), then
makes every call that takes a caller's DataFrame or SparkSession with Connect objects: ``write``
(plain and with ``.debezium()``), ``start`` on a file stream, ``compact`` with ``spark=`` and with the
active session, ``read_envelope``, ``read_json`` and ``infer_json_schema``. Each call's outcome
(error type and message, or ``"returned"``) and the session's class go to ``WORK_DIR/result.json``.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
TABLE = "db.t"


def _outcome(call: Callable[[], Any]) -> dict[str, str]:
    try:
        call()
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
    return {"returned": "yes"}


def main(work: Path) -> None:
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from iceberg_sink.sources.debezium import read_envelope
    from iceberg_sink.sources.readers import infer_json_schema, read_json

    spark = SparkSession.builder.remote("local[1]").config("spark.sql.shuffle.partitions", "1").getOrCreate()
    source = work / "source"
    source.mkdir()
    (source / "a.json").write_text('{"id": 1, "v": "a"}\n', encoding="utf-8")
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    events = spark.createDataFrame([('{"op": "c", "after": {"id": 1}, "source": {"lsn": 1}}',)], "value string")
    stream = spark.readStream.schema("id long, v string").json(str(source))

    def sink(**debezium: Any) -> IcebergSink:
        builder = IcebergSink.builder().embedded(work / "lake").table(TABLE).create_if_missing()
        if debezium:
            builder = builder.debezium(**debezium).cdc(op_column="op", key=["id"], order_by="lsn")
        return builder.build()

    calls: dict[str, Callable[[], Any]] = {
        "write": lambda: sink().write(df),
        "write_debezium": lambda: sink(table_column=None).write(events),
        "start": lambda: sink().start(stream, str(work / "checkpoint"), {"availableNow": True}),
        "compact_spark": lambda: sink().compact(spark=spark),
        "compact_active": lambda: sink().compact(),
        "read_envelope": lambda: read_envelope(events, table_column=None),
        "read_json": lambda: read_json(events, "value"),
        "infer_json_schema": lambda: infer_json_schema(events, "value"),
    }
    result: dict[str, Any] = {"session": f"{type(spark).__module__}.{type(spark).__qualname__}"}
    result["calls"] = {name: _outcome(call) for name, call in calls.items()}
    # The Connect session itself works: the refusals are the sink's, not a broken session's.
    result["rows"] = [tuple(r) for r in df.collect()]
    (work / RESULT_FILE).write_text(json.dumps(result), encoding="utf-8")
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

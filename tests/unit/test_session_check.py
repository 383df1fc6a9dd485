"""Objects that are not a classic session's DataFrame or SparkSession are refused by name before
anything is created (iceberg_sink/_session.py); before, each call failed with an AttributeError
(``'DataFrame' object has no attribute 'isStreaming'``) or deep inside Spark. The Spark Connect
case runs a real Connect session: tests/integration/test_spark_connect.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.sources.debezium import read_envelope
from iceberg_sink.sources.readers import infer_json_schema, read_json

NOT_FRAMES = [
    (pd.DataFrame({"id": [1]}), "pandas.core.frame.DataFrame"),
    (pa.table({"id": [1]}), "pyarrow.lib.Table"),
    (None, "builtins.NoneType"),
    ([{"id": 1}], "builtins.list"),
]


def _sink(tmp_path: Path) -> IcebergSink:
    return IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().build()


CALLS: dict[str, Callable[[IcebergSink, Any, Path], Any]] = {
    "write(df)": lambda sink, value, tmp: sink.write(value),
    "start(streaming_df)": lambda sink, value, tmp: sink.start(value, str(tmp / "checkpoint")),
    "read_envelope(df)": lambda sink, value, tmp: read_envelope(value),
    "read_json(df)": lambda sink, value, tmp: read_json(value, "value"),
    "infer_json_schema(df)": lambda sink, value, tmp: infer_json_schema(value, "value"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(("value", "described"), NOT_FRAMES, ids=[d for _, d in NOT_FRAMES])
def test_a_non_dataframe_is_refused_naming_what_was_received(
    tmp_path: Path, call: str, value: Any, described: str
) -> None:
    sink = _sink(tmp_path)
    with pytest.raises(InvalidSinkConfigError) as raised:
        CALLS[call](sink, value, tmp_path)
    assert str(raised.value) == f"{call}: expected a PySpark DataFrame, received {described}"
    assert not (tmp_path / "checkpoint").exists()
    with pytest.raises(InvalidSinkConfigError, match="does not exist"):
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build()


@pytest.mark.parametrize(("value", "described"), [*NOT_FRAMES[:1], ("spark", "builtins.str")])
def test_compact_refuses_a_non_session(tmp_path: Path, value: Any, described: str) -> None:
    with pytest.raises(InvalidSinkConfigError) as raised:
        _sink(tmp_path).compact(spark=value)
    assert str(raised.value) == f"compact(spark): expected a SparkSession, received {described}"

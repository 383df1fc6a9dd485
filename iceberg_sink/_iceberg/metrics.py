"""Iceberg column metrics of the Parquet files the sink writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema


def parquet_metrics(metadata: pq.FileMetaData, schema: Schema, properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg column metrics from a written Parquet footer, honouring ``write.metadata.metrics.*``."""
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, dict(properties)),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return stats.to_serialized_dict()


def nan_counts_by_field_id(
    schema: Schema, nan_counts_by_name: Mapping[str, int], metrics: Mapping[str, Any]
) -> dict[int, int]:
    """NaN counts keyed by field id, for columns whose metrics are collected at all."""
    collected = metrics["value_counts"]
    result = {}
    for name, count in nan_counts_by_name.items():
        field_id = schema.find_field(name).field_id
        if field_id in collected:
            result[field_id] = count
    return result

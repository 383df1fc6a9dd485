"""The randomized model check (docs/model-check.md): real Spark writes and commits against Python models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.interop.readers import JavaIcebergReader
from tests.model.harness import run_seed

pytestmark = pytest.mark.interop


def test_model(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    model_seed: int,
    model_steps: int,
    model_long: bool,
) -> None:
    seconds = run_seed(spark, java_reader, model_seed, model_steps, root=tmp_path, long=model_long)
    sys.stderr.write(f"model check seed {model_seed}: {model_steps} steps in {seconds:.1f}s\n")

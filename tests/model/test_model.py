"""The randomized model check (docs/model-check.md): real Spark writes and commits against Python models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.interop.readers import JavaIcebergReader
from tests.model import harness
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


def test_model_catalog_outages(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short profile may draw ``catalog_outage`` rarely: one seed where it dominates, between the
    writes of every job, so pending checkpoints, both recovery paths and the limit always run."""
    monkeypatch.setattr(harness, "OPERATIONS", {"cdc": 2, "upsert": 1, "append": 1, "catalog_outage": 4})
    world = harness.World(spark, java_reader, tmp_path, seed=5)
    seconds = world.run(8)
    outages = [line for line in world.trace if "catalog outage" in line]
    assert len(outages) >= 3, world.trace
    sys.stderr.write(f"model check catalog outages: {len(outages)} in {seconds:.1f}s\n")

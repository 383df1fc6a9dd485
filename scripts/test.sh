#!/usr/bin/env bash
# Installs the test dependencies into .venv and runs lint, type checks and the whole test suite
# (real local Spark; the Iceberg Java reader venv .venv-java is built on first use).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv test
# PostgreSQL server binaries for the SQL-catalog tests (they start their own server on loopback).
scripts/ensure_postgres.sh
# javac, to compile the Java reader's S3 mirror file system (tests/interop/java) on first use.
scripts/ensure_javac.sh
# Maven, and the jars of the real pipeline's components (Kafka, Kafka Connect + Debezium, Spark's Kafka
# source), fetched once from Maven Central into ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven:
# tests/integration/test_kafka_source.py and tests/e2e run them (scripts/pipeline_components.py).
scripts/ensure_maven.sh
python3 scripts/pipeline_components.py fetch kafka >/dev/null
python3 scripts/pipeline_components.py fetch connect >/dev/null
python3 scripts/pipeline_components.py fetch spark-kafka \
  --spark-version "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" >/dev/null
echo "== ruff"
.venv/bin/ruff check iceberg_sink tests benchmarks
.venv/bin/ruff format --check iceberg_sink tests benchmarks
echo "== mypy"
.venv/bin/mypy iceberg_sink
echo "== pytest"
exec .venv/bin/python -m pytest "$@"

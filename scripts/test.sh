#!/usr/bin/env bash
# Installs the test dependencies into .venv and runs lint, type checks and the whole test suite
# (real local Spark; the Iceberg Java reader venvs and jars are built or fetched first, once).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv test
# PostgreSQL server binaries for the SQL-catalog tests (they start their own server on loopback).
scripts/ensure_postgres.sh
# MariaDB server binaries for the Debezium MariaDB connector tests (their own server on loopback).
scripts/ensure_mariadb.sh
# The interop readers: the Java reader venvs (PySpark 3.5.7 for Iceberg Java 1.9.2, PySpark 4.1 for
# the newest Iceberg Java) and their jars from Maven Central (needs mvn), built or fetched once
# into .venv-java*, ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven; fails loudly.
scripts/ensure_maven.sh
echo "== interop readers"
.venv/bin/python -m tests.interop.java_env
# The jars of the real pipeline's components (Kafka, Kafka Connect + Debezium, Spark's Kafka
# source), fetched once from Maven Central into ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven
# by the same fetcher (scripts/maven_fetch.py): tests/integration/test_kafka_source.py and tests/e2e
# run them (scripts/pipeline_components.py).
python3 scripts/pipeline_components.py fetch kafka >/dev/null
python3 scripts/pipeline_components.py fetch connect >/dev/null
python3 scripts/pipeline_components.py fetch spark-kafka \
  --spark-version "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" >/dev/null
# ... and for the Spark 3.5 venv (tests/integration/test_spark35.py runs Spark 3.5's Kafka source).
java_venv_python="${ICEBERG_SINK_JAVA_VENV:-.venv-java}/bin/python"
python3 scripts/pipeline_components.py fetch spark-kafka \
  --spark-version "$("$java_venv_python" -c 'import pyspark; print(pyspark.__version__)')" >/dev/null
echo "== ruff"
.venv/bin/ruff check iceberg_sink tests benchmarks
.venv/bin/ruff format --check iceberg_sink tests benchmarks
echo "== mypy"
.venv/bin/mypy iceberg_sink
echo "== layers (import-linter: the contract in pyproject.toml, docs/architecture.md)"
.venv/bin/lint-imports --no-cache
echo "== pytest"
# Two workers by default (ICEBERG_SINK_TEST_WORKERS=0 runs in one process), each with its own
# SparkSession and servers; a test file stays on one worker (module fixtures start once).
# Arguments given with -n/--numprocesses win.
workers=(-n "${ICEBERG_SINK_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
for arg in "$@"; do
  case "$arg" in -n | -n* | --numprocesses*) workers=() ;; esac
done
# The tests start many short-lived JVMs (Spark drivers killed and restarted, Java readers, Kafka):
# the C1 compiler alone and the serial collector cut their CPU by about a quarter on 2 cores, and a
# class data sharing archive of local Spark's classes (made once into .venv/cds by
# scripts/spark_cds.py) halves a Spark JVM's start (each JVM then prints "Picked up
# JAVA_TOOL_OPTIONS" on stderr). Set JAVA_TOOL_OPTIONS to override. (The full JIT for the two
# long-lived test-session JVMs saved them CPU but no wall time over a whole run: 45:07 against 44:32.)
if [ -z "${JAVA_TOOL_OPTIONS+set}" ]; then
  jvm_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
  echo "== Spark class data sharing archive"
  cds=$(.venv/bin/python scripts/spark_cds.py "$jvm_options")
  echo "${cds:-none: the tests run without one}"
  export JAVA_TOOL_OPTIONS="$jvm_options${cds:+ $cds}"
fi
exec .venv/bin/python -m pytest "${workers[@]}" "$@"

#!/usr/bin/env bash
# Installs the test dependencies into .venv and runs lint, type checks and the whole test suite
# (real local Spark; the Iceberg Java reader venvs and jars are built or fetched first, once).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv test
# PostgreSQL server binaries for the SQL-catalog tests (they start their own server on loopback).
scripts/ensure_postgres.sh
# The interop readers: the Java reader venvs (PySpark 3.5.7 for Iceberg Java 1.9.2, PySpark 4.1 for
# the newest Iceberg Java) and their jars from Maven Central (needs mvn), built or fetched once
# into .venv-java*, ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven; fails loudly.
scripts/ensure_maven.sh
echo "== interop readers"
.venv/bin/python -m tests.interop.java_env
echo "== ruff"
.venv/bin/ruff check iceberg_sink tests benchmarks
.venv/bin/ruff format --check iceberg_sink tests benchmarks
echo "== mypy"
.venv/bin/mypy iceberg_sink
echo "== pytest"
exec .venv/bin/python -m pytest "$@"

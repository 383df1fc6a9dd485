#!/usr/bin/env bash
# Installs what the demo needs into .venv and runs the demo pipeline (local Spark, SQLite catalog,
# local warehouse under ./demo-output). Extra arguments go to `python -m iceberg_sink.cli.demo`.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv spark,demo
exec .venv/bin/python -m iceberg_sink.cli.demo "$@"

#!/usr/bin/env bash
# Installs Maven (Debian package `maven`) when `mvn` is missing: scripts/maven_fetch.py fetches every
# jar the project needs from Maven Central with it, those of the interop readers of the tests (the
# newest Iceberg Spark runtime, iceberg-aws-bundle, sqlite-jdbc; tests/interop/java_env.py) and those
# of Kafka, Kafka Connect + Debezium and Spark's Kafka source (scripts/pipeline_components.py).
# Idempotent and quiet when mvn exists; fails loudly otherwise.
set -euo pipefail

if command -v mvn >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: mvn not found and not root to install it; install the Debian package: apt-get install maven" >&2
  exit 1
fi
echo "== installing Maven (apt-get install maven)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends maven >/dev/null
if ! command -v mvn >/dev/null 2>&1; then
  echo "error: apt-get install maven finished but mvn is not on PATH" >&2
  exit 1
fi

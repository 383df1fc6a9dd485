#!/usr/bin/env bash
# Installs Maven (Debian package `maven`) when `mvn` is missing: scripts/pipeline_components.py uses it
# to fetch the jars of Kafka, Kafka Connect + Debezium and Spark's Kafka source from Maven Central.
# Idempotent and quiet when already installed; fails loudly when it cannot install.
set -euo pipefail

if command -v mvn >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: Maven (mvn) not found and not root to install it; install the Debian package: apt-get install maven" >&2
  exit 1
fi
echo "== installing Maven (apt-get install maven)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends maven >/dev/null
command -v mvn >/dev/null 2>&1 || { echo "error: apt-get install maven finished but mvn is not on PATH" >&2; exit 1; }

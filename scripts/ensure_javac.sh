#!/usr/bin/env bash
# Installs a JDK's javac (Debian package `openjdk-17-jdk-headless`) when it is missing: the Iceberg Java
# reader of the tests compiles tests/interop/java/MirrorS3FileSystem.java on first use to read tables
# on S3. Idempotent and quiet when javac exists; fails loudly when it cannot install.
set -euo pipefail

if command -v javac >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: javac not found and not root to install it; install the Debian package: apt-get install openjdk-17-jdk-headless" >&2
  exit 1
fi
echo "== installing javac (apt-get install openjdk-17-jdk-headless)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless >/dev/null
if ! command -v javac >/dev/null 2>&1; then
  echo "error: apt-get install openjdk-17-jdk-headless finished but javac is not on PATH" >&2
  exit 1
fi

#!/usr/bin/env bash
# Installs PostgreSQL's server binaries (Debian package `postgresql`) when they are missing; the tests
# start their own throw-away servers on loopback (tests/integration/postgres.py), never the system one.
# Idempotent and quiet when already installed; fails loudly when it cannot install.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin and not root to install them;" \
    "install the Debian package: apt-get install postgresql" >&2
  exit 1
fi
echo "== installing PostgreSQL (apt-get install postgresql)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  echo "error: apt-get install postgresql finished but no /usr/lib/postgresql/*/bin/initdb exists" >&2
  exit 1
fi

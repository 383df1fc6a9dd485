#!/usr/bin/env bash
# Installs MariaDB's server binaries (Debian package `mariadb-server`) when they are missing; the tests
# start their own throw-away servers on loopback (tests/integration/mariadb.py), never the system one.
# Idempotent and quiet when already installed; fails loudly when it cannot install.
set -euo pipefail

if [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: MariaDB server binaries (/usr/sbin/mariadbd, mariadb-install-db) not found and not root to" \
    "install them; install the Debian package: apt-get install mariadb-server" >&2
  exit 1
fi
echo "== installing MariaDB (apt-get install mariadb-server)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends mariadb-server >/dev/null
if [ ! -x /usr/sbin/mariadbd ] || ! command -v mariadb-install-db >/dev/null; then
  echo "error: apt-get install mariadb-server finished but /usr/sbin/mariadbd or mariadb-install-db is missing" >&2
  exit 1
fi

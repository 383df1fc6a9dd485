#!/usr/bin/env bash
# A throw-away PostgreSQL server on 127.0.0.1 with logical decoding on (wal_level=logical), superuser
# `postgres` without password (trust, loopback only): for trying the pipeline, never for data you keep.
# Needs the Debian package `postgresql` (scripts/ensure_postgres.sh installs it).
#
#   scripts/postgres.sh start DIR [--port P]   # prints the port
#   scripts/postgres.sh stop DIR
#
# See docs/postgres-debezium-kafka.md and scripts/pg_server.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/pg_server.py" "$@"

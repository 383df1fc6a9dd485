#!/usr/bin/env bash
# Kafka Connect (standalone) with Debezium's PostgreSQL connector, JsonConverter for keys and values,
# from the jars on Maven Central (fetched once into ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven).
#
#   scripts/connect.sh fetch
#   scripts/connect.sh start DIR --bootstrap HOST:PORT --connector CONNECTOR.properties [--schemas true|false]
#   scripts/connect.sh stop DIR
#
# See docs/postgres-debezium-kafka.md and scripts/pipeline_components.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if [ "${1:-}" = "fetch" ]; then
  exec "$python" "$here/pipeline_components.py" fetch connect
fi
exec "$python" "$here/pipeline_components.py" connect "$@"

#!/usr/bin/env bash
# A one-node Apache Kafka 4.x broker (KRaft) on 127.0.0.1, from its jars on Maven Central (fetched
# once into ${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven; needs java 17+ and mvn).
#
#   scripts/kafka.sh fetch                 # only fetch the jars
#   scripts/kafka.sh start DIR [--port P]  # start in the background, data in DIR; prints host:port
#   scripts/kafka.sh stop DIR
#
# See docs/postgres-debezium-kafka.md and scripts/pipeline_components.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
if [ "${1:-}" = "fetch" ]; then
  exec "$python" "$here/pipeline_components.py" fetch kafka
fi
exec "$python" "$here/pipeline_components.py" kafka "$@"

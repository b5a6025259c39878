#!/usr/bin/env bash
# The test suite, on a fresh Debian machine with the Rust toolchain: installs the system
# packages the build and tests need when they are missing, starts a Kafka-protocol broker
# for the Kafka end-to-end test, runs `cargo test --workspace`, stops the broker.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

if [ -x scripts/kafka-broker.sh ] && [ -z "${SPILLWAY_KAFKA_BROKER:-}" ]; then
  # Port 19092 unless another program holds it (then any free port).
  port="${SPILLWAY_KAFKA_PORT:-19092}"
  if ! scripts/kafka-broker.sh status >/dev/null 2>&1 \
    && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  fi
  export SPILLWAY_KAFKA_PORT="$port"
  scripts/kafka-broker.sh start
  trap 'scripts/kafka-broker.sh stop' EXIT
  export SPILLWAY_KAFKA_BROKER="127.0.0.1:$port"
fi

cargo test --workspace "$@"

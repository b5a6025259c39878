#!/usr/bin/env bash
# The test suite, on a fresh Debian machine with the Rust toolchain: installs the system
# packages the build and tests need when they are missing, starts a Kafka-protocol broker
# for the Kafka end-to-end test, builds the C conformance client, installs paho-mqtt into
# the tests' venv (the MQTT persistent-session test), runs `cargo test
# --workspace`, stops the broker.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
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

# The independent C client written from core/PROTOCOL.md (tests/c/conformance.c), built
# with the system C compiler; tests/tests/conformance_c.rs runs it against the gateway.
mkdir -p target/c
"${CC:-cc}" -std=c99 -Wall -Wextra -pedantic -Werror -O2 -o target/c/conformance tests/c/conformance.c
export SPILLWAY_C_CONFORMANCE="$PWD/target/c/conformance"

# paho-mqtt for the MQTT listener's persistent-session test, in the tests' own venv (pinned
# by hash); tests/tests/mqtt.rs finds it through SPILLWAY_TEST_PYTHON.
if [ -z "${SPILLWAY_TEST_PYTHON:-}" ]; then
  venv="${SPILLWAY_TOOLS_DIR:-$PWD/target/tools}/test-venv"
  if ! "$venv/bin/python" -c 'import paho.mqtt.client' >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes \
      -r /dev/stdin <<< "paho-mqtt==2.2.0 --hash=sha256:3243630f7c2b05f71d1de8c6f59865eb04d3a59ae8c866e92377faed6753db4d"
  fi
  export SPILLWAY_TEST_PYTHON="$venv/bin/python"
fi

cargo test --workspace "$@"

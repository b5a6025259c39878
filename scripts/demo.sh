#!/usr/bin/env bash
# The Spillway demo, from a fresh clone: installs the Debian packages the build needs when
# they are missing, builds every binary in release mode, then runs `spillway-demo` (real
# sensor data over a serial pty and TCP into a gateway that is SIGKILLed, drained by a
# bridge that is SIGKILLed too, verified end to end) and exits with its exit code:
# 0 passed, 1 a check failed, 2 usage error, 3 the scenario could not run.
# Arguments are passed to spillway-demo (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."

# librdkafka (the bridge's Kafka sink) is built from source: C and C++ compilers, make,
# cmake and the libcurl headers.
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if ! command -v cc >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1 ||
  ! command -v make >/dev/null 2>&1; then
  need+=(build-essential)
fi
if ! dpkg -s libcurl4-openssl-dev >/dev/null 2>&1; then
  need+=(libcurl4-openssl-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "demo.sh: no apt-get here; install the equivalents of: ${need[*]}" >&2
    exit 2
  fi
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "demo.sh: need root or sudo to install: ${need[*]}" >&2
    exit 2
  fi
  echo "installing: ${need[*]}"
  "${as_root[@]}" apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "demo.sh: cargo not found; install the Rust toolchain first (https://rustup.rs)" >&2
  exit 2
fi

echo "building: cargo build --release --bins"
start=$SECONDS
cargo build --release --bins
echo "built in $((SECONDS - start)) s"
echo

exec "${CARGO_TARGET_DIR:-target}/release/spillway-demo" "$@"

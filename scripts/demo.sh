#!/usr/bin/env bash
# The Spillway demo, from a fresh clone: installs the Debian packages the build needs when
# they are missing, builds every binary in release mode, then runs `spillway-demo` (real
# sensor data over a serial pty, TCP and MQTT into a gateway that is SIGKILLed, drained by a
# bridge that is SIGKILLed too, verified end to end) and exits with its exit code:
# 0 passed, 1 a check failed, 2 usage error, 3 the scenario could not run.
# Arguments are passed to spillway-demo (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

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

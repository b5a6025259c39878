#!/usr/bin/env bash
# The gateway on ARM Linux: builds `spillway` as a static binary for 64-bit ARM
# (aarch64-unknown-linux-musl, linked by rust-lld) and 32-bit ARM
# (armv7-unknown-linux-gnueabihf, linked statically by Debian's cross gcc; see
# .cargo/config.toml), then runs a subset of the end-to-end tests of tests/ with each ARM
# binary under qemu-user (SPILLWAY_BIN + SPILLWAY_RUNNER); the host side (test clients,
# `spillway-bridge`) stays x86-64. The subset covers durable publish by
# `spillway-bridge publish`, kill -9 and restart with no acknowledged record lost, a drain,
# `spillway inspect` and a clean stop on SIGTERM.
#
# Usage: scripts/cross-test.sh [TARGET...]   (default: both targets)
# Environment: SPILLWAY_KILL_LOOPS (kill -9 rounds of the durable publish test, default 5
# here).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

scripts/install-deps.sh

declare -A runner=(
  [aarch64-unknown-linux-musl]=qemu-aarch64
  [armv7-unknown-linux-gnueabihf]=qemu-arm
)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(aarch64-unknown-linux-musl armv7-unknown-linux-gnueabihf)

# The end-to-end tests that make up the ARM check (test target: names).
gateway_tests=(
  sigkill_during_durable_publishing_loses_nothing_acknowledged
  inspect_after_a_crash_is_not_corruption
  sigterm_is_clean_and_image_is_protected
)
bridge_tests=(
  publish_drain_tail_status
  publish_survives_a_gateway_kill_without_duplicates
)

for target in "${targets[@]}"; do
  [ -n "${runner[$target]:-}" ] || { echo "cross-test: unknown target $target" >&2; exit 2; }
  echo "cross-test: building spillway for $target"
  cargo build --release --quiet -p spillway-firmware --bin spillway --target "$target"
  bin="target/$target/release/spillway"
  # Static: no program interpreter (dynamic loader) and no shared-library dependencies.
  if readelf -l "$bin" | grep -q 'Requesting program interpreter' ||
    readelf -d "$bin" | grep -q '(NEEDED)'; then
    echo "cross-test: $bin is not statically linked" >&2
    readelf -ld "$bin" | grep -E 'interpreter|NEEDED' >&2
    exit 1
  fi
  echo "cross-test: $bin: $(stat -c %s "$bin") bytes, static, $(readelf -h "$bin" | sed -n 's/ *Machine: *//p')"
done

# The test programs and the host's spillway-bridge, built once for all targets.
cargo test --quiet -p spillway-tests --test gateway --test bridge --no-run
cargo build --quiet -p spillway-bridge --bin spillway-bridge

for target in "${targets[@]}"; do
  bin="$PWD/target/$target/release/spillway"
  echo "cross-test: end-to-end tests with $target under ${runner[$target]}"
  "${runner[$target]}" "$bin" --version
  start=$SECONDS
  SPILLWAY_BIN="$bin" SPILLWAY_RUNNER="${runner[$target]}" \
    SPILLWAY_KILL_LOOPS="${SPILLWAY_KILL_LOOPS:-5}" \
    cargo test --quiet -p spillway-tests --test gateway -- --exact "${gateway_tests[@]}"
  SPILLWAY_BIN="$bin" SPILLWAY_RUNNER="${runner[$target]}" \
    cargo test --quiet -p spillway-tests --test bridge -- --exact "${bridge_tests[@]}"
  echo "cross-test: $target passed in $((SECONDS - start)) s"
done

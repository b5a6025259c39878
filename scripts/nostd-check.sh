#!/usr/bin/env bash
# Proves that spillway-core and spillway-firmware build and run without std: builds the
# freestanding check in tests/nostd-check (its own workspace) three times, plain, with the
# `defmt` feature (DEFMT_LOG=trace, so every log call is compiled in) and with the
# `compression` feature (LZ4 batches through a scratch buffer, no alloc), runs each and
# requires exit code 0. A std leak fails the build with E0152; a failed check exits with the
# code of its `Fail` variant in tests/nostd-check/src/main.rs.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

manifest=tests/nostd-check/Cargo.toml
bin=tests/nostd-check/target/debug/spillway-nostd-check

run_variant() {
    local name=$1
    shift
    local start=$SECONDS
    if ! "$@"; then
        echo "nostd-check [$name]: FAIL (build)"
        return 1
    fi
    local code=0
    "$bin" || code=$?
    if [ "$code" -ne 0 ]; then
        echo "nostd-check [$name]: FAIL (exit code $code, see enum Fail in tests/nostd-check/src/main.rs)"
        return 1
    fi
    echo "nostd-check [$name]: ok (built and ran in $((SECONDS - start)) s)"
}

run_variant plain cargo build --quiet --locked --manifest-path "$manifest"
run_variant defmt env DEFMT_LOG=trace \
    cargo build --quiet --locked --manifest-path "$manifest" --features defmt
run_variant compression cargo build --quiet --locked --manifest-path "$manifest" --features compression

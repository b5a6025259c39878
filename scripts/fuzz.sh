#!/usr/bin/env bash
# Fuzzing of Spillway's input decoders (the cargo-fuzz crate in fuzz/, its own workspace).
#
#   scripts/fuzz.sh smoke [SECONDS]   every target for a fixed number of executions
#                                     with a fixed seed (so a run here and in CI tries the
#                                     same inputs), at most SECONDS each (default 60),
#                                     without a sanitizer, from the committed seeds, in a
#                                     throwaway corpus; what CI runs (.ci/run)
#   scripts/fuzz.sh long [RUNS] [TARGET...]
#                                     each target (default: all) for RUNS executions
#                                     (default 10000000) under AddressSanitizer (leak
#                                     detection on), growing fuzz/corpus/TARGET; hours
#
# Targets: wire_gateway (frame decoder + Gateway on a simulated flash), lines (the line
# splitter), mount_image (damaged images), config_toml (the gateway's config file),
# bridge_reply (the bridge's reply decoder). A crash stops the run with exit code 1 and
# leaves its input in fuzz/artifacts/TARGET/; replay it with
# `cargo fuzz run -s none TARGET fuzz/artifacts/TARGET/crash-...` (in fuzz/), then add a
# regression test to `cargo test` of the crate it concerns.
#
# Builds on the pinned stable toolchain: AddressSanitizer needs RUSTC_BOOTSTRAP=1 (set
# here for `long`). Installs cargo-fuzz with `cargo install --locked` when it is missing.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/../fuzz"

TARGETS=(wire_gateway lines mount_image config_toml bridge_reply)
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi

mode="${1:-smoke}"
case "$mode" in
smoke)
    secs="${2:-60}"
    # Executions per target: together about 1 minute on one core of a 2-core machine.
    declare -A SMOKE_RUNS=([wire_gateway]=90000 [lines]=180000 [mount_image]=90000
        [config_toml]=60000 [bridge_reply]=1500000)
    start=$SECONDS
    cargo fuzz build -s none
    echo "fuzz smoke: built in $((SECONDS - start)) s"
    scratch="$(mktemp -d)"
    # The config target's files, in RAM where there is some.
    SPILLWAY_FUZZ_TMP="$(mktemp -d -p "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")")"
    export SPILLWAY_FUZZ_TMP
    trap 'rm -rf "$scratch" "$SPILLWAY_FUZZ_TMP"' EXIT
    for t in "${TARGETS[@]}"; do
        mkdir -p "$scratch/$t"
        seeds=()
        [ -d "seeds/$t" ] && seeds=("seeds/$t")
        if ! cargo fuzz run -s none "$t" "$scratch/$t" "${seeds[@]}" -- \
            -seed=1 -runs="${SMOKE_RUNS[$t]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=1024 \
            >"$scratch/$t.log" 2>&1; then
            tail -n 40 "$scratch/$t.log"
            echo "fuzz smoke: $t FAILED (input in fuzz/artifacts/$t/)"
            exit 1
        fi
        echo "fuzz smoke: $t ok, $(grep -o 'Done [0-9]* runs' "$scratch/$t.log" | tail -n 1 | cut -d' ' -f2) runs"
    done
    echo "fuzz smoke: all targets ok in $((SECONDS - start)) s"
    ;;
long)
    runs="${2:-10000000}"
    shift $(($# < 2 ? $# : 2))
    [ "$#" -gt 0 ] && TARGETS=("$@")
    export RUSTC_BOOTSTRAP=1
    SPILLWAY_FUZZ_TMP="$(mktemp -d -p "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")")"
    export SPILLWAY_FUZZ_TMP
    trap 'rm -rf "$SPILLWAY_FUZZ_TMP"' EXIT
    cargo fuzz build
    for t in "${TARGETS[@]}"; do
        mkdir -p "corpus/$t"
        seeds=()
        [ -d "seeds/$t" ] && seeds=("seeds/$t")
        start=$SECONDS
        cargo fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
            -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        echo "fuzz long: $t ok, $runs runs in $((SECONDS - start)) s"
    done
    ;;
*)
    echo "usage: scripts/fuzz.sh smoke [SECONDS] | long [RUNS] [TARGET...]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The Spillway demo, from a fresh clone: installs the Debian packages the build needs when
# they are missing, builds every binary in release mode, then runs `spillway-demo` (real
# sensor data over a serial pty, TCP and MQTT into a gateway that is SIGKILLed, drained by a
# bridge that is SIGKILLed too, verified end to end) and exits with its exit code:
# 0 passed, 1 a check failed, 2 usage error, 3 the scenario could not run.
# Arguments are passed to spillway-demo; -h/--help prints this and, once it is built,
# spillway-demo's own options (nothing is installed or built for it).
set -euo pipefail
cd "$(dirname "$0")/.."
case " $* " in
*" -h "* | *" --help "*)
    sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"
    demo="${CARGO_TARGET_DIR:-target}/release/spillway-demo"
    if [ -x "$demo" ]; then
        echo
        "$demo" --help
    else
        echo "(spillway-demo's options: after the first run, $demo --help)"
    fi
    exit 0
    ;;
esac

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

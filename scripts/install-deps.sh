#!/usr/bin/env bash
# Installs the Debian packages Spillway's build and tests need, when they are missing:
# C/C++ compilers (and the ARM cross compilers), make, cmake, pkg-config and the libcurl
# and OpenSSL headers (librdkafka, the bridge's Kafka client, is built from source with
# TLS), socat, stunnel4 (TLS in front of the test broker, for the Kafka-over-TLS test),
# python3-venv (the test broker's installer), mosquitto-clients (`mosquitto_pub`: the MQTT
# listener's tests and the demo).
# Extra package names on the command line are installed too, e.g. `mosquitto` for the
# benchmarks. Uses sudo only when not root. Does nothing when everything is there.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if ! command -v cc >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1 ||
  ! command -v make >/dev/null 2>&1; then
  need+=(build-essential)
fi
dpkg -s libcurl4-openssl-dev >/dev/null 2>&1 || need+=(libcurl4-openssl-dev)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v socat >/dev/null 2>&1 || need+=(socat)
command -v stunnel4 >/dev/null 2>&1 || need+=(stunnel4)
command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
command -v qemu-system-arm >/dev/null 2>&1 || need+=(qemu-system-arm)
command -v arm-linux-gnueabihf-gcc >/dev/null 2>&1 || need+=(gcc-arm-linux-gnueabihf)
command -v aarch64-linux-gnu-strip >/dev/null 2>&1 || need+=(binutils-aarch64-linux-gnu)
# The C and assembly of `ring` (TLS) in the static aarch64 gateway (.cargo/config.toml).
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v dpkg-shlibdeps >/dev/null 2>&1 || need+=(dpkg-dev)
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done

# Rust cross targets: rustup adds those of rust-toolchain.toml when it installs the
# toolchain; an already installed toolchain may lack them.
if command -v rustup >/dev/null 2>&1; then
  (
    cd "$(dirname "$0")/.."
    installed="$(rustup target list --installed 2>/dev/null || true)"
    for target in $(sed -n 's/^ *"\([a-z0-9_]*-[a-z0-9_-]*\)",\{0,1\} *$/\1/p' rust-toolchain.toml); do
      grep -qx "$target" <<<"$installed" || rustup target add "$target"
    done
  )
fi

[ ${#need[@]} -gt 0 ] || exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: no apt-get here; install the equivalents of: ${need[*]}" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: need root or sudo to install: ${need[*]}" >&2
  exit 2
fi
echo "install-deps: installing ${need[*]}"
"${as_root[@]}" apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"

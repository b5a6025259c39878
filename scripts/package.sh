#!/usr/bin/env bash
# What a user downloads, in target/packages/:
# - `spillway-VERSION-TARGET`: the gateway as a static, stripped binary for x86-64
#   (x86_64-unknown-linux-gnu, +crt-static), 64-bit ARM (aarch64-unknown-linux-musl) and
#   32-bit ARM (armv7-unknown-linux-gnueabihf, +crt-static); cross linkers in
#   .cargo/config.toml;
# - `spillway_VERSION_ARCH.deb` for amd64, arm64 and armhf: /usr/bin/spillway, the systemd
#   unit (packaging/spillway.service) and /etc/spillway/spillway.toml (a conffile;
#   listeners on loopback only);
# - `spillway-bridge_VERSION_amd64.deb`: /usr/bin/spillway-bridge (with the Kafka sink),
#   its unit (packaging/spillway-bridge.service) and /etc/spillway/bridge.toml, its
#   shared-library dependencies declared by dpkg-shlibdeps;
# - SHA256SUMS over all of them.
# Needs dpkg-deb, dpkg-shlibdeps and the cross binutils (scripts/install-deps.sh).
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
out=target/packages
rm -rf "$out"
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

declare -A deb_arch=(
  [x86_64-unknown-linux-gnu]=amd64
  [aarch64-unknown-linux-musl]=arm64
  [armv7-unknown-linux-gnueabihf]=armhf
)
declare -A strip_tool=(
  [x86_64-unknown-linux-gnu]=strip
  [aarch64-unknown-linux-musl]=aarch64-linux-gnu-strip
  [armv7-unknown-linux-gnueabihf]=arm-linux-gnueabihf-strip
)
targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-musl armv7-unknown-linux-gnueabihf)
# x86-64 static through glibc's static libraries (the other two get theirs from
# .cargo/config.toml or from musl). Only with an explicit --target: for a host build these
# flags would reach the proc macros too.
x86_static=(env CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static")

# Installed-Size (KiB) of a package tree, DEBIAN/ excluded.
installed_size() { du -sk --exclude=DEBIAN "$1" | cut -f1; }

# build_deb DIR: writes DIR's package into $out, named as dpkg-deb names it.
build_deb() {
  find "$1" -type d -exec chmod 0755 {} +
  dpkg-deb --root-owner-group -Zxz --build "$1" "$out/" >/dev/null
}

# Writes the maintainer scripts of a package with the systemd unit UNIT: reload systemd's
# units after install and removal; the unit is neither enabled nor started (edit the config
# first, then `systemctl enable --now UNIT`).
maintainer_scripts() {
  local dir=$1 unit=$2
  cat >"$dir/DEBIAN/postinst" <<SCRIPT
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
if [ "\$1" = configure ] && [ -n "\$2" ] && [ -d /run/systemd/system ]; then
  systemctl try-restart $unit || true
fi
SCRIPT
  cat >"$dir/DEBIAN/prerm" <<SCRIPT
#!/bin/sh
set -e
if [ "\$1" = remove ] && [ -d /run/systemd/system ]; then systemctl stop $unit || true; fi
SCRIPT
  cat >"$dir/DEBIAN/postrm" <<SCRIPT
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SCRIPT
  chmod 0755 "$dir/DEBIAN/postinst" "$dir/DEBIAN/prerm" "$dir/DEBIAN/postrm"
}

printf '%-32s %12s %12s\n' target "binary" "stripped"
for target in "${targets[@]}"; do
  "${x86_static[@]}" cargo build --release --quiet -p spillway-firmware --bin spillway \
    --target "$target"
  built="target/$target/release/spillway"
  if readelf -l "$built" | grep -q 'Requesting program interpreter' ||
    readelf -d "$built" | grep -q '(NEEDED)'; then
    echo "package: $built is not statically linked" >&2
    exit 1
  fi
  bin="$out/spillway-$version-$target"
  "${strip_tool[$target]}" -o "$bin" "$built"
  printf '%-32s %12s %12s\n' "$target" "$(stat -c %s "$built")" "$(stat -c %s "$bin")"

  arch=${deb_arch[$target]}
  root="$stage/spillway_$arch"
  install -D -m 0755 "$bin" "$root/usr/bin/spillway"
  install -D -m 0644 packaging/spillway.toml "$root/etc/spillway/spillway.toml"
  mkdir -p "$root/lib/systemd/system" "$root/DEBIAN"
  sed 's|^ExecStart=/usr/local/bin/spillway |ExecStart=/usr/bin/spillway |' \
    packaging/spillway.service >"$root/lib/systemd/system/spillway.service"
  grep -q '^ExecStart=/usr/bin/spillway ' "$root/lib/systemd/system/spillway.service"
  echo /etc/spillway/spillway.toml >"$root/DEBIAN/conffiles"
  cat >"$root/DEBIAN/control" <<CONTROL
Package: spillway
Version: $version
Architecture: $arch
Maintainer: Spillway maintainers <spillway@example.invalid>
Section: net
Priority: optional
Installed-Size: $(installed_size "$root")
Description: store-and-forward message queue for edge gateways
 The Spillway gateway: clients publish records over TCP, Unix sockets or serial
 ports; records acknowledged as durable are kept on a flash-style log image until a
 bridge drains them, in order, once. Statically linked; runs as spillway.service.
CONTROL
  maintainer_scripts "$root" spillway.service
  build_deb "$root"
done

# The bridge, x86-64 only: its Kafka client (librdkafka, C) is built by cmake for the host.
cargo build --release --quiet -p spillway-bridge --bin spillway-bridge
root="$stage/spillway-bridge_amd64"
install -D -m 0755 target/release/spillway-bridge "$root/usr/bin/spillway-bridge"
strip "$root/usr/bin/spillway-bridge"
install -D -m 0644 packaging/spillway-bridge.toml "$root/etc/spillway/bridge.toml"
install -D -m 0644 packaging/spillway-bridge.service \
  "$root/lib/systemd/system/spillway-bridge.service"
mkdir -p "$root/DEBIAN"
echo /etc/spillway/bridge.toml >"$root/DEBIAN/conffiles"
# Shared libraries: dpkg-shlibdeps reads the binary's NEEDED entries and the installed
# packages' symbols files (it wants a debian/control to exist).
mkdir -p "$stage/shlibs/debian"
printf 'Source: spillway\n\nPackage: spillway-bridge\nArchitecture: amd64\n' \
  >"$stage/shlibs/debian/control"
depends=$(cd "$stage/shlibs" && dpkg-shlibdeps -O "$root/usr/bin/spillway-bridge" |
  sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "package: no shared-library dependencies found" >&2; exit 1; }
cat >"$root/DEBIAN/control" <<CONTROL
Package: spillway-bridge
Version: $version
Architecture: amd64
Maintainer: Spillway maintainers <spillway@example.invalid>
Section: net
Priority: optional
Depends: $depends
Installed-Size: $(installed_size "$root")
Description: drains Spillway gateways into files or Kafka
 spillway-bridge drains a Spillway gateway's log into NDJSON files or a Kafka topic,
 with checkpoints that resume exactly; it also publishes, tails and reports status.
 Runs as spillway-bridge.service.
CONTROL
maintainer_scripts "$root" spillway-bridge.service
build_deb "$root"

(cd "$out" && sha256sum -- * >SHA256SUMS)
echo "package: $out:"
ls -l "$out"

#!/usr/bin/env bash
# The microcontroller checks, under QEMU's `mps2-an386` (Cortex-M4): builds the firmware
# images of firmware/boards/mps2-an386 (their own workspace) and
#  - serial: boots the gateway image with UART0 on a TCP socket of QEMU's, publishes
#    SPILLWAY_MCU_RECORDS records (default 500) into it with `spillway-bridge publish
#    --ack durable`, drains them with `spillway-bridge drain --once` over the same link
#    into the file sink and checks that every record arrived once, in order, at
#    consecutive offsets.
# Needs qemu-system-arm (scripts/install-deps.sh installs it) and the
# thumbv7em-none-eabihf target (rust-toolchain.toml names it). Exits non-zero on the
# first failed check. Logs of the emulated board (defmt frames, semihosting stderr) are
# kept in target/mcu/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

board=firmware/boards/mps2-an386
elf_dir=$root/$board/target/thumbv7em-none-eabihf/release
work=$root/target/mcu
records=${SPILLWAY_MCU_RECORDS:-500}
mkdir -p "$work"

command -v qemu-system-arm >/dev/null 2>&1 || scripts/install-deps.sh qemu-system-arm
rustup target list --installed 2>/dev/null | grep -qx thumbv7em-none-eabihf ||
  rustup target add thumbv7em-none-eabihf

qemu=(qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic -monitor none
  -semihosting-config enable=on,target=native)

start=$SECONDS
# The board's .cargo/config.toml (target, linker scripts) applies from its directory.
(cd "$board" && cargo build --release --locked --quiet)
cargo build --quiet -p spillway-bridge
bridge=$root/target/debug/spillway-bridge
echo "mcu: images and bridge built in $((SECONDS - start)) s"

qemu_pid=
cleanup() {
  if [ -n "$qemu_pid" ]; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until file $1 has a line matching $2 (at most $3 s) or QEMU exits.
wait_for_line() {
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$1" 2>/dev/null; do
    if ! kill -0 "$qemu_pid" 2>/dev/null; then
      echo "mcu: QEMU exited before \"$2\"; its stderr:" >&2
      cat "$1" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "mcu: no \"$2\" within $3 s" >&2
      return 1
    fi
    sleep 0.1
  done
}

# ----- serial: publish into the emulated gateway, drain it back -------------------------
serial_test() {
  local t0=$SECONDS port dir=$work/serial
  rm -rf "$dir"
  mkdir -p "$dir"
  port=$(free_port)
  "${qemu[@]}" -serial "tcp:127.0.0.1:$port,server,nowait" -kernel "$elf_dir/gateway" \
    >"$dir/defmt.bin" 2>"$dir/semihosting.log" &
  qemu_pid=$!
  wait_for_line "$dir/semihosting.log" '^gateway: serving UART0' 30

  python3 - "$records" >"$dir/input.txt" <<'PY'
import sys
for i in range(int(sys.argv[1])):
    print(f"sst={18 + (i % 300) / 100:.2f}C seq={i:06d}")
PY
  local gw=tcp://127.0.0.1:$port
  local tp=$SECONDS
  "$bridge" publish --gateway "$gw" --topic buoy/sst --ack durable --producer-id 81 \
    --retry-for 20s "$dir/input.txt" >"$dir/publish.log" 2>&1 || {
    echo "mcu serial: publish failed:" >&2
    cat "$dir/publish.log" >&2
    return 1
  }
  echo "mcu serial: publish took $((SECONDS - tp)) s"; tp=$SECONDS
  "$bridge" drain --gateway "$gw" --sink "file:$dir/out" --state "$dir/bridge.redb" --once \
    --retry-for 20s --progress off >"$dir/drain.log" 2>&1 || {
    echo "mcu serial: drain failed:" >&2
    cat "$dir/drain.log" >&2
    return 1
  }
  echo "mcu serial: drain took $((SECONDS - tp)) s"
  python3 - "$dir/input.txt" "$dir/out" <<'PY'
import json, pathlib, sys
want = pathlib.Path(sys.argv[1]).read_text().splitlines()
rows = []
for f in sorted(pathlib.Path(sys.argv[2]).rglob("*")):
    if f.is_file():
        rows += [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
rows.sort(key=lambda r: r["offset"])
got = [r["payload"] for r in rows]
offsets = [r["offset"] for r in rows]
assert all(r["topic"] == "buoy/sst" for r in rows), "a record with another topic"
assert len(set(offsets)) == len(offsets), "an offset drained twice"
assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, \
    "offsets not consecutive"
if got != want:
    missing = len([w for w in want if w not in set(got)])
    sys.exit(f"drained {len(got)} records, published {len(want)}; {missing} missing, "
             f"first difference at {next(i for i, (a, b) in enumerate(zip(got + [None] * len(want), want)) if a != b)}")
print(f"{len(got)} records, offsets {offsets[0]}..{offsets[-1]}, each once and in order")
PY
  cleanup
  qemu_pid=
  echo "mcu serial: $records records published durable over the UART and drained back in $((SECONDS - t0)) s"
}

serial_test
echo "mcu: all checks passed in $((SECONDS - start)) s"

#!/usr/bin/env bash
# The microcontroller checks, under QEMU's `mps2-an386` (Cortex-M4): builds the firmware
# images of firmware/boards/mps2-an386 (their own workspace) and
#  - serial: boots the gateway image with UART0 on a TCP socket of QEMU's, publishes
#    SPILLWAY_MCU_RECORDS records (default 500) into it with `spillway-bridge publish
#    --ack durable`, drains them with `spillway-bridge drain --once` over the same link
#    into the file sink and checks that every record arrived once, in order, at
#    consecutive offsets.
#  - powercut: runs the core's power-cut sweep on a subset of its cut points (one variant
#    per full policy, over 1,000 cuts, each run checked by the same oracle as the host's
#    core/tests/powercut.rs, shared through core/tests/sweep/scenario.rs) on the Cortex-M4
#    image, and requires its summary lines (cuts, mounts checked, a digest of every run's
#    counts) to equal those of the host test of the same seeds
#    (`sweep_subset_matching_the_microcontroller_build`).
#  - footprint: sizes of the core alone (bin `core-only`) and of core + gateway (bin
#    `gateway`) at opt-level "s" (profile footprint-s) and "z" (profile footprint-z), 4 KiB
#    RAM buffer each: .text, .rodata, .data + .bss, and the stack high water each image
#    measured under QEMU (the gateway's while serving a short publish and drain), and the
#    core's peer built the same way: `sequential-storage`'s queue (bin `seqstor-queue`,
#    the same records pushed, read back, read again after a rebuild, popped). The
#    footprint profiles are the release ones without overflow checks (what a release
#    build ships); the serial and power-cut checks above run the release images, with
#    them, whose gateway is printed below the table. Printed against the goal (flash ≤ 48
#    KiB, RAM ≤ 16 KiB); not a failure when over.
# Needs qemu-system-arm (scripts/install-deps.sh installs it) and the
# thumbv7em-none-eabihf target (rust-toolchain.toml names it). Exits non-zero on the
# first failed check. Logs of the emulated board (defmt frames, semihosting stderr) are
# kept in target/mcu/.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
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
(cd "$board" && cargo build --release --locked --quiet &&
  for profile in footprint-s footprint-z; do
    cargo build --profile $profile --locked --quiet --bin core-only --bin gateway \
      --bin seqstor-queue
  done)
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
# serial_test IMAGE RECORDS DIR
serial_test() {
  local image=$1 records=$2 dir=$3
  local t0=$SECONDS port
  rm -rf "$dir"
  mkdir -p "$dir"
  port=$(free_port)
  "${qemu[@]}" -serial "tcp:127.0.0.1:$port,server,nowait" -kernel "$image" \
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

# ----- powercut: the core's sweep on the Cortex-M4, compared with the host -------------
powercut_test() {
  local t0=$SECONDS dir=$work/powercut
  rm -rf "$dir"
  mkdir -p "$dir"
  # At most 2 minutes of QEMU time (about 15 s of guest time here).
  local code=0
  timeout 120 "${qemu[@]}" -kernel "$elf_dir/powercut" \
    >"$dir/defmt.bin" 2>"$dir/semihosting.log" || code=$?
  if [ "$code" -ne 0 ]; then
    echo "mcu powercut: the Cortex-M run failed (exit $code); its report:" >&2
    cat "$dir/semihosting.log" >&2
    return 1
  fi
  # --workspace: the features of scripts/test.sh's build, so that .ci/run reuses it.
  cargo test --quiet --workspace --test powercut \
    sweep_subset_matching_the_microcontroller_build -- --nocapture >"$dir/host.log" 2>&1 || {
    echo "mcu powercut: the host test failed:" >&2
    cat "$dir/host.log" >&2
    return 1
  }
  grep '^powercut subset ' "$dir/semihosting.log" >"$dir/mcu.txt" || true
  grep '^powercut subset ' "$dir/host.log" >"$dir/host.txt" || true
  if [ ! -s "$dir/mcu.txt" ] || ! diff -u "$dir/host.txt" "$dir/mcu.txt"; then
    echo "mcu powercut: the Cortex-M sweep differs from the host's (above: host, then MCU)" >&2
    return 1
  fi
  sed 's/^/mcu powercut: /' "$dir/mcu.txt"
  echo "mcu powercut: $(grep '^powercut: ' "$dir/semihosting.log" | sed 's/^powercut: //'), equal to the host run; $((SECONDS - t0)) s"
}

# ----- footprint ------------------------------------------------------------------------
# section_bytes ELF SECTION: the size of the section, bytes (0 when absent).
section_bytes() {
  local hex
  hex=$(readelf -S -W "$1" |
    sed -n "s/.*] \\$2 *[A-Z]* *[0-9a-f]* [0-9a-f]* \\([0-9a-f]*\\) .*/\\1/p")
  echo $((16#${hex:-0}))
}

kib() {
  awk -v b="$1" 'BEGIN { printf "%.1f", b / 1024 }'
}

# footprint_row NAME OPT ELF STACK
footprint_row() {
  local vt text ro data bss flash ram
  vt=$(section_bytes "$3" .vector_table)
  text=$(section_bytes "$3" .text)
  ro=$(section_bytes "$3" .rodata)
  data=$(section_bytes "$3" .data)
  bss=$(( $(section_bytes "$3" .bss) + $(section_bytes "$3" .uninit) ))
  flash=$((vt + text + ro + data))
  ram=$((data + bss + $4))
  printf 'mcu footprint: | %-13s | %-3s | %7d | %9d | %12d | %7d | %7s KiB | %7s KiB |\n' \
    "$1" "$2" "$text" "$ro" $((data + bss)) "$4" "$(kib "$flash")" "$(kib "$ram")"
}

# image_stack ELF: runs a self-checking image (core-only, seqstor-queue), prints its stack
# high water.
image_stack() {
  local name log
  name=$(basename "$1")
  log=$work/footprint/$(basename "$(dirname "$1")")-$name.log
  timeout 60 "${qemu[@]}" -kernel "$1" >/dev/null 2>"$log" || {
    echo "mcu footprint: $name failed:" >&2
    cat "$log" >&2
    return 1
  }
  sed -n "s/^$name: ok, stack high water \\([0-9]*\\) bytes\$/\\1/p" "$log"
}

gateway_stack() {
  grep '^gateway: stack high water' "$1/semihosting.log" | tail -1 | sed 's/[^0-9]*\([0-9]*\) bytes$/\1/'
}

footprint() {
  mkdir -p "$work/footprint"
  local s_dir=$root/$board/target/thumbv7em-none-eabihf/footprint-s
  local z_dir=$root/$board/target/thumbv7em-none-eabihf/footprint-z
  # Each footprint gateway serves a short publish and drain for its stack figure.
  serial_test "$s_dir/gateway" 50 "$work/serial-fs" >/dev/null
  serial_test "$z_dir/gateway" 50 "$work/serial-fz" >/dev/null
  echo 'mcu footprint: opt-level "s" / "z", LTO fat, codegen-units 1, panic abort, overflow checks off, defmt at info'
  echo 'mcu footprint: | image         | opt | .text B | .rodata B | .data+.bss B | stack B |       flash |  RAM+stack |'
  footprint_row core-only s "$s_dir/core-only" "$(image_stack "$s_dir/core-only")"
  footprint_row core-only z "$z_dir/core-only" "$(image_stack "$z_dir/core-only")"
  footprint_row seqstor-queue s "$s_dir/seqstor-queue" "$(image_stack "$s_dir/seqstor-queue")"
  footprint_row seqstor-queue z "$z_dir/seqstor-queue" "$(image_stack "$z_dir/seqstor-queue")"
  footprint_row core+gateway s "$s_dir/gateway" "$(gateway_stack "$work/serial-fs")"
  footprint_row core+gateway z "$z_dir/gateway" "$(gateway_stack "$work/serial-fz")"
  echo "mcu footprint: goal for core + gateway: flash ≤ 48 KiB, RAM ≤ 16 KiB (4 KiB log buffer)"
  echo "mcu footprint: the tested gateway (release, opt-level \"s\", overflow checks on, serving $records records):"
  footprint_row core+gateway s "$elf_dir/gateway" "$(gateway_stack "$work/serial")"
}

serial_test "$elf_dir/gateway" "$records" "$work/serial"
powercut_test
footprint
echo "mcu: all checks passed in $((SECONDS - start)) s"

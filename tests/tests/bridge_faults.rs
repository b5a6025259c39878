//! `spillway-bridge drain` on the real binaries under storage faults, injected with the
//! `LD_PRELOAD` shim of `tests/faultfs`: an `fdatasync` of a sink file that fails with EIO
//! (its writes dropped, or kept in the page cache but not on disk), a kill -9 after it, and a
//! failed redb commit of the state file. Every record must end up in the sink exactly once,
//! in order, also after a "reboot" that shows only what reached the disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use spillway_tests::bridge::{
    publish_args, resume_offsets, sink_files, spawn_bridge_lines, wait_for_line,
};
use spillway_tests::faultfs::{Kept, faultfs_env, reboot};
use spillway_tests::gateway::{free_port, image_in};
use spillway_tests::process::ChildProcess;
use spillway_tests::wait::wait_until;
use spillway_tests::{GatewayProcess, bridge_bin, run_bridge};

const GATEWAY_ID: &str = "faults-gw";

/// A gateway on `DIR/gw.img` (4 MiB unless `extra` has `--size`) with `extra` flags: the
/// process and its URI.
fn start_gateway(dir: &Path, extra: &[&str]) -> (GatewayProcess, String) {
    let port = free_port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let mut args = image_in(dir, &["--listen", &listen, "--gateway-id", GATEWAY_ID]);
    if !extra.contains(&"--size") {
        args.extend(["--size".into(), "4M".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    (
        GatewayProcess::start(&args, 1),
        format!("tcp://127.0.0.1:{port}"),
    )
}

/// How many records [`gateway_with_records`] holds.
const N: usize = 2000;

/// A gateway on `DIR/gw.img` holding the records `t 0` to `t 1999` of topic `t`, each
/// acknowledged durable: the process and its URI.
fn gateway_with_records(dir: &Path) -> (GatewayProcess, String) {
    let (g, gw) = start_gateway(dir, &[]);
    publish(dir, &gw, "t", N);
    (g, gw)
}

fn publish(dir: &Path, gw: &str, topic: &str, n: usize) {
    publish_ack(dir, gw, topic, n, "durable");
}

fn publish_ack(dir: &Path, gw: &str, topic: &str, n: usize, ack: &str) {
    let p = dir.join(format!("{topic}.txt"));
    let text: String = (0..n).map(|i| format!("{topic} {i}\n")).collect();
    std::fs::write(&p, text).unwrap();
    let out = run_bridge(
        &[
            publish_args(gw, topic),
            vec!["--ack", ack, &p.display().to_string()],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (offset, payload) of every line of the file sink, file by file in first-offset order and
/// line by line as written (nothing sorted: order is part of what is checked). For a sink
/// no bridge is writing: every byte must belong to a whole line.
fn sink_lines(out: &Path) -> Vec<(u64, String)> {
    lines_of_sink(out, false)
}

/// [`sink_lines`] while a bridge may still be writing: a file may end in a line not yet
/// written out (its bytes after the last newline are left for a later look), and a file
/// may be renamed on rotation between listing and reading (it is then left out).
fn sink_lines_so_far(out: &Path) -> Vec<(u64, String)> {
    lines_of_sink(out, true)
}

fn lines_of_sink(out: &Path, running: bool) -> Vec<(u64, String)> {
    let mut v = Vec::new();
    for path in sink_files(out) {
        let name = path.display();
        let mut bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if running && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{name}: {e}"),
        };
        if running {
            let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            bytes.truncate(whole);
        }
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let j: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|e| {
                panic!(
                    "{name}: not a whole JSON line ({e}): {:?}",
                    String::from_utf8_lossy(line)
                )
            });
            if j.get("gap").is_some() {
                // A gap line (no offset, no payload): see `gap_lines`.
                continue;
            }
            v.push((
                j["offset"].as_u64().unwrap(),
                j["payload"].as_str().unwrap().to_string(),
            ));
        }
    }
    v
}

/// The `gap` objects of every gap line of the file sink, in file order.
fn gap_lines(out: &Path) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for path in sink_files(out) {
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let j: serde_json::Value = serde_json::from_str(line).unwrap();
            if j.get("gap").is_some() {
                assert!(
                    j.get("offset").is_none() && j.get("payload").is_none(),
                    "{j}"
                );
                v.push(j["gap"].clone());
            }
        }
    }
    v
}

/// Every record `topic i` for `i` in `0..n` exactly once, in offset order.
fn assert_exactly_once(out: &Path, topic: &str, n: usize, when: &str) {
    let lines = sink_lines(out);
    let offsets: Vec<u64> = lines.iter().map(|l| l.0).collect();
    assert_eq!(
        offsets,
        (0..n as u64).collect::<Vec<_>>(),
        "{when}: every record once, in order"
    );
    for (off, payload) in &lines {
        assert_eq!(payload, &format!("{topic} {off}"), "{when}");
    }
}

fn drain_args(gw: &str, sink: &Path, state: &Path) -> Vec<String> {
    // Small batches, about two to a group checkpoint: many fsyncs and checkpoints, each
    // after more than one batch written.
    let mut args = plain_drain_args(gw, sink, state);
    args.extend(["--max-batch-bytes", "2048", "--checkpoint-bytes", "1K"].map(String::from));
    args
}

/// `drain` of `gw` into the file sink `sink` with the state file `state`, no progress
/// output, and the default batches and checkpoints.
fn plain_drain_args(gw: &str, sink: &Path, state: &Path) -> Vec<String> {
    [
        "drain",
        "--gateway",
        gw,
        "--sink",
        &format!("file:{}", sink.display()),
        "--state",
        &state.display().to_string(),
        "--progress",
        "off",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_with_env(args: &[String], env: &[(String, String)]) -> Output {
    Command::new(bridge_bin())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "info")
        .output()
        .expect("run spillway-bridge")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `ARGS --once` with the environment `env`, which must succeed: its stderr.
fn drain_once_ok(args: &[String], env: &[(String, String)]) -> String {
    let o = run_with_env(&[args, &["--once".to_string()]].concat(), env);
    let err = text(&o);
    assert!(o.status.success(), "{err}");
    err
}

/// Starts `ARGS` with the environment `env` and kills it (SIGKILL) once it has logged a
/// line containing `needle`: every line it logged.
fn kill_9_after_line(args: &[String], env: &[(String, String)], needle: &str) -> Vec<String> {
    let (mut c, rx) = spawn_bridge_lines(args, env);
    let mut seen = Vec::new();
    wait_for_line(&rx, needle, &mut seen);
    let _ = c.kill();
    let _ = c.wait();
    seen
}

/// The `n`th fdatasync of a sink file fails with EIO; the sink cuts the file back to its
/// synced length, the drain resends from its checkpoint, and every record is in the files
/// once, in order, also after a reboot shows only what reached the disk.
fn sink_fsync_eio(kept: Kept) {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path());
    let out = dir.path().join("out");
    let state = dir.path().join("s.redb");
    let shim_state = dir.path().join("faultfs.state");
    let env = faultfs_env(".jsonl.open", &shim_state, kept, Some(5));
    let err = drain_once_ok(&drain_args(&gw, &out, &state), &env);
    assert!(err.contains("faultfs: "), "the shim fired: {err}");
    assert_exactly_once(&out, "t", N, "after the drain");
    let r = reboot(&shim_state);
    eprintln!("{kept:?}: {}", r.trim());
    assert_exactly_once(&out, "t", N, "after a reboot");
    assert!(err.contains("sink failed at offset"), "{err}");
    if kept == Kept::Kept {
        // The failed lines were still shown: cut off before the resend.
        assert!(err.contains("cut back from"), "{err}");
    }
    assert!(
        !err.contains("duplicates"),
        "no line taken for a duplicate: {err}"
    );
}

#[test]
fn sink_fsync_eio_with_dropped_pages_lands_every_record_once() {
    sink_fsync_eio(Kept::Dropped);
}

#[test]
fn sink_fsync_eio_with_kept_pages_lands_every_record_once() {
    sink_fsync_eio(Kept::Kept);
}

/// The failed fsync leaves its lines visible (kept pages) and the bridge is killed -9 right
/// after: the restarted bridge, still seeing those lines, cuts the files back to the
/// checkpoint's synced lengths before writing, so none of them is taken for a written
/// record; after a reboot every record is there once, in order.
#[test]
fn sink_fsync_eio_then_kill_9_with_kept_pages_lands_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path());
    let out = dir.path().join("out");
    let state = dir.path().join("s.redb");
    let shim_state = dir.path().join("faultfs.state");
    let env = faultfs_env(".jsonl.open", &shim_state, Kept::Kept, Some(5));
    let args = drain_args(&gw, &out, &state);
    // SIGKILL, during the resend's backoff.
    let seen = kill_9_after_line(&args, &env, "sink failed at offset");
    let visible = sink_lines(&out).len();
    assert!(seen.iter().any(|l| l.contains("faultfs: ")), "{seen:?}");
    let failed_at: u64 = seen
        .iter()
        .find_map(|l| {
            let rest = l.split("sink failed at offset ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no offset in the failure's line: {seen:?}"));

    // Restart without a reboot: the failed lines are still shown by the cache.
    let err = drain_once_ok(&args, &env);
    let resumed = resume_offsets(&err);
    eprintln!(
        "kill -9 after the failed fsync at offset {failed_at}: {visible} lines visible at the kill; the restart resumed at {resumed:?}"
    );
    // The restart resumed from a checkpoint saved before the failure.
    assert!(
        resumed.len() == 1 && resumed[0] > 0 && resumed[0] <= failed_at,
        "{err}"
    );
    assert_exactly_once(&out, "t", N, "after the restart");
    reboot(&shim_state);
    assert_exactly_once(&out, "t", N, "after a reboot");
    assert!(err.contains("cut back from"), "{err}");
    assert!(
        !err.contains("duplicates"),
        "no line taken for a duplicate: {err}"
    );
}

/// A drain run `NAME` in `dir` with its state file under the shim: its sink directory
/// `DIR/out-NAME`, its state file `DIR/NAME.redb`, the shim's own state `DIR/NAME.faultfs`,
/// and the shim's environment, in which the state file's 12th fdatasync fails with EIO and
/// its pages are `kept` or dropped.
fn state_file_fault(
    dir: &Path,
    name: &str,
    kept: Kept,
) -> (PathBuf, PathBuf, PathBuf, Vec<(String, String)>) {
    let out = dir.join(format!("out-{name}"));
    let state = dir.join(format!("{name}.redb"));
    let shim = dir.join(format!("{name}.faultfs"));
    let env = faultfs_env(&format!("{name}.redb"), &shim, kept, Some(12));
    (out, state, shim, env)
}

/// A failed fsync of the state file (a redb commit): `drain --once` exits 4 naming the
/// file; without `--once` the drain reopens it and resumes from its last durable
/// checkpoint, and every record lands once.
#[test]
fn a_failed_state_commit_exits_4_with_once_and_resumes_without() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path());
    let (out, state, _, env) = state_file_fault(dir.path(), "once", Kept::Dropped);
    let args = drain_args(&gw, &out, &state);
    let o = run_with_env(&[&args[..], &["--once".to_string()]].concat(), &env);
    let err = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("faultfs: "), "{err}");
    assert!(err.contains(&state.display().to_string()), "{err}");
    // Run again (the shim fires once per state file): it finishes the job.
    drain_once_ok(&args, &env);
    assert_exactly_once(&out, "t", N, "--once after exit 4");

    let (out, state, _, env) = state_file_fault(dir.path(), "run", Kept::Dropped);
    let mut args = drain_args(&gw, &out, &state);
    args.extend(["--consumer".into(), "second".into()]);
    args.extend(["--from".into(), "earliest".into()]);
    let (mut c, rx) = spawn_bridge_lines(&args, &env);
    let mut seen = Vec::new();
    wait_for_line(&rx, "reopened", &mut seen);
    // Done when the checkpoint reached the end (the sink's lines are all there).
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink_lines_so_far(&out).len() < N {
        assert!(Instant::now() < deadline, "{}", seen.join("\n"));
        while let Ok(l) = rx.try_recv() {
            seen.push(l);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    spillway_tests::process::signal(&c, libc::SIGTERM);
    let status = c.wait().unwrap();
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.push(l);
    }
    assert!(status.success(), "{}", seen.join("\n"));
    assert!(
        seen.iter()
            .any(|l| l.contains("resuming from its last durable checkpoint")),
        "{}",
        seen.join("\n")
    );
    assert_exactly_once(&out, "t", N, "after the reopen");
}

/// On a 256 KiB image under `--full drop-oldest`, records dropped before any bridge drained
/// are a gap with its reason and count for the first drain and in `status`; a drain started
/// with `--from earliest` has none.
#[test]
fn records_dropped_before_the_first_drain_are_reported_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = start_gateway(
        dir.path(),
        &[
            "--size",
            "256K",
            "--erase-size",
            "4096",
            "--buffer-bytes",
            "16384",
            "--full",
            "drop-oldest",
            // The records are alike: compressed, 20,000 of them would fit in the image.
            "--compression",
            "none",
        ],
    );
    let n = 20_000;
    publish_ack(dir.path(), &gw, "t", n, "buffered");

    let out = dir.path().join("out");
    let state = dir.path().join("s.redb");
    let err = drain_once_ok(&drain_args(&gw, &out, &state), &[]);
    let lines = sink_lines(&out);
    let first = lines.first().map(|l| l.0).expect("some records left");
    assert!(first > 0, "records were dropped");
    assert_eq!(lines.len() as u64, n as u64 - first, "the rest, once");
    assert!(
        err.contains(&format!("offsets 0..{first} ({first} records) are gone")),
        "{err}"
    );
    assert!(err.contains("1 gaps"), "{err}");
    // The gap is in the data too: one line before the records, in the topic's file.
    let gaps = gap_lines(&out);
    assert_eq!(
        gaps,
        vec![serde_json::json!({"from": 0, "to": first, "count": first, "reason": "dropped"})],
        "{gaps:?}"
    );
    let s = run_bridge(&[
        "status",
        "--gateway",
        &gw,
        "--state",
        &state.display().to_string(),
    ]);
    let status = String::from_utf8_lossy(&s.stdout);
    assert!(
        status.contains(&format!("gaps 1 ({first} lost)")),
        "{status}"
    );
    eprintln!("256 KiB image, {n} records: first drain reports offsets 0..{first} as a gap");

    // An explicit --from: no gap.
    let out2 = dir.path().join("out2");
    let state2 = dir.path().join("s2.redb");
    let mut args = drain_args(&gw, &out2, &state2);
    args.extend([
        "--from".into(),
        "earliest".into(),
        "--consumer".into(),
        "replay".into(),
    ]);
    let err = drain_once_ok(&args, &[]);
    assert!(err.contains("0 gaps"), "{err}");
}

/// The state file's failed commit left its pages in the cache (kept): the drain reopens the
/// state file from what is on disk, not from those pages, so after a reboot redb still opens
/// and the next drain lands every record once.
#[test]
fn a_failed_state_commit_with_kept_pages_survives_a_reboot() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path());
    let (out, state, shim, env) = state_file_fault(dir.path(), "s", Kept::Kept);
    let args = drain_args(&gw, &out, &state);
    // SIGKILL: a power cut right after.
    kill_9_after_line(&args, &env, "reopened");
    let r = reboot(&shim);
    eprintln!("state file, kept pages: {}", r.trim());
    let err = drain_once_ok(&args, &[]);
    // The drain after the reboot resumed from a checkpoint that reached the disk.
    let resumed = resume_offsets(&err);
    eprintln!("resumed at {resumed:?} after the reboot");
    assert!(resumed.len() == 1 && resumed[0] > 0, "{err}");
    assert_exactly_once(&out, "t", N, "after a reboot and a drain");
}

/// A tmpfs of `bytes` mounted on a new directory `at` for the life of the value (lazily
/// unmounted on drop); `None` where this process may not mount one (not root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, bytes: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// The sink's disk fills up (a 1 MiB tmpfs for about 5 MB of lines) while a downstream
/// job takes every closed file away: with the default group checkpoints (up to 16 MiB of
/// payload or 1 s), a group larger than the space left failed whole, again and again, and
/// no file was ever closed for the job to take. After a failure the drain now checkpoints
/// one batch at a time until its resends are through, so it gets as far as the space
/// allows, closes the full files, and finishes once the job has made room: every record
/// once, in order.
#[test]
fn a_full_sink_disk_drains_as_files_are_taken_away() {
    full_sink_disk_drains(&["--rotate-bytes", "64K"]);
}

/// As [`a_full_sink_disk_drains_as_files_are_taken_away`], with files rotated by time
/// only (`--rotate-interval 1s`, a checkpoint per fetch): the first file fills the disk,
/// and once it is due for rotation every record in it is below the checkpoint. It kept
/// its open name for good, as only a checkpoint (which no write could reach) or an idle
/// drain closed it; a failed write now closes the files its checkpoint covers.
#[test]
fn a_full_sink_disk_with_rotate_interval_drains_as_files_are_taken_away() {
    full_sink_disk_drains(&["--rotate-interval", "1s", "--checkpoint-interval", "0"]);
}

/// As [`a_full_sink_disk_drains_as_files_are_taken_away`], with files rotated at the
/// whole disk (`--rotate-bytes 1M` on 1 MiB): the batch in which a file reaches its size
/// and the next one begins fails on the next file's writes, and resent whole it failed
/// for ever, cut off the full file each time, so that file never closed and the job never
/// had anything to take. A failure now closes every open file the checkpoint covers (cut
/// back to it), so the full file, holding the disk's last page, is closed although the
/// next file never gets a line, and the drain goes on once the job has taken it.
#[test]
fn a_full_sink_disk_with_files_as_large_as_it_drains_as_files_are_taken_away() {
    full_sink_disk_drains(&["--rotate-bytes", "1M"]);
}

/// A drain with `extra` flags into a sink on a 1 MiB tmpfs for about 5 MB of lines, a
/// downstream job taking every closed file away: every record once, in order.
fn full_sink_disk_drains(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("small"), 1 << 20) else {
        eprintln!("cannot mount a tmpfs here (not root?): skipping the full-disk test");
        return;
    };
    let (_g, gw) = start_gateway(dir.path(), &["--size", "16M"]);
    let n = 20_000u64;
    let pad = "x".repeat(100);
    let input = dir.path().join("in.txt");
    let lines: String = (0..n).map(|i| format!("t {i} {pad}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    let p = run_bridge(
        &[
            publish_args(&gw, "t"),
            vec!["--ack", "durable", &input.display().to_string()],
        ]
        .concat(),
    );
    assert!(p.status.success(), "{}", text(&p));
    let out = fs.0.join("out");
    let taken = dir.path().join("taken");
    std::fs::create_dir_all(&taken).unwrap();
    let state = dir.path().join("s.redb");
    let mut args = plain_drain_args(&gw, &out, &state);
    args.extend(["--backoff-max-ms", "1000"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let (c, rx) = spawn_bridge_lines(&args, &[]);
    // Killed on drop, also when the wait below fails.
    let mut c = ChildProcess::new(c);
    // The downstream job: copies each closed file off the small disk, then removes it.
    let take_closed = || {
        for path in sink_files(&out) {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.ends_with(".jsonl") && std::fs::copy(&path, taken.join(&name)).is_ok() {
                std::fs::remove_file(&path).unwrap();
            }
        }
    };
    let log = std::cell::RefCell::new(Vec::new());
    let all = wait_until(
        Duration::from_secs(120),
        || {
            take_closed();
            log.borrow_mut().extend(rx.try_iter());
            let mut lines = sink_lines(&taken);
            lines.extend(sink_lines_so_far(&out));
            (lines.len() as u64 >= n).then_some(lines)
        },
        || {
            let log = log.borrow();
            format!(
                "the drain did not get every record past the full disk; its last lines: {:?}",
                &log[log.len().saturating_sub(5)..]
            )
        },
    );
    c.kill();
    let mut log = log.into_inner();
    log.extend(rx.try_iter());
    assert!(
        log.iter().any(|l| l.contains("No space left on device")),
        "the disk filled up: {log:?}"
    );
    let offsets: Vec<u64> = all.iter().map(|l| l.0).collect();
    assert_eq!(
        offsets,
        (0..n).collect::<Vec<_>>(),
        "every record once, in order"
    );
    for (off, payload) in &all {
        assert_eq!(payload, &format!("t {off} {pad}"));
    }
}

//! Starting the real `spillway-bridge` binary, built on first use like
//! [`spillway_bin`](crate::gateway::spillway_bin): run to completion ([`run_bridge`]), or in
//! the background ([`spawn_bridge`], [`spawn_bridge_lines`]), or for a bounded time
//! ([`run_bridge_within`]).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::gateway::workspace_bin;
use crate::process::ChildProcess;
pub use crate::sink_files::sink_files;

/// Path of the `spillway-bridge` binary, built on first use (or `SPILLWAY_BRIDGE_BIN`).
pub fn bridge_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("SPILLWAY_BRIDGE_BIN", "spillway-bridge", "spillway-bridge"))
        .clone()
}

/// Runs `spillway-bridge ARGS` to completion.
pub fn run_bridge(args: &[&str]) -> Output {
    Command::new(bridge_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("run spillway-bridge")
}

/// Starts `spillway-bridge ARGS` in the background at `info`, with no input and its stdout
/// and stderr piped (take them with [`Child::wait_with_output`]).
pub fn spawn_bridge_piped(args: &[&str]) -> Child {
    Command::new(bridge_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start spillway-bridge")
}

/// Runs `spillway-bridge ARGS` for at most `limit`, reading its stdout and stderr as they
/// come; `None` (and the process killed) if it was still running then.
pub fn run_bridge_within(args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = spawn_bridge_piped(args);
    fn read_all(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for spillway-bridge") {
            return Some(Output {
                status,
                stdout: stdout.join().unwrap_or_default(),
                stderr: stderr.join().unwrap_or_default(),
            });
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `spillway-bridge ARGS` with `env` added to its environment and its stderr read
/// by a thread: every line goes to the returned channel.
pub fn spawn_bridge_lines(
    args: &[String],
    env: &[(String, String)],
) -> (Child, mpsc::Receiver<String>) {
    let mut c = Command::new(bridge_bin())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start spillway-bridge");
    let err = c.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (c, rx)
}

/// Waits (20 s at most) for a line containing `needle` from `rx` (a
/// [`spawn_bridge_lines`] channel), pushing every line it takes to `seen`; panics with
/// them if none came.
pub fn wait_for_line(rx: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    wait_for_line_within(rx, needle, seen, Duration::from_secs(20));
}

/// [`wait_for_line`], waiting `limit` at most.
pub fn wait_for_line_within(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    seen: &mut Vec<String>,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            let hit = line.contains(needle);
            seen.push(line);
            if hit {
                return;
            }
        }
    }
    panic!("no line with {needle:?} in:\n{}", seen.join("\n"));
}

/// Runs `spillway-bridge ARGS` to completion, which must exit 2 (a usage error: a flag or
/// a config key refused before anything ran); returns its stderr, which says why.
pub fn run_bridge_usage_error(args: &[&str]) -> String {
    let out = run_bridge(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "spillway-bridge {args:?}: {err}"
    );
    err
}

/// Runs `spillway-bridge ARGS` to completion, which must succeed (else panics with its
/// stderr).
pub fn run_bridge_ok(args: &[&str]) -> Output {
    let out = run_bridge(args);
    assert!(
        out.status.success(),
        "spillway-bridge {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts `BIN ARGS` (a `spillway-bridge`, e.g. a `drain` to kill part-way) in the
/// background with its stderr, at `info` (`RUST_LOG=info`, whatever the caller's
/// environment says: the tests read its lines), written to `log` (created or truncated).
///
/// # Errors
/// The log file cannot be created or the process cannot be started; the message names the
/// file or the binary.
pub fn spawn_bridge(bin: &Path, args: &[String], log: &Path) -> Result<ChildProcess, String> {
    let file = File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    let child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    Ok(ChildProcess::new(child))
}

/// The sum of every sample of metric `name` (all gateways of a drain) that the `--metrics`
/// endpoint on `127.0.0.1:port` (a bridge's or a gateway's) serves; `None` while it cannot
/// be read.
pub fn metric_sum(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// The gateway's next offset (via `spillway-bridge status --json`), 0 while it is
/// unreachable.
pub fn gateway_next_offset(gw: &str) -> u64 {
    let out = run_bridge(&["status", "--gateway", gw, "--json"]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|j| j["stats"]["next_offset"].as_u64())
        .unwrap_or(0)
}

/// `drain --gateway GW --sink SINK --state STATE --progress off`: the flags every drain of
/// the tests starts with (add `--once` and the rest).
pub fn drain_args<'a>(gw: &'a str, sink: &'a str, state: &'a str) -> Vec<&'a str> {
    vec![
        "drain",
        "--gateway",
        gw,
        "--sink",
        sink,
        "--state",
        state,
        "--progress",
        "off",
    ]
}

/// Runs `drain --once` against `gw` with `extra` flags (after `--config FILE` when
/// `config` is given, the file written as `DIR/bridge.toml`), sinking into `file:DIR/out`
/// with the state file `DIR/s.redb`: its exit code (-1 for a signal), its stderr and how
/// long it ran, the binary built before the clock starts (the retry budget measured is the
/// drain's, not cargo's).
///
/// # Panics
/// If the drain still runs after `limit` (it is killed).
pub fn drain_once_within(
    dir: &Path,
    gw: &str,
    config: Option<&str>,
    extra: &[&str],
    limit: Duration,
) -> (i32, String, Duration) {
    let sink = format!("file:{}", dir.join("out").display());
    let state = dir.join("s.redb").display().to_string();
    let cfg_path = dir.join("bridge.toml").display().to_string();
    let mut args: Vec<&str> = Vec::new();
    if let Some(c) = config {
        std::fs::write(&cfg_path, c).expect("write the config file");
        args.extend(["--config", &cfg_path]);
    }
    args.extend(drain_args(gw, &sink, &state));
    args.push("--once");
    args.extend(extra);
    bridge_bin();
    let started = Instant::now();
    let out = run_bridge_within(&args, limit)
        .unwrap_or_else(|| panic!("drain --once still retrying after {limit:?}"));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), err, started.elapsed())
}

/// The offsets at which a drain's log `log` (its stderr at `info`) says it resumed from a
/// stored checkpoint (`resuming consumer "C" at offset N`, one line per gateway and
/// session), in the order logged; empty when it started without one every time.
pub fn resume_offsets(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("resuming consumer"))
        .filter_map(|l| {
            let rest = &l[l.rfind(" at offset ")? + " at offset ".len()..];
            let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse().ok()
        })
        .collect()
}

/// `publish --gateway GW --topic TOPIC`: the flags every publish of the tests starts with
/// (add the messages or input files and the rest).
pub fn publish_args<'a>(gw: &'a str, topic: &'a str) -> Vec<&'a str> {
    vec!["publish", "--gateway", gw, "--topic", topic]
}

/// `tail --from earliest --format FORMAT` of the gateway `gw`, which must succeed: its
/// stdout, one line a record.
pub fn tail_everything(gw: &str, format: &str) -> String {
    let out = run_bridge(&[
        "tail",
        "--gateway",
        gw,
        "--from",
        "earliest",
        "--format",
        format,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that the log of the gateway `gw`, read from its first offset, holds the input
/// lines `PREFIX 0` to `PREFIX n-1`: each once, in input order (offsets may have gaps).
pub fn assert_log_holds_lines_once_in_order(gw: &str, prefix: &str, n: usize) {
    let text = tail_everything(gw, "raw");
    let lines: Vec<&str> = text.lines().collect();
    let want: Vec<String> = (0..n).map(|i| format!("{prefix} {i}")).collect();
    assert_eq!(lines.len(), n, "every input line stored exactly once");
    assert!(lines == want, "the log holds the input in order");
}

/// The committed offset of consumer `consumer` in the output of `status --json`, 0 when
/// the output has none (unreachable gateway, unknown consumer).
pub fn committed_offset(status_json: &[u8], consumer: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(status_json).unwrap_or_default();
    v["consumers"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == consumer))
        .and_then(|c| c["committed_offset"].as_u64())
        .unwrap_or(0)
}

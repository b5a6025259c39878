//! Starting the real `spillway` binary.
//!
//! [`spillway_bin`] builds the binary once per test process with the same cargo and
//! target directory as the running test (`cargo build -p spillway-firmware --bin spillway`,
//! in the profile the test was built with), so `cargo test --workspace` on a clean checkout
//! works without a separate build step.
//!
//! Environment: `SPILLWAY_BIN` names a prebuilt gateway binary instead, and
//! `SPILLWAY_RUNNER` a command line that runs it (e.g. `qemu-aarch64` for an ARM build under
//! qemu-user, as `scripts/cross-test.sh` does): [`GatewayProcess`] and [`run_cli`] start the
//! gateway through [`gateway_command`]. (The fault-shim tests preload an x86-64 library and
//! run the binary directly.)

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::process::ChildProcess;
use crate::wait::wait_until;

/// Path of the `spillway` binary, built on first use (or `SPILLWAY_BIN`).
pub fn spillway_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("SPILLWAY_BIN", "spillway-firmware", "spillway"))
        .clone()
}

/// A [`Command`] that runs the gateway binary `bin`: under the runner named by
/// `SPILLWAY_RUNNER` (whitespace-separated program and arguments, e.g. `qemu-arm`) when that
/// is set and not empty, else `bin` itself.
pub fn gateway_command(bin: &Path) -> Command {
    let runner = std::env::var("SPILLWAY_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// Path of binary `bin` of package `package`: the path in environment variable
/// `override_var` if set, else built with `cargo build -p PACKAGE --bin BIN` into the target
/// directory and profile of the running test or benchmark (its executable lives in
/// `<target>/<profile>/deps/`), so `cargo test --workspace` on a clean checkout needs no
/// separate build step.
///
/// # Panics
/// If the build fails (a test cannot go on without the binary).
pub fn workspace_bin(override_var: &str, package: &str, bin: &str) -> PathBuf {
    workspace_artifact(override_var, package, &["--bin", bin], bin)
}

/// Path of `file` (a binary or a library) that `cargo build -p PACKAGE TARGET...` writes
/// into the target directory and profile of the running test or benchmark, built there
/// first; the path in environment variable `override_var` instead when it is set.
///
/// # Panics
/// If the build fails.
pub fn workspace_artifact(
    override_var: &str,
    package: &str,
    target: &[&str],
    file: &str,
) -> PathBuf {
    if let Ok(p) = std::env::var(override_var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile> directory")
        .to_path_buf();
    let target_dir = profile_dir
        .parent()
        .expect("target directory")
        .to_path_buf();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", package])
        .args(target)
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "building {file} of {package} failed");
    profile_dir.join(file)
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The whole HTTP/1.1 answer (status line, headers, body) to `GET path` at
/// `127.0.0.1:port`: a gateway's `--metrics` endpoint, `http_get(port, "/metrics")`.
///
/// # Panics
/// If the port cannot be reached or the answer read.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .expect("send the request");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).expect("read the answer");
    text
}

/// Asserts that the metrics endpoint at `127.0.0.1:port` answers `GET /metrics` with 200
/// and a text that holds each of `want` (a whole sample line such as `spillway_full 0`, or
/// the start of one: `spillway_used_bytes `); returns the answer.
///
/// # Panics
/// Naming the first of `want` missing, with the answer.
pub fn assert_metrics(port: u16, want: &[&str]) -> String {
    let text = http_get(port, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for w in want {
        assert!(text.contains(w), "{w} missing in:\n{text}");
    }
    text
}

/// A gateway on a fresh image `DIR/gw.img` (1 MiB unless `extra` has `--size`, 4 KiB erase
/// blocks) listening on one free TCP port, with `extra` flags after those; returns the
/// process and its `tcp://127.0.0.1:PORT` URI. What the bridge's command-line tests start.
pub fn small_gateway(dir: &Path, extra: &[&str]) -> (GatewayProcess, String) {
    let uri = format!("tcp://127.0.0.1:{}", free_port());
    let mut args = image_in(dir, &["--erase-size", "4K", "--listen", &uri]);
    if !extra.contains(&"--size") {
        args.extend(["--size".into(), "1M".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    (GatewayProcess::start(&args, 1), uri)
}

/// The arguments of `spillway run` for a gateway on the image `DIR/gw.img`: `--image
/// DIR/gw.img`, then `flags` (its size, listeners and the rest).
pub fn image_in(dir: &Path, flags: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--image".to_string(),
        dir.join("gw.img").display().to_string(),
    ];
    args.extend(flags.iter().map(|s| s.to_string()));
    args
}

/// A running gateway process; killed (SIGKILL) on drop (through its [`ChildProcess`]).
pub struct GatewayProcess {
    child: ChildProcess,
    /// Every stderr line so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl GatewayProcess {
    /// Starts `spillway run ARGS` and waits until it logged `listening on` for each of
    /// `listeners` URIs (30 s at most). Panics with the log if it exits first.
    pub fn start(args: &[String], listeners: usize) -> GatewayProcess {
        Self::start_with_env(args, listeners, &[])
    }

    /// [`GatewayProcess::start`] with extra environment variables (e.g. the fault shim's).
    pub fn start_with_env(
        args: &[String],
        listeners: usize,
        env: &[(String, String)],
    ) -> GatewayProcess {
        Self::spawn(&spillway_bin(), args, listeners, env, None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `BIN run ARGS` with `env` added to the environment and waits until it logged
    /// `listening on` for each of `listeners` URIs (30 s at most). Every stderr line is kept
    /// in [`GatewayProcess::log`] and, with `log_file`, appended to that file too.
    ///
    /// # Errors
    /// A message (with the log, or the log file's path) when the process cannot be started,
    /// exits while starting, or is not listening within 30 s.
    pub fn spawn(
        bin: &Path,
        args: &[String],
        listeners: usize,
        env: &[(String, String)],
        log_file: Option<&Path>,
    ) -> Result<GatewayProcess, String> {
        let mut file = match log_file {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("open {}: {e}", p.display()))?,
            ),
            None => None,
        };
        let mut child = gateway_command(bin)
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(f) = file.as_mut() {
                        let _ = writeln!(f, "{line}");
                    }
                    // Kept before it is announced: whoever waited for it finds it in
                    // the log.
                    let listening = line.contains("listening on ");
                    if let Ok(mut l) = log.lock() {
                        l.push(line);
                    }
                    if listening {
                        let _ = tx.send(());
                    }
                }
            });
        }
        let mut g = GatewayProcess {
            child: ChildProcess::new(child),
            log,
        };
        let show = |g: &GatewayProcess| match log_file {
            Some(p) => format!("(log: {})", p.display()),
            None => format!(":\n{}", g.log_text()),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < listeners {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(()) => seen += 1,
                Err(_) => {
                    if let Some(status) = g.try_wait() {
                        return Err(format!(
                            "spillway exited with {status} while starting {}",
                            show(&g)
                        ));
                    }
                    if Instant::now() > deadline {
                        return Err(format!("spillway did not start within 30 s {}", show(&g)));
                    }
                }
            }
        }
        Ok(g)
    }

    /// The process id (0 once it was killed or stopped).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The log so far as one string.
    pub fn log_text(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// The log lines so far that contain any of `needles`.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        self.log
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|x| needles.iter().any(|n| x.contains(n)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (20 s at most) until the log has `n` lines containing `needle`; returns those
    /// lines.
    ///
    /// # Panics
    /// With the log, if fewer than `n` such lines came within 20 s.
    pub fn wait_for_log(&self, needle: &str, n: usize) -> Vec<String> {
        wait_until(
            Duration::from_secs(20),
            || Some(self.log_lines(&[needle])).filter(|l| l.len() >= n),
            || {
                format!(
                    "{n} line(s) with {needle:?} in the log:\n{}",
                    self.log_text()
                )
            },
        )
    }

    /// The exit status if it exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status; `None` when it did not
    /// exit in time (it is then SIGKILLed) or was not running.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child.stop(timeout)
    }

    /// Sends SIGTERM and waits (20 s at most) for the exit status.
    ///
    /// # Panics
    /// With the log, if it is not running or does not exit within 20 s.
    pub fn terminate(&mut self) -> ExitStatus {
        assert!(self.child.is_running(), "spillway is not running");
        self.stop(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("spillway did not stop on SIGTERM:\n{}", self.log_text()))
    }
}

/// Runs `spillway ARGS` to completion; returns (exit code, stdout, stderr).
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = gateway_command(&spillway_bin())
        .args(args)
        .output()
        .expect("run spillway");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

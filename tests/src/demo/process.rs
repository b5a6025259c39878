//! The demo's gateway and bridge processes: start, signal, wait, kill.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serialport::TTYPort;

use super::{DemoError, io_err};

pub(super) fn send_signal(child: &Child, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped (the `Child` is alive), so the id cannot have been reused.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Clears a tty's exclusive mode (`TIOCNXCL`) through any open descriptor of it.
pub(super) fn clear_exclusive(tty: &TTYPort) {
    use std::os::fd::AsRawFd;
    // SAFETY: TIOCNXCL takes no argument and only changes the tty's flags; the descriptor
    // is open for as long as `tty` lives.
    unsafe {
        libc::ioctl(tty.as_raw_fd(), libc::TIOCNXCL);
    }
}

/// Waits up to `timeout` for `child` to exit.
pub(super) fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running gateway; SIGKILLed on drop.
pub(super) struct Gateway {
    pub(super) child: Option<Child>,
    /// Lines of its log of interest, in order (shared with the reader thread).
    pub(super) log: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts `spillway run ARGS`, its stderr appended to `log_path`, and waits until it
    /// logged `listening on` `listeners` times.
    pub(super) fn start(
        bin: &Path,
        args: &[String],
        listeners: usize,
        log_path: &Path,
    ) -> Result<Gateway, DemoError> {
        let mut log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(io_err(format!("open {}", log_path.display())))?;
        let mut child = Command::new(bin)
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err(format!("start {}", bin.display())))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| DemoError::Step("no stderr pipe".into()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(log_file, "{line}");
                    if line.contains("listening on ") {
                        let _ = tx.send(());
                    }
                    if let Ok(mut l) = log.lock() {
                        l.push(line);
                    }
                }
            });
        }
        let mut g = Gateway {
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < listeners {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(()) => seen += 1,
                Err(_) => {
                    if let Some(Ok(Some(status))) = g.child.as_mut().map(Child::try_wait) {
                        return Err(DemoError::Step(format!(
                            "spillway exited with {status} while starting (log: {})",
                            log_path.display()
                        )));
                    }
                    if Instant::now() > deadline {
                        return Err(DemoError::Step(format!(
                            "spillway did not start within 30 s (log: {})",
                            log_path.display()
                        )));
                    }
                }
            }
        }
        Ok(g)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Log lines containing any of `needles`.
    pub(super) fn log_lines(&self, needles: &[&str]) -> Vec<String> {
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

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit status (SIGKILL after 20 s).
    pub(super) fn terminate(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        send_signal(&c, libc::SIGTERM);
        match wait_timeout(&mut c, Duration::from_secs(20)) {
            Ok(Some(s)) => Some(s),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                None
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `spillway-bridge drain`; SIGKILLed on drop.
pub(super) struct Bridge {
    pub(super) child: Option<Child>,
}

impl Bridge {
    pub(super) fn start(bin: &Path, args: &[String], log_path: &Path) -> Result<Bridge, DemoError> {
        let log =
            File::create(log_path).map_err(io_err(format!("create {}", log_path.display())))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(io_err(format!("start {}", bin.display())))?;
        Ok(Bridge { child: Some(child) })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub(super) fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(super) fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        send_signal(&c, libc::SIGTERM);
        match wait_timeout(&mut c, timeout) {
            Ok(Some(s)) => Some(s),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                None
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.kill();
    }
}

//! Signals and bounded waits for the child processes that the tests, the benchmarks and the
//! demo start (the gateway, the bridge): SIGTERM or SIGKILL a child, wait for its exit with
//! a time limit, stop it (SIGTERM, then SIGKILL when it overstays), run one with its
//! standard input given ([`output_with_stdin`]); and the start of a peer server from a
//! config file ([`spawn_configured`]).

use std::io::{self, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Sends signal `sig` (e.g. `libc::SIGTERM`) to `child`; does nothing if it was reaped.
pub fn signal(child: &Child, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, not yet
    // reaped (the `Child` is alive), so the id cannot have been reused.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Starts `bin -c DIR/NAME.conf` after writing `config` into that file, its stderr into
/// `DIR/NAME.log`, stdin and stdout closed: a peer server (nats-server, mosquitto) started
/// from a config file in its own directory.
///
/// # Errors
/// Writing the config file, creating the log file, or the spawn.
pub fn spawn_configured(bin: &Path, dir: &Path, name: &str, config: &str) -> io::Result<Child> {
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(&conf, config)?;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
}

/// Waits up to `timeout` for `child` to exit: `Ok(None)` when it is still running then.
///
/// # Errors
/// `waitpid` failed.
pub fn wait_within(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
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

/// Runs `cmd` to completion with `input` on its standard input (then closed) and its
/// stdout and stderr captured. Panics naming `what` if it cannot be started.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8], what: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input)
        .expect("write stdin");
    child.wait_with_output().expect("wait for the process")
}

/// SIGKILLs and reaps `child`.
pub fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends SIGTERM and waits up to `timeout` for the exit status; `None` when the child did
/// not exit in time (it is then SIGKILLed and reaped) or could not be waited for.
pub fn stop(mut child: Child, timeout: Duration) -> Option<ExitStatus> {
    signal(&child, libc::SIGTERM);
    match wait_within(&mut child, timeout) {
        Ok(Some(s)) => Some(s),
        _ => {
            kill(child);
            None
        }
    }
}

/// A child process that is SIGKILLed and reaped on drop unless it was stopped first.
#[derive(Debug)]
pub struct ChildProcess(Option<Child>);

impl ChildProcess {
    /// Takes charge of `child`.
    pub fn new(child: Child) -> ChildProcess {
        ChildProcess(Some(child))
    }

    /// The process id (0 once it was killed or stopped).
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// The exit status if it exited by itself.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.0.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(c) = self.0.take() {
            kill(c);
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit status; `None` when it did not
    /// exit in time (it is then SIGKILLed) or was not running.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        stop(self.0.take()?, timeout)
    }

    /// Sends signal `sig` (e.g. `libc::SIGSTOP` to pause it, `libc::SIGCONT` to resume
    /// it); does nothing once it was killed or stopped.
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(c) = self.0.as_ref() {
            signal(c, sig);
        }
    }

    /// Whether it is still in charge of a process (not killed or stopped yet).
    pub fn is_running(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

//! The buoy's serial sensor: writes the series to the pty master line by line, paced over
//! the replay; and the pty's exclusive mode, cleared between two gateways.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serialport::TTYPort;

/// Clears a tty's exclusive mode (`TIOCNXCL`) through any open descriptor of it.
pub(super) fn clear_exclusive(tty: &TTYPort) {
    use std::os::fd::AsRawFd;
    // SAFETY: TIOCNXCL takes no argument and only changes the tty's flags; the descriptor
    // is open for as long as `tty` lives.
    unsafe {
        libc::ioctl(tty.as_raw_fd(), libc::TIOCNXCL);
    }
}

/// When item `i` of `n` is due: spread evenly over `replay` from `t0`.
pub(super) fn due(t0: Instant, replay: Duration, i: usize, n: usize) -> Instant {
    t0 + replay.mul_f64(i as f64 / n.max(1) as f64)
}

/// Shared progress of the serial sensor.
#[derive(Debug, Default)]
pub(super) struct SerialProgress {
    /// Time (since the start) at which each line was completely written.
    pub(super) sent_at: Vec<Duration>,
    /// An error that stopped it.
    pub(super) error: Option<String>,
}

/// Writes `lines` to the pty master, paced, each followed by `\n`. A write that times out
/// (the pty buffer full while nobody reads) is retried.
pub(super) fn serial_sensor(
    mut port: TTYPort,
    lines: Arc<Vec<String>>,
    t0: Instant,
    replay: Duration,
    progress: Arc<Mutex<SerialProgress>>,
) {
    let n = lines.len();
    for (i, line) in lines.iter().enumerate() {
        let at = due(t0, replay, i, n);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        let mut done = 0;
        while done < bytes.len() {
            match port.write(&bytes[done..]) {
                Ok(k) => done += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::TimedOut
                            | io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    if let Ok(mut p) = progress.lock() {
                        p.error = Some(format!("serial line: write failed: {e}"));
                    }
                    return;
                }
            }
        }
        if let Ok(mut p) = progress.lock() {
            p.sent_at.push(t0.elapsed());
        }
    }
}

//! A Mosquitto broker started for a benchmark ([`Mosquitto`]): a fresh process on a free
//! port of 127.0.0.1, anonymous access, unlimited queues, its own temporary directory, killed
//! on drop; and where to find the binary ([`mosquitto_bin`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::gateway::free_port;
use crate::mqtt_load::MqttConn;
use crate::process::spawn_configured;

/// Whether Mosquitto keeps its queues in a persistence file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// `persistence true` in its temporary directory (written at autosave intervals and at
    /// shutdown).
    File,
    /// `persistence false`, and no limit on the messages in flight to a client (a reader
    /// of the queue gets all of it at once).
    Off,
}

/// A running mosquitto; killed on drop.
pub struct Mosquitto {
    /// The process.
    pub child: Child,
    /// Its MQTT address, `127.0.0.1:PORT`.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts `bin` with `persistence`, `max_queued_messages 0` and `max_queued_bytes 0` (no
    /// queue limit); waits (10 s at most) until it accepts an MQTT connection.
    ///
    /// # Errors
    /// The I/O error of the directory, the config file or the spawn; mosquitto exiting, or
    /// not accepting within 10 s.
    pub fn start(bin: &Path, persistence: Persistence) -> io::Result<Mosquitto> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let store = match persistence {
            Persistence::File => format!(
                "persistence true\npersistence_location {}/\n",
                dir.path().display()
            ),
            Persistence::Off => "persistence false\nmax_inflight_messages 0\n".to_string(),
        };
        let child = spawn_configured(
            bin,
            dir.path(),
            "mosquitto",
            &format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\n{store}\
                 max_queued_messages 0\nmax_queued_bytes 0\nlog_dest stderr\nuser root\n"
            ),
        )?;
        let mut m = Mosquitto {
            child,
            addr: format!("127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(c) = MqttConn::connect(&m.addr, "bench-probe", true) {
                let _ = c.disconnect();
                return Ok(m);
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                return Err(io::Error::other(format!("mosquitto exited with {status}")));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("mosquitto did not start within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its log (stderr), as written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// The last 20 lines of its log (for a failure message).
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds `mosquitto`: `$SPILLWAY_MOSQUITTO`, else `/usr/sbin/mosquitto`.
pub fn mosquitto_bin() -> Option<PathBuf> {
    let p = std::env::var_os("SPILLWAY_MOSQUITTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/mosquitto"));
    p.is_file().then_some(p)
}

/// `mosquitto -h`'s first line, "mosquitto version X", as "mosquitto X".
pub fn mosquitto_version(bin: &Path) -> String {
    Command::new(bin)
        .arg("-h")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.replace(" version", ""))
        })
        .unwrap_or_else(|| "mosquitto".to_string())
}

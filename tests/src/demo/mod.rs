//! The Spillway demo: real sensor data through a gateway that is killed and an uplink that
//! is down for a while, verified end to end.
//!
//! [`run`] plays this scenario with the real `spillway` and `spillway-bridge` binaries:
//!
//! 1. Starts `spillway run` on a new flash image (formatted on first start) with a TCP
//!    listener and a serial port in line mode on topic `buoy/sst`. The serial port is the
//!    slave side of a pty pair that this process opens and keeps, master and slave, for the
//!    whole run: the "cable" stays plugged in while the gateway restarts.
//! 2. Replays two real series (see `tests/data/SOURCES.md`), both paced to take
//!    [`Options::replay`]:
//!    - the buoy's sea surface temperature over the serial line, one CSV line per reading
//!      as the sensor would print it (the line keeps its own timestamp as text; the gateway
//!      stamps the receipt time);
//!    - the glucose monitor over TCP as framed durable publishes, one record per value on
//!      `cgm/isig` and `cgm/glucose`, with the reading's time as `timestamp_us`. Values
//!      that are missing (`nil` or empty) are skipped and counted. Each topic's publisher
//!      keeps several publishes in flight, spread round-robin over [`Options::lanes`]
//!      producer ids, so that no producer ever has more than
//!      [`PRODUCER_WINDOW`](spillway_core::log::PRODUCER_WINDOW)
//!      unacknowledged: the gateway remembers that many sequence numbers per producer and
//!      recognises a resend within them.
//! 3. SIGKILLs the gateway part-way and restarts it on the same image after
//!    [`Options::gateway_down`]. The publishers reconnect and resend every record not yet
//!    acknowledged with the same producer id and sequence; what the gateway had already
//!    stored comes back as a duplicate acknowledgement with the original offset and is not
//!    stored twice. Line mode has no acknowledgements: lines the gateway had read but not
//!    yet written to flash are lost, and a line cut in half by the kill arrives as a
//!    fragment. Lines written while it is down wait in the pty.
//! 4. Keeps the uplink down (no bridge) for the first part, then starts
//!    `spillway-bridge drain` into a file sink, SIGKILLs it once while it drains and
//!    restarts it; after the replay it stops it with SIGTERM and runs `drain --once` to the
//!    end.
//! 5. Once the replay is over, publishes the buoy's readings once more as an MQTT sensor
//!    would, with `mosquitto_pub -q 1 -l` on topic `buoy/sst/mqtt` into the gateway's MQTT
//!    listener: `mosquitto_pub` exits 0 only when every message got its PUBACK, which the
//!    gateway sends once the record is durable.
//! 6. Verifies against what was sent, what was acknowledged and what the gateway's log
//!    holds (see [`Summary::failures`]): every acknowledged record is in the sink at its
//!    acknowledged offset with the same bytes and timestamp; the sink holds every record
//!    of the gateway's log exactly once per (log id, offset), in offset order per topic;
//!    every TCP record was stored exactly once; the serial line's differences are explained
//!    by the gateway kill.
//!
//! It prints progress lines as it goes (unless [`Options::quiet`]) and returns a
//! [`Summary`] whose `Display` is the final table.

mod publisher;
mod scenario;
mod serial;
mod series;
mod sink;
mod summary;
mod verify;
mod workdir;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use scenario::Scenario;
pub use series::{CgmSeries, CgmValue, SstSeries, load_cgm, load_sst, parse_utc_us};
pub use summary::{Summary, TopicRow};
use verify::{Observed, verify};
use workdir::{Say, WorkDir};

/// Topic of the buoy's serial line.
pub const TOPIC_SST: &str = "buoy/sst";
/// Topic of the glucose monitor's sensor current.
pub const TOPIC_ISIG: &str = "cgm/isig";
/// Topic of the glucose monitor's glucose value.
pub const TOPIC_GLUCOSE: &str = "cgm/glucose";
/// Topic of the buoy's readings published over MQTT (QoS 1, `mosquitto_pub`).
pub const TOPIC_SST_MQTT: &str = "buoy/sst/mqtt";
/// File of the buoy series in the data directory.
pub const SST_FILE: &str = "sea_surface_temperature.csv.gz";
/// File of the glucose series in the data directory.
pub const CGM_FILE: &str = "cgm.csv.gz";
/// Gateway id the demo's gateway announces.
pub const GATEWAY_ID: &str = "demo-gw";
/// Baud rate given for the serial port (a pty does not enforce it).
pub const BAUD: u32 = 115_200;

/// The gateway's linger (`--linger-ms`): line-mode records wait this long in RAM.
pub(crate) const LINGER_MS: u64 = 100;

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `spillway` gateway binary.
    pub spillway_bin: PathBuf,
    /// The `spillway-bridge` binary.
    pub bridge_bin: PathBuf,
    /// Directory holding [`SST_FILE`] and [`CGM_FILE`].
    pub data_dir: PathBuf,
    /// Working directory (image, sink, state, logs); emptied at the start if it is a
    /// previous run's (refused if it holds anything else).
    pub work_dir: PathBuf,
    /// Replay only the first rows of each series (`None`: all of them).
    pub rows: Option<usize>,
    /// How long the replay of each series takes (the pace).
    pub replay: Duration,
    /// How long the gateway stays down after its SIGKILL.
    pub gateway_down: Duration,
    /// Producer ids per TCP topic; up to `lanes` ×
    /// [`PRODUCER_WINDOW`](spillway_core::log::PRODUCER_WINDOW) publishes in flight.
    pub lanes: usize,
    /// Flash image size, bytes.
    pub image_bytes: u64,
    /// Seed of the random jitter of the kill times (printed).
    pub seed: u64,
    /// Progress line interval.
    pub progress_every: Duration,
    /// Print nothing while running.
    pub quiet: bool,
}

impl Options {
    /// The full demo's settings: every row, a 40 s replay, the gateway down for 1.5 s.
    pub fn new(spillway_bin: PathBuf, bridge_bin: PathBuf, work_dir: PathBuf) -> Options {
        Options {
            spillway_bin,
            bridge_bin,
            data_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("data"),
            work_dir,
            rows: None,
            replay: Duration::from_secs(40),
            gateway_down: Duration::from_millis(1500),
            lanes: 4,
            image_bytes: 64 << 20,
            seed: rand::random(),
            progress_every: Duration::from_secs(3),
            quiet: false,
        }
    }
}

/// Why the demo could not run to its verification.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// An input file does not have the expected shape.
    #[error("{}:{line}: {why}", file.display())]
    Data {
        /// The file.
        file: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A process or peer did not behave (did not start, exited with an error, refused).
    #[error("{0}")]
    Step(String),
}

/// Wraps an I/O error with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DemoError {
    let what = what.into();
    move |source| DemoError::Io { what, source }
}

/// Runs the demo (see the module doc). `Err` when it could not get as far as the
/// verification; failed checks are in [`Summary::failures`].
pub fn run(opts: &Options) -> Result<Summary, DemoError> {
    let say = Say { quiet: opts.quiet };
    let work = WorkDir::prepare(&opts.work_dir)?;
    let sst = load_sst(&opts.data_dir.join(SST_FILE), opts.rows)?;
    let cgm = load_cgm(&opts.data_dir.join(CGM_FILE), opts.rows)?;
    say.line(series::describe(&sst, &cgm, opts.replay, opts.seed));

    let mut scenario = Scenario::start(opts, say, work.clone(), &sst, &cgm)?;
    scenario.play()?;
    scenario.settle()?;
    let mut summary = scenario.final_drain()?;
    let (first_offset, records) = scenario.read_log_and_stop(&mut summary)?;

    let sent_at = publisher::lock(&scenario.serial).sent_at.clone();
    let publishers = &scenario.publishers;
    let observed = Observed {
        sst: &sst,
        cgm: &cgm,
        sent_at: &sent_at,
        killed_at: scenario.killed_at.unwrap_or_default(),
        back_at: scenario.back_at.unwrap_or_default(),
        publishers: [&publishers[0], &publishers[1]],
        log_id: publishers[0].lock().log_id.unwrap_or(0),
        first_offset,
        records: &records,
        sink_dir: &work.sink,
        mqtt: &scenario.mqtt,
    };
    verify(&observed, &mut summary);
    Ok(summary)
}

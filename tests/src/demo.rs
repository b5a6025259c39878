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
//!      producer ids, so that no producer ever has more than [`PRODUCER_WINDOW`]
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
//! 5. Verifies against what was sent, what was acknowledged and what the gateway's log
//!    holds (see [`Summary::failures`]): every acknowledged record is in the sink at its
//!    acknowledged offset with the same bytes and timestamp; the sink holds every record
//!    of the gateway's log exactly once per (log id, offset), in offset order per topic;
//!    every TCP record was stored exactly once; the serial line's differences are explained
//!    by the gateway kill.
//!
//! It prints progress lines as it goes (unless [`Options::quiet`]) and returns a
//! [`Summary`] whose `Display` is the final table.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serialport::{SerialPort, TTYPort};
use spillway_core::log::PRODUCER_WINDOW;
use spillway_core::wire::{AckLevel, Producer, Request};

use crate::client::{Client, FetchedRecord, Reply};

/// Topic of the buoy's serial line.
pub const TOPIC_SST: &str = "buoy/sst";
/// Topic of the glucose monitor's sensor current.
pub const TOPIC_ISIG: &str = "cgm/isig";
/// Topic of the glucose monitor's glucose value.
pub const TOPIC_GLUCOSE: &str = "cgm/glucose";
/// File of the buoy series in the data directory.
pub const SST_FILE: &str = "sea_surface_temperature.csv.gz";
/// File of the glucose series in the data directory.
pub const CGM_FILE: &str = "cgm.csv.gz";
/// Gateway id the demo's gateway announces.
pub const GATEWAY_ID: &str = "demo-gw";
/// Baud rate given for the serial port (a pty does not enforce it).
pub const BAUD: u32 = 115_200;

/// Where the gateway is SIGKILLed, as a fraction of the replay (before jitter).
const GATEWAY_KILL_AT: f64 = 0.40;
/// Where the uplink comes up (the bridge starts), as a fraction of the replay.
const UPLINK_UP_AT: f64 = 0.55;
/// How long after its start the bridge is SIGKILLed, as a fraction of the replay.
const BRIDGE_KILL_AFTER: f64 = 0.10;
/// A file marking a working directory as the demo's (so that it may be emptied).
const MARKER: &str = ".spillway-demo";
/// The gateway's linger (`--linger-ms`): line-mode records wait this long in RAM.
const LINGER_MS: u64 = 100;

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
    /// Producer ids per TCP topic; up to `lanes` × [`PRODUCER_WINDOW`] publishes in flight.
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
#[derive(Debug)]
#[non_exhaustive]
pub enum DemoError {
    /// A file or process operation failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// An input file does not have the expected shape.
    Data {
        /// The file.
        file: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A process or peer did not behave (did not start, exited with an error, refused).
    Step(String),
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemoError::Io { what, source } => write!(f, "{what}: {source}"),
            DemoError::Data { file, line, why } => {
                write!(f, "{}:{line}: {why}", file.display())
            }
            DemoError::Step(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DemoError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DemoError {
    let what = what.into();
    move |source| DemoError::Io { what, source }
}

/// One row of the summary table: one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicRow {
    /// Topic.
    pub topic: String,
    /// How the records travelled (`serial lines` or `TCP durable`).
    pub path: &'static str,
    /// Rows of the input file replayed (after the row limit).
    pub input_rows: u64,
    /// Rows without a value, not sent.
    pub skipped_empty: u64,
    /// Records sent (lines written, or distinct publishes; resends not counted).
    pub sent: u64,
    /// Publishes resent after a reconnect (same producer id and sequence).
    pub resent: u64,
    /// Records acknowledged by the gateway (`None`: line mode has no acknowledgements).
    pub acked: Option<u64>,
    /// Acknowledgements with `duplicate: true` (a resend of a stored record).
    pub duplicate_acks: u64,
    /// Records of this topic in the gateway's log at the end.
    pub stored: u64,
    /// Distinct records of this topic in the sink.
    pub delivered: u64,
    /// Sink lines beyond the first for the same (log id, offset).
    pub duplicate_lines: u64,
    /// Acknowledged (TCP) or stored (serial) records missing from the sink, or there with
    /// other bytes.
    pub lost: u64,
}

/// What the run showed.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Seed of the kill-time jitter.
    pub seed: u64,
    /// The working directory (sink files, logs).
    pub work_dir: PathBuf,
    /// Per topic, in the order sst, isig, glucose.
    pub topics: Vec<TopicRow>,
    /// Time from the first record sent to the end of the final drain.
    pub total: Duration,
    /// Time the replay took (first to last record sent and acknowledged).
    pub replay: Duration,
    /// How long the gateway was down (SIGKILL to listening again).
    pub gateway_downtime: Duration,
    /// How long the uplink was down (start to the first bridge start).
    pub uplink_downtime: Duration,
    /// Records the file sink skipped because it already had them (after the bridge kill).
    pub sink_skipped_duplicates: u64,
    /// Records the final `drain --once` forwarded.
    pub final_drain_records: u64,
    /// Explanations of the differences between the columns.
    pub notes: Vec<String>,
    /// Checks that failed; empty when the demo passed.
    pub failures: Vec<String>,
}

impl Summary {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The row of `topic`.
    pub fn topic(&self, topic: &str) -> Option<&TopicRow> {
        self.topics.iter().find(|t| t.topic == topic)
    }
}

/// `12345` as `12,345`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = [
            "topic",
            "path",
            "input rows",
            "no value",
            "sent",
            "resent",
            "acked",
            "dup acks",
            "stored",
            "delivered",
            "dup lines",
            "lost",
        ];
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut total = TopicRow {
            topic: "total".into(),
            acked: Some(0),
            ..TopicRow::default()
        };
        for t in &self.topics {
            total.input_rows += t.input_rows;
            total.skipped_empty += t.skipped_empty;
            total.sent += t.sent;
            total.resent += t.resent;
            total.acked = Some(total.acked.unwrap_or(0) + t.acked.unwrap_or(0));
            total.duplicate_acks += t.duplicate_acks;
            total.stored += t.stored;
            total.delivered += t.delivered;
            total.duplicate_lines += t.duplicate_lines;
            total.lost += t.lost;
        }
        for t in self.topics.iter().chain(std::iter::once(&total)) {
            rows.push(vec![
                t.topic.clone(),
                t.path.to_string(),
                thousands(t.input_rows),
                thousands(t.skipped_empty),
                thousands(t.sent),
                thousands(t.resent),
                t.acked.map_or("-".into(), thousands),
                thousands(t.duplicate_acks),
                thousands(t.stored),
                thousands(t.delivered),
                thousands(t.duplicate_lines),
                thousands(t.lost),
            ]);
        }
        let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
                if i < 2 {
                    s.push_str(&format!("{c:<w$}  "));
                } else {
                    s.push_str(&format!("{c:>w$}  "));
                }
            }
            writeln!(f, "{}", s.trim_end())
        };
        let head: Vec<String> = head.iter().map(|s| s.to_string()).collect();
        line(f, &head)?;
        let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
        line(f, &rule)?;
        let n = rows.len();
        for (i, r) in rows.iter().enumerate() {
            if i + 1 == n {
                line(f, &rule)?;
            }
            line(f, r)?;
        }
        writeln!(f)?;
        let secs = self.total.as_secs_f64();
        writeln!(
            f,
            "time {:.1} s (replay {:.1} s, gateway down {:.1} s, uplink down for the first {:.1} s); \
             {} records delivered, {} records/s",
            secs,
            self.replay.as_secs_f64(),
            self.gateway_downtime.as_secs_f64(),
            self.uplink_downtime.as_secs_f64(),
            thousands(total.delivered),
            thousands((total.delivered as f64 / secs.max(1e-9)).round() as u64)
        )?;
        writeln!(
            f,
            "bridge: SIGKILLed once while draining; after its restart the file sink skipped {} \
             resent records it already had; the final drain --once forwarded {}{}",
            thousands(self.sink_skipped_duplicates),
            thousands(self.final_drain_records),
            if self.final_drain_records == 0 {
                " (the bridge had caught up before its SIGTERM)"
            } else {
                ""
            }
        )?;
        if !self.notes.is_empty() {
            writeln!(f)?;
            for n in &self.notes {
                writeln!(f, "- {n}")?;
            }
        }
        writeln!(f)?;
        writeln!(f, "files: {} (seed {})", self.work_dir.display(), self.seed)?;
        if self.failures.is_empty() {
            writeln!(
                f,
                "PASS: every acknowledged record delivered exactly once, in order, with its bytes; \
                 lost 0"
            )
        } else {
            writeln!(f, "FAIL:")?;
            for x in &self.failures {
                writeln!(f, "  - {x}")?;
            }
            Ok(())
        }
    }
}

// ----- Input series ---------------------------------------------------------------------

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD hh:mm:ss` or `YYYY-MM-DDThh:mm:ssZ` (UTC) as µs since the Unix epoch.
pub fn parse_utc_us(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches('Z');
    let b = s.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b' ' || b[10] == b'T') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + se);
    u64::try_from(secs).ok().map(|s| s * 1_000_000)
}

/// The buoy series: each line as the sensor prints it.
#[derive(Debug, Clone, Default)]
pub struct SstSeries {
    /// Data lines (no header, no newline), at most the row limit.
    pub lines: Vec<String>,
    /// Rows without a temperature (not sent).
    pub empty: u64,
    /// Time of the first and last reading, µs.
    pub span_us: (u64, u64),
}

/// One value of the glucose monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgmValue {
    /// Row index in the file (from 0, header not counted).
    pub row: usize,
    /// Time of the reading, µs since the Unix epoch (the file's times taken as UTC).
    pub timestamp_us: u64,
    /// The value as text, as in the file.
    pub value: String,
}

/// The glucose series, split into its two channels.
#[derive(Debug, Clone, Default)]
pub struct CgmSeries {
    /// Rows read.
    pub rows: usize,
    /// Sensor current values.
    pub isig: Vec<CgmValue>,
    /// Glucose values.
    pub glucose: Vec<CgmValue>,
    /// Rows without a sensor current.
    pub isig_empty: u64,
    /// Rows without a glucose value.
    pub glucose_empty: u64,
    /// Time of the first and last reading, µs.
    pub span_us: (u64, u64),
}

fn gz_lines(path: &Path) -> Result<Vec<String>, DemoError> {
    let f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .map_err(io_err(format!("read {}", path.display())))?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect())
}

fn is_empty_value(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v.eq_ignore_ascii_case("nil") || v.eq_ignore_ascii_case("nan")
}

/// Reads the buoy series (`time (UTC),temperature (celsius)`), at most `rows` rows.
pub fn load_sst(path: &Path, rows: Option<usize>) -> Result<SstSeries, DemoError> {
    let all = gz_lines(path)?;
    let bad = |line: usize, why: String| DemoError::Data {
        file: path.to_path_buf(),
        line,
        why,
    };
    let mut it = all.into_iter().enumerate();
    match it.next() {
        Some((_, h)) if h.starts_with("time") => {}
        other => return Err(bad(1, format!("unexpected header {other:?}"))),
    }
    let mut s = SstSeries::default();
    let mut first = None;
    let mut last = 0;
    for (i, line) in it.take(rows.unwrap_or(usize::MAX)) {
        let Some((t, v)) = line.split_once(',') else {
            return Err(bad(i + 1, "expected time,temperature".into()));
        };
        let ts = parse_utc_us(t).ok_or_else(|| bad(i + 1, format!("bad time {t:?}")))?;
        first.get_or_insert(ts);
        last = ts;
        if is_empty_value(v) {
            s.empty += 1;
            continue;
        }
        s.lines.push(line);
    }
    s.span_us = (first.unwrap_or(0), last);
    Ok(s)
}

/// Reads the glucose series (`isig,datetime,glucose`), at most `rows` rows.
pub fn load_cgm(path: &Path, rows: Option<usize>) -> Result<CgmSeries, DemoError> {
    let all = gz_lines(path)?;
    let bad = |line: usize, why: String| DemoError::Data {
        file: path.to_path_buf(),
        line,
        why,
    };
    let mut it = all.into_iter().enumerate();
    match it.next() {
        Some((_, h)) if h == "isig,datetime,glucose" => {}
        other => return Err(bad(1, format!("unexpected header {other:?}"))),
    }
    let mut s = CgmSeries::default();
    let mut first = None;
    let mut last = 0;
    for (i, line) in it.take(rows.unwrap_or(usize::MAX)) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 3 {
            return Err(bad(i + 1, "expected isig,datetime,glucose".into()));
        }
        let ts = parse_utc_us(f[1]).ok_or_else(|| bad(i + 1, format!("bad time {:?}", f[1])))?;
        first.get_or_insert(ts);
        last = ts;
        let row = s.rows;
        s.rows += 1;
        for (v, out, empty) in [
            (f[0], &mut s.isig, &mut s.isig_empty),
            (f[2], &mut s.glucose, &mut s.glucose_empty),
        ] {
            if is_empty_value(v) {
                *empty += 1;
            } else {
                out.push(CgmValue {
                    row,
                    timestamp_us: ts,
                    value: v.trim().to_string(),
                });
            }
        }
    }
    s.span_us = (first.unwrap_or(0), last);
    Ok(s)
}

// ----- Processes --------------------------------------------------------------------------

fn send_signal(child: &Child, sig: libc::c_int) {
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
fn clear_exclusive(tty: &TTYPort) {
    use std::os::fd::AsRawFd;
    // SAFETY: TIOCNXCL takes no argument and only changes the tty's flags; the descriptor
    // is open for as long as `tty` lives.
    unsafe {
        libc::ioctl(tty.as_raw_fd(), libc::TIOCNXCL);
    }
}

/// Waits up to `timeout` for `child` to exit.
fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
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
struct Gateway {
    child: Option<Child>,
    /// Lines of its log of interest, in order (shared with the reader thread).
    log: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// Starts `spillway run ARGS`, its stderr appended to `log_path`, and waits until it
    /// logged `listening on` `listeners` times.
    fn start(
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

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Log lines containing any of `needles`.
    fn log_lines(&self, needles: &[&str]) -> Vec<String> {
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

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit status (SIGKILL after 20 s).
    fn terminate(&mut self) -> Option<ExitStatus> {
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
struct Bridge {
    child: Option<Child>,
}

impl Bridge {
    fn start(bin: &Path, args: &[String], log_path: &Path) -> Result<Bridge, DemoError> {
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

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
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

// ----- The serial sensor ----------------------------------------------------------------

/// When item `i` of `n` is due: spread evenly over `replay` from `t0`.
fn due(t0: Instant, replay: Duration, i: usize, n: usize) -> Instant {
    t0 + replay.mul_f64(i as f64 / n.max(1) as f64)
}

/// Shared progress of the serial sensor.
#[derive(Debug, Default)]
struct SerialProgress {
    /// Time (since the start) at which each line was completely written.
    sent_at: Vec<Duration>,
    /// An error that stopped it.
    error: Option<String>,
}

/// Writes `lines` to the pty master, paced, each followed by `\n`. A write that times out
/// (the pty buffer full while nobody reads) is retried.
fn serial_sensor(
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

// ----- TCP publishers -----------------------------------------------------------------------

/// One record a TCP publisher sends.
#[derive(Debug, Clone)]
struct Outgoing {
    /// Input row, for pacing.
    row: usize,
    /// Payload.
    payload: Vec<u8>,
    /// Reading time, µs.
    timestamp_us: u64,
    /// Producer id and sequence (fixed: a resend uses the same).
    producer: Producer,
}

/// An acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Acked {
    offset: u64,
    duplicate: bool,
}

/// What a publisher and its reply reader share.
#[derive(Debug)]
struct PubState {
    /// Connection generation; replies of older connections are ignored.
    generation: u64,
    /// The current connection failed.
    dead: bool,
    /// Wire seq → record index, on the current connection.
    inflight: HashMap<u32, usize>,
    /// Records sent (on any connection) and not acknowledged.
    unacked: BTreeSet<usize>,
    /// Unacknowledged records per producer lane.
    lane_unacked: Vec<usize>,
    /// Per record, its acknowledgement.
    acks: Vec<Option<Acked>>,
    /// Acknowledged records.
    acked: usize,
    /// First record never sent.
    next: usize,
    /// Resends after a reconnect.
    resent: u64,
    /// Acknowledgements with `duplicate: true`.
    duplicate_acks: u64,
    /// `StorageFailed` answers (each ends the connection; its records are resent).
    storage_failures: u64,
    /// Connections after the first.
    reconnects: u64,
    /// Log id of the first `Welcome`.
    log_id: Option<u128>,
    /// A failure that stops the publisher.
    error: Option<String>,
    /// Finished (everything acknowledged, or stopped by `error`).
    finished: bool,
}

struct Publisher {
    topic: String,
    records: Vec<Outgoing>,
    lanes: usize,
    shared: Arc<(Mutex<PubState>, Condvar)>,
}

impl Publisher {
    fn new(topic: &str, values: &[CgmValue], lanes: usize, id_base: u64) -> Publisher {
        let lanes = lanes.max(1);
        let records: Vec<Outgoing> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Outgoing {
                row: v.row,
                payload: v.value.as_bytes().to_vec(),
                timestamp_us: v.timestamp_us,
                producer: Producer {
                    id: id_base + (i % lanes) as u64,
                    seq: u32::try_from(i / lanes + 1).unwrap_or(u32::MAX),
                },
            })
            .collect();
        let st = PubState {
            generation: 0,
            dead: true,
            inflight: HashMap::new(),
            unacked: BTreeSet::new(),
            lane_unacked: vec![0; lanes],
            acks: vec![None; records.len()],
            acked: 0,
            next: 0,
            resent: 0,
            duplicate_acks: 0,
            storage_failures: 0,
            reconnects: 0,
            log_id: None,
            error: None,
            finished: false,
        };
        Publisher {
            topic: topic.to_string(),
            records,
            lanes,
            shared: Arc::new((Mutex::new(st), Condvar::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PubState> {
        lock(&self.shared.0)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connects and says hello, retrying until `deadline`.
fn connect_hello(addr: &str, deadline: Instant) -> Result<(TcpStream, Reply), String> {
    loop {
        let attempt = (|| -> io::Result<(TcpStream, Reply)> {
            let sa: std::net::SocketAddr = addr
                .parse()
                .map_err(|_| io::Error::other(format!("bad address {addr}")))?;
            let s = TcpStream::connect_timeout(&sa, Duration::from_secs(1))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut c = Client::new(Box::new(s.try_clone()?));
            let w = c.hello("spillway-demo")?;
            s.set_read_timeout(None)?;
            Ok((s, w))
        })();
        match attempt {
            Ok(x) => return Ok(x),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot connect to the gateway at {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

/// Reads replies of connection `generation` until it fails.
fn reply_reader(
    stream: TcpStream,
    generation: u64,
    pubr: Arc<(Mutex<PubState>, Condvar)>,
    lanes: usize,
) {
    let mut c = Client::new(Box::new(stream));
    loop {
        let r = c.recv();
        let (m, cv) = &*pubr;
        let mut st = lock(m);
        if st.generation != generation {
            return;
        }
        match r {
            Ok(Reply::Ack {
                seq,
                offset,
                duplicate,
            }) => {
                if let Some(idx) = st.inflight.remove(&seq)
                    && st.acks[idx].is_none()
                {
                    st.acks[idx] = Some(Acked { offset, duplicate });
                    st.acked += 1;
                    st.unacked.remove(&idx);
                    st.lane_unacked[idx % lanes] -= 1;
                    if duplicate {
                        st.duplicate_acks += 1;
                    }
                }
            }
            // The gateway's storage failed: nothing waiting was made durable. Reconnect
            // and resend every unacknowledged record once it has recovered (the producer
            // ids deduplicate what did reach flash).
            Ok(ref e @ Reply::Error { .. }) if e.is_storage_failure() => {
                st.storage_failures += 1;
                st.dead = true;
                cv.notify_all();
                return;
            }
            Ok(Reply::Error { seq, code, message }) => {
                st.error = Some(format!(
                    "the gateway refused publish {seq}: {code:?}: {message}"
                ));
                st.dead = true;
                cv.notify_all();
                return;
            }
            Ok(_) => {}
            Err(_) => {
                st.dead = true;
                cv.notify_all();
                return;
            }
        }
        cv.notify_all();
    }
}

/// Publishes every record of `p` as a durable, idempotent publish, paced over `replay`
/// by input row (of `rows` rows), keeping at most [`PRODUCER_WINDOW`] unacknowledged per
/// producer lane, reconnecting and resending the unacknowledged after a failure.
fn run_publisher(
    p: &Publisher,
    addr: &str,
    t0: Instant,
    replay: Duration,
    rows: usize,
    reconnect_for: Duration,
) {
    let n = p.records.len();
    let finish = |err: Option<String>| {
        let mut st = p.lock();
        if st.error.is_none() {
            st.error = err;
        }
        st.finished = true;
        p.shared.1.notify_all();
    };
    let mut first = true;
    loop {
        {
            let st = p.lock();
            if st.error.is_some() || (st.next == n && st.unacked.is_empty()) {
                break;
            }
        }
        let (stream, welcome) = match connect_hello(addr, Instant::now() + reconnect_for) {
            Ok(x) => x,
            Err(e) => return finish(Some(e)),
        };
        let Reply::Welcome { log_id, .. } = welcome else {
            return finish(Some(format!("the gateway answered hello with {welcome:?}")));
        };
        let reader_stream = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => return finish(Some(format!("socket clone: {e}"))),
        };
        let mut w = Client::new(Box::new(match stream.try_clone() {
            Ok(s) => s,
            Err(e) => return finish(Some(format!("socket clone: {e}"))),
        }));
        let (generation, resend) = {
            let mut st = p.lock();
            match st.log_id {
                None => st.log_id = Some(log_id),
                Some(l) if l != log_id => {
                    drop(st);
                    return finish(Some(format!(
                        "the gateway's log id changed from {l:032x} to {log_id:032x}"
                    )));
                }
                Some(_) => {}
            }
            st.generation += 1;
            st.dead = false;
            st.inflight.clear();
            if !first {
                st.reconnects += 1;
            }
            (
                st.generation,
                st.unacked.iter().copied().collect::<Vec<_>>(),
            )
        };
        first = false;
        let reader = {
            let shared = p.shared.clone();
            let lanes = p.lanes;
            std::thread::spawn(move || reply_reader(reader_stream, generation, shared, lanes))
        };
        let mut wire_seq: u32 = 0;
        let mut send = |w: &mut Client, idx: usize, resend: bool| -> bool {
            wire_seq = wire_seq.wrapping_add(1).max(1);
            let r = &p.records[idx];
            {
                let mut st = p.lock();
                st.inflight.insert(wire_seq, idx);
                if resend {
                    st.resent += 1;
                }
            }
            w.send(&Request::Publish {
                seq: wire_seq,
                topic: &p.topic,
                timestamp_us: Some(r.timestamp_us),
                payload: &r.payload,
                ack: AckLevel::Durable,
                producer: Some(r.producer),
            })
            .is_ok()
        };
        let mut ok = true;
        for idx in resend {
            if !send(&mut w, idx, true) {
                ok = false;
                break;
            }
        }
        while ok {
            let idx = {
                let (m, cv) = &*p.shared;
                let mut st = lock(m);
                if st.dead || st.error.is_some() {
                    break;
                }
                if st.next == n {
                    if st.unacked.is_empty() {
                        break;
                    }
                    let _ = cv.wait_timeout(st, Duration::from_millis(50));
                    continue;
                }
                let next = st.next;
                if st.lane_unacked[next % p.lanes] >= PRODUCER_WINDOW {
                    let _ = cv.wait_timeout(st, Duration::from_millis(50));
                    continue;
                }
                let at = due(t0, replay, p.records[next].row, rows);
                let now = Instant::now();
                if at > now {
                    let _ = cv.wait_timeout(st, (at - now).min(Duration::from_millis(50)));
                    continue;
                }
                st.next += 1;
                st.unacked.insert(next);
                st.lane_unacked[next % p.lanes] += 1;
                next
            };
            ok = send(&mut w, idx, false);
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        let _ = reader.join();
        {
            let mut st = p.lock();
            st.dead = true;
        }
    }
    finish(None);
}

// ----- The sink ---------------------------------------------------------------------------

/// Counts the lines of the sink's files as they grow, reading only what is new.
#[derive(Debug, Default)]
struct SinkCounter {
    /// Per file: bytes read and lines counted.
    files: HashMap<PathBuf, (u64, u64)>,
    /// Highest offset seen in a last line.
    high: Option<u64>,
}

impl SinkCounter {
    fn lines(&mut self, dir: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Ok(mut f) = File::open(&path) else {
                continue;
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let entry = self.files.entry(path).or_insert((0, 0));
            if len < entry.0 {
                // Cut back (a torn line after a kill): count again.
                *entry = (0, 0);
            }
            if len == entry.0 {
                continue;
            }
            let mut buf = Vec::new();
            if io::Seek::seek(&mut f, io::SeekFrom::Start(entry.0)).is_err()
                || f.take(len - entry.0).read_to_end(&mut buf).is_err()
            {
                continue;
            }
            // Only whole lines count; a partial one is read again next time.
            let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            entry.0 += last_nl as u64 + 1;
            entry.1 += buf[..=last_nl].iter().filter(|&&b| b == b'\n').count() as u64;
            let start = buf[..last_nl]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&buf[start..last_nl])
                && let Some(off) = v["offset"].as_u64()
            {
                self.high = Some(self.high.map_or(off, |h| h.max(off)));
            }
        }
        self.files.values().map(|v| v.1).sum()
    }
}

/// Total size of the sink's files, bytes.
fn sink_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// One line of the file sink.
#[derive(Debug, Clone)]
struct SinkLine {
    log_id: String,
    offset: u64,
    topic: String,
    timestamp_us: u64,
    payload: Vec<u8>,
}

/// The sink's lines per file stem, in file order; errors are reported as failures.
fn read_sink(dir: &Path, failures: &mut Vec<String>) -> BTreeMap<String, Vec<SinkLine>> {
    let mut files: BTreeMap<String, BTreeMap<u64, PathBuf>> = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let parsed = name
                .strip_suffix(".jsonl")
                .and_then(|b| b.rsplit_once('.'))
                .and_then(|(stem, n)| Some((stem.to_string(), n.parse::<u64>().ok()?)));
            match parsed {
                Some((stem, n)) => {
                    files.entry(stem).or_default().insert(n, e.path());
                }
                None => failures.push(format!("unexpected file in the sink: {name}")),
            }
        }
    }
    let mut out = BTreeMap::new();
    for (stem, by_n) in files {
        let mut lines = Vec::new();
        for path in by_n.values() {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("cannot read {}: {e}", path.display()));
                    continue;
                }
            };
            if !text.is_empty() && !text.ends_with('\n') {
                failures.push(format!("{}: last line is torn", path.display()));
            }
            for (i, l) in text.lines().enumerate() {
                let v: serde_json::Value = match serde_json::from_str(l) {
                    Ok(v) => v,
                    Err(e) => {
                        failures.push(format!("{}:{}: not JSON: {e}", path.display(), i + 1));
                        continue;
                    }
                };
                let payload = match v["payload_encoding"].as_str() {
                    Some("utf8") => v["payload"].as_str().unwrap_or("").as_bytes().to_vec(),
                    other => {
                        failures.push(format!(
                            "{}:{}: payload encoding {other:?}, expected utf8",
                            path.display(),
                            i + 1
                        ));
                        continue;
                    }
                };
                lines.push(SinkLine {
                    log_id: v["log_id"].as_str().unwrap_or("").to_string(),
                    offset: v["offset"].as_u64().unwrap_or(u64::MAX),
                    topic: v["topic"].as_str().unwrap_or("").to_string(),
                    timestamp_us: v["timestamp_us"].as_u64().unwrap_or(0),
                    payload,
                });
            }
        }
        out.insert(stem, lines);
    }
    out
}

// ----- The serial line's account ------------------------------------------------------------

/// How the stored buoy records compare with the lines sent.
#[derive(Debug, Default)]
struct LineAccount {
    /// Sent lines found in the log, once each.
    matched: u64,
    /// Indexes of sent lines not in the log.
    missing: Vec<usize>,
    /// Stored payloads that are no sent line, with the index of the line they are the end
    /// of (if any).
    fragments: Vec<(String, Option<usize>)>,
    /// Sent lines stored more than once.
    repeated: u64,
}

fn account_lines(sent: &[String], stored: &[&[u8]]) -> LineAccount {
    let mut index: HashMap<&[u8], Vec<usize>> = HashMap::new();
    for (i, l) in sent.iter().enumerate() {
        index.entry(l.as_bytes()).or_default().push(i);
    }
    let mut acc = LineAccount::default();
    let mut seen = vec![false; sent.len()];
    let mut ptr = 0usize;
    for p in stored {
        let candidates = index.get(p);
        match candidates.and_then(|v| v.iter().copied().find(|&j| !seen[j])) {
            Some(j) => {
                seen[j] = true;
                acc.matched += 1;
                ptr = ptr.max(j + 1);
            }
            None if candidates.is_some() => acc.repeated += 1,
            None => {
                let text = String::from_utf8_lossy(p).into_owned();
                // A line cut by the kill: the end of a line just before the current one.
                let of = (ptr.saturating_sub(3)..(ptr + 3).min(sent.len()))
                    .find(|&j| !seen[j] && !p.is_empty() && sent[j].as_bytes().ends_with(p));
                acc.fragments.push((text, of));
            }
        }
    }
    acc.missing = (0..sent.len()).filter(|&j| !seen[j]).collect();
    acc
}

/// Contiguous runs of sorted indexes, as (first, last).
fn runs(idx: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &i in idx {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == i => *last = i,
            _ => out.push((i, i)),
        }
    }
    out
}

// ----- The run ----------------------------------------------------------------------------

/// The message part of an `env_logger` line (`[time LEVEL target] message`).
fn log_message(line: &str) -> &str {
    match line.split_once("] ") {
        Some((head, msg)) if head.starts_with('[') => msg,
        _ => line,
    }
}

/// Seconds since `t0`, for progress lines.
struct Clock(Instant);

impl Clock {
    fn stamp(&self) -> String {
        format!("[{:6.1}s]", self.0.elapsed().as_secs_f64())
    }
}

/// The gateway's counters over a kept connection (`None` while it is down).
fn gateway_stats(c: &mut Option<Client>, addr: &str) -> Option<spillway_core::wire::GatewayStats> {
    if c.is_none() {
        let s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(200)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut cl = Client::new(Box::new(s));
        cl.hello("spillway-demo-monitor").ok()?;
        *c = Some(cl);
    }
    match c.as_mut()?.stats() {
        Ok(s) => Some(s),
        Err(_) => {
            *c = None;
            None
        }
    }
}

/// The numbers after `needle` in every line of `text` that has it.
fn numbers_after(text: &str, needle: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let rest = &l[l.find(needle)? + needle.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Everything [`verify`] needs.
struct Observed<'a> {
    sst: &'a SstSeries,
    cgm: &'a CgmSeries,
    sent_at: &'a [Duration],
    killed_at: Duration,
    back_at: Duration,
    publishers: [&'a Publisher; 2],
    log_id: u128,
    first_offset: u64,
    records: &'a [FetchedRecord],
    sink_dir: &'a Path,
}

/// Compares input, acknowledgements, the gateway's log and the sink (module doc, step 5).
fn verify(o: &Observed<'_>, summary: &mut Summary) {
    let failures = &mut summary.failures;
    let notes = &mut summary.notes;
    let log_hex = format!("{:032x}", o.log_id);

    // The sink: exactly once per (log id, offset), in offset order per topic.
    let sink = read_sink(o.sink_dir, failures);
    let mut by_offset: HashMap<u64, &SinkLine> = HashMap::new();
    let mut dup_lines: HashMap<&str, u64> = HashMap::new();
    let mut foreign = 0u64;
    for (stem, lines) in &sink {
        let mut high: Option<u64> = None;
        for l in lines {
            if l.log_id != log_hex {
                foreign += 1;
                continue;
            }
            if let Some(first) = by_offset.get(&l.offset) {
                *dup_lines.entry(l.topic.as_str()).or_default() += 1;
                if first.payload != l.payload || first.topic != l.topic {
                    failures.push(format!(
                        "offset {} is in the sink twice with different contents",
                        l.offset
                    ));
                }
                continue;
            }
            if high.is_some_and(|h| l.offset < h) {
                failures.push(format!(
                    "sink files of {stem}: offset {} after {} (out of order)",
                    l.offset,
                    high.unwrap_or(0)
                ));
            }
            high = Some(high.map_or(l.offset, |h| h.max(l.offset)));
            by_offset.insert(l.offset, l);
        }
    }
    if foreign > 0 {
        failures.push(format!(
            "{foreign} sink lines carry another log id than {log_hex}"
        ));
    }

    // The gateway's log against the sink.
    let mut lost_stored: HashMap<&str, u64> = HashMap::new();
    let mut stored: HashMap<&str, u64> = HashMap::new();
    let mut gw_offsets: BTreeSet<u64> = BTreeSet::new();
    let mut mismatched = 0u64;
    for r in o.records {
        *stored.entry(r.topic.as_str()).or_default() += 1;
        gw_offsets.insert(r.offset);
        match by_offset.get(&r.offset) {
            None => *lost_stored.entry(r.topic.as_str()).or_default() += 1,
            Some(l) => {
                if l.topic != r.topic || l.payload != r.payload || l.timestamp_us != r.timestamp_us
                {
                    mismatched += 1;
                }
            }
        }
    }
    if mismatched > 0 {
        failures.push(format!(
            "{mismatched} sink lines differ from the gateway's record at their offset"
        ));
    }
    let phantom = by_offset
        .keys()
        .filter(|&&off| off >= o.first_offset && !gw_offsets.contains(&off))
        .count();
    if phantom > 0 {
        failures.push(format!(
            "{phantom} sink lines have an offset the gateway's log does not"
        ));
    }
    if o.first_offset > 0 {
        notes.push(format!(
            "the gateway had reclaimed offsets below {} (drained and committed); those are \
             checked against the acknowledgements only",
            o.first_offset
        ));
    }
    let delivered = |topic: &str| by_offset.values().filter(|l| l.topic == topic).count() as u64;

    // The serial line.
    let sent = o.sent_at.len();
    let sst_sent = &o.sst.lines[..sent];
    let sst_stored: Vec<&[u8]> = o
        .records
        .iter()
        .filter(|r| r.topic == TOPIC_SST)
        .map(|r| r.payload.as_slice())
        .collect();
    let acc = account_lines(sst_sent, &sst_stored);
    let mut sst_row = TopicRow {
        topic: TOPIC_SST.into(),
        path: "serial lines",
        input_rows: o.sst.lines.len() as u64 + o.sst.empty,
        skipped_empty: o.sst.empty,
        sent: sent as u64,
        resent: 0,
        acked: None,
        duplicate_acks: 0,
        stored: stored.get(TOPIC_SST).copied().unwrap_or(0),
        delivered: delivered(TOPIC_SST),
        duplicate_lines: dup_lines.get(TOPIC_SST).copied().unwrap_or(0),
        lost: lost_stored.get(TOPIC_SST).copied().unwrap_or(0),
    };
    if sent < o.sst.lines.len() {
        failures.push(format!(
            "only {sent} of {} buoy lines were written to the serial line",
            o.sst.lines.len()
        ));
    }
    if acc.repeated > 0 {
        failures.push(format!("{} buoy lines are stored twice", acc.repeated));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let window = Duration::from_millis(LINGER_MS) + Duration::from_secs(2);
    let mut unexplained = Vec::new();
    for (a, b) in runs(&acc.missing) {
        let (ta, tb) = (o.sent_at[a], o.sent_at[b]);
        if ta + window < o.killed_at || tb > o.killed_at {
            unexplained.push(format!(
                "lines {}..={} (sent at {:.1}..{:.1} s)",
                a + 1,
                b + 1,
                ta.as_secs_f64(),
                tb.as_secs_f64()
            ));
        }
    }
    let missing: BTreeSet<usize> = acc.missing.iter().copied().collect();
    let (during_down, during_down_stored) = o
        .sent_at
        .iter()
        .enumerate()
        .filter(|(_, t)| **t >= o.killed_at && **t <= o.back_at)
        .fold((0u64, 0u64), |(n, k), (i, _)| {
            (n + 1, k + u64::from(!missing.contains(&i)))
        });
    let mut sst_note = format!(
        "{TOPIC_SST}: {} lines written to the serial line, {} stored as written",
        thousands(sent as u64),
        thousands(acc.matched)
    );
    if !acc.missing.is_empty() {
        let first = acc.missing[0];
        let last = acc.missing[acc.missing.len() - 1];
        sst_note.push_str(&format!(
            "; {} not stored (lines {}..={}, written {:.0} to {:.0} ms before the gateway's \
             SIGKILL): line mode has no acknowledgements, and with --ack buffered the gateway \
             holds lines in RAM for up to --linger-ms {LINGER_MS} before writing them to flash, \
             so the lines it had read but not yet written died with it",
            thousands(acc.missing.len() as u64),
            first + 1,
            last + 1,
            ms(o.killed_at.saturating_sub(o.sent_at[first])),
            ms(o.killed_at.saturating_sub(o.sent_at[last])),
        ));
    }
    for (frag, of) in &acc.fragments {
        match of {
            Some(j) => sst_note.push_str(&format!(
                "; 1 record {frag:?} is the end of line {} ({:?}), cut in half by the kill: \
                 the killed gateway had read its first bytes, the restarted one read the rest",
                j + 1,
                o.sst.lines[*j]
            )),
            None => sst_note.push_str(&format!("; 1 record {frag:?} matches no line sent")),
        }
    }
    sst_note.push_str(&format!(
        "; of the {} lines written while the gateway was down, {} waited in the pty and were \
         stored after the restart",
        thousands(during_down),
        thousands(during_down_stored)
    ));
    notes.push(sst_note);
    if !unexplained.is_empty() {
        failures.push(format!(
            "buoy lines lost away from the gateway kill: {}",
            unexplained.join(", ")
        ));
    }
    let unmatched_fragments = acc.fragments.iter().filter(|f| f.1.is_none()).count();
    if acc.fragments.len() > 1 || unmatched_fragments > 0 {
        failures.push(format!(
            "{} stored buoy records are not lines that were sent",
            acc.fragments.len()
        ));
    }
    let expect_sst = acc.matched + acc.fragments.len() as u64;
    if sst_row.delivered != expect_sst {
        failures.push(format!(
            "{TOPIC_SST}: {} delivered, expected {} (sent {} − {} lost at the kill + {} fragments)",
            sst_row.delivered,
            expect_sst,
            sent,
            acc.missing.len(),
            acc.fragments.len()
        ));
    }
    sst_row.lost = lost_stored.get(TOPIC_SST).copied().unwrap_or(0);
    summary.topics.push(sst_row);

    // The TCP publishers.
    let gw_by_offset: HashMap<u64, &FetchedRecord> =
        o.records.iter().map(|r| (r.offset, r)).collect();
    let mut resent_total = 0;
    let mut dup_total = 0;
    for (p, empty) in o
        .publishers
        .iter()
        .zip([o.cgm.isig_empty, o.cgm.glucose_empty])
    {
        let st = p.lock();
        let topic = p.topic.as_str();
        let mut lost = 0u64;
        let mut wrong_offset = 0u64;
        for (r, a) in p.records.iter().zip(&st.acks) {
            let Some(a) = a else { continue };
            if let Some(g) = gw_by_offset.get(&a.offset)
                && (g.producer != Some(r.producer) || g.payload != r.payload)
            {
                wrong_offset += 1;
            }
            let ok = by_offset.get(&a.offset).is_some_and(|l| {
                l.topic == topic && l.payload == r.payload && l.timestamp_us == r.timestamp_us
            });
            if !ok {
                lost += 1;
            }
        }
        if wrong_offset > 0 {
            failures.push(format!(
                "{topic}: {wrong_offset} acknowledgements name an offset holding another record"
            ));
        }
        let mut producers: HashMap<(u64, u32), u64> = HashMap::new();
        for g in o.records.iter().filter(|g| g.topic == topic) {
            if let Some(pr) = g.producer {
                *producers.entry((pr.id, pr.seq)).or_default() += 1;
            }
        }
        let twice = producers.values().filter(|&&c| c > 1).count();
        if twice > 0 {
            failures.push(format!(
                "{topic}: {twice} (producer id, sequence) pairs are stored more than once"
            ));
        }
        let row = TopicRow {
            topic: topic.to_string(),
            path: "TCP durable",
            input_rows: o.cgm.rows as u64,
            skipped_empty: empty,
            sent: st.next as u64,
            resent: st.resent,
            acked: Some(st.acked as u64),
            duplicate_acks: st.duplicate_acks,
            stored: stored.get(topic).copied().unwrap_or(0),
            delivered: delivered(topic),
            duplicate_lines: dup_lines.get(topic).copied().unwrap_or(0),
            lost: lost + lost_stored.get(topic).copied().unwrap_or(0),
        };
        let expect = row.input_rows - row.skipped_empty;
        if row.acked != Some(expect) || row.delivered != expect || row.stored != expect {
            failures.push(format!(
                "{topic}: {expect} values in the input, {} acknowledged, {} stored, {} delivered",
                row.acked.unwrap_or(0),
                row.stored,
                row.delivered
            ));
        }
        if empty > 0 {
            notes.push(format!(
                "{topic}: {} of {} rows have no value (`nil` in the file) and were not sent; \
                 the other {} are each stored and delivered once",
                thousands(empty),
                thousands(row.input_rows),
                thousands(expect)
            ));
        }
        if st.storage_failures > 0 {
            notes.push(format!(
                "{topic}: the gateway answered {} durable publishes with StorageFailed; \
                 they were resent after it recovered",
                thousands(st.storage_failures)
            ));
        }
        resent_total += st.resent;
        dup_total += st.duplicate_acks;
        summary.topics.push(row);
    }
    if resent_total == 0 {
        notes.push(
            "TCP: the acknowledgements of every publish sent before the gateway's SIGKILL had \
             arrived before the connection dropped, so nothing needed resending this time; \
             the publishers reconnected to the restarted gateway and went on"
                .to_string(),
        );
    } else {
        notes.push(format!(
            "TCP: {} publishes had no acknowledgement when the gateway was SIGKILLed and were \
             resent after its restart with the same producer id and sequence number: {} had \
             reached flash before the kill and came back as duplicate acknowledgements with \
             their original offsets (not stored twice), {} were stored then",
            thousands(resent_total),
            thousands(dup_total),
            thousands(resent_total.saturating_sub(dup_total))
        ));
    }
    let dup_lines_total: u64 = dup_lines.values().sum();
    for t in &summary.topics {
        if t.lost > 0 {
            failures.push(format!("{}: {} records lost", t.topic, t.lost));
        }
    }
    if dup_lines_total > 0 {
        failures.push(format!(
            "{dup_lines_total} records are in the sink more than once"
        ));
    }
}

/// Runs the demo (see the module doc). `Err` when it could not get as far as the
/// verification; failed checks are in [`Summary::failures`].
pub fn run(opts: &Options) -> Result<Summary, DemoError> {
    let say = |s: String| {
        if !opts.quiet {
            println!("{s}");
            let _ = io::stdout().flush();
        }
    };
    let replay = opts.replay;
    let w = &opts.work_dir;
    if w.exists() {
        let is_ours = w.join(MARKER).exists();
        let empty = std::fs::read_dir(w)
            .map(|mut rd| rd.next().is_none())
            .unwrap_or(false);
        if !is_ours && !empty {
            return Err(DemoError::Step(format!(
                "{} exists and is not a previous demo's working directory: not emptying it",
                w.display()
            )));
        }
        std::fs::remove_dir_all(w).map_err(io_err(format!("empty {}", w.display())))?;
    }
    std::fs::create_dir_all(w).map_err(io_err(format!("create {}", w.display())))?;
    std::fs::write(w.join(MARKER), b"spillway-demo working directory\n")
        .map_err(io_err(format!("create {}", w.join(MARKER).display())))?;
    let image = w.join("gateway.img");
    let sink_dir = w.join("sink");
    let state = w.join("bridge-state.redb");
    let gw_log = w.join("gateway.log");

    let sst = load_sst(&opts.data_dir.join(SST_FILE), opts.rows)?;
    let cgm = load_cgm(&opts.data_dir.join(CGM_FILE), opts.rows)?;
    let days = |span: (u64, u64)| span.1.saturating_sub(span.0) as f64 / 86_400e6;
    say(format!(
        "data: buoy sea surface temperature, {} rows over {:.0} days; glucose monitor, {} rows \
         over {:.0} days ({} sensor-current and {} glucose values)",
        thousands(sst.lines.len() as u64 + sst.empty),
        days(sst.span_us),
        thousands(cgm.rows as u64),
        days(cgm.span_us),
        thousands(cgm.isig.len() as u64),
        thousands(cgm.glucose.len() as u64)
    ));
    let speedup = |span: (u64, u64)| {
        span.1.saturating_sub(span.0) as f64 / 1e6 / replay.as_secs_f64().max(1e-3)
    };
    say(format!(
        "replay: {:.0} s each, {:.0}x (buoy) and {:.0}x (glucose) faster than real time; seed {}",
        replay.as_secs_f64(),
        speedup(sst.span_us),
        speedup(cgm.span_us),
        opts.seed
    ));

    let (master, slave) =
        TTYPort::pair().map_err(|e| DemoError::Step(format!("cannot open a pty pair: {e}")))?;
    let pts = slave
        .name()
        .ok_or_else(|| DemoError::Step("the pty has no name".into()))?;
    let mut writer = master
        .try_clone_native()
        .map_err(|e| DemoError::Step(format!("cannot clone the pty master: {e}")))?;
    let _ = writer.set_timeout(Duration::from_millis(200));
    let addr = format!("127.0.0.1:{}", crate::gateway::free_port());
    let gw_args: Vec<String> = [
        "--image",
        &image.display().to_string(),
        "--size",
        &if opts.image_bytes.is_multiple_of(1 << 20) {
            format!("{}M", opts.image_bytes >> 20)
        } else {
            opts.image_bytes.to_string()
        },
        "--erase-size",
        "4K",
        "--write-size",
        "4",
        "--listen",
        &format!("tcp://{addr}"),
        "--serial",
        &format!("serial://{pts}?baud={BAUD}&mode=lines&topic={TOPIC_SST}"),
        "--gateway-id",
        GATEWAY_ID,
        "--ack",
        "buffered",
        "--linger-ms",
        &LINGER_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    say(format!(
        "starting the gateway: spillway run {}",
        gw_args.join(" ")
    ));
    let mut gw = Gateway::start(&opts.spillway_bin, &gw_args, 2, &gw_log)?;
    for l in gw.log_lines(&["created image", "listening on"]) {
        say(format!("  gateway: {}", log_message(&l)));
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let kill_at = replay.mul_f64(GATEWAY_KILL_AT + rng.random_range(-0.05..0.05));
    let uplink_at = replay
        .mul_f64(UPLINK_UP_AT)
        .max(kill_at + opts.gateway_down + Duration::from_millis(300));
    let bridge_kill_after = replay
        .mul_f64(BRIDGE_KILL_AFTER * rng.random_range(0.75..1.25))
        .max(Duration::from_millis(400));
    let id_bases: [u64; 2] = [rng.random::<u64>() >> 8 << 8, rng.random::<u64>() >> 8 << 8];

    let sst_lines = Arc::new(sst.lines.clone());
    let serial = Arc::new(Mutex::new(SerialProgress::default()));
    let publishers = [
        Arc::new(Publisher::new(
            TOPIC_ISIG,
            &cgm.isig,
            opts.lanes,
            id_bases[0],
        )),
        Arc::new(Publisher::new(
            TOPIC_GLUCOSE,
            &cgm.glucose,
            opts.lanes,
            id_bases[1],
        )),
    ];
    let clock = Clock(Instant::now());
    let t0 = clock.0;
    say(format!(
        "{} replay started: buoy lines on the serial line, glucose values as durable TCP \
         publishes; uplink down (no bridge)",
        clock.stamp()
    ));
    let serial_thread: JoinHandle<()> = {
        let (lines, serial) = (sst_lines.clone(), serial.clone());
        std::thread::spawn(move || serial_sensor(writer, lines, t0, replay, serial))
    };
    let pub_threads: Vec<JoinHandle<()>> = publishers
        .iter()
        .map(|p| {
            let (p, addr, rows) = (p.clone(), addr.clone(), cgm.rows);
            std::thread::spawn(move || {
                run_publisher(&p, &addr, t0, replay, rows, Duration::from_secs(60));
            })
        })
        .collect();

    let drain_args = |once: bool| -> Vec<String> {
        let mut a: Vec<String> = [
            "drain",
            "--gateway",
            &format!("tcp://{addr}"),
            "--sink",
            &format!("file:{}", sink_dir.display()),
            "--state",
            &state.display().to_string(),
            "--progress",
            "off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if once {
            a.push("--once".into());
        }
        a
    };

    let mut monitor: Option<Client> = None;
    let mut sink_count = SinkCounter::default();
    let mut killed_at: Option<Duration> = None;
    let mut back_at: Option<Duration> = None;
    let mut bridge: Option<Bridge> = None;
    let mut bridge_runs = 0u32;
    let mut bridge_killed_at: Option<Duration> = None;
    let mut bridge_kill_lines = u64::MAX;
    let mut next_progress = t0 + opts.progress_every;
    let result: Result<(), DemoError> = loop {
        let now = t0.elapsed();
        if killed_at.is_none() && now >= kill_at {
            // The worst moment: with durable publishes in flight (waited for up to 0.5 s).
            let in_flight = || {
                publishers
                    .iter()
                    .map(|p| p.lock().unacked.len())
                    .sum::<usize>()
            };
            let wait_until = Instant::now() + Duration::from_millis(500);
            while in_flight() == 0 && Instant::now() < wait_until {
                std::thread::sleep(Duration::from_micros(100));
            }
            let lines = lock(&serial).sent_at.len();
            let pid = gw.pid();
            gw.kill();
            monitor = None;
            killed_at = Some(t0.elapsed());
            say(format!(
                "{} SIGKILL gateway (pid {pid}) while durable publishes are in flight; {} buoy \
                 lines written so far, and the serial line keeps writing into the pty",
                clock.stamp(),
                thousands(lines as u64)
            ));
        }
        if let Some(k) = killed_at
            && back_at.is_none()
            && now >= k + opts.gateway_down
        {
            // The killed gateway left the pty in exclusive mode (TIOCEXCL), which outlives
            // it because this process keeps the slave open: clear it so that the new gateway
            // can open the port without root.
            clear_exclusive(&slave);
            let t = Instant::now();
            match Gateway::start(&opts.spillway_bin, &gw_args, 2, &gw_log) {
                Ok(g) => gw = g,
                Err(e) => break Err(e),
            }
            back_at = Some(t0.elapsed());
            say(format!(
                "{} gateway restarted on the same image ({} ms to listening)",
                clock.stamp(),
                t.elapsed().as_millis()
            ));
            for l in gw.log_lines(&["not clean"]) {
                say(format!("  gateway: {}", log_message(&l)));
            }
            say(
                "  (offsets are never reused: new records continue from the offset lease the \
                 gateway had reserved, so the offsets in between stay unused)"
                    .to_string(),
            );
        }
        if bridge_runs == 0 && now >= uplink_at {
            // Records held by the gateway: all but the few lines a kill may have cost.
            let backlog = publishers.iter().map(|p| p.lock().acked).sum::<usize>() as u64
                + lock(&serial).sent_at.len() as u64;
            bridge_kill_lines = (backlog as f64 * rng.random_range(0.3..0.7)) as u64;
            match Bridge::start(
                &opts.bridge_bin,
                &drain_args(false),
                &w.join("bridge-1.log"),
            ) {
                Ok(b) => bridge = Some(b),
                Err(e) => break Err(e),
            }
            bridge_runs = 1;
            say(format!(
                "{} uplink up: spillway-bridge drain --sink file:{} (backlog about {} records)",
                clock.stamp(),
                sink_dir.display(),
                thousands(backlog)
            ));
        }
        if bridge_runs == 1
            && bridge_killed_at.is_none()
            && (now >= uplink_at + bridge_kill_after
                || sink_count.lines(&sink_dir) >= bridge_kill_lines)
            && let Some(b) = bridge.as_mut()
        {
            // The worst moment: right after a batch reached the files, before the bridge
            // saved its checkpoint.
            let before = sink_bytes(&sink_dir);
            let wait_until = Instant::now() + Duration::from_secs(1);
            let mut wrote = false;
            while !wrote && Instant::now() < wait_until {
                std::thread::sleep(Duration::from_micros(200));
                wrote = sink_bytes(&sink_dir) != before;
            }
            let pid = b.pid();
            b.kill();
            bridge_killed_at = Some(t0.elapsed());
            let lines = sink_count.lines(&sink_dir);
            say(format!(
                "{} SIGKILL bridge (pid {pid}){} while it drains: the sink has {} lines, the \
                 gateway holds about {} records",
                clock.stamp(),
                if wrote {
                    " right after it wrote a batch"
                } else {
                    ""
                },
                thousands(lines),
                thousands(
                    publishers.iter().map(|p| p.lock().acked).sum::<usize>() as u64
                        + lock(&serial).sent_at.len() as u64
                )
            ));
        }
        if bridge_runs == 1
            && let Some(k) = bridge_killed_at
            && now >= k + Duration::from_millis(300)
        {
            match Bridge::start(
                &opts.bridge_bin,
                &drain_args(false),
                &w.join("bridge-2.log"),
            ) {
                Ok(b) => bridge = Some(b),
                Err(e) => break Err(e),
            }
            bridge_runs = 2;
            say(format!(
                "{} bridge restarted: it resumes from its checkpoint",
                clock.stamp()
            ));
        }
        if let Some(b) = bridge.as_mut()
            && let Some(st) = b.exited()
        {
            break Err(DemoError::Step(format!(
                "spillway-bridge drain exited with {st} (log: {})",
                w.join(format!("bridge-{bridge_runs}.log")).display()
            )));
        }
        // (While it is killed, `gw` holds no child.)
        if let Some(Ok(Some(st))) = gw.child.as_mut().map(Child::try_wait) {
            break Err(DemoError::Step(format!(
                "spillway exited with {st} (log: {})",
                gw_log.display()
            )));
        }
        if let Some(e) = publishers.iter().find_map(|p| p.lock().error.clone()) {
            break Err(DemoError::Step(e));
        }
        if let Some(e) = lock(&serial).error.clone() {
            break Err(DemoError::Step(e));
        }
        if Instant::now() >= next_progress {
            next_progress += opts.progress_every;
            let lines = lock(&serial).sent_at.len();
            let mut line = format!(
                "{} serial {}/{} lines",
                clock.stamp(),
                thousands(lines as u64),
                thousands(sst.lines.len() as u64)
            );
            for p in &publishers {
                let st = p.lock();
                line.push_str(&format!(
                    " | {} {}/{} acked",
                    p.topic,
                    thousands(st.acked as u64),
                    thousands(p.records.len() as u64)
                ));
            }
            let next = gateway_stats(&mut monitor, &addr).map(|s| s.next_offset);
            match next {
                Some(n) => line.push_str(&format!(" | gateway next offset {}", thousands(n))),
                None => line.push_str(" | gateway DOWN"),
            }
            if bridge_runs == 0 {
                line.push_str(" | uplink down");
            } else {
                let lines = sink_count.lines(&sink_dir);
                line.push_str(&format!(" | sink {} lines", thousands(lines)));
                if let (Some(n), Some(h)) = (next, sink_count.high) {
                    line.push_str(&format!(
                        ", {} offsets behind",
                        thousands(n.saturating_sub(h + 1))
                    ));
                }
            }
            say(line);
        }
        let done = serial_thread.is_finished()
            && pub_threads.iter().all(JoinHandle::is_finished)
            && bridge_runs == 2;
        if done {
            break Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if let Err(e) = result {
        gw.kill();
        return Err(e);
    }
    let _ = serial_thread.join();
    for t in pub_threads {
        let _ = t.join();
    }
    let replay_took = t0.elapsed();
    let (killed_at, back_at) = match (killed_at, back_at) {
        (Some(k), Some(b)) => (k, b),
        _ => return Err(DemoError::Step("the gateway was never killed".into())),
    };
    let acked: usize = publishers.iter().map(|p| p.lock().acked).sum();
    say(format!(
        "{} replay done: {} buoy lines written, {} glucose publishes acknowledged",
        clock.stamp(),
        thousands(lock(&serial).sent_at.len() as u64),
        thousands(acked as u64)
    ));

    // Let the last lines reach flash: the log stops growing and everything is durable.
    let settle_until = Instant::now() + Duration::from_secs(15);
    let mut last = (u64::MAX, Instant::now());
    loop {
        if let Some(s) = gateway_stats(&mut monitor, &addr) {
            if s.next_offset != last.0 {
                last = (s.next_offset, Instant::now());
            } else if s.durable_offset == s.next_offset
                && last.1.elapsed() >= Duration::from_millis(4 * LINGER_MS)
            {
                break;
            }
        }
        if Instant::now() > settle_until {
            return Err(DemoError::Step(
                "the gateway's log did not settle within 15 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut summary = Summary {
        seed: opts.seed,
        work_dir: w.clone(),
        replay: replay_took,
        gateway_downtime: back_at.saturating_sub(killed_at),
        uplink_downtime: uplink_at,
        ..Summary::default()
    };
    if let Some(mut b) = bridge.take() {
        match b.terminate(Duration::from_secs(60)) {
            Some(st) if st.success() => say(format!(
                "{} bridge stopped with SIGTERM (exit 0)",
                clock.stamp()
            )),
            other => summary.failures.push(format!(
                "the bridge did not stop cleanly on SIGTERM: {other:?}"
            )),
        }
    }
    let once_log = w.join("bridge-once.log");
    let t = Instant::now();
    let status = Command::new(&opts.bridge_bin)
        .args(drain_args(true))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            File::create(&once_log).map_err(io_err(format!("create {}", once_log.display())))?,
        ))
        .status()
        .map_err(io_err("run spillway-bridge drain --once"))?;
    let once_text = std::fs::read_to_string(&once_log).unwrap_or_default();
    summary.final_drain_records = numbers_after(&once_text, "forwarded ")
        .first()
        .copied()
        .unwrap_or(0);
    if !status.success() {
        summary.failures.push(format!(
            "drain --once exited with {status} (log: {})",
            once_log.display()
        ));
    }
    say(format!(
        "{} final drain --once: forwarded {} records in {} ms (exit {})",
        clock.stamp(),
        thousands(summary.final_drain_records),
        t.elapsed().as_millis(),
        status.code().unwrap_or(-1)
    ));
    summary.total = t0.elapsed();
    for i in 1..=2 {
        let text = std::fs::read_to_string(w.join(format!("bridge-{i}.log"))).unwrap_or_default();
        summary.sink_skipped_duplicates += numbers_after(&text, "file sink: skipped ")
            .iter()
            .sum::<u64>();
    }
    summary.sink_skipped_duplicates += numbers_after(&once_text, "file sink: skipped ")
        .iter()
        .sum::<u64>();

    // The gateway's whole log, then a clean stop.
    let mut c = Client::tcp(&addr).map_err(io_err("connect to the gateway"))?;
    let stats = c.stats().map_err(io_err("gateway stats"))?;
    let records = c.fetch_all(0).map_err(io_err("read the gateway's log"))?;
    drop(c);
    drop(monitor);
    match gw.terminate() {
        Some(st) if st.success() => {}
        other => summary.failures.push(format!(
            "the gateway did not stop cleanly on SIGTERM: {other:?}"
        )),
    }
    drop((master, slave));
    say(format!(
        "{} verifying {} sink lines against {} acknowledgements and the gateway's {} records",
        clock.stamp(),
        thousands(sink_count.lines(&sink_dir)),
        thousands(acked as u64),
        thousands(records.len() as u64)
    ));
    let log_id = publishers[0].lock().log_id.unwrap_or(0);
    let sent_at = lock(&serial).sent_at.clone();
    let observed = Observed {
        sst: &sst,
        cgm: &cgm,
        sent_at: &sent_at,
        killed_at,
        back_at,
        publishers: [&publishers[0], &publishers[1]],
        log_id,
        first_offset: stats.first_offset,
        records: &records,
        sink_dir: &sink_dir,
    };
    verify(&observed, &mut summary);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times() {
        assert_eq!(parse_utc_us("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_utc_us("2016-02-15T00:30:00Z"),
            Some(1_455_496_200_000_000)
        );
        assert_eq!(
            parse_utc_us("2010-03-24 09:51:00"),
            Some(1_269_424_260_000_000)
        );
        // 2000 was a leap year, 2100 will not be.
        assert_eq!(
            parse_utc_us("2000-03-01 00:00:00").unwrap()
                - parse_utc_us("2000-02-28 00:00:00").unwrap(),
            2 * 86_400_000_000
        );
        assert_eq!(
            parse_utc_us("2100-03-01 00:00:00").unwrap()
                - parse_utc_us("2100-02-28 00:00:00").unwrap(),
            86_400_000_000
        );
        for bad in [
            "",
            "2010-03-24",
            "2010-13-01 00:00:00",
            "2010-03-24 24:00:00",
            "x010-03-24 00:00:00",
        ] {
            assert_eq!(parse_utc_us(bad), None, "{bad}");
        }
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(52_281), "52,281");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_vendored_series_have_the_documented_shape() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
        let sst = load_sst(&data.join(SST_FILE), None).unwrap();
        assert_eq!(sst.lines.len() as u64 + sst.empty, 19_226);
        assert_eq!(sst.lines[0], "2016-02-15T00:00:00Z,4.929");
        let cgm = load_cgm(&data.join(CGM_FILE), None).unwrap();
        assert_eq!(cgm.rows, 52_281);
        assert_eq!(cgm.glucose.len() as u64 + cgm.glucose_empty, 52_281);
        assert_eq!(cgm.isig.len() as u64 + cgm.isig_empty, 52_281);
        assert!(
            cgm.isig_empty > 0,
            "the file has rows without a sensor current"
        );
        assert_eq!(cgm.isig[0].value, "22.59");
        assert_eq!(cgm.glucose[0].value, "258");
        assert_eq!(cgm.glucose[0].timestamp_us, 1_269_424_260_000_000);
        let few = load_cgm(&data.join(CGM_FILE), Some(10)).unwrap();
        assert_eq!(few.rows, 10);
    }

    #[test]
    fn line_account_finds_lost_lines_and_fragments() {
        let sent: Vec<String> = (0..10)
            .map(|i| format!("2016-01-01T00:0{i}:00Z,{i}.5"))
            .collect();
        let b = |i: usize| sent[i].as_bytes();
        // Lines 4 and 5 lost, the end of line 6 stored as a fragment, then the rest.
        let stored: Vec<&[u8]> = vec![b(0), b(1), b(2), b(3), b":00Z,6.5", b(7), b(8), b(9)];
        let acc = account_lines(&sent, &stored);
        assert_eq!(acc.matched, 7);
        assert_eq!(acc.missing, vec![4, 5, 6]);
        assert_eq!(acc.fragments, vec![(":00Z,6.5".to_string(), Some(6))]);
        assert_eq!(acc.repeated, 0);
        assert_eq!(runs(&acc.missing), vec![(4, 6)]);
        assert_eq!(runs(&[1, 2, 5, 7, 8]), vec![(1, 2), (5, 5), (7, 8)]);
        let twice = account_lines(&sent[..2], &[b(0), b(1), b(1)]);
        assert_eq!(twice.repeated, 1);
    }

    #[test]
    fn numbers_in_logs() {
        let text = "x file sink: skipped 12 duplicates\nfoo\ny file sink: skipped 3 dups";
        assert_eq!(numbers_after(text, "file sink: skipped "), vec![12, 3]);
        assert_eq!(
            log_message("[2026-01-01T00:00:00.000Z INFO  spillway] listening on x"),
            "listening on x"
        );
    }

    #[test]
    fn summary_table_lines_up() {
        let s = Summary {
            topics: vec![
                TopicRow {
                    topic: TOPIC_SST.into(),
                    path: "serial lines",
                    input_rows: 19_226,
                    sent: 19_226,
                    stored: 19_200,
                    delivered: 19_200,
                    ..TopicRow::default()
                },
                TopicRow {
                    topic: TOPIC_ISIG.into(),
                    path: "TCP durable",
                    input_rows: 52_281,
                    skipped_empty: 1_061,
                    sent: 51_220,
                    acked: Some(51_220),
                    stored: 51_220,
                    delivered: 51_220,
                    ..TopicRow::default()
                },
            ],
            total: Duration::from_secs(50),
            ..Summary::default()
        };
        let text = s.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("topic"), "{text}");
        assert!(
            lines[2].contains("19,226") && lines[2].contains(" - "),
            "{text}"
        );
        assert!(
            lines[5].starts_with("total") && lines[5].contains("70,420"),
            "{text}"
        );
        assert!(text.contains("PASS"), "{text}");
    }
}

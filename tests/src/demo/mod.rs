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
//! 5. Verifies against what was sent, what was acknowledged and what the gateway's log
//!    holds (see [`Summary::failures`]): every acknowledged record is in the sink at its
//!    acknowledged offset with the same bytes and timestamp; the sink holds every record
//!    of the gateway's log exactly once per (log id, offset), in offset order per topic;
//!    every TCP record was stored exactly once; the serial line's differences are explained
//!    by the gateway kill.
//!
//! It prints progress lines as it goes (unless [`Options::quiet`]) and returns a
//! [`Summary`] whose `Display` is the final table.

mod process;
mod publisher;
mod serial;
mod series;
mod sink;
mod summary;
mod verify;

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serialport::{SerialPort, TTYPort};

use crate::client::Client;
use process::{Bridge, Gateway, clear_exclusive};
use publisher::{Publisher, lock, run_publisher};
use serial::{SerialProgress, serial_sensor};
pub use series::{CgmSeries, CgmValue, SstSeries, load_cgm, load_sst, parse_utc_us};
use sink::{SinkCounter, sink_bytes};
use summary::thousands;
pub use summary::{Summary, TopicRow};
use verify::{Observed, verify};

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

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DemoError {
    let what = what.into();
    move |source| DemoError::Io { what, source }
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
    fn numbers_in_logs() {
        let text = "x file sink: skipped 12 duplicates\nfoo\ny file sink: skipped 3 dups";
        assert_eq!(numbers_after(text, "file sink: skipped "), vec![12, 3]);
        assert_eq!(
            log_message("[2026-01-01T00:00:00.000Z INFO  spillway] listening on x"),
            "listening on x"
        );
    }
}

//! Publish throughput of the real `spillway` binary over TCP loopback, side by side with
//! NATS JetStream on the same machine in the same run, and the disk's own sync bandwidth.
//! [`run`] measures everything; its [`Report`] prints as Markdown tables.
//!
//! ## What is compared
//! Every case: [`PUBLISHERS`] publishers, each on its own TCP connection and thread, each
//! publishing the same number of 100-byte records with up to [`WINDOW`] unacknowledged
//! (pipelined: a publisher waits for the oldest acknowledgement only when its window is
//! full), over 127.0.0.1. The clock runs from the first publish until every publisher has
//! all its acknowledgements. Every server starts fresh on a new temporary directory before
//! each run (start-up not timed).
//! - **buffered**: spillway with `AckLevel::Buffered` (acknowledged once in the gateway's RAM
//!   buffer; written to the image in batches, synced by the gateway's timers) against a
//!   JetStream file-backed stream with asynchronous publishes that wait for each `PubAck`
//!   (the message is in the stream's block file, written but not synced: JetStream's default
//!   `sync_interval` is two minutes).
//! - **durable**: spillway with `AckLevel::Durable` (group commit: every durable publish
//!   waiting is acknowledged after one flash write and one `fdatasync`) against the same
//!   stream on a server configured with `sync_interval: always` (JetStream writes and
//!   `fsync`s every message before its `PubAck`). Fewer records than buffered, so that the
//!   run stays within minutes when the peer syncs each one.
//! - **disk**: the floor under both, on a file in the same temporary directory: sequential
//!   100-byte appends each followed by `fdatasync` (one record per sync, what a server
//!   without group commit can reach at best), 4 KiB writes each followed by `fdatasync`, into
//!   a preallocated file (as spillway's image) and appending to a growing file (as
//!   JetStream's block files, where each sync also commits the new file size), and 1 MiB
//!   writes each followed by `fdatasync`. Reported as MiB/s, syncs/s and 100-byte-payload
//!   records/s equivalents (bytes/s ÷ 100: the bound if a record cost only its payload).
//!
//! - **TLS**: the buffered and durable spillway cases once more with every publisher on a
//!   `tls://` listener (TLS 1.3, rustls on both sides, certificates made for the run),
//!   reported beside the plaintext runs as a ratio (the goal: at least
//!   [`TLS_GOAL`] × plaintext).
//!
//! The cases are interleaved within each repetition, so that other work on the machine
//! disturbs them alike, with a `sync` and a short pause between them; the tables give
//! min / median / max over the repetitions and spillway ÷ NATS on medians.
//!
//! The NATS peer needs nats-server 2.10 or later (`sync_interval: always`; see
//! [`nats_server_bin`](crate::nats::nats_server_bin)). Without one the peer is skipped and
//! the report says so.

use std::fmt;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use spillway_core::wire::{AckLevel, GatewayStats};

use crate::bench_core::{Machine, Spread, machine};
use crate::client::{
    Client, DEFAULT_REPLY_TIMEOUT, GatewayAddr, Reply, Wait, connect, next_reply, send_publish,
};
use crate::figures::{table_head, thousands};
use crate::gateway::{GatewayProcess, free_port};
use crate::nats::{NatsConn, NatsServer, PubAck, nats_server_version};

/// Publishers, each with its own connection.
pub const PUBLISHERS: usize = 8;
/// Unacknowledged publishes per publisher.
pub const WINDOW: usize = 64;
/// Payload bytes per record.
pub const PAYLOAD: usize = 100;
/// The least TLS ÷ plaintext ingest rate aimed for.
pub const TLS_GOAL: f64 = 0.7;

/// Topic (spillway) and subject (NATS) published to.
pub const SUBJECT: &str = "bench";

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Buffered records per publisher.
    pub per_buffered: usize,
    /// Durable records per publisher.
    pub per_durable: usize,
    /// Repetitions of every case.
    pub reps: usize,
    /// Time given to each disk case per repetition.
    pub disk_budget: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            per_buffered: 20_000,
            per_durable: 2_000,
            reps: 5,
            disk_budget: Duration::from_secs(1),
        }
    }
}

impl Options {
    /// A run of a few seconds that exercises every row (for `cargo test`).
    pub fn smoke() -> Options {
        Options {
            per_buffered: 200,
            per_durable: 20,
            reps: 1,
            disk_budget: Duration::from_millis(50),
        }
    }
}

/// What one spillway run measured.
#[derive(Debug, Clone)]
pub struct SpillwayRun {
    /// Throughput and server CPU.
    pub measured: Measured,
    /// The gateway's counters after the run.
    pub stats: GatewayStats,
}

/// What one timed run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Records acknowledged per second, first publish to last acknowledgement.
    pub records_per_s: f64,
    /// CPU time (user + system) the server process spent in that window, µs per record.
    pub server_cpu_us: f64,
}

/// What one NATS run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NatsRun {
    /// Throughput and server CPU.
    pub measured: Measured,
    /// Stream bytes per message, as JetStream accounts them after the run.
    pub bytes_per_record: f64,
}

/// CPU time (user + system) of process `pid` so far, µs, from `/proc/PID/stat` (kernel
/// ticks of 10 ms: `USER_HZ` is 100 on Linux).
pub fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    f.get(11)
        .zip(f.get(12))
        .map_or(0, |(u, s)| (u + s) * 10_000)
}

/// Runs [`PUBLISHERS`] threads of `per_publisher` publishes each through `publish`,
/// against the server process `pid`. Every connection is made before the clock starts.
pub fn timed<C: Send + 'static>(
    pid: u32,
    per_publisher: usize,
    connect: impl Fn() -> C,
    publish: fn(C, usize),
) -> Measured {
    let conns: Vec<C> = (0..PUBLISHERS).map(|_| connect()).collect();
    let gate = std::sync::Arc::new(std::sync::Barrier::new(PUBLISHERS + 1));
    let handles: Vec<_> = conns
        .into_iter()
        .map(|c| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.wait();
                publish(c, per_publisher);
            })
        })
        .collect();
    let cpu0 = cpu_us(pid);
    gate.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("publisher");
    }
    let secs = start.elapsed().as_secs_f64();
    let records = (PUBLISHERS * per_publisher) as f64;
    Measured {
        records_per_s: records / secs,
        server_cpu_us: cpu_us(pid).saturating_sub(cpu0) as f64 / records,
    }
}

/// The `spillway run` arguments of the benchmark: a 64 MiB image with 64 KiB erase blocks
/// in `dir`, a 256 KiB RAM buffer, oldest segments dropped when full, one TCP listener on
/// `addr`.
pub fn spillway_args(dir: &Path, addr: &str) -> Vec<String> {
    spillway_args_with(dir, "drop-oldest", &[format!("tcp://{addr}")])
}

/// The `spillway run` arguments of the ingest benchmarks' gateways: a 64 MiB image with
/// 64 KiB erase blocks in `dir`, a 256 KiB RAM buffer, `--full full`, and a `--listen` for
/// each URI of `listen`.
pub fn spillway_args_with(dir: &Path, full: &str, listen: &[String]) -> Vec<String> {
    let image = dir.join("bench.img").display().to_string();
    let mut args: Vec<String> = [
        "--image",
        &image,
        "--size",
        "64M",
        "--erase-size",
        "64K",
        "--buffer-bytes",
        "256K",
        "--full",
        full,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for l in listen {
        args.extend(["--listen".to_string(), l.clone()]);
    }
    args
}

/// One spillway run with `ack` on a fresh image.
///
/// # Panics
/// If the gateway does not start, refuses a publish, or appended a different number of
/// records.
pub fn spillway(ack: AckLevel, per_publisher: usize) -> SpillwayRun {
    spillway_over(ack, per_publisher, false)
}

/// One spillway run with `ack` on a fresh image, over TLS when `tls` (a `tls://` listener
/// with certificates made for the run; the clients check the gateway's).
///
/// # Panics
/// As [`spillway`].
pub fn spillway_over(ack: AckLevel, per_publisher: usize, tls: bool) -> SpillwayRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = spillway_args(dir.path(), &addr);
    let setup = tls.then(|| crate::pki::TlsSetup::new(dir.path()));
    if let Some(t) = &setup {
        for a in args.iter_mut() {
            if *a == format!("tcp://{addr}") {
                *a = format!("tls://{addr}");
            }
        }
        args.extend(t.gateway_args());
    }
    let gateway = GatewayProcess::start(&args, 1);
    let ca = setup.as_ref().map(|t| t.pki.ca.clone());
    let security = ca.map(|ca| {
        spillway_bridge::security::SecurityFiles {
            tls_ca: Some(ca),
            ..Default::default()
        }
        .load()
        .expect("the run's CA")
    });
    let connect = move || match &security {
        Some(s) => {
            let uri: GatewayAddr = format!("tls://{addr}").parse().expect("tls:// address");
            Client::connect_with(&uri, "test-client", DEFAULT_REPLY_TIMEOUT, s)
                .wait()
                .expect("connect to spillway over TLS")
        }
        None => connect(&addr).expect("connect to spillway"),
    };
    let publish: fn(Client, usize) = match ack {
        AckLevel::Durable => |c, n| spillway_publisher(c, n, AckLevel::Durable),
        _ => |c, n| spillway_publisher(c, n, AckLevel::Buffered),
    };
    let measured = timed(gateway.pid(), per_publisher, &connect, publish);
    let stats = connect().stats().wait().expect("spillway stats");
    assert_eq!(
        stats.records_appended,
        (PUBLISHERS * per_publisher) as u64,
        "spillway appended a different number of records"
    );
    if ack == AckLevel::Durable {
        // Every record was acknowledged as durable: none may still be only in RAM.
        assert!(
            stats.buffered_records == 0 && stats.syncs > 0,
            "spillway acknowledged durable publishes without writing and syncing them: {stats:?}"
        );
    }
    SpillwayRun { measured, stats }
}

/// One spillway publisher: `n` pipelined publishes at level `ack`, every reply an `Ack`.
///
/// # Panics
/// On a connection error or a reply that is not an `Ack`.
pub fn spillway_publisher(mut c: Client, n: usize, ack: AckLevel) {
    let payload = [0x5au8; PAYLOAD];
    pipelined(
        &mut c,
        n,
        |c| {
            send_publish(c, SUBJECT, &payload, ack).expect("send");
        },
        |c| match next_reply(c).expect("reply") {
            (_, Reply::Ack(_)) => {}
            other => panic!("{other:?}"),
        },
    );
}

/// Sends `n` requests on `c` with `send`, taking an answer with `take` whenever [`WINDOW`]
/// are unanswered and then the rest: the pipelining of both sides of the comparison.
fn pipelined<C>(c: &mut C, n: usize, mut send: impl FnMut(&mut C), mut take: impl FnMut(&mut C)) {
    let mut inflight = 0;
    for _ in 0..n {
        send(c);
        inflight += 1;
        if inflight >= WINDOW {
            take(c);
            inflight -= 1;
        }
    }
    for _ in 0..inflight {
        take(c);
    }
}

/// One NATS run on a fresh server and file-backed stream.
///
/// # Panics
/// If the server does not start, refuses a publish, or stored a different number of
/// messages.
pub fn nats(bin: &Path, sync_always: bool, per_publisher: usize) -> NatsRun {
    let server = NatsServer::start(bin, sync_always).expect("start nats-server");
    let mut admin = NatsConn::tcp(&server.addr).expect("connect to nats-server");
    admin.subscribe_inbox(1).expect("subscribe");
    admin
        .create_file_stream("BENCH", &[SUBJECT])
        .expect("create stream");
    let connect = || nats_connect(&server.addr);
    let measured = timed(server.pid(), per_publisher, connect, nats_publisher);
    let info = admin.stream_info("BENCH").expect("stream info");
    assert_eq!(
        info["state"]["messages"].as_u64(),
        Some((PUBLISHERS * per_publisher) as u64),
        "JetStream stored a different number of messages: {info}"
    );
    NatsRun {
        measured,
        bytes_per_record: info["state"]["bytes"].as_f64().unwrap_or(0.0)
            / (PUBLISHERS * per_publisher) as f64,
    }
}

/// A NATS connection to `addr` subscribed to its own inbox (where `PubAck`s arrive).
///
/// # Panics
/// If the connection or the subscription fails.
pub fn nats_connect(addr: &str) -> NatsConn {
    let mut c = NatsConn::tcp(addr).expect("connect to nats-server");
    c.subscribe_inbox(1).expect("subscribe");
    c
}

/// One NATS publisher: `n` pipelined publishes, every answer a stored `PubAck`.
///
/// # Panics
/// On a connection error or a refused publish.
pub fn nats_publisher(mut c: NatsConn, n: usize) {
    let payload = [0x5au8; PAYLOAD];
    pipelined(
        &mut c,
        n,
        |c| {
            c.publish_with_reply(SUBJECT, &payload).expect("publish");
        },
        |c| {
            let m = c.next_msg().expect("PubAck");
            match PubAck::parse(&m.payload) {
                PubAck::Stored { .. } => {}
                PubAck::Error(e) => panic!("JetStream refused a publish: {e}"),
            }
        },
    );
}

/// A disk case: writes of `block` bytes, each followed by `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCase {
    /// Table label.
    pub label: &'static str,
    /// Bytes per write.
    pub block: usize,
    /// Overwrite a file written (and synced) beforehand instead of appending.
    pub preallocated: bool,
}

/// The disk cases, in table order.
pub const DISK_CASES: [DiskCase; 4] = [
    DiskCase {
        label: "100 B write + fdatasync, appending (one record per sync)",
        block: PAYLOAD,
        preallocated: false,
    },
    DiskCase {
        label: "4 KiB write + fdatasync, preallocated file",
        block: 4 << 10,
        preallocated: true,
    },
    DiskCase {
        label: "4 KiB write + fdatasync, appending",
        block: 4 << 10,
        preallocated: false,
    },
    DiskCase {
        label: "1 MiB write + fdatasync, preallocated file",
        block: 1 << 20,
        preallocated: true,
    },
];

/// Sequential writes of `case.block` bytes, each followed by `fdatasync`, for about
/// `budget` (at most 64 MiB), in a file under the temporary directory; returns bytes/s and
/// syncs/s.
///
/// # Panics
/// On an I/O error.
pub fn disk(case: DiskCase, budget: Duration) -> (f64, f64) {
    const MAX_BYTES: usize = 64 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sync.bin");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create disk test file");
    let block = vec![0xa5u8; case.block];
    if case.preallocated {
        let chunk = vec![0xffu8; 1 << 20];
        for i in 0..MAX_BYTES / chunk.len() {
            file.write_all_at(&chunk, (i * chunk.len()) as u64)
                .expect("preallocate");
        }
        file.sync_all().expect("sync");
    }
    let start = Instant::now();
    let mut at = 0;
    let mut syncs = 0u32;
    while at + case.block <= MAX_BYTES && (syncs < 4 || start.elapsed() < budget) {
        file.write_all_at(&block, at as u64).expect("write");
        file.sync_data().expect("fdatasync");
        at += case.block;
        syncs += 1;
    }
    let s = start.elapsed().as_secs_f64();
    (at as f64 / s, f64::from(syncs) / s)
}

/// Lets the previous case's writes and file deletions reach the disk before the next case
/// starts (`sync`, then 200 ms), so that one case's write-back does not land in another's
/// timed window.
pub fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_millis(200));
}

/// Runs of one case: spillway's and the peer's (empty when the peer was skipped).
#[derive(Debug, Clone, Default)]
pub struct CaseRuns {
    /// Spillway's runs.
    pub spillway: Vec<SpillwayRun>,
    /// NATS runs, in the same repetitions.
    pub nats: Vec<NatsRun>,
    /// Spillway's runs over TLS, in the same repetitions.
    pub tls: Vec<SpillwayRun>,
}

impl CaseRuns {
    /// Spillway's records/s.
    pub fn spillway_rates(&self) -> Vec<f64> {
        self.spillway
            .iter()
            .map(|r| r.measured.records_per_s)
            .collect()
    }

    /// Spillway's records/s over TLS.
    pub fn tls_rates(&self) -> Vec<f64> {
        self.tls.iter().map(|r| r.measured.records_per_s).collect()
    }

    /// NATS records/s.
    pub fn nats_rates(&self) -> Vec<f64> {
        self.nats.iter().map(|r| r.measured.records_per_s).collect()
    }
}

/// One disk case's samples.
#[derive(Debug, Clone)]
pub struct DiskRow {
    /// The case.
    pub case: DiskCase,
    /// Bytes/s per repetition.
    pub bytes_per_s: Vec<f64>,
    /// Syncs/s per repetition.
    pub syncs_per_s: Vec<f64>,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it ran, described when the run started.
    pub machine: Machine,
    /// Load averages when the run ended.
    pub load_at_end: String,
    /// What ran.
    pub options: Options,
    /// The peer's version line, `None` if it was skipped.
    pub nats_version: Option<String>,
    /// Buffered acknowledgements.
    pub buffered: CaseRuns,
    /// Durable acknowledgements.
    pub durable: CaseRuns,
    /// The disk cases, in [`DISK_CASES`] order.
    pub disk: Vec<DiskRow>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Runs every case of `opts`, against the nats-server `nats_bin` when given; `progress` is
/// told what starts.
pub fn run(opts: &Options, nats_bin: Option<&Path>, mut progress: impl FnMut(&str)) -> Report {
    let begun = Instant::now();
    let at_start = machine();
    let nats_version = nats_bin.map(|bin| {
        let v = nats_server_version(bin).unwrap_or_else(|e| format!("version unknown: {e}"));
        format!("{v} ({})", bin.display())
    });
    let mut buffered = CaseRuns::default();
    let mut durable = CaseRuns::default();
    let mut disk_rows: Vec<DiskRow> = DISK_CASES
        .iter()
        .map(|&case| DiskRow {
            case,
            bytes_per_s: Vec::new(),
            syncs_per_s: Vec::new(),
        })
        .collect();
    let reps = opts.reps.max(1);
    for rep in 0..reps {
        progress(&format!("gateway ingest, repetition {} of {reps}", rep + 1));
        settle();
        // Buffered, then durable: spillway over TCP, over TLS, then NATS (with a sync on
        // every message when durable).
        for (runs, ack, per, sync_always) in [
            (&mut buffered, AckLevel::Buffered, opts.per_buffered, false),
            (&mut durable, AckLevel::Durable, opts.per_durable, true),
        ] {
            runs.spillway.push(spillway(ack, per));
            settle();
            runs.tls.push(spillway_over(ack, per, true));
            settle();
            if let Some(bin) = nats_bin {
                runs.nats.push(nats(bin, sync_always, per));
                settle();
            }
        }
        for row in &mut disk_rows {
            let (bytes_per_s, syncs_per_s) = disk(row.case, opts.disk_budget);
            settle();
            row.bytes_per_s.push(bytes_per_s);
            row.syncs_per_s.push(syncs_per_s);
        }
    }
    Report {
        machine: at_start,
        load_at_end: machine().load,
        options: opts.clone(),
        nats_version,
        buffered,
        durable,
        disk: disk_rows,
        elapsed: begun.elapsed(),
    }
}

/// `min / median / max` of `samples` with thousands separators.
pub fn spread_text(samples: &[f64]) -> String {
    Spread::of(samples).show(thousands)
}

impl Report {
    /// The cases with their table labels.
    fn cases(&self) -> [(&'static str, &CaseRuns); 2] {
        [
            (
                "buffered ack (NATS: file stream, async publish, no sync)",
                &self.buffered,
            ),
            (
                "durable ack (spillway: group commit + fdatasync; NATS: sync_interval always)",
                &self.durable,
            ),
        ]
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let reps = o.reps.max(1);
        writeln!(f, "machine: {}", self.machine)?;
        writeln!(
            f,
            "{PUBLISHERS} publishers, {WINDOW} publishes in flight each, {PAYLOAD}-byte records, \
             TCP loopback; buffered {} and durable {} records per publisher; store and disk \
             tests in {}",
            o.per_buffered,
            o.per_durable,
            std::env::temp_dir().display()
        )?;
        match &self.nats_version {
            Some(v) => writeln!(f, "peer: {v}, JetStream file stream")?,
            None => writeln!(
                f,
                "NATS peer skipped: run scripts/nats-server.sh (or set SPILLWAY_NATS_SERVER)"
            )?,
        }
        writeln!(f)?;
        table_head(
            f,
            &format!(
                "| records/s, min / median / max of {reps} | spillway | NATS JetStream | spillway ÷ NATS (medians) |"
            ),
        )?;
        for (label, runs) in self.cases() {
            let sw = runs.spillway_rates();
            let peer = runs.nats_rates();
            let (peer_cell, ratio) = if peer.is_empty() {
                ("skipped".to_string(), "–".to_string())
            } else {
                (
                    spread_text(&peer),
                    format!("{:.2}", Spread::of(&sw).median / Spread::of(&peer).median),
                )
            };
            writeln!(
                f,
                "| {label} | {} | {peer_cell} | {ratio} |",
                spread_text(&sw)
            )?;
        }
        writeln!(f)?;
        table_head(
            f,
            &format!(
                "| spillway over TLS, records/s, min / median / max of {reps} | plaintext TCP | TLS | TLS ÷ plaintext (medians; goal ≥ {TLS_GOAL:.2}) |"
            ),
        )?;
        for (label, runs) in self.cases() {
            let (plain, tls) = (runs.spillway_rates(), runs.tls_rates());
            if tls.is_empty() {
                continue;
            }
            let ratio = Spread::of(&tls).median / Spread::of(&plain).median;
            let verdict = if ratio >= TLS_GOAL { "met" } else { "NOT met" };
            let label = label.split_once(" (").map_or(label, |(l, _)| l);
            writeln!(
                f,
                "| {label} | {} | {} | {ratio:.2} ({verdict}) |",
                spread_text(&plain),
                spread_text(&tls)
            )?;
        }
        writeln!(f)?;
        table_head(
            f,
            "| per record, medians | server CPU µs, spillway / NATS | bytes stored, spillway / NATS | records per fdatasync, spillway |",
        )?;
        for (label, runs) in self.cases() {
            let median = |xs: Vec<f64>| {
                if xs.is_empty() {
                    "–".to_string()
                } else {
                    format!("{:.1}", Spread::of(&xs).median)
                }
            };
            let sw = &runs.spillway;
            let peer = &runs.nats;
            let sw_cpu = median(sw.iter().map(|r| r.measured.server_cpu_us).collect());
            let peer_cpu = median(peer.iter().map(|r| r.measured.server_cpu_us).collect());
            let sw_bytes = median(
                sw.iter()
                    .map(|r| {
                        // Records still in the RAM buffer have not cost image bytes yet.
                        let written = r.stats.records_appended - r.stats.buffered_records;
                        r.stats.flash_bytes_programmed as f64 / written.max(1) as f64
                    })
                    .collect(),
            );
            let peer_bytes = median(peer.iter().map(|r| r.bytes_per_record).collect());
            let group = median(
                sw.iter()
                    .map(|r| r.stats.records_appended as f64 / r.stats.syncs.max(1) as f64)
                    .collect(),
            );
            let label = label.split_once(" (").map_or(label, |(l, _)| l);
            writeln!(
                f,
                "| {label} | {sw_cpu} / {peer_cpu} | {sw_bytes} / {peer_bytes} | {group} |"
            )?;
        }
        writeln!(f)?;
        table_head(
            f,
            &format!(
                "| disk, same filesystem, min / median / max of {reps} | MiB/s | fdatasync/s | records/s equivalent (bytes/s ÷ {PAYLOAD}) |"
            ),
        )?;
        for row in &self.disk {
            let mib: Vec<f64> = row
                .bytes_per_s
                .iter()
                .map(|b| b / f64::from(1u32 << 20))
                .collect();
            let recs: Vec<f64> = row.bytes_per_s.iter().map(|b| b / PAYLOAD as f64).collect();
            writeln!(
                f,
                "| {} | {} | {} | {} |",
                row.case.label,
                Spread::of(&mib).show(|x| format!("{x:.2}")),
                spread_text(&row.syncs_per_s),
                spread_text(&recs)
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "Server CPU: user + system time of the server process during the timed window \
             (10 ms ticks). Bytes stored: spillway's image bytes programmed per record written \
             to the image (record and batch headers, padding), NATS's stream bytes per message. \
             NATS with sync_interval always syncs every message on its own (no group commit), \
             so its durable rate is bounded by the disk's one-record-per-sync row. The buffered \
             guarantees differ: a spillway buffered ack means the record is in the gateway's \
             RAM (lost if the process dies), a NATS one that it is in the stream file (survives \
             the process, not a power cut)."
        )?;
        writeln!(
            f,
            "load average {} at the end; whole run {:.0} s",
            self.load_at_end,
            self.elapsed.as_secs_f64()
        )
    }
}

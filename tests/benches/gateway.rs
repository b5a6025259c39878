//! Publish throughput of the real `spillway` binary over TCP loopback, side by side with
//! NATS JetStream on the same machine in the same run, and the disk's own sync bandwidth.
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
//!   writes each followed by `fdatasync`. Printed as MiB/s, syncs/s and 100-byte-payload
//!   records/s equivalents (bytes/s ÷ 100: the bound if a record cost only its payload).
//!
//! The cases are interleaved within each repetition, so that other work on the machine
//! disturbs them alike, with a `sync` and a short pause between them; the table gives
//! min / median / max over the repetitions and spillway ÷ NATS on medians.
//!
//! The NATS peer needs nats-server 2.10 or later (`sync_interval: always`):
//! `scripts/nats-server.sh` installs the pinned one under `target/tools/`; the bench also
//! takes `$SPILLWAY_NATS_SERVER`. Without either it prints that the peer was skipped.
//!
//! `cargo bench -p spillway-tests --bench gateway`. Environment: `SPILLWAY_BENCH_RECORDS`
//! (buffered records per publisher, default 20000), `SPILLWAY_BENCH_DURABLE_RECORDS`
//! (durable records per publisher, default 2000), `SPILLWAY_BENCH_REPS` (default 5). Under
//! `cargo test` (no `--bench` argument) it does a short smoke run.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use spillway_core::wire::{AckLevel, GatewayStats};
use spillway_tests::bench_core::{Spread, machine};
use spillway_tests::client::{Client, Reply};
use spillway_tests::gateway::{GatewayProcess, free_port};
use spillway_tests::nats::{NatsConn, NatsServer, PubAck, nats_server_bin, nats_server_version};

/// Publishers, each with its own connection.
const PUBLISHERS: usize = 8;
/// Unacknowledged publishes per publisher.
const WINDOW: usize = 64;
/// Payload bytes per record.
const PAYLOAD: usize = 100;
/// Topic (spillway) and subject (NATS) published to.
const SUBJECT: &str = "bench";

/// What one spillway run measured.
struct SpillwayRun {
    measured: Measured,
    /// The gateway's counters after the run.
    stats: GatewayStats,
}

/// What one timed run measured.
#[derive(Clone, Copy)]
struct Measured {
    /// Records acknowledged per second, first publish to last acknowledgement.
    records_per_s: f64,
    /// CPU time (user + system) the server process spent in that window, µs per record.
    server_cpu_us: f64,
}

/// CPU time (user + system) of process `pid` so far, µs, from `/proc/PID/stat` (kernel
/// ticks of 10 ms: `USER_HZ` is 100 on Linux).
fn cpu_us(pid: u32) -> u64 {
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
fn timed<C: Send + 'static>(
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
        server_cpu_us: (cpu_us(pid) - cpu0) as f64 / records,
    }
}

/// One spillway run with `ack` on a fresh image.
fn spillway(ack: AckLevel, per_publisher: usize) -> SpillwayRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let image = dir.path().join("bench.img").display().to_string();
    let listen = format!("tcp://{addr}");
    let args: Vec<String> = [
        "--image",
        &image,
        "--size",
        "64M",
        "--erase-size",
        "64K",
        "--buffer-bytes",
        "256K",
        "--full",
        "drop-oldest",
        "--listen",
        &listen,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let gateway = GatewayProcess::start(&args, 1);
    let connect = || Client::tcp(&addr).expect("connect to spillway");
    let publish: fn(Client, usize) = match ack {
        AckLevel::Durable => |c, n| spillway_publisher(c, n, AckLevel::Durable),
        _ => |c, n| spillway_publisher(c, n, AckLevel::Buffered),
    };
    let measured = timed(gateway.pid(), per_publisher, connect, publish);
    let stats = Client::tcp(&addr)
        .and_then(|mut c| c.stats())
        .expect("spillway stats");
    assert_eq!(
        stats.records_appended,
        (PUBLISHERS * per_publisher) as u64,
        "spillway appended a different number of records"
    );
    SpillwayRun { measured, stats }
}

/// One spillway publisher: `n` pipelined publishes, every reply an `Ack`.
fn spillway_publisher(mut c: Client, n: usize, ack: AckLevel) {
    let payload = [0x5au8; PAYLOAD];
    let mut inflight = VecDeque::with_capacity(WINDOW);
    for _ in 0..n {
        let seq = c.send_publish(SUBJECT, &payload, ack, None).expect("send");
        inflight.push_back(seq);
        if inflight.len() >= WINDOW {
            let r = c.recv().expect("reply");
            assert!(matches!(r, Reply::Ack { .. }), "{r:?}");
            inflight.pop_front();
        }
    }
    while inflight.pop_front().is_some() {
        let r = c.recv().expect("reply");
        assert!(matches!(r, Reply::Ack { .. }), "{r:?}");
    }
}

/// What one NATS run measured.
struct NatsRun {
    measured: Measured,
    /// Stream bytes per message, as JetStream accounts them after the run.
    bytes_per_record: f64,
}

/// One NATS run on a fresh server and file-backed stream.
fn nats(bin: &Path, sync_always: bool, per_publisher: usize) -> NatsRun {
    let server = NatsServer::start(bin, sync_always).expect("start nats-server");
    let mut admin = NatsConn::tcp(&server.addr).expect("connect to nats-server");
    admin.subscribe_inbox(1).expect("subscribe");
    admin
        .create_file_stream("BENCH", &[SUBJECT])
        .expect("create stream");
    let connect = || {
        let mut c = NatsConn::tcp(&server.addr).expect("connect to nats-server");
        c.subscribe_inbox(1).expect("subscribe");
        c
    };
    let measured = timed(server.pid(), per_publisher, connect, nats_publisher);
    let info = admin
        .request("$JS.API.STREAM.INFO.BENCH", b"")
        .expect("stream info");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("stream info");
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

/// One NATS publisher: `n` pipelined publishes, every answer a stored `PubAck`.
fn nats_publisher(mut c: NatsConn, n: usize) {
    let payload = [0x5au8; PAYLOAD];
    let mut inflight = 0;
    let ack = |c: &mut NatsConn| {
        let m = c.next_msg().expect("PubAck");
        match PubAck::parse(&m.payload) {
            PubAck::Stored { .. } => {}
            PubAck::Error(e) => panic!("JetStream refused a publish: {e}"),
        }
    };
    for _ in 0..n {
        c.publish_with_reply(SUBJECT, &payload).expect("publish");
        inflight += 1;
        if inflight >= WINDOW {
            ack(&mut c);
            inflight -= 1;
        }
    }
    for _ in 0..inflight {
        ack(&mut c);
    }
}

/// A disk case: writes of `block` bytes, each followed by `fdatasync`.
#[derive(Clone, Copy)]
struct DiskCase {
    label: &'static str,
    block: usize,
    /// Overwrite a file written (and synced) beforehand instead of appending.
    preallocated: bool,
}

const DISK_CASES: [DiskCase; 4] = [
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
/// `budget` (at most 64 MiB); returns bytes/s and syncs/s.
fn disk(case: DiskCase, budget: Duration) -> (f64, f64) {
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
fn settle() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_millis(200));
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Formats records/s with a thousands separator.
fn rate(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn spread(samples: &[f64]) -> String {
    let s = Spread::of(samples);
    format!("{} / {} / {}", rate(s.min), rate(s.median), rate(s.max))
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (per_buffered, per_durable, reps, disk_budget) = if smoke {
        (200, 20, 1, Duration::from_millis(50))
    } else {
        (
            env_usize("SPILLWAY_BENCH_RECORDS").unwrap_or(20_000),
            env_usize("SPILLWAY_BENCH_DURABLE_RECORDS").unwrap_or(2_000),
            env_usize("SPILLWAY_BENCH_REPS").unwrap_or(5).max(1),
            Duration::from_secs(1),
        )
    };
    let nats_bin = nats_server_bin();
    let m = machine();
    let begun = Instant::now();
    println!(
        "machine: {}, {} logical cores, {}; load average {} at the start",
        m.cpu, m.cores, m.os, m.load
    );
    println!(
        "{PUBLISHERS} publishers, {WINDOW} publishes in flight each, {PAYLOAD}-byte records, \
         TCP loopback; buffered {per_buffered} and durable {per_durable} records per publisher; \
         store and disk tests in {}",
        std::env::temp_dir().display()
    );
    match &nats_bin {
        Some(bin) => {
            let v = nats_server_version(bin).unwrap_or_else(|e| format!("version unknown: {e}"));
            println!("peer: {v} ({}), JetStream file stream", bin.display());
        }
        None => {
            println!("NATS peer skipped: run scripts/nats-server.sh (or set SPILLWAY_NATS_SERVER)")
        }
    }

    // Per case: spillway runs, NATS runs.
    let mut buffered: (Vec<SpillwayRun>, Vec<NatsRun>) = (Vec::new(), Vec::new());
    let mut durable: (Vec<SpillwayRun>, Vec<NatsRun>) = (Vec::new(), Vec::new());
    let mut disk_rows: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); DISK_CASES.len()];
    for rep in 0..reps {
        eprintln!("… repetition {} of {reps}", rep + 1);
        settle();
        buffered.0.push(spillway(AckLevel::Buffered, per_buffered));
        settle();
        if let Some(bin) = &nats_bin {
            buffered.1.push(nats(bin, false, per_buffered));
            settle();
        }
        durable.0.push(spillway(AckLevel::Durable, per_durable));
        settle();
        if let Some(bin) = &nats_bin {
            durable.1.push(nats(bin, true, per_durable));
            settle();
        }
        for (case, row) in DISK_CASES.iter().zip(disk_rows.iter_mut()) {
            let (bytes_per_s, syncs_per_s) = disk(*case, disk_budget);
            settle();
            row.0.push(bytes_per_s);
            row.1.push(syncs_per_s);
        }
    }

    let cases = [
        (
            "buffered ack (NATS: file stream, async publish, no sync)",
            &buffered,
        ),
        (
            "durable ack (spillway: group commit + fdatasync; NATS: sync_interval always)",
            &durable,
        ),
    ];
    println!();
    println!(
        "| records/s, min / median / max of {reps} | spillway | NATS JetStream | spillway ÷ NATS (medians) |"
    );
    println!("|---|---|---|---|");
    for (label, (sw, peer)) in cases {
        let sw: Vec<f64> = sw.iter().map(|r| r.measured.records_per_s).collect();
        let peer: Vec<f64> = peer.iter().map(|r| r.measured.records_per_s).collect();
        let (peer_cell, ratio) = if peer.is_empty() {
            ("skipped".to_string(), "–".to_string())
        } else {
            (
                spread(&peer),
                format!("{:.2}", Spread::of(&sw).median / Spread::of(&peer).median),
            )
        };
        println!("| {label} | {} | {peer_cell} | {ratio} |", spread(&sw));
    }
    println!();
    println!(
        "| per record, medians | server CPU µs, spillway / NATS | bytes stored, spillway / NATS | records per fdatasync, spillway |"
    );
    println!("|---|---|---|---|");
    for (label, (sw, peer)) in cases {
        let median = |xs: Vec<f64>| {
            if xs.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1}", Spread::of(&xs).median)
            }
        };
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
        println!("| {label} | {sw_cpu} / {peer_cpu} | {sw_bytes} / {peer_bytes} | {group} |");
    }
    println!();
    println!(
        "| disk, same filesystem, min / median / max of {reps} | MiB/s | fdatasync/s | records/s equivalent (bytes/s ÷ {PAYLOAD}) |"
    );
    println!("|---|---|---|---|");
    for (case, (bytes, syncs)) in DISK_CASES.iter().zip(&disk_rows) {
        let mib: Vec<f64> = bytes.iter().map(|b| b / f64::from(1u32 << 20)).collect();
        let s = Spread::of(&mib);
        let recs: Vec<f64> = bytes.iter().map(|b| b / PAYLOAD as f64).collect();
        println!(
            "| {} | {:.2} / {:.2} / {:.2} | {} | {} |",
            case.label,
            s.min,
            s.median,
            s.max,
            spread(syncs),
            spread(&recs)
        );
    }
    println!();
    println!(
        "Server CPU: user + system time of the server process during the timed window \
         (10 ms ticks). Bytes stored: spillway's image bytes programmed per record written \
         to the image (record and batch headers, padding), NATS's stream bytes per message. NATS with sync_interval always syncs \
         every message on its own (no group commit), so its durable rate is bounded by the \
         disk's one-record-per-sync row. The buffered guarantees differ: a spillway buffered ack \
         means the record is in the gateway's RAM (lost if the process dies), a NATS one that \
         it is in the stream file (survives the process, not a power cut)."
    );
    let end = machine();
    println!(
        "load average {} at the end; whole run {:.0} s",
        end.load,
        begun.elapsed().as_secs_f64()
    );
    let _ = std::io::stdout().flush();
}

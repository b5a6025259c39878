//! Records/s drained into Kafka by `spillway-bridge drain --once` from a real `spillway`
//! gateway, side by side with a plain rdkafka producer sending the same records (same key,
//! headers and payload sizes; idempotent, `acks=all`, the bridge's batching settings) to
//! the same broker: the ceiling. [`run`] measures; its [`Report`] prints as a Markdown table
//! with min/median/max over the runs and the ratio.
//!
//! The broker is a [`Broker`]: a real one (`scripts/kafka-broker.sh start` runs tansu in
//! memory on 127.0.0.1:19092) or librdkafka's in-process mock cluster.
//!
//! What is timed: the bridge's whole process (start, handshake, tail scan, drain, final
//! commit, exit), and the producer from its creation to the last delivery report. The
//! gateway is filled once (`publish_sized`: `spillway-bridge publish --ack durable`, not
//! timed); every run writes to a fresh topic, bridge and producer alternating.
//!
//! Every bridge run starts from nothing: a fresh state file and a consumer name of its own
//! (`bench-run-N`), so it drains the gateway from its first offset; a drain under a name
//! the gateway already holds would resume at that name's committed offset and forward
//! nothing. The run's consumer is deleted on the gateway afterwards (not timed), so any
//! number of runs fits the gateway's consumer table. Every run of both sides is then
//! verified by reading its topic back ([`verify_topic`]): exactly the records sent, in
//! order, each payload and `spillway-offset` header as sent. A run that fails this is kept
//! in the [`Report`] with what was found, its rate counts only the records that arrived,
//! and [`Report::failures`] names it: the benchmark programs exit non-zero on any.

use std::fmt;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::producer::BaseProducer;

use crate::bench_core::{Machine, machine};
use crate::bridge::bridge_bin;
use crate::client::{Wait, connect};
use crate::figures::thousands;
use crate::gateway::{GatewayProcess, free_port};
use crate::kafka::Broker;
use crate::sides::Measured;

mod producer;
mod read_back;

pub(crate) use producer::{BridgeLike, Counting, send_like_the_bridge, timed_producer_run};
pub use read_back::{Verified, verify_topic, verify_topic_sized};
pub(crate) use read_back::{read_back, spillway_offset};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Records drained (and produced) per run.
    pub records: usize,
    /// Runs of each side.
    pub runs: usize,
}

impl Default for Options {
    /// 300,000 records: enough that the fixed start-up costs of both sides (the idempotent
    /// producer waits about half a second for its producer id) do not decide the ratio.
    fn default() -> Self {
        Options {
            records: 300_000,
            runs: 3,
        }
    }
}

/// Payload bytes per record.
pub const PAYLOAD: usize = 100;
/// Topic of the records on the gateway.
pub(crate) const TOPIC: &str = "bench/sst";
/// Gateway id announced by the benchmark's gateway (part of every message key).
pub(crate) const GATEWAY_ID: &str = "bench-gw";

/// The payload of record `i` when records have `len` bytes (at least 11): distinct per
/// record.
pub(crate) fn payload_of(i: usize, len: usize) -> Vec<u8> {
    let mut p = format!("{i:010} ").into_bytes();
    p.resize(len, b'x');
    p
}

/// The gateway image for `n` records: room for every one of them (a record of [`PAYLOAD`]
/// bytes takes well under 256 bytes of flash with its headers), so none is dropped or
/// refused before the runs; 128 MiB at least. As `spillway run --size` takes it.
pub(crate) fn image_size(n: usize) -> String {
    let mib = (n.saturating_mul(256) >> 20) + 16;
    format!("{}M", mib.max(128))
}

/// The gateway's `--max-frame-bytes` in the drain comparisons: the drain's default fetch
/// budget (`--max-batch-bytes` 256K), so that one fetch reply carries what the bridge asks
/// for, as a gateway set up for draining would be run (the default frame, 64 KiB, makes
/// four round trips of it).
pub const GATEWAY_FRAME: &str = "256K";

/// Starts a gateway on a fresh image of `size` (as `spillway run --size` takes it) in `dir`,
/// announcing gateway id `id`, with frames of [`GATEWAY_FRAME`]; returns it and its
/// `host:port`.
pub(crate) fn start_gateway(
    dir: &std::path::Path,
    id: &str,
    size: &str,
) -> (GatewayProcess, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "--image",
        &dir.join(format!("{id}.img")).display().to_string(),
        "--size",
        size,
        "--erase-size",
        "64K",
        "--listen",
        &format!("tcp://{addr}"),
        "--gateway-id",
        id,
        "--max-frame-bytes",
        GATEWAY_FRAME,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    (GatewayProcess::start(&args, 1), addr)
}

/// Stores `n` records of `len` payload bytes ([`payload_of`], in index order, so offsets
/// `0..n` on a fresh log) to topic `bench/sst` on the gateway at `addr` with
/// `spillway-bridge publish --ack durable`, fed through its standard input; returns the
/// gateway's log id. The publisher's pipelined windows store 300,000 records in seconds,
/// where publishing one record at a time took 110–130 s on a busy 2-core machine,
/// which made a fill of millions impractical.
///
/// # Panics
/// If `publish` fails (it exits 0 only when every line was acknowledged durably), or the
/// gateway cannot be reached.
pub(crate) fn publish_sized(addr: &str, n: usize, len: usize) -> u128 {
    let mut child = Command::new(bridge_bin())
        .args(["publish", "--ack", "durable", "--topic", TOPIC])
        .arg("--gateway")
        .arg(format!("tcp://{addr}"))
        .arg("-")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run spillway-bridge publish");
    let mut stdin = child.stdin.take().expect("publish's stdin");
    let writer = std::thread::spawn(move || {
        let mut buf = std::io::BufWriter::with_capacity(1 << 20, &mut stdin);
        for i in 0..n {
            buf.write_all(&payload_of(i, len))?;
            buf.write_all(b"\n")?;
        }
        // The pipe closes when the thread ends: the end of the input.
        buf.flush()
    });
    let out = child.wait_with_output().expect("wait for publish");
    let written = writer.join().expect("input writer");
    assert!(
        out.status.success() && written.is_ok(),
        "filling the gateway with {n} records: publish exited with {} (input: {written:?}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let c = connect(addr).expect("connect to the gateway");
    c.welcome().log_id
}

/// One timed run of one side.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Wall time, s.
    pub secs: f64,
    /// What its topic held afterwards.
    pub verified: Verified,
}

impl Run {
    /// Records/s, counting only the records found in their place in the topic (all of them
    /// for a run that passed its check).
    pub fn records_per_s(&self) -> f64 {
        self.verified.matching as f64 / self.secs
    }
}

impl Measured for Run {
    fn records_per_s(&self) -> f64 {
        Run::records_per_s(self)
    }

    fn problem(&self) -> Option<&str> {
        self.verified.problem.as_deref()
    }
}

/// Both sides' runs of a Kafka comparison: the bridge's and the plain producer's.
pub type Sides = crate::sides::Sides<Run>;

impl Sides {
    /// Runs `bridge` (given the run's number, from 1) and `producer` `runs` times (at least
    /// once), alternating; `progress` hears what each run measured and found. A run that
    /// fails its check does not stop the others.
    pub(crate) fn alternate(
        runs: usize,
        progress: &mut impl FnMut(&str),
        mut bridge: impl FnMut(usize) -> Run,
        mut producer: impl FnMut() -> Run,
    ) -> Sides {
        let _ = bridge_bin();
        let mut sides = Sides::new(["bridge", "producer"]);
        let check = |r: &Run| match &r.verified.problem {
            None => format!("{} records read back", r.verified.found),
            Some(p) => format!("FAILED: {p}"),
        };
        for r in 0..runs.max(1) {
            let b = bridge(r + 1);
            let p = producer();
            progress(&format!(
                "run {}: bridge {:.0} records/s ({}), producer {:.0} records/s ({})",
                r + 1,
                b.records_per_s(),
                check(&b),
                p.records_per_s(),
                check(&p)
            ));
            sides.push(b, p);
        }
        sides
    }
}

/// One `spillway-bridge drain --once` of the gateways at `addrs` into `sink` (a `--sink`
/// URI) under consumer name `consumer`, with a fresh state file; its wall time in s (the
/// whole process) and, when it did not exit 0, why (the last lines of its stderr).
pub(crate) fn drain_once(addrs: &[String], consumer: &str, sink: &str) -> (f64, Option<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(bridge_bin());
    cmd.args(["drain", "--once", "--progress", "off"]);
    for a in addrs {
        cmd.arg("--gateway").arg(format!("tcp://{a}"));
    }
    cmd.arg("--consumer")
        .arg(consumer)
        .arg("--sink")
        .arg(sink)
        .arg("--state")
        .arg(dir.path().join("s.redb"))
        .env("RUST_LOG", "warn");
    let t = Instant::now();
    let out = cmd.output().expect("run spillway-bridge");
    let secs = t.elapsed().as_secs_f64();
    let failed = (!out.status.success()).then(|| {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        format!(
            "drain exited with {}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )
    });
    (secs, failed)
}

/// The committed offset of `consumer` on the gateway at `addr`, then deletes it there.
///
/// # Panics
/// If the gateway cannot be reached or refuses.
pub(crate) fn committed_and_delete(addr: &str, consumer: &str) -> Option<u64> {
    let mut c = connect(addr).expect("connect to the gateway");
    let committed = c
        .consumers()
        .wait()
        .expect("list consumers")
        .iter()
        .find(|e| e.name == consumer)
        .map(|e| e.committed_offset);
    c.delete_consumer(consumer)
        .wait()
        .unwrap_or_else(|e| panic!("deleting consumer {consumer}: {e}"));
    committed
}

/// One `spillway-bridge drain --once` of the whole gateway into a fresh topic, with a fresh
/// state file and the consumer name `bench-run-N` of run `run` (nothing of an earlier run
/// can make it start past the gateway's first offset); verified by reading the topic back
/// and by the consumer's committed offset on the gateway, which is then deleted (not
/// timed).
///
/// # Panics
/// If the gateway cannot be reached afterwards.
fn bridge_run(broker: &Broker, addr: &str, n: usize, run: usize) -> Run {
    let topic = broker.new_topic("bench-bridge", 1);
    let consumer = format!("bench-run-{run}");
    let (secs, exit) = drain_once(&[addr.to_string()], &consumer, &broker.sink_uri(&topic));
    let mut verified = verify_topic(&broker.bootstrap(), &topic, n as u64);
    let committed = committed_and_delete(addr, &consumer);
    if exit.is_some() {
        verified.problem = exit;
    } else if verified.ok() && committed != Some(n as u64) {
        verified.problem = Some(format!(
            "the topic holds every record, but consumer {consumer} committed {committed:?} \
             on the gateway, not {n}"
        ));
    }
    Run { secs, verified }
}

/// A plain idempotent producer sending the same `n` records (key, headers, payload) to a
/// fresh topic, verified by reading the topic back.
fn producer_run(broker: &Broker, log_id: u128, n: usize) -> Run {
    let topic = broker.new_topic("bench-producer", 1);
    let log_hex = format!("{log_id:032x}");
    let ts_us: u64 = 1_700_000_000_000_000;
    // Build the records before the clock starts: the ceiling has them in memory.
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| payload_of(i, PAYLOAD)).collect();
    let bootstrap = broker.bootstrap();
    let send = |p: &BaseProducer<Counting>| {
        for (i, pl) in payloads.iter().enumerate() {
            send_like_the_bridge(
                p,
                &BridgeLike {
                    kafka_topic: &topic,
                    // The bridge's key: the gateway id.
                    gateway: GATEWAY_ID,
                    log_hex: &log_hex,
                    topic: TOPIC,
                    offset: i,
                    timestamp_us: ts_us + i as u64,
                    payload: pl,
                },
            );
        }
    };
    timed_producer_run(&bootstrap, n as u64, send, || {
        verify_topic(&bootstrap, &topic, n as u64)
    })
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// What ran.
    pub options: Options,
    /// The broker, described.
    pub broker: String,
    /// Both sides' runs.
    pub sides: Sides,
    /// Time to fill the gateway (`publish_sized`).
    pub fill: Duration,
}

impl Report {
    /// Every run whose topic did not hold exactly the records sent, described (empty when
    /// every run passed).
    pub fn failures(&self) -> Vec<String> {
        self.sides.failures("Kafka")
    }
}

/// Fills a fresh gateway and runs both sides `opts.runs` times, alternating, against
/// `broker`; `progress` is told what starts and what each run measured and found. A run
/// that fails its check does not stop the others: see [`Report::failures`].
///
/// # Panics
/// If the gateway or the broker fails.
pub fn run(opts: &Options, broker: &Broker, mut progress: impl FnMut(&str)) -> Report {
    let at_start = machine();
    let n = opts.records;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_gateway, addr) = start_gateway(dir.path(), GATEWAY_ID, &image_size(n));
    progress(&format!(
        "publish {n} records of {PAYLOAD} bytes durably; each run drains all of them into a \
         fresh topic, and every topic is read back"
    ));
    // Built (if it must be) before the fill's clock starts.
    let _ = bridge_bin();
    let t = Instant::now();
    let log_id = publish_sized(&addr, n, PAYLOAD);
    let fill = t.elapsed();
    let sides = Sides::alternate(
        opts.runs,
        &mut progress,
        |r| bridge_run(broker, &addr, n, r),
        || producer_run(broker, log_id, n),
    );
    Report {
        machine: at_start,
        options: opts.clone(),
        broker: broker.describe(),
        sides,
        fill,
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.options.records;
        let runs = self.sides.ours.len();
        self.sides.write_spreads(
            f,
            &format!(
                "{} records of {PAYLOAD} B, {}, {runs} runs",
                thousands(n as f64),
                self.broker
            ),
            [
                "`spillway-bridge drain --once`, records/s (whole process)",
                "plain rdkafka producer, records/s (the ceiling)",
                "bridge ÷ producer, per run",
            ],
        )?;
        writeln!(f)?;
        self.sides.write_runs(
            f,
            "bridge s | bridge: records in its topic, in place | producer s | \
             producer: records in its topic, in place | bridge ÷ producer",
            |b, p| {
                format!(
                    "{:.2} | {} of {} | {:.2} | {} of {} | {:.2}",
                    b.secs,
                    thousands(b.verified.matching as f64),
                    thousands(b.verified.expected as f64),
                    p.secs,
                    thousands(p.verified.matching as f64),
                    thousands(p.verified.expected as f64),
                    b.records_per_s() / p.records_per_s(),
                )
            },
            |_, _| "verified".into(),
        )?;
        writeln!(f)?;
        self.sides.write_verdict(
            f,
            &self.failures(),
            &format!(
                "Every run verified: its topic, read back to the end, holds exactly the {} \
                 records sent, in order, each with its payload and `spillway-offset` header; \
                 every bridge run drained under its own consumer name from a fresh state \
                 file, and that consumer's committed offset on the gateway was {}.",
                thousands(n as f64),
                thousands(n as f64),
            ),
        )
    }
}

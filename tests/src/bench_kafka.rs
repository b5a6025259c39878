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
//! gateway is filled once with durable publishes (not timed); every run writes to a fresh
//! topic, bridge and producer alternating; the first run of each side is checked by reading
//! the topic back.

use std::collections::VecDeque;
use std::fmt;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use spillway_core::wire::AckLevel;

use crate::bench_core::{Machine, Spread, machine};
use crate::bench_gateway::thousands;
use crate::bridge::bridge_bin;
use crate::client::{Client, Reply};
use crate::gateway::{GatewayProcess, free_port};
use crate::kafka::{Broker, consume_all};

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
const TOPIC: &str = "bench/sst";
/// Gateway id announced by the benchmark's gateway (part of every message key).
const GATEWAY_ID: &str = "bench-gw";
/// Durable publishes in flight while the gateway is filled.
const WINDOW: usize = 256;

/// Counts delivery reports.
struct Counting {
    ok: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();

    fn delivery(&self, r: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        use std::sync::atomic::Ordering::Relaxed;
        match r {
            Ok(_) => self.ok.fetch_add(1, Relaxed),
            Err(_) => self.failed.fetch_add(1, Relaxed),
        };
    }
}

/// The payload of record `i`: `PAYLOAD` bytes, distinct per record.
fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("{i:010} ").into_bytes();
    p.resize(PAYLOAD, b'x');
    p
}

/// Publishes `n` records durably, pipelined; returns the gateway's log id.
fn publish(addr: &str, n: usize) -> u128 {
    let mut c = Client::tcp(addr).expect("connect");
    let Some(Reply::Welcome { log_id, .. }) = c.welcome.clone() else {
        panic!("no welcome from the gateway")
    };
    let mut inflight = VecDeque::new();
    for i in 0..n {
        let seq = c
            .send_publish(TOPIC, &payload(i), AckLevel::Durable, None)
            .expect("send");
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
    log_id
}

/// One `spillway-bridge drain --once` into a fresh topic; records/s.
fn bridge_run(broker: &Broker, gw: &str, n: usize, check: bool) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let topic = broker.new_topic("bench-bridge", 1);
    let state = dir.path().join("s.redb");
    let t = Instant::now();
    let out = Command::new(bridge_bin())
        .args(["drain", "--once", "--progress", "off", "--gateway", gw])
        .arg("--sink")
        .arg(format!("kafka://{}/{topic}", broker.bootstrap()))
        .arg("--state")
        .arg(&state)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run spillway-bridge");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "drain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if check {
        let msgs = consume_all(&broker.bootstrap(), &topic, 1);
        assert_eq!(msgs.len(), n, "bridge: records in the topic");
        assert_eq!(msgs[n - 1].payload, payload(n - 1));
    }
    n as f64 / secs
}

/// A plain idempotent producer sending the same `n` records (key, headers, payload) to a
/// fresh topic; records/s.
fn producer_run(broker: &Broker, log_id: u128, n: usize, check: bool) -> f64 {
    use std::sync::atomic::Ordering::Relaxed;
    let topic = broker.new_topic("bench-producer", 1);
    let key = format!("{GATEWAY_ID}/{TOPIC}");
    let log_hex = format!("{log_id:032x}");
    let ts_us: u64 = 1_700_000_000_000_000;
    // Build the records before the clock starts: the ceiling has them in memory.
    let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
    let t = Instant::now();
    let p: BaseProducer<Counting> = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .create_with_context(Counting {
            ok: 0.into(),
            failed: 0.into(),
        })
        .expect("producer");
    for (i, pl) in payloads.iter().enumerate() {
        let off = i.to_string();
        let ts = (ts_us + i as u64).to_string();
        let mut rec = BaseRecord::to(&topic)
            .key(key.as_str())
            .payload(pl.as_slice())
            .timestamp(i64::try_from(ts_us / 1000).unwrap_or(0))
            .headers(
                OwnedHeaders::new_with_capacity(5)
                    .insert(Header {
                        key: "spillway-gateway",
                        value: Some(GATEWAY_ID),
                    })
                    .insert(Header {
                        key: "spillway-log-id",
                        value: Some(log_hex.as_str()),
                    })
                    .insert(Header {
                        key: "spillway-offset",
                        value: Some(off.as_str()),
                    })
                    .insert(Header {
                        key: "spillway-topic",
                        value: Some(TOPIC),
                    })
                    .insert(Header {
                        key: "spillway-timestamp-us",
                        value: Some(ts.as_str()),
                    }),
            );
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    rec = r;
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(120)).expect("flush");
    while p.context().ok.load(Relaxed) + p.context().failed.load(Relaxed) < n as u64 {
        p.poll(Duration::from_millis(10));
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(p.context().failed.load(Relaxed), 0, "delivery failures");
    if check {
        let msgs = consume_all(&broker.bootstrap(), &topic, 1);
        assert_eq!(msgs.len(), n, "producer: records in the topic");
        assert_eq!(msgs[0].payload, payload(0));
    }
    n as f64 / secs
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
    /// Bridge records/s per run.
    pub bridge: Vec<f64>,
    /// Producer records/s per run, in the same order.
    pub producer: Vec<f64>,
    /// Time to fill the gateway (durable publishes).
    pub fill: Duration,
}

impl Report {
    /// Bridge ÷ producer per run (the runs alternate, so each pair saw the same machine).
    pub fn ratios(&self) -> Vec<f64> {
        self.bridge
            .iter()
            .zip(&self.producer)
            .map(|(b, p)| b / p)
            .collect()
    }
}

/// Fills a fresh gateway and runs both sides `opts.runs` times, alternating, against
/// `broker`; `progress` is told what starts and what each run measured.
///
/// # Panics
/// If the gateway, the bridge or the broker fails, or a topic holds other records than were
/// sent.
pub fn run(opts: &Options, broker: &Broker, mut progress: impl FnMut(&str)) -> Report {
    let at_start = machine();
    let n = opts.records;
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "--image",
        &dir.path().join("bench.img").display().to_string(),
        "--size",
        "128M",
        "--erase-size",
        "64K",
        "--listen",
        &format!("tcp://{addr}"),
        "--gateway-id",
        GATEWAY_ID,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _gateway = GatewayProcess::start(&args, 1);
    progress(&format!(
        "publish {n} records of {PAYLOAD} bytes durably; each run drains all of them into a fresh topic"
    ));
    let t = Instant::now();
    let log_id = publish(&addr, n);
    let fill = t.elapsed();
    let gw = format!("tcp://{addr}");
    let _ = bridge_bin();
    let mut bridge = Vec::new();
    let mut producer = Vec::new();
    for r in 0..opts.runs.max(1) {
        let b = bridge_run(broker, &gw, n, r == 0);
        let p = producer_run(broker, log_id, n, r == 0);
        progress(&format!(
            "run {}: bridge {b:.0} records/s, producer {p:.0} records/s",
            r + 1
        ));
        bridge.push(b);
        producer.push(p);
    }
    Report {
        machine: at_start,
        options: opts.clone(),
        broker: broker.describe(),
        bridge,
        producer,
        fill,
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.options.records;
        let runs = self.bridge.len();
        let row = |f: &mut fmt::Formatter<'_>, label: &str, v: &[f64]| {
            let s = Spread::of(v);
            writeln!(
                f,
                "| {label} | {} | {} | {} |",
                thousands(s.min),
                thousands(s.median),
                thousands(s.max)
            )
        };
        writeln!(
            f,
            "| {n} records of {PAYLOAD} B, {}, {runs} runs | min | median | max |",
            self.broker
        )?;
        writeln!(f, "|---|---|---|---|")?;
        row(
            f,
            "`spillway-bridge drain --once`, records/s (whole process)",
            &self.bridge,
        )?;
        row(
            f,
            "plain rdkafka producer, records/s (the ceiling)",
            &self.producer,
        )?;
        let r = Spread::of(&self.ratios());
        writeln!(
            f,
            "| bridge ÷ producer, per run | {:.2} | {:.2} | {:.2} |",
            r.min, r.median, r.max
        )
    }
}

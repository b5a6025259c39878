//! Bridge drain into a Kafka-protocol broker, side by side with a plain rdkafka producer
//! sending the same records to the same broker (the ceiling), in the same run. [`run`]
//! measures; its [`Report`] prints as a Markdown table.
//!
//! ## What is compared
//! A real `spillway` gateway is filled once with [`Options::records`] records of
//! [`PAYLOAD`] bytes (durable publishes, not timed). Then, [`Options::runs`] times and
//! alternating:
//! - **bridge**: `spillway-bridge drain --once` from that gateway into a fresh topic (one
//!   partition) with a fresh state file and consumer name, timed as a whole process: start,
//!   handshake, fetches, produce, delivery reports, final checkpoint, exit.
//! - **producer**: an rdkafka `FutureProducer` (the bridge's settings: idempotent,
//!   `acks=all`, 5 requests in flight, `linger.ms=5`) sending the same records (same key,
//!   same five headers, same payload sizes) into another fresh topic, timed from its creation
//!   until the last delivery report. The records are built before the clock starts.
//!
//! Both sides' first runs are checked by reading the topic back and counting.
//!
//! The broker is any Kafka-protocol broker at a `host:port` (tansu in memory in
//! `scripts/bench.sh`). Topics are created through the admin API (tansu does not create
//! them on first use).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::util::AsyncRuntime;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use spillway_core::wire::AckLevel;

use crate::bench_core::{Machine, Spread, machine};
use crate::bench_gateway::thousands;
use crate::bridge::bridge_bin;
use crate::client::{Client, Reply};
use crate::gateway::{GatewayProcess, free_port};

/// Payload bytes per record.
pub const PAYLOAD: usize = 100;
/// Topic of the records on the gateway.
const TOPIC: &str = "bench/sst";
/// Gateway id announced by the benchmark's gateway (part of every message key).
const GATEWAY_ID: &str = "bench-gw";
/// Durable publishes in flight while the gateway is filled.
const WINDOW: usize = 256;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Records drained (and produced) per run.
    pub records: usize,
    /// Runs of each side.
    pub runs: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            records: 50_000,
            runs: 5,
        }
    }
}

/// rdkafka's async runtime hooks on smol: tasks go to smol's global executor, timers are
/// smol timers.
#[derive(Debug, Clone, Copy)]
pub struct SmolRuntime;

impl AsyncRuntime for SmolRuntime {
    type Delay = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn spawn<T>(task: T)
    where
        T: Future<Output = ()> + Send + 'static,
    {
        smol::spawn(task).detach();
    }

    fn delay_for(duration: Duration) -> Self::Delay {
        Box::pin(async move {
            smol::Timer::after(duration).await;
        })
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// What ran.
    pub options: Options,
    /// The broker's address.
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

/// The payload of record `i`: [`PAYLOAD`] bytes, distinct per record.
fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("{i:010} ").into_bytes();
    p.resize(PAYLOAD, b'x');
    p
}

/// Creates `topic` with one partition through the admin API.
///
/// # Panics
/// If the broker refuses.
pub fn create_topic(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let t = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    let res =
        smol::block_on(admin.create_topics([&t], &AdminOptions::new())).expect("create topics");
    for r in res {
        if let Err((name, e)) = r {
            panic!("creating topic {name}: {e}");
        }
    }
}

/// A topic name that no earlier run used.
fn fresh_topic(brokers: &str, prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("{prefix}-{nanos:x}");
    create_topic(brokers, &name);
    name
}

/// Counts the messages of partition 0 of `topic`, reading from the beginning to the end the
/// fetch responses report (60 s at most).
///
/// # Panics
/// On a consumer error or the time limit.
pub fn count_messages(brokers: &str, topic: &str) -> usize {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "spillway-bench")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    c.assign(&tpl).expect("assign");
    let t = Instant::now();
    let mut n = 0;
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "topic {topic} not read to the end in 60 s"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return n,
            Some(Err(e)) => panic!("consuming {topic}: {e}"),
            Some(Ok(_)) => n += 1,
        }
    }
}

/// Publishes `n` records durably, pipelined; returns the gateway's log id.
fn fill(addr: &str, n: usize) -> u128 {
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
fn bridge_run(brokers: &str, gateway: &str, n: usize, run: usize, check: bool) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let topic = fresh_topic(brokers, "bench-bridge");
    let t = Instant::now();
    let out = Command::new(bridge_bin())
        .args(["drain", "--once", "--progress", "off", "--from", "earliest"])
        .args(["--gateway", gateway])
        .arg("--sink")
        .arg(format!("kafka://{brokers}/{topic}"))
        .arg("--state")
        .arg(dir.path().join("state.redb"))
        .arg("--consumer")
        .arg(format!("bench{run}"))
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
        assert_eq!(count_messages(brokers, &topic), n, "bridge: records in topic");
    }
    n as f64 / secs
}

/// A plain producer sending the same `n` records (key, headers, payload) into a fresh
/// topic; records/s.
fn producer_run(brokers: &str, log_id: u128, n: usize, check: bool) -> f64 {
    let topic = fresh_topic(brokers, "bench-producer");
    let key = format!("{GATEWAY_ID}/{TOPIC}");
    let log_hex = format!("{log_id:032x}");
    let ts_us: u64 = 1_700_000_000_000_000;
    // The ceiling has its records in memory before the clock starts.
    let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
    let offsets: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let stamps: Vec<String> = (0..n).map(|i| (ts_us + i as u64).to_string()).collect();
    let t = Instant::now();
    let p: FutureProducer<DefaultClientContext, SmolRuntime> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .create()
        .expect("producer");
    let mut pending: VecDeque<DeliveryFuture> = VecDeque::with_capacity(n);
    let await_one = |f: DeliveryFuture| match smol::block_on(f) {
        Ok(Ok(_)) => {}
        Ok(Err((e, _))) => panic!("delivery failed: {e}"),
        Err(_) => panic!("delivery report lost"),
    };
    for i in 0..n {
        let headers = OwnedHeaders::new_with_capacity(5)
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
                value: Some(offsets[i].as_str()),
            })
            .insert(Header {
                key: "spillway-topic",
                value: Some(TOPIC),
            })
            .insert(Header {
                key: "spillway-timestamp-us",
                value: Some(stamps[i].as_str()),
            });
        let mut rec = FutureRecord::to(&topic)
            .key(key.as_str())
            .payload(payloads[i].as_slice())
            .timestamp(i64::try_from((ts_us + i as u64) / 1000).unwrap_or(0))
            .headers(headers);
        loop {
            match p.send_result(rec) {
                Ok(f) => {
                    pending.push_back(f);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    rec = r;
                    match pending.pop_front() {
                        Some(f) => await_one(f),
                        None => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
    }
    for f in pending {
        await_one(f);
    }
    let secs = t.elapsed().as_secs_f64();
    drop(p);
    if check {
        assert_eq!(
            count_messages(brokers, &topic),
            n,
            "producer: records in topic"
        );
    }
    n as f64 / secs
}

/// Fills a fresh gateway and runs both sides `opts.runs` times, alternating, against the
/// broker at `brokers`; `progress` is told what starts.
///
/// # Panics
/// If the gateway, the bridge or the broker fails, or a topic holds a different number of
/// records than was sent.
pub fn run(opts: &Options, brokers: &str, mut progress: impl FnMut(&str)) -> Report {
    let at_start = machine();
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
    progress(&format!("fill the gateway with {} records", opts.records));
    let t = Instant::now();
    let log_id = fill(&addr, opts.records);
    let filled = t.elapsed();
    let gateway = format!("tcp://{addr}");
    let _ = bridge_bin();
    let mut bridge = Vec::new();
    let mut producer = Vec::new();
    for r in 0..opts.runs.max(1) {
        progress(&format!("bridge drain and producer, run {}", r + 1));
        bridge.push(bridge_run(brokers, &gateway, opts.records, r, r == 0));
        producer.push(producer_run(brokers, log_id, opts.records, r == 0));
    }
    Report {
        machine: at_start,
        options: opts.clone(),
        broker: brokers.to_string(),
        bridge,
        producer,
        fill: filled,
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
            "| {n} records of {PAYLOAD} B into the broker at {}, {runs} runs | min | median | max |",
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
            "plain rdkafka FutureProducer, records/s (the ceiling)",
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

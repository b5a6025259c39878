//! Two benchmarks of one bridge for many gateways and of its uplink cap, both into a
//! Kafka-protocol broker:
//!
//! - [`run_fleet`]: records/s of one `spillway-bridge drain --once` of 16 real `spillway`
//!   gateways at once (aggregate), beside a plain rdkafka producer sending the same records
//!   (same keys, headers, sizes; the bridge's producer settings) to the same broker. Every
//!   run of both sides writes a fresh topic of [`FleetOptions::partitions`] partitions and is
//!   read back to the end: each gateway's records exactly once, in offset order, each
//!   payload in place. Every bridge run drains from a fresh state file under a consumer name
//!   of its own, and that consumer's committed offset on every gateway must be the gateway's
//!   record count (then the consumer is deleted, not timed).
//! - [`run_cap`]: `drain --max-bytes-per-sec` held over a window. A gateway holds more
//!   records than the window can take at the cap; the bridge drains them (no `--once`) into a
//!   fresh topic with `--metrics`. The rate is read from its counter
//!   `spillway_bridge_forwarded_bytes_total` (payload bytes whose delivery reports arrived
//!   and whose checkpoint was saved): sampled [`CapOptions::warm_up`] after the first
//!   delivery (past the limiter's one-second burst) and again [`CapOptions::window`] later,
//!   rate = bytes between the samples ÷ the time between them (also per third of the
//!   window). The bridge is then stopped with SIGTERM; its topic must hold exactly the
//!   records its consumer committed on the gateway, in order, and the gateway must still
//!   have had records left (else the window was not all under the cap). A rate outside
//!   [`CapOptions::tolerance_pct`] of the cap fails the run.
//!
//! A failed check is kept in the report and named by its `failures()`; the benchmark
//! programs exit non-zero on any.

use std::fmt;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::message::Message;

use crate::bench_core::{Machine, machine};
use crate::bench_kafka::{
    BridgeLike, PAYLOAD, Run, Sides, TOPIC, Verified, committed_and_delete, drain_once, payload_of,
    publish_sized, read_back, send_like_the_bridge, spillway_offset, start_gateway,
    timed_producer_run, verify_topic_sized,
};
use crate::bridge::{bridge_bin, metric_sum};
use crate::figures::{table_head, thousands};
use crate::gateway::{GatewayProcess, free_port};
use crate::kafka::Broker;
use crate::process::ChildProcess;

/// What [`run_fleet`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetOptions {
    /// Gateway processes.
    pub gateways: usize,
    /// Records of [`PAYLOAD`] bytes stored in each.
    pub per_gateway: usize,
    /// Partitions of every topic.
    pub partitions: i32,
    /// Runs of each side.
    pub runs: usize,
}

impl Default for FleetOptions {
    /// 16 gateways × 20,000 records (320,000 in all, about the single-gateway benchmark's
    /// 300,000), 4 partitions, 3 runs.
    fn default() -> Self {
        FleetOptions {
            gateways: 16,
            per_gateway: 20_000,
            partitions: 4,
            runs: 3,
        }
    }
}

/// Gateway id of fleet gateway `g`.
fn fleet_id(g: usize) -> String {
    format!("bench-fleet-{g}")
}

/// Reads every partition of `topic` to its end and checks that it holds, for each of
/// `gateways` gateways, its `per` records exactly once and in offset order: key = gateway
/// id, header `spillway-offset` = the record's place in that gateway's sequence, payload
/// [`payload_of`] it. Streams (only counters are kept).
///
/// # Panics
/// If no consumer can be created or assigned.
fn verify_fleet_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    gateways: usize,
    per: u64,
) -> Verified {
    let ids: Vec<String> = (0..gateways).map(fleet_id).collect();
    let mut next = vec![0u64; gateways];
    let mut matching = 0u64;
    let mut first_wrong: Option<String> = None;
    let (found, read_error) = read_back(bootstrap, topic, partitions, |m| {
        let g = m
            .key()
            .and_then(|k| ids.iter().position(|id| id.as_bytes() == k));
        let offset = spillway_offset(m);
        match (g, offset) {
            (Some(g), Some(o))
                if o == next[g]
                    && o < per
                    && usize::try_from(o)
                        .is_ok_and(|i| m.payload() == Some(payload_of(i, PAYLOAD).as_slice())) =>
            {
                next[g] += 1;
                matching += 1;
            }
            _ => {
                first_wrong.get_or_insert(format!(
                    "partition {} offset {}: key {:?}, spillway-offset {offset:?}: not the next record of its gateway ({})",
                    m.partition(),
                    m.offset(),
                    m.key().map(String::from_utf8_lossy),
                    g.map_or("unknown gateway".to_string(), |g| format!(
                        "expected offset {}",
                        next[g]
                    ))
                ));
            }
        }
    });
    let expected = per * gateways as u64;
    let short: Vec<String> = next
        .iter()
        .enumerate()
        .filter(|(_, n)| **n != per)
        .map(|(g, n)| format!("{}: {n}", ids[g]))
        .collect();
    let problem = if found != expected {
        Some(format!("{found} records in the topic, {expected} sent"))
    } else if !short.is_empty() {
        Some(format!(
            "gateways with fewer than {per} records in order: {}",
            short.join(", ")
        ))
    } else {
        first_wrong.or(read_error)
    };
    Verified {
        expected,
        found,
        matching,
        problem,
    }
}

/// One `drain --once` of every gateway into a fresh topic (see the module doc).
fn fleet_bridge_run(broker: &Broker, addrs: &[String], o: &FleetOptions, run: usize) -> Run {
    let topic = broker.new_topic("bench-fleet-bridge", o.partitions);
    let consumer = format!("bench-fleet-run-{run}");
    let (secs, exit) = drain_once(addrs, &consumer, &broker.sink_uri(&topic));
    let per = o.per_gateway as u64;
    let mut verified =
        verify_fleet_topic(&broker.bootstrap(), &topic, o.partitions, o.gateways, per);
    let wrong: Vec<String> = addrs
        .iter()
        .enumerate()
        .filter_map(|(g, a)| {
            let c = committed_and_delete(a, &consumer);
            (c != Some(per)).then(|| format!("{}: {c:?}", fleet_id(g)))
        })
        .collect();
    if exit.is_some() {
        verified.problem = exit;
    } else if verified.ok() && !wrong.is_empty() {
        verified.problem = Some(format!(
            "the topic holds every record, but consumer {consumer} committed on the gateways \
             not {per}: {}",
            wrong.join(", ")
        ));
    }
    Run { secs, verified }
}

/// A plain idempotent producer sending the records of every gateway (gateways interleaved
/// in runs of 1,000, as the bridge's concurrent drains interleave them) to a fresh topic,
/// timed from its creation to the last delivery report; verified by reading it back.
fn fleet_producer_run(broker: &Broker, log_ids: &[u128], o: &FleetOptions) -> Run {
    let topic = broker.new_topic("bench-fleet-producer", o.partitions);
    let ids: Vec<String> = (0..o.gateways).map(fleet_id).collect();
    let hexes: Vec<String> = log_ids.iter().map(|l| format!("{l:032x}")).collect();
    let ts_us: u64 = 1_700_000_000_000_000;
    // Built before the clock starts: the ceiling has them in memory.
    let payloads: Vec<Vec<u8>> = (0..o.per_gateway).map(|i| payload_of(i, PAYLOAD)).collect();
    let n = (o.per_gateway * o.gateways) as u64;
    const RUN: usize = 1000;
    let bootstrap = broker.bootstrap();
    let send = |p: &_| {
        for start in (0..o.per_gateway).step_by(RUN) {
            for g in 0..o.gateways {
                for (i, pl) in payloads
                    .iter()
                    .enumerate()
                    .skip(start)
                    .take(RUN.min(o.per_gateway - start))
                {
                    send_like_the_bridge(
                        p,
                        &BridgeLike {
                            kafka_topic: &topic,
                            gateway: &ids[g],
                            log_hex: &hexes[g],
                            topic: TOPIC,
                            offset: i,
                            timestamp_us: ts_us + i as u64,
                            payload: pl,
                        },
                    );
                }
            }
        }
    };
    timed_producer_run(&bootstrap, n, send, || {
        verify_fleet_topic(
            &bootstrap,
            &topic,
            o.partitions,
            o.gateways,
            o.per_gateway as u64,
        )
    })
}

/// What [`run_fleet`] measured.
#[derive(Debug, Clone)]
pub struct FleetReport {
    /// Where it ran.
    pub machine: Machine,
    /// What ran.
    pub options: FleetOptions,
    /// The broker, described.
    pub broker: String,
    /// Both sides' runs (the bridge's aggregate over every gateway).
    pub sides: Sides,
    /// Time to start the gateways and fill them (durable publishes, concurrently).
    pub fill: Duration,
}

/// The goal of the fleet ratio (bridge ÷ producer).
pub const FLEET_GOAL: f64 = 0.8;

impl FleetReport {
    /// Every run that did not put exactly the records it had to into its topic, described.
    pub fn failures(&self) -> Vec<String> {
        self.sides.failures("Kafka fleet")
    }
}

/// Starts and fills `opts.gateways` gateways (concurrently), then runs both sides
/// `opts.runs` times, alternating; `progress` hears what starts and what each run found.
///
/// # Panics
/// If a gateway or the broker fails.
pub fn run_fleet(
    opts: &FleetOptions,
    broker: &Broker,
    mut progress: impl FnMut(&str),
) -> FleetReport {
    let at_start = machine();
    let dir = tempfile::tempdir().expect("tempdir");
    progress(&format!(
        "start {} gateways and publish {} records of {PAYLOAD} B durably into each",
        opts.gateways, opts.per_gateway
    ));
    let t = Instant::now();
    // About 256 B of flash per record, and room to spare.
    let size = format!("{}M", ((opts.per_gateway * 256) >> 20) + 16);
    let (gateways, addrs): (Vec<GatewayProcess>, Vec<String>) = (0..opts.gateways)
        .map(|g| start_gateway(dir.path(), &fleet_id(g), &size))
        .unzip();
    let log_ids: Vec<u128> = std::thread::scope(|s| {
        let handles: Vec<_> = addrs
            .iter()
            .map(|a| s.spawn(|| publish_sized(a, opts.per_gateway, PAYLOAD)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("publisher"))
            .collect()
    });
    let fill = t.elapsed();
    let sides = Sides::alternate(
        opts.runs,
        &mut progress,
        |r| fleet_bridge_run(broker, &addrs, opts, r),
        || fleet_producer_run(broker, &log_ids, opts),
    );
    drop(gateways);
    FleetReport {
        machine: at_start,
        options: opts.clone(),
        broker: broker.describe(),
        sides,
        fill,
    }
}

impl fmt::Display for FleetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        self.sides.write_spreads(
            f,
            &format!(
                "{} gateways × {} records of {PAYLOAD} B, {} partitions, {}, {} runs",
                o.gateways,
                thousands(o.per_gateway as f64),
                o.partitions,
                self.broker,
                self.sides.ours.len()
            ),
            [
                "one `spillway-bridge drain --once` of every gateway, records/s (whole process)",
                "plain rdkafka producer, same records, records/s",
                &format!("bridge ÷ producer, per run (goal ≥ {FLEET_GOAL})"),
            ],
        )?;
        writeln!(f)?;
        self.sides.write_runs(
            f,
            "bridge s | producer s | bridge ÷ producer",
            |b, p| {
                format!(
                    "{:.2} | {:.2} | {:.2}",
                    b.secs,
                    p.secs,
                    b.records_per_s() / p.records_per_s()
                )
            },
            |b, _| {
                format!(
                    "verified: {} of {} in place, each side",
                    thousands(b.verified.matching as f64),
                    thousands(b.verified.expected as f64)
                )
            },
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "Starting and filling the gateways took {:.1} s (not timed).",
            self.fill.as_secs_f64()
        )
    }
}

/// What [`run_cap`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapOptions {
    /// The cap, bytes/s (`--max-bytes-per-sec` takes it as a number of bytes).
    pub bytes_per_sec: u64,
    /// Payload bytes per record.
    pub payload: usize,
    /// From the first delivery to the first sample.
    pub warm_up: Duration,
    /// Between the two samples.
    pub window: Duration,
    /// Largest allowed |achieved ÷ cap − 1|.
    pub tolerance_pct: u32,
}

impl Default for CapOptions {
    /// 1 MiB/s (`1M`), records of 1,000 B, 5 s warm-up, 30 s window, ±10 %.
    fn default() -> Self {
        CapOptions {
            bytes_per_sec: 1 << 20,
            payload: 1000,
            warm_up: Duration::from_secs(5),
            window: Duration::from_secs(30),
            tolerance_pct: 10,
        }
    }
}

impl CapOptions {
    /// Records stored in the gateway: what the warm-up and the window take at the cap, and
    /// 10 s more, so that the drain is still capped at the window's end.
    pub fn records(&self) -> usize {
        let secs = (self.warm_up + self.window + Duration::from_secs(10)).as_secs_f64();
        (secs * self.bytes_per_sec as f64 / self.payload as f64).ceil() as usize
    }
}

/// What [`run_cap`] measured.
#[derive(Debug, Clone)]
pub struct CapReport {
    /// What ran.
    pub options: CapOptions,
    /// Payload bytes/s over the window.
    pub achieved: f64,
    /// Payload bytes/s over each third of the window.
    pub thirds: Vec<f64>,
    /// Exact length of the window between the samples.
    pub window: Duration,
    /// Records the gateway held.
    pub stored: u64,
    /// Records the bridge had delivered and committed when it was stopped.
    pub committed: u64,
    /// The read-back of the topic.
    pub verified: Verified,
    /// What is wrong with the run (`None`: the cap held within the tolerance and the
    /// topic holds exactly the committed records).
    pub problem: Option<String>,
}

impl CapReport {
    /// Achieved rate ÷ cap.
    pub fn ratio(&self) -> f64 {
        self.achieved / self.options.bytes_per_sec as f64
    }

    /// The run's failure, if any, described.
    pub fn failures(&self) -> Vec<String> {
        self.problem
            .iter()
            .map(|p| format!("uplink cap: {p}"))
            .collect()
    }
}

/// Reads the bridge's forwarded payload bytes until it answers (`None` after 10 s).
fn forwarded_bytes(port: u16) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = metric_sum(port, "spillway_bridge_forwarded_bytes_total") {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the capped drain once (see the module doc).
///
/// # Panics
/// If the gateway, the broker or the bridge's metrics cannot be reached.
pub fn run_cap(opts: &CapOptions, broker: &Broker, mut progress: impl FnMut(&str)) -> CapReport {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = opts.records();
    let size = format!("{}M", ((n * (opts.payload + 256)) >> 20) + 16);
    let (gateway, addr) = start_gateway(dir.path(), "bench-gw", &size);
    progress(&format!(
        "publish {n} records of {} B durably; drain them under --max-bytes-per-sec {}",
        opts.payload, opts.bytes_per_sec
    ));
    publish_sized(&addr, n, opts.payload);
    let topic = broker.new_topic("bench-cap", 1);
    let port = free_port();
    let consumer = "bench-cap";
    let child = Command::new(bridge_bin())
        .args(["drain", "--progress", "off", "--consumer", consumer])
        .arg("--gateway")
        .arg(format!("tcp://{addr}"))
        .arg("--sink")
        .arg(broker.sink_uri(&topic))
        .arg("--state")
        .arg(dir.path().join("s.redb"))
        .arg("--max-bytes-per-sec")
        .arg(opts.bytes_per_sec.to_string())
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("start spillway-bridge");
    // Killed on the way out if anything below panics.
    let mut child = ChildProcess::new(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while forwarded_bytes(port).unwrap_or(0.0) <= 0.0 {
        assert!(
            Instant::now() < deadline,
            "the capped drain delivered nothing in 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(opts.warm_up);
    let sample = || {
        let b = forwarded_bytes(port).expect("bridge metrics");
        (Instant::now(), b)
    };
    let mut samples = vec![sample()];
    for k in 1..=3u32 {
        let until = samples[0].0 + opts.window * k / 3;
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        samples.push(sample());
    }
    let exit = child.stop(Duration::from_secs(30));
    let rate = |a: &(Instant, f64), b: &(Instant, f64)| (b.1 - a.1) / (b.0 - a.0).as_secs_f64();
    let achieved = rate(&samples[0], &samples[3]);
    let thirds: Vec<f64> = samples.windows(2).map(|w| rate(&w[0], &w[1])).collect();
    let window = samples[3].0 - samples[0].0;
    let committed = committed_and_delete(&addr, consumer).unwrap_or(0);
    drop(gateway);
    let verified = verify_topic_sized(&broker.bootstrap(), &topic, committed, opts.payload);
    let cap = opts.bytes_per_sec as f64;
    let off = (achieved / cap - 1.0).abs() * 100.0;
    let problem = if exit.is_none_or(|s| !s.success()) {
        Some(format!(
            "the bridge did not exit 0 within 30 s of SIGTERM ({exit:?})"
        ))
    } else if let Some(p) = &verified.problem {
        Some(format!(
            "the topic does not hold the committed records: {p}"
        ))
    } else if committed >= n as u64 {
        Some(format!(
            "the gateway's {n} records were all drained before the bridge was stopped: the window was not all under the cap"
        ))
    } else if off > f64::from(opts.tolerance_pct) {
        Some(format!(
            "{achieved:.0} B/s over {:.1} s, {off:.1} % from the cap of {cap:.0} B/s (at most {} % allowed)",
            window.as_secs_f64(),
            opts.tolerance_pct
        ))
    } else {
        None
    };
    progress(&format!(
        "{achieved:.0} B/s over {:.1} s ({:.3} of the cap); thirds {:?}; {committed} records committed and read back{}",
        window.as_secs_f64(),
        achieved / cap,
        thirds.iter().map(|t| t.round()).collect::<Vec<_>>(),
        problem
            .as_ref()
            .map_or(String::new(), |p| format!("; FAILED: {p}"))
    ));
    CapReport {
        options: opts.clone(),
        achieved,
        thirds,
        window,
        stored: n as u64,
        committed,
        verified,
        problem,
    }
}

impl fmt::Display for CapReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let cap = o.bytes_per_sec as f64;
        table_head(
            f,
            &format!(
                "| `--max-bytes-per-sec {}`, records of {} B | payload B/s | ÷ cap |",
                o.bytes_per_sec, o.payload
            ),
        )?;
        writeln!(
            f,
            "| whole window, {:.1} s (goal: within ±{} %) | {} | **{:.3}** |",
            self.window.as_secs_f64(),
            o.tolerance_pct,
            thousands(self.achieved),
            self.achieved / cap
        )?;
        for (i, t) in self.thirds.iter().enumerate() {
            writeln!(
                f,
                "| third {} of the window | {} | {:.3} |",
                i + 1,
                thousands(*t),
                t / cap
            )?;
        }
        writeln!(f)?;
        match &self.problem {
            None => writeln!(
                f,
                "Verified: the gateway held {} records and still had some left at the end of \
                 the window; the topic, read back, holds exactly the {} records the bridge had \
                 committed when it was stopped, in order.",
                thousands(self.stored as f64),
                thousands(self.committed as f64)
            ),
            Some(p) => writeln!(f, "**FAILED**: {p}"),
        }
    }
}

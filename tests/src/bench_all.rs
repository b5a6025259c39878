//! Every benchmark of Spillway against its peers in one run, written as a Markdown report
//! (`BENCH.md`) with SVG plots into a results folder. [`run`] measures; [`AllReport::write`]
//! writes the folder.
//!
//! The comparisons, each measured beside its peer in the same run (interleaved where both
//! are in this process) and shown as spillway ÷ peer on medians:
//! 1. core appends/s, flash bytes per payload byte, erases per MiB and reads/s against the
//!    `sequential-storage` queue ([`bench_core::write_case`]);
//! 2. mount (recovery) time against image size, against a read of every byte of the same
//!    image and the peer's cold first operation ([`bench_core::mount_size`]), plotted;
//! 3. gateway ingest over TCP, buffered and durable, against NATS JetStream, with the disk's
//!    sync bandwidth ([`bench_gateway`]);
//! 4. bridge drain into a Kafka-protocol broker against a plain producer ([`bench_kafka`]);
//! 5. footprint beside nats-server and mosquitto ([`bench_footprint`]);
//! 6. MQTT QoS 1 fan-in of 50 publishers against Mosquitto, with the load generator's own
//!    ceiling against a discard server ([`bench_mqtt`]);
//! 7. one bridge draining 16 gateways into Kafka against a plain producer sending the same
//!    records ([`bench_fleet::run_fleet`]);
//! 8. the uplink cap `--max-bytes-per-sec 1M` held over 30 s, against the cap itself
//!    ([`bench_fleet::run_cap`]).
//!
//! A ratio's range is the widest the extremes allow (spillway's min ÷ the peer's max to
//! spillway's max ÷ the peer's min), unless the repetitions were paired, then it is the
//! range of the per-pair ratios.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bench_core::{
    self, Engine, Machine, PeerCold, SpillwayMount, Spread, WriteRun, machine,
};
use crate::bench_fleet;
use crate::bench_footprint;
use crate::bench_gateway::{self, thousands};
use crate::bench_kafka;
use crate::bench_mqtt;
use crate::plot::{self, Bar, Series};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Append and read cases, repetitions and flash size of comparison 1 (its mount fields
    /// are not used: see the `mount_*` fields here).
    pub core: bench_core::Options,
    /// Mount image sizes, MiB, ascending.
    pub mount_sizes_mib: Vec<u32>,
    /// Repetitions of every mount figure up to 64 MiB.
    pub mount_reps: usize,
    /// Repetitions of every mount figure above 64 MiB (each copies a large image).
    pub mount_reps_large: usize,
    /// Largest image the peer is filled and timed on, MiB.
    pub mount_peer_max_mib: u32,
    /// Segments of the "fixed segment count" mount series.
    pub mount_fixed_segments: u32,
    /// Comparison 3.
    pub gateway: bench_gateway::Options,
    /// The nats-server binary for comparisons 3 and 5 (`None`: the peer is skipped).
    pub nats_bin: Option<PathBuf>,
    /// Comparison 4 and the broker's `host:port` (`None`: skipped).
    pub kafka: Option<(bench_kafka::Options, String)>,
    /// Comparison 5.
    pub footprint: bench_footprint::Options,
    /// Comparison 6.
    pub mqtt: bench_mqtt::Options,
    /// Comparison 7 (on the broker of [`Options::kafka`]).
    pub fleet: bench_fleet::FleetOptions,
    /// Comparison 8 (on the broker of [`Options::kafka`]).
    pub cap: bench_fleet::CapOptions,
    /// Which comparisons run (index 0 is comparison 1); all of them normally.
    pub parts: [bool; 8],
}

impl Options {
    /// Runs only the comparisons numbered in `only` (1–8).
    pub fn only(mut self, only: &[u8]) -> Options {
        for (i, p) in self.parts.iter_mut().enumerate() {
            *p = only.contains(&(i as u8 + 1));
        }
        self
    }

    /// The full run: 9 to 14 minutes on a 2-core machine busy with other builds (the
    /// standalone benchmarks' defaults, fewer mount repetitions above 64 MiB).
    pub fn full(nats_bin: Option<PathBuf>, broker: Option<String>) -> Options {
        Options {
            core: bench_core::Options::default(),
            mount_sizes_mib: vec![1, 4, 16, 64, 256, 1024],
            mount_reps: 15,
            mount_reps_large: 7,
            mount_peer_max_mib: 64,
            mount_fixed_segments: 64,
            gateway: bench_gateway::Options::default(),
            kafka: broker.map(|b| (bench_kafka::Options::default(), b)),
            footprint: bench_footprint::Options {
                per_publisher: 20_000,
                nats_bin: nats_bin.clone(),
                mosquitto_bin: bench_footprint::mosquitto_bin(),
            },
            mqtt: bench_mqtt::Options::full(bench_footprint::mosquitto_bin()),
            nats_bin,
            fleet: bench_fleet::FleetOptions::default(),
            cap: bench_fleet::CapOptions::default(),
            parts: [true; 8],
        }
    }

    /// A run of seconds that exercises every comparison on tiny sizes (for `cargo test`).
    pub fn smoke(nats_bin: Option<PathBuf>, broker: Option<String>) -> Options {
        Options {
            core: bench_core::Options::smoke(),
            mount_sizes_mib: vec![1, 2],
            mount_reps: 2,
            mount_reps_large: 1,
            mount_peer_max_mib: 1,
            mount_fixed_segments: 16,
            gateway: bench_gateway::Options::smoke(),
            kafka: broker.map(|b| {
                (
                    bench_kafka::Options {
                        records: 500,
                        runs: 1,
                    },
                    b,
                )
            }),
            footprint: bench_footprint::Options {
                per_publisher: 200,
                nats_bin: nats_bin.clone(),
                mosquitto_bin: bench_footprint::mosquitto_bin(),
            },
            mqtt: bench_mqtt::Options::smoke(bench_footprint::mosquitto_bin()),
            nats_bin,
            fleet: bench_fleet::FleetOptions {
                gateways: 2,
                per_gateway: 300,
                partitions: 2,
                runs: 1,
            },
            // A short window holds few batches: a wide tolerance.
            cap: bench_fleet::CapOptions {
                bytes_per_sec: 256 << 10,
                warm_up: Duration::from_secs(1),
                window: Duration::from_secs(3),
                tolerance_pct: 50,
                ..bench_fleet::CapOptions::default()
            },
            parts: [true; 8],
        }
    }
}

/// Mount figures of one image size.
#[derive(Debug, Clone)]
pub struct MountRow {
    /// Image size, MiB.
    pub size_mib: u32,
    /// Spillway with 16 KiB segments (the size grows the segment count).
    pub small_segments: SpillwayMount,
    /// Spillway with [`Options::mount_fixed_segments`] segments (the size grows the
    /// segments).
    pub fixed_count: SpillwayMount,
    /// The peer, up to [`Options::mount_peer_max_mib`].
    pub peer: Option<PeerCold>,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct AllReport {
    /// What ran.
    pub options: Options,
    /// The machine at the start.
    pub machine: Machine,
    /// Load averages at the end.
    pub load_at_end: String,
    /// When it ran (UTC, from `date`).
    pub date: String,
    /// Comparison 1, in `options.core.write_cases` order, [`Engine::ALL`] inside.
    pub writes: Vec<WriteRun>,
    /// Comparison 1's compression rows on the real series.
    pub compression: crate::bench_compression::Report,
    /// Comparison 2, by size.
    pub mounts: Vec<MountRow>,
    /// Comparison 3 (`None` if not run).
    pub gateway: Option<bench_gateway::Report>,
    /// Comparison 4 (`None` if not run or no broker was given).
    pub kafka: Option<bench_kafka::Report>,
    /// Comparison 5 (`None` if not run).
    pub footprint: Option<bench_footprint::Report>,
    /// Comparison 6 (`None` if not run).
    pub mqtt: Option<bench_mqtt::Report>,
    /// Comparison 7 (`None` if not run or no broker was given).
    pub fleet: Option<bench_fleet::FleetReport>,
    /// Comparison 8 (`None` if not run or no broker was given).
    pub cap: Option<bench_fleet::CapReport>,
    /// Wall time of each comparison.
    pub timings: Vec<(&'static str, Duration)>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Runs every comparison; `progress` is told what starts.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> AllReport {
    let begun = Instant::now();
    let at_start = machine();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut timings = Vec::new();

    let t = Instant::now();
    let mut writes = Vec::new();
    let cases = if opts.parts[0] {
        opts.core.write_cases.as_slice()
    } else {
        &[]
    };
    for &case in cases {
        progress(&format!(
            "1. core: append and read {} B records, write size {}",
            case.payload_len, case.write_size
        ));
        writes.extend(bench_core::write_case(case, &opts.core));
    }
    let compression = if opts.parts[0] {
        bench_core::compression_runs(&opts.core, &mut |w: &str| {
            progress(&format!("1. core: {w}"))
        })
    } else {
        Default::default()
    };
    timings.push(("1. core appends and reads", t.elapsed()));

    let t = Instant::now();
    let mut mounts = Vec::new();
    let sizes = if opts.parts[1] {
        opts.mount_sizes_mib.as_slice()
    } else {
        &[]
    };
    for &size_mib in sizes {
        progress(&format!("2. mount: {size_mib} MiB images"));
        let fixed_bps = (size_mib * 256 / opts.mount_fixed_segments).max(1);
        let mut bps = vec![bench_core::BLOCKS_PER_SEGMENT];
        if fixed_bps != bench_core::BLOCKS_PER_SEGMENT {
            bps.push(fixed_bps);
        }
        let mount_opts = bench_core::Options {
            mount_reps: if size_mib > 64 {
                opts.mount_reps_large
            } else {
                opts.mount_reps
            },
            mount_peer_max_mib: opts.mount_peer_max_mib,
            mount_cases: Vec::new(),
            ..opts.core.clone()
        };
        let (m, peer) = bench_core::mount_size(size_mib, &bps, &mount_opts);
        let small = m[0].clone();
        let fixed = m.get(1).cloned().unwrap_or_else(|| small.clone());
        mounts.push(MountRow {
            size_mib,
            small_segments: small,
            fixed_count: fixed,
            peer,
        });
    }
    timings.push(("2. mount against image size", t.elapsed()));

    let t = Instant::now();
    let gateway = opts.parts[2].then(|| {
        bench_gateway::run(&opts.gateway, opts.nats_bin.as_deref(), |w| {
            progress(&format!("3. {w}"))
        })
    });
    timings.push(("3. gateway ingest", t.elapsed()));

    let t = Instant::now();
    let kafka = opts
        .kafka
        .as_ref()
        .filter(|_| opts.parts[3])
        .map(|(k, addr)| {
            let broker = crate::kafka::Broker::Real(addr.clone());
            bench_kafka::run(k, &broker, |w| progress(&format!("4. kafka: {w}")))
        });
    timings.push(("4. bridge drain into Kafka", t.elapsed()));

    let t = Instant::now();
    let footprint = opts.parts[4]
        .then(|| bench_footprint::run(&opts.footprint, |w| progress(&format!("5. {w}"))));
    timings.push(("5. footprint", t.elapsed()));

    let t = Instant::now();
    let mqtt = opts.parts[5].then(|| bench_mqtt::run(&opts.mqtt, |w| progress(&format!("6. {w}"))));
    timings.push(("6. MQTT QoS 1 fan-in", t.elapsed()));

    let broker = opts
        .kafka
        .as_ref()
        .map(|(_, addr)| crate::kafka::Broker::Real(addr.clone()));
    let t = Instant::now();
    let fleet = broker.as_ref().filter(|_| opts.parts[6]).map(|b| {
        bench_fleet::run_fleet(&opts.fleet, b, |w| {
            progress(&format!("7. kafka fleet: {w}"))
        })
    });
    timings.push(("7. one bridge, 16 gateways, into Kafka", t.elapsed()));

    let t = Instant::now();
    let cap = broker
        .as_ref()
        .filter(|_| opts.parts[7])
        .map(|b| bench_fleet::run_cap(&opts.cap, b, |w| progress(&format!("8. uplink cap: {w}"))));
    timings.push(("8. uplink cap", t.elapsed()));

    AllReport {
        options: opts.clone(),
        machine: at_start,
        load_at_end: machine().load,
        date,
        writes,
        compression,
        mounts,
        gateway,
        kafka,
        footprint,
        mqtt,
        fleet,
        cap,
        timings,
        elapsed: begun.elapsed(),
    }
}

/// A headline ratio.
#[derive(Debug, Clone)]
pub struct Ratio {
    /// Comparison number (1–6).
    pub comparison: u8,
    /// What is compared.
    pub label: String,
    /// Spillway's median, formatted with its unit.
    pub spillway: String,
    /// The peer's median, formatted with its unit.
    pub peer: String,
    /// Which peer.
    pub peer_name: String,
    /// Spillway ÷ peer on medians.
    pub ratio: f64,
    /// Range of the ratio (see the module doc), if the figures vary between repetitions.
    pub range: Option<(f64, f64)>,
    /// Whether a ratio above 1 favours spillway.
    pub higher_is_better: bool,
    /// The goal the ratio is held to, `(low, high)` (`high` infinite: at least `low`);
    /// with one, "behind" means outside it.
    pub goal: Option<(f64, f64)>,
}

impl Ratio {
    /// Whether this ratio favours spillway (equal counts as not behind).
    pub fn favours_spillway(&self) -> bool {
        if let Some((lo, hi)) = self.goal {
            return lo <= self.ratio && self.ratio <= hi;
        }
        if self.higher_is_better {
            self.ratio >= 1.0
        } else {
            self.ratio <= 1.0
        }
    }
}

/// The goal of comparison 4: bridge ÷ producer.
pub const KAFKA_GOAL: f64 = 0.9;

/// The widest ratio range two spreads allow.
fn bounds(a: &Spread, b: &Spread) -> (f64, f64) {
    (a.min / b.max, a.max / b.min)
}

/// The range of paired ratios.
fn paired(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    (!r.is_empty()).then(|| {
        let s = Spread::of(&r);
        (s.min, s.max)
    })
}

/// Formats a rate with a k/M suffix.
fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn mib(kib: u64) -> String {
    format!("{:.2} MiB", kib as f64 / 1024.0)
}

impl AllReport {
    /// Every headline ratio, in comparison order.
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut out = Vec::new();
        let peer_name = "sequential-storage";
        for group in self.writes.chunks(Engine::ALL.len()) {
            let Some(peer) = group.iter().find(|r| r.engine == Engine::Peer) else {
                continue;
            };
            let case = format!(
                "{} B, write size {}",
                peer.case.payload_len, peer.case.write_size
            );
            for r in group.iter().filter(|r| r.engine != Engine::Peer) {
                let who = if r.engine == Engine::Spillway {
                    "buffered"
                } else {
                    "flush every record"
                };
                out.push(Ratio {
                    comparison: 1,
                    label: format!("appends/s, {case}, {who}"),
                    spillway: si(r.appends_per_s.median),
                    peer: si(peer.appends_per_s.median),
                    peer_name: peer_name.into(),
                    ratio: r.appends_per_s.median / peer.appends_per_s.median,
                    range: Some(bounds(&r.appends_per_s, &peer.appends_per_s)),
                    higher_is_better: true,
                    goal: None,
                });
                out.push(Ratio {
                    comparison: 1,
                    label: format!("flash bytes per payload byte, {case}, {who}"),
                    spillway: format!("{:.3}", r.programmed_per_payload_byte()),
                    peer: format!("{:.3}", peer.programmed_per_payload_byte()),
                    peer_name: peer_name.into(),
                    ratio: r.programmed_per_payload_byte() / peer.programmed_per_payload_byte(),
                    range: None,
                    higher_is_better: false,
                    goal: None,
                });
                out.push(Ratio {
                    comparison: 1,
                    label: format!("erases per MiB, {case}, {who}"),
                    spillway: format!("{:.1}", r.erases_per_mib()),
                    peer: format!("{:.1}", peer.erases_per_mib()),
                    peer_name: peer_name.into(),
                    ratio: r.erases_per_mib() / peer.erases_per_mib(),
                    range: None,
                    higher_is_better: false,
                    goal: None,
                });
            }
            // Reads do not depend on how the records were flushed: the buffered run.
            if let Some(r) = group.iter().find(|r| r.engine == Engine::Spillway) {
                out.push(Ratio {
                    comparison: 1,
                    label: format!("reads/s, {case}"),
                    spillway: si(r.reads_per_s.median),
                    peer: si(peer.reads_per_s.median),
                    peer_name: peer_name.into(),
                    ratio: r.reads_per_s.median / peer.reads_per_s.median,
                    range: Some(bounds(&r.reads_per_s, &peer.reads_per_s)),
                    higher_is_better: true,
                    goal: None,
                });
            }
        }
        if let Some(m) = self.mounts.iter().rev().find(|m| m.peer.is_some())
            && let Some(p) = &m.peer
        {
            out.push(Ratio {
                comparison: 2,
                label: format!(
                    "mount ms, {} MiB (16 KiB segments) vs cold first peek",
                    m.size_mib
                ),
                spillway: format!("{:.3} ms", m.small_segments.ms.median),
                peer: format!("{:.3} ms", p.peek_ms.median),
                peer_name: peer_name.into(),
                ratio: m.small_segments.ms.median / p.peek_ms.median,
                range: Some(bounds(&m.small_segments.ms, &p.peek_ms)),
                higher_is_better: false,
                goal: None,
            });
        }
        if let Some(m) = self.mounts.last() {
            for (what, s) in [
                ("16 KiB segments", &m.small_segments),
                (
                    &*format!("{} segments", self.options.mount_fixed_segments),
                    &m.fixed_count,
                ),
            ] {
                out.push(Ratio {
                    comparison: 2,
                    label: format!("mount ms, {} MiB ({what}) vs reading the image", m.size_mib),
                    spillway: format!("{:.3} ms", s.ms.median),
                    peer: format!("{:.3} ms", s.full_scan_ms.median),
                    peer_name: "full scan".into(),
                    ratio: s.ms.median / s.full_scan_ms.median,
                    range: Some(bounds(&s.ms, &s.full_scan_ms)),
                    higher_is_better: false,
                    goal: None,
                });
            }
        }
        let runs = self
            .gateway
            .iter()
            .flat_map(|g| [("buffered", &g.buffered), ("durable", &g.durable)]);
        for (what, runs) in runs {
            let (sw, peer) = (runs.spillway_rates(), runs.nats_rates());
            if peer.is_empty() {
                continue;
            }
            let (a, b) = (Spread::of(&sw), Spread::of(&peer));
            out.push(Ratio {
                comparison: 3,
                label: format!("TCP ingest records/s, 100 B, {what}"),
                spillway: si(a.median),
                peer: si(b.median),
                peer_name: "NATS JetStream".into(),
                ratio: a.median / b.median,
                range: paired(&sw, &peer),
                higher_is_better: true,
                goal: None,
            });
        }
        if let Some(k) = &self.kafka {
            let (bridge, producer) = (k.bridge_rates(), k.producer_rates());
            let (a, b) = (Spread::of(&bridge), Spread::of(&producer));
            let unverified = if k.failures().is_empty() {
                ""
            } else {
                " (FAILED its check: not valid)"
            };
            out.push(Ratio {
                comparison: 4,
                label: format!("records/s into Kafka, bridge drain vs plain producer{unverified}"),
                spillway: si(a.median),
                peer: si(b.median),
                peer_name: "rdkafka producer".into(),
                ratio: a.median / b.median,
                range: paired(&bridge, &producer),
                higher_is_better: true,
                goal: Some((KAFKA_GOAL, f64::INFINITY)),
            });
        }
        let servers = self
            .footprint
            .as_ref()
            .map_or(&[][..], |f| f.servers.as_slice());
        if let Some(sw) = servers.first() {
            for peer in &servers[1..] {
                let short = peer.name.split_whitespace().next().unwrap_or("peer");
                if let (Some(a), Some(b)) = (sw.binary.stripped_bytes, peer.binary.stripped_bytes) {
                    out.push(Ratio {
                        comparison: 5,
                        label: format!("stripped binary size vs {short}"),
                        spillway: mib(a / 1024),
                        peer: mib(b / 1024),
                        peer_name: peer.name.clone(),
                        ratio: a as f64 / b as f64,
                        range: None,
                        higher_is_better: false,
                        goal: None,
                    });
                }
                if !peer.binary.shared_libs.is_empty() {
                    let with_libs = |b: &bench_footprint::BinarySize| {
                        b.stripped_bytes.unwrap_or(b.file_bytes) + b.extra_libs_bytes
                    };
                    let (a, b) = (with_libs(&sw.binary), with_libs(&peer.binary));
                    out.push(Ratio {
                        comparison: 5,
                        label: format!(
                            "stripped binary + shared libraries besides the C runtime vs {short}"
                        ),
                        spillway: mib(a / 1024),
                        peer: mib(b / 1024),
                        peer_name: peer.name.clone(),
                        ratio: a as f64 / b as f64,
                        range: None,
                        higher_is_better: false,
                        goal: None,
                    });
                }
                out.push(Ratio {
                    comparison: 5,
                    label: format!("peak RSS, 100 idle clients, vs {short}"),
                    spillway: mib(sw.idle.hwm_kib),
                    peer: mib(peer.idle.hwm_kib),
                    peer_name: peer.name.clone(),
                    ratio: sw.idle.hwm_kib as f64 / peer.idle.hwm_kib.max(1) as f64,
                    range: None,
                    higher_is_better: false,
                    goal: None,
                });
                out.push(Ratio {
                    comparison: 5,
                    label: format!("peak RSS under load vs {short}"),
                    spillway: mib(sw.loaded.hwm_kib),
                    peer: mib(peer.loaded.hwm_kib),
                    peer_name: peer.name.clone(),
                    ratio: sw.loaded.hwm_kib as f64 / peer.loaded.hwm_kib.max(1) as f64,
                    range: None,
                    higher_is_better: false,
                    goal: None,
                });
            }
        }
        if let Some(r) = &self.mqtt
            && let Some(peer) = &r.mosquitto
        {
            for c in r.cases.iter().filter(|c| !c.mosquitto.is_empty()) {
                let (sw, mq) = (c.spillway_rates(), c.mosquitto_rates());
                let (a, b) = (Spread::of(&sw), Spread::of(&mq));
                out.push(Ratio {
                    comparison: 6,
                    label: format!(
                        "MQTT QoS 1 fan-in messages/s, {} B (PUBACK after fdatasync vs before any disk write)",
                        c.payload
                    ),
                    spillway: si(a.median),
                    peer: si(b.median),
                    peer_name: peer.clone(),
                    ratio: a.median / b.median,
                    range: paired(&sw, &mq),
                    higher_is_better: true,
                    goal: None,
                });
                let p99 = |runs: &[bench_mqtt::Measured]| {
                    runs.iter().map(|m| m.p99_ms).collect::<Vec<f64>>()
                };
                let (sw, mq) = (p99(&c.spillway), p99(&c.mosquitto));
                let (a, b) = (Spread::of(&sw), Spread::of(&mq));
                out.push(Ratio {
                    comparison: 6,
                    label: format!("MQTT QoS 1 PUBACK p99 latency, {} B", c.payload),
                    spillway: format!("{:.2} ms", a.median),
                    peer: format!("{:.2} ms", b.median),
                    peer_name: peer.clone(),
                    ratio: a.median / b.median,
                    range: paired(&sw, &mq),
                    higher_is_better: false,
                    goal: None,
                });
            }
        }
        if let Some(k) = &self.fleet {
            let (bridge, producer) = (k.bridge_rates(), k.producer_rates());
            let (a, b) = (Spread::of(&bridge), Spread::of(&producer));
            let unverified = if k.failures().is_empty() {
                ""
            } else {
                " (FAILED its check: not valid)"
            };
            out.push(Ratio {
                comparison: 7,
                label: format!(
                    "records/s into Kafka, one bridge draining {} gateways vs plain producer{unverified}",
                    k.options.gateways
                ),
                spillway: si(a.median),
                peer: si(b.median),
                peer_name: "rdkafka producer".into(),
                ratio: a.median / b.median,
                range: paired(&bridge, &producer),
                higher_is_better: true,
                goal: Some((bench_fleet::FLEET_GOAL, f64::INFINITY)),
            });
        }
        if let Some(c) = &self.cap {
            let cap = c.options.bytes_per_sec as f64;
            let tol = f64::from(c.options.tolerance_pct) / 100.0;
            let thirds: Vec<f64> = c.thirds.iter().map(|t| t / cap).collect();
            let t = (!thirds.is_empty()).then(|| Spread::of(&thirds));
            out.push(Ratio {
                comparison: 8,
                label: format!(
                    "payload B/s under --max-bytes-per-sec {} over {:.0} s vs the cap{}",
                    c.options.bytes_per_sec,
                    c.window.as_secs_f64(),
                    if c.failures().is_empty() {
                        ""
                    } else {
                        " (FAILED its check)"
                    }
                ),
                spillway: si(c.achieved),
                peer: si(cap),
                peer_name: "the cap".into(),
                ratio: c.ratio(),
                range: t.map(|t| (t.min, t.max)),
                higher_is_better: false,
                goal: Some((1.0 - tol, 1.0 + tol)),
            });
        }
        out
    }

    /// Every check this run failed, described (empty when every figure's run did the work
    /// it claims). The benchmark program exits non-zero when there is any.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self
            .kafka
            .as_ref()
            .map_or_else(Vec::new, bench_kafka::Report::failures);
        out.extend(self.mqtt.iter().flat_map(bench_mqtt::Report::failures));
        out.extend(
            self.fleet
                .iter()
                .flat_map(bench_fleet::FleetReport::failures),
        );
        out.extend(self.cap.iter().flat_map(bench_fleet::CapReport::failures));
        out
    }

    /// Writes `BENCH.md`, `mount.svg` and `ratios.svg` into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        self.plot_mount(&dir.join("mount.svg"))
            .map_err(std::io::Error::other)?;
        let bars: Vec<Bar> = self
            .ratios()
            .iter()
            .map(|r| Bar {
                label: format!("{}. {}", r.comparison, r.label),
                ratio: r.ratio,
                range: r.range,
                higher_is_better: r.higher_is_better,
            })
            .collect();
        plot::ratio_bars(
            &dir.join("ratios.svg"),
            "spillway ÷ peer, medians (green: spillway ahead, red: behind; whisker: range)",
            &bars,
        )
        .map_err(std::io::Error::other)?;
        std::fs::write(dir.join("BENCH.md"), self.markdown())
    }

    /// The mount plot: time against image size on log-log axes.
    fn plot_mount(&self, path: &Path) -> Result<(), plot::PlotError> {
        let size = |m: &MountRow| f64::from(m.size_mib);
        let mut series = vec![
            Series {
                label: "spillway mount, 16 KiB segments".into(),
                points: self
                    .mounts
                    .iter()
                    .map(|m| (size(m), m.small_segments.ms.median))
                    .collect(),
            },
            Series {
                label: format!(
                    "spillway mount, {} segments",
                    self.options.mount_fixed_segments
                ),
                points: self
                    .mounts
                    .iter()
                    .map(|m| (size(m), m.fixed_count.ms.median))
                    .collect(),
            },
            Series {
                label: "read every byte of the image once".into(),
                points: self
                    .mounts
                    .iter()
                    .map(|m| (size(m), m.small_segments.full_scan_ms.median))
                    .collect(),
            },
        ];
        let peer: Vec<(f64, f64)> = self
            .mounts
            .iter()
            .filter_map(|m| m.peer.as_ref().map(|p| (size(m), p.peek_ms.median)))
            .collect();
        if !peer.is_empty() {
            series.push(Series {
                label: "sequential-storage cold first peek".into(),
                points: peer,
            });
        }
        plot::log_log_lines(
            path,
            "Mount (recovery) time after a power cut vs image size (medians)",
            "image size, MiB",
            "ms",
            &series,
        )
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_markdown(&mut s);
        s
    }

    fn write_markdown(&self, f: &mut String) -> std::fmt::Result {
        let o = &self.options;
        let m = &self.machine;
        writeln!(f, "# Spillway benchmarks")?;
        writeln!(f)?;
        writeln!(
            f,
            "Generated by `scripts/bench.sh` on {}; not edited by hand. Machine: {}, {} \
             logical cores, {}, kernel {}; load average {} at the start, {} at the end. \
             Whole run {:.0} s.",
            self.date,
            m.cpu,
            m.cores,
            m.os,
            m.kernel,
            m.load,
            self.load_at_end,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "Every figure was measured in this run beside its peer, repetitions interleaved, \
             and is given as min / median / max. A ratio is spillway ÷ peer on medians; its \
             range is the per-repetition ratios where the repetitions were paired \
             (comparisons 3, 4 and 6), else the widest the extremes allow (spillway min ÷ peer \
             max … spillway max ÷ peer min). Flash bytes and erases are exact counts. This \
             is a shared 2-core machine: absolute figures move from run to run, the ratios \
             much less."
        )?;
        writeln!(f)?;
        let failures = self.failures();
        if !failures.is_empty() {
            writeln!(
                f,
                "**This run FAILED its checks: the figures below are not valid.**"
            )?;
            writeln!(f)?;
            for e in &failures {
                writeln!(f, "- {e}")?;
            }
            writeln!(f)?;
        }
        writeln!(f, "## Headline ratios")?;
        writeln!(f)?;
        writeln!(f, "![spillway ÷ peer](ratios.svg)")?;
        writeln!(f)?;
        writeln!(
            f,
            "| # | figure | spillway | peer | peer value | spillway ÷ peer | range | better | goal |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|")?;
        let ratios = self.ratios();
        for r in &ratios {
            let range = r
                .range
                .map_or("exact".to_string(), |(a, b)| format!("{a:.2} … {b:.2}"));
            let goal = match r.goal {
                None => String::new(),
                Some((lo, hi)) if hi.is_infinite() => format!("≥ {lo:.2}"),
                Some((lo, hi)) => format!("{lo:.2} … {hi:.2}"),
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | **{:.2}** | {} | {} | {goal} |",
                r.comparison,
                r.label,
                r.spillway,
                r.peer_name,
                r.peer,
                r.ratio,
                range,
                if r.higher_is_better {
                    "higher"
                } else {
                    "lower"
                },
            )?;
        }
        writeln!(f)?;
        let behind: Vec<&Ratio> = ratios.iter().filter(|r| !r.favours_spillway()).collect();
        if behind.is_empty() {
            writeln!(
                f,
                "Spillway is behind its peer (or outside its goal) on none of these figures."
            )?;
        } else {
            writeln!(f, "Spillway is behind its peer, or outside its goal, on:")?;
            for r in behind {
                writeln!(f, "- {} ({}): {:.2}", r.label, r.peer_name, r.ratio)?;
            }
        }
        writeln!(f)?;

        self.write_core(f)?;
        self.write_mount(f)?;

        writeln!(
            f,
            "## 3. Gateway ingest over TCP loopback: spillway vs NATS JetStream"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "Real `spillway` and `nats-server` processes, each started fresh per run; \
             {} publishers × {} buffered / {} durable records of 100 B, {} in flight each; \
             {} repetitions, cases interleaved.",
            bench_gateway::PUBLISHERS,
            o.gateway.per_buffered,
            o.gateway.per_durable,
            bench_gateway::WINDOW,
            o.gateway.reps
        )?;
        writeln!(f)?;
        match &self.gateway {
            Some(g) => {
                // The gateway report's own machine line is the one above.
                let g = g.to_string();
                for line in g.lines().skip_while(|l| l.starts_with("machine:")) {
                    writeln!(f, "{line}")?;
                }
            }
            None => writeln!(f, "Not run.")?,
        }
        writeln!(f)?;

        writeln!(
            f,
            "## 4. Bridge drain into a Kafka-protocol broker vs a plain producer"
        )?;
        writeln!(f)?;
        match &self.kafka {
            Some(k) => {
                writeln!(
                    f,
                    "A real gateway holds {} records of 100 B; each run drains all of them with \
                     `spillway-bridge drain --once` into a fresh topic (whole process timed: \
                     start, handshake, tail scan, fetches, delivery reports, checkpoint, exit), \
                     from a fresh state file under a consumer name of its own (deleted on the \
                     gateway after the run), then a plain rdkafka producer with the bridge's \
                     settings (idempotent, acks=all, linger 5 ms) sends the same records (same \
                     key, headers, sizes) into another fresh topic, timed from its creation to \
                     the last delivery report. After each run its topic is read back to the end \
                     (not timed): a run counts only if the topic holds exactly the records \
                     sent, in order, payload and offset header each in place. Broker: tansu in \
                     memory. Filling the gateway took {:.1} s (durable publishes, not timed).",
                    k.options.records,
                    k.fill.as_secs_f64()
                )?;
                writeln!(f)?;
                writeln!(f, "{k}")?;
            }
            None => {
                writeln!(
                    f,
                    "Not run{}.",
                    if self.options.kafka.is_none() {
                        ": no broker (`SPILLWAY_KAFKA_BROKER` was not set)"
                    } else {
                        ""
                    }
                )?;
                writeln!(f)?;
            }
        }

        writeln!(
            f,
            "## 5. Footprint: spillway beside nats-server and mosquitto"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "Each server started fresh with its store in a temporary directory; {} idle \
             clients connect and complete the handshake and stay connected; then the load \
             below runs, every record acknowledged by the server and nothing consuming it. \
             Peak RSS is `VmHWM` from `/proc/PID/status`. The load's records/s are from one \
             run and are not a throughput comparison (see 3).",
            bench_footprint::IDLE_CLIENTS
        )?;
        writeln!(f)?;
        match &self.footprint {
            Some(r) => writeln!(f, "{r}")?,
            None => writeln!(f, "Not run.\n")?,
        }
        writeln!(
            f,
            "## 6. MQTT QoS 1 fan-in: spillway vs Mosquitto, and the load generator's ceiling"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{} MQTT 3.1.1 publishers with persistent sessions, {} QoS 1 messages each per \
             run, {} unacknowledged at most per publisher, driven by one load generator \
             (Rust, `mqtt-protocol-core`, one thread per connection); {} repetitions, cases \
             interleaved. Spillway: a fresh image per run, PUBACK once the record is written \
             and `fdatasync`ed; afterwards its log is read back and must hold exactly one \
             record per message, in order per publisher. Mosquitto: `persistence true`, a \
             persistent QoS 1 subscriber session that is offline during the run \
             (`max_queued_messages 0`: every message queued), PUBACK before any disk write \
             (it writes its persistence file at autosave and shutdown); afterwards the \
             subscriber connects and must receive exactly one delivery per message. Discard: \
             a server in the bench process that PUBACKs at once and keeps nothing, the \
             generator's ceiling, which must be at least {}× both servers' rates. Latency: \
             from the write of a PUBLISH to the read of its PUBACK.",
            bench_mqtt::PUBLISHERS,
            o.mqtt.per_publisher,
            bench_mqtt::WINDOW,
            o.mqtt.reps,
            bench_mqtt::CEILING_FACTOR
        )?;
        writeln!(f)?;
        match &self.mqtt {
            Some(r) => writeln!(f, "{r}")?,
            None => writeln!(f, "Not run.\n")?,
        }
        writeln!(
            f,
            "## 7. One bridge for 16 gateways into Kafka vs a plain producer"
        )?;
        writeln!(f)?;
        match &self.fleet {
            Some(k) => {
                writeln!(
                    f,
                    "{} real gateways hold {} records of 100 B each; each run drains all of \
                     them with one `spillway-bridge drain --once --gateway … ×{}` into a fresh \
                     {}-partition topic (whole process timed), from a fresh state file under a \
                     consumer name of its own (deleted on every gateway afterwards), then a \
                     plain rdkafka producer with the bridge's settings sends the same records \
                     (keyed by gateway id, same headers, gateways interleaved in runs of 1,000) \
                     into another fresh topic, timed from its creation to the last delivery \
                     report. Every topic is read back to the end (not timed): each gateway's \
                     records exactly once, in offset order, payloads in place; and the run's \
                     consumer must have committed every gateway's last offset.",
                    k.options.gateways,
                    thousands(k.options.per_gateway as f64),
                    k.options.gateways,
                    k.options.partitions
                )?;
                writeln!(f)?;
                writeln!(f, "{k}")?;
            }
            None => writeln!(f, "Not run.\n")?,
        }
        writeln!(f, "## 8. Uplink cap held over a window")?;
        writeln!(f)?;
        match &self.cap {
            Some(c) => {
                writeln!(
                    f,
                    "One gateway holds {} records of {} B, more than the warm-up, the window and \
                     10 s more take at the cap; `spillway-bridge drain --max-bytes-per-sec {}` \
                     drains them into a fresh topic. The rate is read from the bridge's counter \
                     `spillway_bridge_forwarded_bytes_total` (payload bytes delivered and \
                     checkpointed), sampled {:.0} s after its first delivery (past the \
                     limiter's one-second burst) and again {:.0} s later: bytes between the \
                     samples ÷ time between them. The counter moves one batch at a time (a \
                     batch holds about one second's worth under a cap), so a third of the \
                     window is coarser than the whole. Then SIGTERM; the topic is read back and \
                     must hold exactly the records the bridge committed, in order.",
                    thousands(c.stored as f64),
                    c.options.payload,
                    c.options.bytes_per_sec,
                    c.options.warm_up.as_secs_f64(),
                    c.options.window.as_secs_f64()
                )?;
                writeln!(f)?;
                writeln!(f, "{c}")?;
            }
            None => writeln!(f, "Not run.\n")?,
        }
        writeln!(f, "## Run")?;
        writeln!(f)?;
        writeln!(f, "| part | wall time, s |")?;
        writeln!(f, "|---|---|")?;
        for (what, d) in &self.timings {
            writeln!(f, "| {what} | {:.0} |", d.as_secs_f64())?;
        }
        writeln!(f, "| whole run | {:.0} |", self.elapsed.as_secs_f64())?;
        Ok(())
    }

    fn write_core(&self, f: &mut String) -> std::fmt::Result {
        let o = &self.options.core;
        writeln!(
            f,
            "## 1. Core: spillway-core vs sequential-storage 8.0.2 on the same simulated NOR \
             flash"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{} KiB flash, 4 KiB erase blocks, {} MiB of payload per run (the ring wraps; \
             measured after one flash capacity of warm-up), {} repetitions interleaved. \
             Spillway: 16 KiB segments, oldest dropped when full, with its 4 KiB RAM buffer \
             written as one batch when full, and with a flush after every record (the peer's \
             guarantee on every push). Peer: its best cache, oldest overwritten when full. \
             Flash in RAM: the figures are CPU work and flash operations, not flash latency. \
             Reads: every retained record, in order, 4 KiB buffer, every CRC checked.",
            o.write_flash >> 10,
            o.write_payload_total >> 20,
            o.reps
        )?;
        writeln!(f)?;
        // The core report's own tables, without its title and machine paragraph.
        let core = bench_core::Report {
            machine: self.machine.clone(),
            load_at_end: self.load_at_end.clone(),
            options: o.clone(),
            writes: self.writes.clone(),
            mounts: Vec::new(),
            peer_cold: Vec::new(),
            compression: self.compression.clone(),
            elapsed: Duration::ZERO,
        }
        .to_string();
        let mut lines = core.lines().peekable();
        while lines.peek().is_some_and(|l| !l.starts_with("## Appends")) {
            lines.next();
        }
        for line in lines.take_while(|l| !l.starts_with("## Mount")) {
            match line.strip_prefix("## ") {
                Some(h) => writeln!(f, "### {h}")?,
                None => writeln!(f, "{line}")?,
            }
        }
        Ok(())
    }

    fn write_mount(&self, f: &mut String) -> std::fmt::Result {
        let o = &self.options;
        writeln!(f, "## 2. Mount (recovery) time against image size")?;
        writeln!(f)?;
        writeln!(
            f,
            "Each image is filled to {}% of its capacity with 256 B records (the ring has \
             wrapped, its head is mid-flash) and left as a power cut leaves it; then the \
             first operation after a reboot is timed on a fresh copy of the image: \
             spillway's mount, a plain read of every byte (what any full scan costs at \
             least), the peer's first `peek` and first `push` with a fresh cache. Spillway \
             runs with 16 KiB segments (the segment count grows with the image: one header \
             read per segment) and with {} segments (the segment size grows: the head \
             segment is scanned batch by batch). {} repetitions up to 64 MiB, {} above.",
            self.options.core.mount_fill_percent,
            o.mount_fixed_segments,
            o.mount_reps,
            o.mount_reps_large,
        )?;
        writeln!(f)?;
        let fills: Vec<String> = self
            .mounts
            .iter()
            .filter_map(|m| {
                m.peer
                    .as_ref()
                    .map(|p| format!("{:.1} s at {} MiB", p.fill.as_secs_f64(), m.size_mib))
            })
            .collect();
        if self
            .mounts
            .iter()
            .any(|m| m.size_mib > o.mount_peer_max_mib)
        {
            writeln!(
                f,
                "The peer is capped at {} MiB: its images are filled one push at a time, and \
                 filling took {} in this run, growing faster than the size; the larger \
                 images would take many minutes each, beyond this run's budget. Above the \
                 cap only spillway and the full read are measured.",
                o.mount_peer_max_mib,
                fills.join(", ")
            )?;
            writeln!(f)?;
        }
        writeln!(f, "![mount time vs image size](mount.svg)")?;
        writeln!(f)?;
        writeln!(
            f,
            "| image | spillway, 16 KiB segments: mount ms | flash reads | spillway, {} \
             segments: mount ms | read every byte, ms | mount ÷ read (16 KiB) | \
             sequential-storage first peek ms | flash reads | first push ms | \
             mount ÷ peek (16 KiB) |",
            o.mount_fixed_segments
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|---|")?;
        let ms = |s: &Spread| format!("{:.3} / {:.3} / {:.3}", s.min, s.median, s.max);
        for m in &self.mounts {
            let a = &m.small_segments;
            let (peek, reads, push, ratio) = match &m.peer {
                Some(p) => (
                    ms(&p.peek_ms),
                    p.peek_reads.to_string(),
                    ms(&p.push_ms),
                    format!("{:.3}", a.ms.median / p.peek_ms.median),
                ),
                None => ("not run (cap)".into(), "–".into(), "–".into(), "–".into()),
            };
            writeln!(
                f,
                "| {} MiB | {} | {} | {} | {} | {:.4} | {} | {} | {} | {} |",
                m.size_mib,
                ms(&a.ms),
                a.reads,
                ms(&m.fixed_count.ms),
                ms(&a.full_scan_ms),
                a.ms.median / a.full_scan_ms.median,
                peek,
                reads,
                push,
                ratio
            )?;
        }
        writeln!(f)?;
        Ok(())
    }
}

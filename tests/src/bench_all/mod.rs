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
//!    ([`bench_fleet::run_cap`]);
//! 9. bridge drain into the file sink against a plain writer of the same lines with one
//!    fsync per rotation ([`bench_file_sink`]).
//!
//! A ratio's range is the widest the extremes allow (spillway's min ÷ the peer's max to
//! spillway's max ÷ the peer's min), unless the repetitions were paired, then it is the
//! range of the per-pair ratios.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::bench_core::{self, Machine, PeerCold, SpillwayMount, WriteRun, machine};
use crate::bench_file_sink;
use crate::bench_fleet;
use crate::bench_footprint;
use crate::bench_gateway;
use crate::bench_kafka;
use crate::bench_mqtt;

mod markdown;
mod ratios;

pub use ratios::{KAFKA_GOAL, Ratio};

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
    /// Comparison 9.
    pub file_sink: bench_file_sink::Options,
    /// Which comparisons run (index 0 is comparison 1); all of them normally.
    pub parts: [bool; 9],
}

impl Options {
    /// Runs only the comparisons numbered in `only` (1–9).
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
            file_sink: bench_file_sink::default_options(),
            parts: [true; 9],
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
            file_sink: bench_file_sink::Options {
                records: 500,
                runs: 1,
            },
            parts: [true; 9],
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
    /// Comparison 1, in `options.core.write_cases` order,
    /// [`Engine::ALL`](bench_core::Engine::ALL) inside.
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
    /// Comparison 9 (`None` if not run).
    pub file_sink: Option<bench_file_sink::Report>,
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

    let t = Instant::now();
    let file_sink = opts.parts[8].then(|| {
        bench_file_sink::run(&opts.file_sink, |w| progress(&format!("9. file sink: {w}")))
    });
    timings.push(("9. bridge drain into files", t.elapsed()));

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
        file_sink,
        timings,
        elapsed: begun.elapsed(),
    }
}

//! The headline ratios of a run ([`AllReport::ratios`]: spillway ÷ peer on medians, with
//! their ranges and goals) and the checks it failed ([`AllReport::failures`]).

use super::AllReport;
use crate::bench_core::{Engine, Spread};
use crate::bench_file_sink;
use crate::bench_fleet;
use crate::bench_footprint;
use crate::bench_kafka;
use crate::bench_mqtt;
use crate::figures::si;
use crate::sides::{Measured, Sides};

/// A headline ratio.
#[derive(Debug, Clone)]
pub struct Ratio {
    /// Comparison number (1–9).
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
    /// A ratio of two exact figures (no range), shown as `spillway` and `peer`.
    fn exact(
        (comparison, label, peer_name): (u8, String, &str),
        (spillway, peer): (String, String),
        ratio: f64,
        higher_is_better: bool,
    ) -> Ratio {
        Ratio {
            comparison,
            label,
            spillway,
            peer,
            peer_name: peer_name.to_string(),
            ratio,
            range: None,
            higher_is_better,
            goal: None,
        }
    }

    /// The ratio of the medians of two spreads measured apart (range: [`bounds`]), shown
    /// with `show`.
    fn of_spreads(
        what: (u8, String, &str),
        (a, b): (&Spread, &Spread),
        show: impl Fn(f64) -> String,
        higher_is_better: bool,
    ) -> Ratio {
        Ratio {
            range: Some(bounds(a, b)),
            ..Ratio::exact(
                what,
                (show(a.median), show(b.median)),
                a.median / b.median,
                higher_is_better,
            )
        }
    }

    /// The ratio of the medians of paired samples, run `i` of each side back to back
    /// (range: [`paired`]), shown with `show`.
    fn of_pairs(
        what: (u8, String, &str),
        (a, b): (&[f64], &[f64]),
        show: impl Fn(f64) -> String,
        higher_is_better: bool,
    ) -> Ratio {
        Ratio {
            range: paired(a, b),
            ..Ratio::of_spreads(
                what,
                (&Spread::of(a), &Spread::of(b)),
                show,
                higher_is_better,
            )
        }
    }

    /// The same ratio held to `(low, high)`.
    fn goal(self, low: f64, high: f64) -> Ratio {
        Ratio {
            goal: Some((low, high)),
            ..self
        }
    }

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

/// The headline ratio of a comparison of paired runs: Spillway's records/s against the
/// peer's (`peer_name`), held to at least `goal`; `label` says so when a run failed its
/// check (`verified` false).
fn sides_ratio<R: Measured>(
    (comparison, label, peer_name): (u8, String, &str),
    sides: &Sides<R>,
    verified: bool,
    goal: f64,
) -> Ratio {
    let unverified = if verified {
        ""
    } else {
        " (FAILED its check: not valid)"
    };
    Ratio::of_pairs(
        (comparison, format!("{label}{unverified}"), peer_name),
        (&sides.ours_rates(), &sides.peer_rates()),
        si,
        true,
    )
    .goal(goal, f64::INFINITY)
}

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
                out.push(Ratio::of_spreads(
                    (1, format!("appends/s, {case}, {who}"), peer_name),
                    (&r.appends_per_s, &peer.appends_per_s),
                    si,
                    true,
                ));
                let (a, b) = (
                    r.programmed_per_payload_byte(),
                    peer.programmed_per_payload_byte(),
                );
                out.push(Ratio::exact(
                    (
                        1,
                        format!("flash bytes per payload byte, {case}, {who}"),
                        peer_name,
                    ),
                    (format!("{a:.3}"), format!("{b:.3}")),
                    a / b,
                    false,
                ));
                let (a, b) = (r.erases_per_mib(), peer.erases_per_mib());
                out.push(Ratio::exact(
                    (1, format!("erases per MiB, {case}, {who}"), peer_name),
                    (format!("{a:.1}"), format!("{b:.1}")),
                    a / b,
                    false,
                ));
            }
            // Reads do not depend on how the records were flushed: the buffered run.
            if let Some(r) = group.iter().find(|r| r.engine == Engine::Spillway) {
                out.push(Ratio::of_spreads(
                    (1, format!("reads/s, {case}"), peer_name),
                    (&r.reads_per_s, &peer.reads_per_s),
                    si,
                    true,
                ));
            }
        }
        let ms = |x: f64| format!("{x:.3} ms");
        if let Some(m) = self.mounts.iter().rev().find(|m| m.peer.is_some())
            && let Some(p) = &m.peer
        {
            out.push(Ratio::of_spreads(
                (
                    2,
                    format!(
                        "mount ms, {} MiB (16 KiB segments) vs cold first peek",
                        m.size_mib
                    ),
                    peer_name,
                ),
                (&m.small_segments.ms, &p.peek_ms),
                ms,
                false,
            ));
        }
        if let Some(m) = self.mounts.last() {
            for (what, s) in [
                ("16 KiB segments", &m.small_segments),
                (
                    &*format!("{} segments", self.options.mount_fixed_segments),
                    &m.fixed_count,
                ),
            ] {
                out.push(Ratio::of_spreads(
                    (
                        2,
                        format!("mount ms, {} MiB ({what}) vs reading the image", m.size_mib),
                        "full scan",
                    ),
                    (&s.ms, &s.full_scan_ms),
                    ms,
                    false,
                ));
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
            out.push(Ratio::of_pairs(
                (
                    3,
                    format!("TCP ingest records/s, 100 B, {what}"),
                    "NATS JetStream",
                ),
                (&sw, &peer),
                si,
                true,
            ));
        }
        if let Some(k) = &self.kafka {
            out.push(sides_ratio(
                (
                    4,
                    "records/s into Kafka, bridge drain vs plain producer".into(),
                    "rdkafka producer",
                ),
                &k.sides,
                k.failures().is_empty(),
                KAFKA_GOAL,
            ));
        }
        let servers = self
            .footprint
            .as_ref()
            .map_or(&[][..], |f| f.servers.as_slice());
        if let Some(sw) = servers.first() {
            for peer in &servers[1..] {
                let short = peer.name.split_whitespace().next().unwrap_or("peer");
                let sizes = |label: String, a: u64, b: u64, ratio: f64| {
                    Ratio::exact((5, label, &peer.name), (mib(a), mib(b)), ratio, false)
                };
                if let (Some(a), Some(b)) = (sw.binary.stripped_bytes, peer.binary.stripped_bytes) {
                    out.push(sizes(
                        format!("stripped binary size vs {short}"),
                        a / 1024,
                        b / 1024,
                        a as f64 / b as f64,
                    ));
                }
                if !peer.binary.shared_libs.is_empty() {
                    let with_libs = |b: &bench_footprint::BinarySize| {
                        b.stripped_bytes.unwrap_or(b.file_bytes) + b.extra_libs_bytes
                    };
                    let (a, b) = (with_libs(&sw.binary), with_libs(&peer.binary));
                    out.push(sizes(
                        format!(
                            "stripped binary + shared libraries besides the C runtime vs {short}"
                        ),
                        a / 1024,
                        b / 1024,
                        a as f64 / b as f64,
                    ));
                }
                for (label, a, b) in [
                    (
                        format!("peak RSS, 100 idle clients, vs {short}"),
                        sw.idle.hwm_kib,
                        peer.idle.hwm_kib,
                    ),
                    (
                        format!("peak RSS under load vs {short}"),
                        sw.loaded.hwm_kib,
                        peer.loaded.hwm_kib,
                    ),
                ] {
                    out.push(sizes(label, a, b, a as f64 / b.max(1) as f64));
                }
            }
        }
        if let Some(r) = &self.mqtt
            && let Some(peer) = &r.mosquitto
        {
            for c in r.cases.iter().filter(|c| !c.mosquitto.is_empty()) {
                out.push(Ratio::of_pairs(
                    (
                        6,
                        format!(
                            "MQTT QoS 1 fan-in messages/s, {} B (PUBACK after fdatasync vs before any disk write)",
                            c.payload
                        ),
                        peer,
                    ),
                    (&c.spillway_rates(), &c.mosquitto_rates()),
                    si,
                    true,
                ));
                let p99 = |runs: &[bench_mqtt::Measured]| {
                    runs.iter().map(|m| m.p99_ms).collect::<Vec<f64>>()
                };
                out.push(Ratio::of_pairs(
                    (
                        6,
                        format!("MQTT QoS 1 PUBACK p99 latency, {} B", c.payload),
                        peer,
                    ),
                    (&p99(&c.spillway), &p99(&c.mosquitto)),
                    |x| format!("{x:.2} ms"),
                    false,
                ));
            }
        }
        if let Some(k) = &self.fleet {
            out.push(sides_ratio(
                (
                    7,
                    format!(
                        "records/s into Kafka, one bridge draining {} gateways vs plain producer",
                        k.options.gateways
                    ),
                    "rdkafka producer",
                ),
                &k.sides,
                k.failures().is_empty(),
                bench_fleet::FLEET_GOAL,
            ));
        }
        if let Some(c) = &self.cap {
            let cap = c.options.bytes_per_sec as f64;
            let tol = f64::from(c.options.tolerance_pct) / 100.0;
            let thirds: Vec<f64> = c.thirds.iter().map(|t| t / cap).collect();
            let t = (!thirds.is_empty()).then(|| Spread::of(&thirds));
            let failed = if c.failures().is_empty() {
                ""
            } else {
                " (FAILED its check)"
            };
            let label = format!(
                "payload B/s under --max-bytes-per-sec {} over {:.0} s vs the cap{failed}",
                c.options.bytes_per_sec,
                c.window.as_secs_f64(),
            );
            out.push(
                Ratio {
                    range: t.map(|t| (t.min, t.max)),
                    ..Ratio::exact(
                        (8, label, "the cap"),
                        (si(c.achieved), si(cap)),
                        c.ratio(),
                        false,
                    )
                }
                .goal(1.0 - tol, 1.0 + tol),
            );
        }
        if let Some(k) = &self.file_sink {
            out.push(sides_ratio(
                (
                    9,
                    "records/s into files, bridge drain vs plain writer with one fsync per rotation"
                        .into(),
                    "plain writer",
                ),
                &k.sides,
                k.failures().is_empty(),
                bench_file_sink::GOAL,
            ));
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
        out.extend(
            self.file_sink
                .iter()
                .flat_map(bench_file_sink::Report::failures),
        );
        out
    }
}

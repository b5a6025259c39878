//! MQTT QoS 1 fan-in: the real `spillway` binary's `mqtt://` listener beside Mosquitto 2.0
//! on the same machine in the same run, both driven by one load generator, whose own
//! ceiling is measured against a discard server. [`run`] measures; its [`Report`] prints as
//! Markdown.
//!
//! ## What runs
//! Every run: [`PUBLISHERS`] MQTT 3.1.1 connections, each with a persistent session (clean
//! session 0) and its own thread, each publishing [`Options::per_publisher`] QoS 1 messages
//! of one payload size to [`TOPIC`], up to [`WINDOW`] unacknowledged (pipelined: new
//! PUBLISHes are written as PUBACKs free their places, in one write per batch). The clock
//! runs from the first PUBLISH until every publisher has all its PUBACKs; every connection
//! is made before it starts. A message's PUBACK latency is the time from the write of its
//! PUBLISH to the read that brought its PUBACK (so it includes the wait behind the earlier
//! messages of its window). Each payload starts with the publisher's number and the
//! message's number (two `u32`, little-endian), so every message is told apart when the
//! run is checked.
//!
//! The load generator ([`mqtt_load`](crate::mqtt_load)) encodes and decodes with
//! `mqtt-protocol-core` (the codec of the gateway's listener) over blocking std TCP sockets.
//!
//! - **discard**: a server in this process that answers every QoS 1 PUBLISH with a PUBACK
//!   and keeps nothing (the same codec, one thread per connection). Its rate is the load
//!   generator's ceiling on this machine; it must be at least [`CEILING_FACTOR`] times both
//!   servers' rates, or the run fails: the figures would measure the generator.
//! - **spillway**: `spillway run` with an `mqtt://` listener at its default acknowledgement
//!   for QoS 1: PUBACK once the record is durable, that is written to the image and
//!   `fdatasync`ed (group commit). Checked afterwards by reading the log back over a
//!   framed TCP listener: exactly one record per message, in order per publisher, topic and
//!   payload as sent, nothing left only in RAM.
//! - **mosquitto**: Mosquitto 2.0 with `persistence true` and a persistent QoS 1 subscriber
//!   session that subscribed to the topic and disconnected before the run, with
//!   `max_queued_messages 0` (no limit), so that it queues every message. Mosquitto sends
//!   the PUBACK once the message is queued in memory: it writes its persistence file at
//!   `autosave_interval` and at shutdown, not per message. Checked afterwards by
//!   connecting that subscriber (not timed) and counting what it receives, PUBACKing each:
//!   exactly one delivery per message.
//!
//! The three cases run interleaved within each repetition, 16-byte and 100-byte payloads
//! each; the tables give min / median / max over the repetitions and spillway ÷ mosquitto on
//! medians (the goal: at least [`GOAL`]).

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mqtt_protocol_core::mqtt::packet::GenericPacket;

use crate::bench_core::Spread;
use crate::bench_gateway::spillway_args_with;
use crate::client::{Wait, connect, read_log};
use crate::figures::{table_head, thousands};
use crate::gateway::{GatewayProcess, free_port};
use crate::mosquitto::{Mosquitto, Persistence, mosquitto_version};
pub use crate::mqtt_load::Measured;
use crate::mqtt_load::{Discard, MqttConn, fan_in, parse_payload, payload};

/// Publishers, each with its own connection, thread and persistent session.
pub const PUBLISHERS: usize = 50;
/// Unacknowledged QoS 1 publishes per publisher (below the gateway's receive maximum).
pub const WINDOW: usize = 16;
/// Payload sizes, bytes.
pub const PAYLOADS: [usize; 2] = [16, 100];
/// The least load-generator ceiling ÷ server rate accepted.
pub const CEILING_FACTOR: f64 = 3.0;
/// The spillway ÷ mosquitto rate aimed for.
pub const GOAL: f64 = 1.0;
/// Topic published to.
pub const TOPIC: &str = "bench/fanin";
/// Client id of mosquitto's offline subscriber.
const SUBSCRIBER: &str = "bench-away";

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Messages per publisher in every run.
    pub per_publisher: usize,
    /// Repetitions of every case.
    pub reps: usize,
    /// Fail the run when the generator's ceiling is under [`CEILING_FACTOR`] × a server's
    /// rate (off for the smoke run, whose runs are too short to say).
    pub check_ceiling: bool,
    /// The mosquitto binary; `None` skips the peer.
    pub mosquitto_bin: Option<PathBuf>,
}

impl Options {
    /// The benchmark's run: 4,000 messages per publisher (200,000 per run), 3 repetitions.
    pub fn full(mosquitto_bin: Option<PathBuf>) -> Options {
        Options {
            per_publisher: 4_000,
            reps: 3,
            check_ceiling: true,
            mosquitto_bin,
        }
    }

    /// A run of seconds that exercises every case (for `cargo test`).
    pub fn smoke(mosquitto_bin: Option<PathBuf>) -> Options {
        Options {
            per_publisher: 40,
            reps: 1,
            check_ceiling: false,
            mosquitto_bin,
        }
    }

    fn messages(&self) -> usize {
        PUBLISHERS * self.per_publisher
    }
}

/// The runs of one payload size.
#[derive(Debug, Clone, Default)]
pub struct Case {
    /// Payload bytes.
    pub payload: usize,
    /// Against the discard server, one per repetition.
    pub discard: Vec<Measured>,
    /// Against spillway, one per repetition.
    pub spillway: Vec<Measured>,
    /// Against mosquitto, one per repetition (empty when skipped).
    pub mosquitto: Vec<Measured>,
}

fn rates(runs: &[Measured]) -> Vec<f64> {
    runs.iter().map(|m| m.msgs_per_s).collect()
}

impl Case {
    /// Spillway's rates, by repetition.
    pub fn spillway_rates(&self) -> Vec<f64> {
        rates(&self.spillway)
    }

    /// Mosquitto's rates, by repetition.
    pub fn mosquitto_rates(&self) -> Vec<f64> {
        rates(&self.mosquitto)
    }

    /// Median generator ceiling ÷ the faster server's median rate.
    pub fn headroom(&self) -> f64 {
        let med = |r: &[Measured]| {
            if r.is_empty() {
                0.0
            } else {
                Spread::of(&rates(r)).median
            }
        };
        med(&self.discard) / med(&self.spillway).max(med(&self.mosquitto))
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// What ran.
    pub options: Options,
    /// Mosquitto's name and version (`None`: skipped).
    pub mosquitto: Option<String>,
    /// One per payload size of [`PAYLOADS`].
    pub cases: Vec<Case>,
}

impl Report {
    /// The checks this run failed: a generator ceiling under [`CEILING_FACTOR`] × a
    /// server's rate (when [`Options::check_ceiling`]). Missing messages panic at once.
    pub fn failures(&self) -> Vec<String> {
        if !self.options.check_ceiling {
            return Vec::new();
        }
        self.cases
            .iter()
            .filter(|c| c.headroom() < CEILING_FACTOR)
            .map(|c| {
                format!(
                    "6. MQTT fan-in, {} B: the load generator's ceiling is only {:.2}× the faster \
                     server's rate (at least {CEILING_FACTOR}× needed): the figures measure the \
                     generator, not the servers",
                    c.payload,
                    c.headroom()
                )
            })
            .collect()
    }
}

fn discard_run(opts: &Options, len: usize) -> Measured {
    let d = Discard::start().expect("start the discard server");
    let m = fan_in(&d.addr, None, opts.per_publisher, len);
    assert_eq!(
        d.received.load(Ordering::Relaxed),
        opts.messages() as u64,
        "the discard server received a different number of PUBLISHes than were acknowledged"
    );
    m
}

/// One spillway run on a fresh 64 MiB image: an `mqtt://` listener (QoS 1 PUBACK once
/// durable) and a framed `tcp://` one to read the log back.
///
/// # Panics
/// If the gateway does not start, refuses a publish, or its log does not hold exactly one
/// record per message, in order per publisher, written and synced.
fn spillway_run(opts: &Options, len: usize) -> Measured {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mqtt, tcp) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let args = spillway_args_with(
        dir.path(),
        "reject-new",
        &[format!("mqtt://{mqtt}"), format!("tcp://{tcp}")],
    );
    let gateway = GatewayProcess::start(&args, 2);
    let m = fan_in(&mqtt, Some(gateway.pid()), opts.per_publisher, len);
    let mut c = connect(&tcp).expect("connect to spillway's framed listener");
    let stats = c.stats().wait().expect("spillway stats");
    assert!(
        stats.buffered_records == 0 && stats.syncs > 0,
        "spillway sent PUBACKs for QoS 1 records it had not written and synced: {stats:?}"
    );
    let records = read_log(&mut c, 0).expect("read spillway's log back");
    let mut next = [0u32; PUBLISHERS];
    for r in &records {
        let (p, seq) = parse_payload(&r.payload).unwrap_or((u32::MAX, 0));
        assert!(
            r.topic == TOPIC
                && r.payload == payload(p, seq, len)
                && next.get(p as usize) == Some(&seq),
            "spillway's log holds an unexpected record at offset {} (topic {:?}, {} B, publisher \
             {p}, message {seq}; expected messages in order per publisher)",
            r.offset,
            r.topic,
            r.payload.len()
        );
        next[p as usize] += 1;
    }
    assert_eq!(
        records.len(),
        opts.messages(),
        "spillway's log holds {} records for {} acknowledged messages",
        records.len(),
        opts.messages()
    );
    m
}

/// One mosquitto run on a fresh server.
///
/// # Panics
/// If mosquitto does not start, refuses a publish, or its offline subscriber does not
/// receive exactly one delivery of every message.
fn mosquitto_run(bin: &Path, opts: &Options, len: usize) -> Measured {
    let server = Mosquitto::start(bin, Persistence::File).expect("start mosquitto");
    let mut sub = MqttConn::connect(&server.addr, SUBSCRIBER, false).expect("subscriber");
    sub.subscribe(TOPIC).expect("subscribe");
    sub.disconnect().expect("disconnect the subscriber");
    let m = fan_in(
        &server.addr,
        Some(server.child.id()),
        opts.per_publisher,
        len,
    );
    // Not timed: the subscriber comes back and takes what was queued for it.
    let mut sub = MqttConn::connect(&server.addr, SUBSCRIBER, false).expect("subscriber back");
    sub.s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut seen: HashSet<(u32, u32)> = HashSet::with_capacity(opts.messages());
    let (mut deliveries, mut bad) = (0usize, None);
    while seen.len() < opts.messages() {
        let r = sub.read_packets(|p| {
            if let GenericPacket::V3_1_1Publish(p) = p {
                deliveries += 1;
                let body = p.payload().as_slice();
                match parse_payload(body) {
                    Some((a, b)) if body == payload(a, b, len).as_slice() => {
                        seen.insert((a, b));
                    }
                    _ => bad = Some(body.len()),
                }
            }
        });
        if let Err(e) = r {
            let mut missing: Vec<(u32, u32)> = (0..PUBLISHERS as u32)
                .flat_map(|p| (0..opts.per_publisher as u32).map(move |q| (p, q)))
                .filter(|k| !seen.contains(k))
                .collect();
            missing.truncate(25);
            eprintln!("missing (publisher, message): {missing:?}");
            eprintln!(
                "{}",
                server
                    .log()
                    .lines()
                    .filter(|l| l.contains("bench-away") || l.contains("rror") || l.contains("arn"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            panic!(
                "mosquitto's offline subscriber received {} of {} messages ({deliveries} \
                 deliveries, a payload not sent: {bad:?}) before: {e}; its log ends:\n{}",
                seen.len(),
                opts.messages(),
                server.log_tail()
            );
        }
    }
    // Anything more (a duplicate) would arrive at once.
    sub.s
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    while sub
        .read_packets(|p| {
            if matches!(p, GenericPacket::V3_1_1Publish(_)) {
                deliveries += 1;
            }
        })
        .is_ok()
    {}
    assert!(
        bad.is_none(),
        "mosquitto delivered a payload not sent: {bad:?} B"
    );
    assert_eq!(
        deliveries,
        opts.messages(),
        "mosquitto's offline subscriber received {deliveries} deliveries for {} messages",
        opts.messages()
    );
    m
}

/// Runs every case of `opts`, repetitions interleaved; `progress` is told what starts.
///
/// # Panics
/// If a server does not start, or a run did not store or deliver every acknowledged
/// message exactly once.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Report {
    let mut cases: Vec<Case> = PAYLOADS
        .iter()
        .map(|&payload| Case {
            payload,
            ..Case::default()
        })
        .collect();
    let pause = || {
        let _ = Command::new("sync").status();
        std::thread::sleep(Duration::from_millis(200));
    };
    for rep in 0..opts.reps {
        for case in cases.iter_mut() {
            let len = case.payload;
            let what = |who: &str| {
                format!(
                    "mqtt fan-in: {who}, {len} B, repetition {}/{}",
                    rep + 1,
                    opts.reps
                )
            };
            progress(&what("discard server"));
            case.discard.push(discard_run(opts, len));
            pause();
            progress(&what("spillway"));
            case.spillway.push(spillway_run(opts, len));
            pause();
            if let Some(bin) = &opts.mosquitto_bin {
                progress(&what("mosquitto"));
                case.mosquitto.push(mosquitto_run(bin, opts, len));
                pause();
            }
        }
    }
    Report {
        options: opts.clone(),
        mosquitto: opts.mosquitto_bin.as_deref().map(mosquitto_version),
        cases,
    }
}

fn spread(runs: &[Measured], f: impl Fn(&Measured) -> f64, fmt1: fn(f64) -> String) -> String {
    if runs.is_empty() {
        return "–".into();
    }
    let v: Vec<f64> = runs.iter().map(f).collect();
    Spread::of(&v).show(fmt1)
}

fn ms(x: f64) -> String {
    format!("{x:.2}")
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peer = self.mosquitto.as_deref().unwrap_or("mosquitto");
        table_head(
            f,
            "| payload | server | acknowledges QoS 1 | messages/s | PUBACK p50, ms | PUBACK p99, ms | \
             server CPU, µs/message |",
        )?;
        for c in &self.cases {
            let mut rows = vec![
                (
                    "load generator ceiling (discard server)",
                    "at once, keeps nothing",
                    &c.discard,
                ),
                (
                    "spillway",
                    "after the record is written and fdatasync'ed",
                    &c.spillway,
                ),
            ];
            if !c.mosquitto.is_empty() {
                rows.push((
                    peer,
                    "before its disk write (queued in memory; persistence file at autosave and \
                     shutdown)",
                    &c.mosquitto,
                ));
            }
            for (who, when, runs) in rows {
                writeln!(
                    f,
                    "| {} B | {who} | {when} | {} | {} | {} | {} |",
                    c.payload,
                    spread(runs, |m| m.msgs_per_s, thousands),
                    spread(runs, |m| m.p50_ms, ms),
                    spread(runs, |m| m.p99_ms, ms),
                    if runs.iter().all(|m| m.server_cpu_us == 0.0) {
                        "–".to_string()
                    } else {
                        spread(runs, |m| m.server_cpu_us, |x| format!("{x:.1}"))
                    },
                )?;
            }
        }
        writeln!(f)?;
        table_head(
            f,
            &format!(
                "| payload | spillway ÷ {peer}, messages/s (goal ≥ {GOAL:.1}) | p50 latency, spillway ÷ \
             {peer} | p99 latency, spillway ÷ {peer} | generator ceiling ÷ faster server (≥ \
             {CEILING_FACTOR:.0} needed) |"
            ),
        )?;
        for c in &self.cases {
            let med = |r: &[Measured], g: fn(&Measured) -> f64| {
                Spread::of(&r.iter().map(g).collect::<Vec<_>>()).median
            };
            let (rate, p50, p99) = if c.mosquitto.is_empty() {
                ("not run".to_string(), "–".to_string(), "–".to_string())
            } else {
                let r = med(&c.spillway, |m| m.msgs_per_s) / med(&c.mosquitto, |m| m.msgs_per_s);
                (
                    format!(
                        "**{r:.2}** ({})",
                        if r >= GOAL {
                            "goal met"
                        } else {
                            "goal NOT met"
                        }
                    ),
                    format!(
                        "{:.2}",
                        med(&c.spillway, |m| m.p50_ms) / med(&c.mosquitto, |m| m.p50_ms)
                    ),
                    format!(
                        "{:.2}",
                        med(&c.spillway, |m| m.p99_ms) / med(&c.mosquitto, |m| m.p99_ms)
                    ),
                )
            };
            writeln!(
                f,
                "| {} B | {rate} | {p50} | {p99} | {:.2} |",
                c.payload,
                c.headroom()
            )?;
        }
        if self.mosquitto.is_none() {
            writeln!(
                f,
                "\nSkipped: mosquitto: not installed (apt package mosquitto)"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_against_the_discard_server_counts_every_message() {
        let opts = Options::smoke(None);
        let m = discard_run(&opts, 16);
        assert!(m.msgs_per_s > 0.0 && m.p99_ms >= m.p50_ms, "{m:?}");
    }
}

//! The plain rdkafka producer the Kafka comparisons time against the bridge: the bridge's
//! producer settings, its key and headers on every record ([`send_like_the_bridge`]), and a
//! timed run that waits for every delivery report ([`timed_producer_run`]).

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};

use super::{Run, Verified};

/// Counts delivery reports.
#[derive(Default)]
pub(crate) struct Counting {
    pub(crate) ok: std::sync::atomic::AtomicU64,
    pub(crate) failed: std::sync::atomic::AtomicU64,
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

/// The plain producer the Kafka comparisons time: idempotent, `acks=all`, 5 requests in
/// flight, `linger.ms=5`, a queue of 100,000 messages, counting its delivery reports.
pub(crate) fn plain_producer(bootstrap: &str) -> BaseProducer<Counting> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .create_with_context(Counting::default())
        .expect("producer")
}

/// One record as the bridge sends it, for the plain producer.
pub(crate) struct BridgeLike<'a> {
    /// Kafka topic.
    pub(crate) kafka_topic: &'a str,
    /// Gateway id: the key and the `spillway-gateway` header.
    pub(crate) gateway: &'a str,
    /// Log id, 32 hex digits.
    pub(crate) log_hex: &'a str,
    /// The Spillway topic (`spillway-topic`).
    pub(crate) topic: &'a str,
    /// Log offset (`spillway-offset`).
    pub(crate) offset: usize,
    /// Record timestamp, µs since the Unix epoch (`spillway-timestamp-us`; the Kafka
    /// timestamp in ms).
    pub(crate) timestamp_us: u64,
    /// The payload.
    pub(crate) payload: &'a [u8],
}

/// Sends `r` with the key and headers the bridge gives it, polling while the producer's
/// queue is full.
///
/// # Panics
/// On a produce error other than a full queue.
pub(crate) fn send_like_the_bridge(p: &BaseProducer<Counting>, r: &BridgeLike<'_>) {
    let off = r.offset.to_string();
    let ts = r.timestamp_us.to_string();
    let mut rec = BaseRecord::to(r.kafka_topic)
        .key(r.gateway)
        .payload(r.payload)
        .timestamp(i64::try_from(r.timestamp_us / 1000).unwrap_or(0))
        .headers(
            OwnedHeaders::new_with_capacity(5)
                .insert(Header {
                    key: "spillway-gateway",
                    value: Some(r.gateway),
                })
                .insert(Header {
                    key: "spillway-log-id",
                    value: Some(r.log_hex),
                })
                .insert(Header {
                    key: "spillway-offset",
                    value: Some(off.as_str()),
                })
                .insert(Header {
                    key: "spillway-topic",
                    value: Some(r.topic),
                })
                .insert(Header {
                    key: "spillway-timestamp-us",
                    value: Some(ts.as_str()),
                }),
        );
    loop {
        match p.send(rec) {
            Ok(()) => break,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                p.poll(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("produce: {e}"),
        }
    }
    p.poll(Duration::ZERO);
}

/// Flushes `p` and waits until it has a delivery report for each of `n` records; returns
/// how many failed.
///
/// # Panics
/// If the flush fails (2 minutes).
fn flush_all(p: &BaseProducer<Counting>, n: u64) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    p.flush(Duration::from_secs(120)).expect("flush");
    while p.context().ok.load(Relaxed) + p.context().failed.load(Relaxed) < n {
        p.poll(Duration::from_millis(10));
    }
    p.context().failed.load(Relaxed)
}

/// A timed run of the plain producer ([`plain_producer`]): `send` gives it the `n` records
/// of the run, timed from the producer's creation to the last delivery report; then
/// `verify` reads the run's topic back (not timed). A delivery failure fails the run.
pub(crate) fn timed_producer_run(
    bootstrap: &str,
    n: u64,
    send: impl FnOnce(&BaseProducer<Counting>),
    verify: impl FnOnce() -> Verified,
) -> Run {
    let t = Instant::now();
    let p = plain_producer(bootstrap);
    send(&p);
    let failed = flush_all(&p, n);
    let secs = t.elapsed().as_secs_f64();
    drop(p);
    let mut verified = verify();
    if failed > 0 {
        verified.problem = Some(format!("{failed} delivery failures"));
    }
    Run { secs, verified }
}

//! The `kafka://HOST:PORT/TOPIC` sink, on librdkafka (the `rdkafka` crate, built from
//! source and linked statically), driven from smol through [`SmolRuntime`].
//!
//! - Target: one Kafka topic for every record, or, with `{topic}` in the URI's topic
//!   (`kafka://HOST:PORT/{topic}`), a Kafka topic per Spillway topic, characters Kafka
//!   refuses replaced ([`super::kafka_topic`] has the rule).
//! - Producer settings: `enable.idempotence=true` (no duplicates or reordering from the
//!   producer's own retries), `acks=all`, `max.in.flight.requests.per.connection=5`
//!   (ordering kept by idempotence), `message.timeout.ms` = the delivery timeout (default
//!   5 min: librdkafka resends on its own for that long rather than dropping). The
//!   properties passed through with `-X` / `[kafka]` ([`crate::sink::properties`]) are set
//!   after these, on the producer and on the tail-scan consumer; the four the guarantee
//!   depends on are refused before they get here.
//! - Each record: key = `<gateway id>/<topic>` (so one gateway's topic stays in one
//!   partition, in order); value = the payload bytes; Kafka timestamp = the record's
//!   timestamp in ms; headers `spillway-gateway`, `spillway-log-id` (32 hex digits),
//!   `spillway-offset` (decimal), `spillway-topic`, `spillway-timestamp-us` (decimal), so
//!   downstream can deduplicate by (log id, offset).
//! - [`KafkaSink::submit`] enqueues a batch and returns a [`Pending`] that settles when the
//!   delivery report of every record arrived: the checkpoint advances on delivery reports,
//!   never on enqueue. The drain keeps several batches submitted at once (see
//!   [`crate::drain`], "Pipelining"). When a report is an error, the records before it (in
//!   offset order) count as delivered and the drain resends from the first one that was
//!   not. [`KafkaSink::deliver`] is submit and settle in one.
//! - [`KafkaSink::scan_tail`] reads the last records of every partition of a topic (for
//!   the effectively-once resume, see [`crate::drain`]): it asks each partition for its
//!   watermarks, `assign`s a consumer (no consumer group, nothing committed) at
//!   `high − window`, reads up to the high watermark, and keeps the records whose
//!   `spillway-log-id` header is the log being drained. With a topic per Spillway topic,
//!   the resume scans the Kafka topic of every Spillway topic among the gateway's records
//!   after the checkpoint (`drain::kafka_tail`). The scan itself is in `tail.rs`.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::util::AsyncRuntime;

use super::kafka_topic::KafkaTopic;
use super::properties::KafkaProperties;
use super::{DeliverError, KafkaKey, SinkError, Source};
use crate::client::{OwnedRecord, log_id_hex};

mod tail;
use tail::scan_tail_blocking;
pub use tail::{TailRecord, TailScan, key_partition};

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

/// The producer type used by the sink.
pub type SmolProducer = FutureProducer<DefaultClientContext, SmolRuntime>;

/// Header names written on every message.
pub mod headers {
    /// Gateway id.
    pub const GATEWAY: &str = "spillway-gateway";
    /// Log id, 32 hex digits.
    pub const LOG_ID: &str = "spillway-log-id";
    /// Offset in the gateway's log, decimal.
    pub const OFFSET: &str = "spillway-offset";
    /// The record's topic on the gateway.
    pub const TOPIC: &str = "spillway-topic";
    /// The record's timestamp, µs since the Unix epoch, decimal.
    pub const TIMESTAMP_US: &str = "spillway-timestamp-us";
    /// On a gap record (empty payload, no offset header): `A..B reason`.
    pub const GAP: &str = "spillway-gap";
}

/// The message key of a record: the gateway id ([`KafkaKey::Gateway`], the default, so
/// that one gateway's records keep their order in one partition of a many-partition topic),
/// or `<gateway id>/<topic>` ([`KafkaKey::GatewayTopic`], what earlier versions did).
pub fn record_key(key: KafkaKey, gateway_id: &str, topic: &str) -> String {
    match key {
        KafkaKey::Gateway => gateway_id.to_string(),
        KafkaKey::GatewayTopic => format!("{gateway_id}/{topic}"),
    }
}

/// The headers of a message of gateway `gateway_id`: `spillway-gateway`, `spillway-log-id`
/// (`log_id`, 32 hex digits), then `rest` (name, value) in order.
fn message_headers(gateway_id: &str, log_id: &str, rest: &[(&str, &str)]) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(2 + rest.len())
        .insert(Header {
            key: headers::GATEWAY,
            value: Some(gateway_id),
        })
        .insert(Header {
            key: headers::LOG_ID,
            value: Some(log_id),
        });
    for &(key, value) in rest {
        h = h.insert(Header {
            key,
            value: Some(value),
        });
    }
    h
}

/// The Kafka sink. Clones share one producer (the drains of a fleet).
#[derive(Clone)]
pub struct KafkaSink {
    producer: SmolProducer,
    brokers: String,
    /// Where records go.
    topic: KafkaTopic,
    /// With a topic per Spillway topic: the Kafka topics this handle sent records to (or
    /// was told of by [`KafkaSink::note_topics`]), where a gap record goes. At most
    /// [`MAX_GAP_TOPICS`].
    sent_topics: BTreeSet<String>,
    /// Offsets of the gateway's records the resume found in Kafka after a hole (and
    /// checked against the gateway): not sent again ([`KafkaSink::skip_delivered`]).
    skip: BTreeSet<u64>,
    /// Passed-through librdkafka properties, also set on the tail-scan consumer.
    properties: KafkaProperties,
    /// What a record's message key is.
    key: KafkaKey,
}

/// The most Kafka topics a gap record is sent to (with a topic per Spillway topic).
pub const MAX_GAP_TOPICS: usize = 1024;

/// How long [`KafkaSink::submit`] waits before enqueueing again when the producer's queue
/// is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

/// A batch enqueued by [`KafkaSink::submit`] whose delivery reports are outstanding.
///
/// Dropping it does not take the messages back (they may still be delivered); it only
/// stops listening for their reports.
pub struct Pending {
    /// Reports not yet received, in offset order.
    reports: VecDeque<Report>,
    /// Leading records acknowledged, counted from the first.
    acked: usize,
    /// The first failed report.
    failure: Option<SinkError>,
    /// Enqueueing stopped after the records in `reports` with this error.
    enqueue_failure: Option<SinkError>,
    /// Records not sent because Kafka holds them already, and their payload bytes.
    skipped: (u64, u64),
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("outstanding", &self.reports.len())
            .field("acked", &self.acked)
            .field("failure", &self.failure)
            .field("enqueue_failure", &self.enqueue_failure)
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// The outcome of one record of a [`Pending`] batch.
enum Report {
    /// Enqueued: its delivery report.
    Sent(DeliveryFuture),
    /// Not sent: the resume found it in Kafka already ([`KafkaSink::skip_delivered`]).
    Delivered,
}

impl Pending {
    /// Waits until every enqueued record has a delivery report (success or failure). Waits
    /// for all of them even after a failure, so that a resend never overtakes a message
    /// of the same batch still queued in the producer.
    ///
    /// Cancel-safe: reports already received are kept, and a later call continues.
    pub async fn settle(&mut self) {
        while let Some(f) = self.reports.front_mut() {
            let r = match f {
                Report::Sent(f) => KafkaSink::report(f).await,
                Report::Delivered => Ok(()),
            };
            self.reports.pop_front();
            match r {
                Ok(()) if self.failure.is_none() => self.acked += 1,
                Ok(()) => {}
                Err(e) => {
                    self.failure.get_or_insert(e);
                }
            }
        }
    }

    /// Records of the batch not sent because the resume found them in Kafka already
    /// ([`KafkaSink::skip_delivered`]), and their payload bytes: they count as delivered,
    /// not as forwarded.
    pub fn skipped(&self) -> (u64, u64) {
        self.skipped
    }

    /// After [`Pending::settle`]: `Ok` if every record was acknowledged, else the first
    /// failure and how many leading records were acknowledged before it. Before settling,
    /// the records not settled yet count as not acknowledged.
    pub fn result(&mut self) -> Result<(), DeliverError> {
        match self.failure.take().or_else(|| self.enqueue_failure.take()) {
            Some(error) => Err(DeliverError {
                delivered: self.acked,
                error,
            }),
            None if self.reports.is_empty() => Ok(()),
            None => Err(DeliverError {
                delivered: self.acked,
                error: SinkError::Kafka("delivery reports still outstanding".into()),
            }),
        }
    }
}

/// A failure to create a producer or consumer: a refused property is
/// [`SinkError::Config`], with every secret value redacted from librdkafka's message.
fn config_err(properties: &KafkaProperties, e: KafkaError) -> SinkError {
    match e {
        KafkaError::ClientConfig(_, desc, key, _) => {
            SinkError::Config(format!("property {key:?}: {}", properties.redact(&desc)))
        }
        KafkaError::ClientCreation(msg) => SinkError::Config(properties.redact(&msg)),
        e => SinkError::Kafka(properties.redact(&e.to_string())),
    }
}

fn kafka_err(e: KafkaError) -> SinkError {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageTimedOut) => SinkError::Timeout,
        _ => SinkError::Kafka(e.to_string()),
    }
}

impl KafkaSink {
    /// A producer for `brokers` (comma-separated `HOST:PORT`) writing to `topic` (a topic,
    /// or a template with `{topic}`, see [`super::kafka_topic`]). Connecting happens in
    /// the background; an unreachable broker shows as delivery errors, not here.
    ///
    /// # Errors
    /// As [`KafkaSink::with_properties`].
    pub fn new(brokers: &str, topic: &str, delivery_timeout_ms: u64) -> Result<Self, SinkError> {
        Self::with_properties(
            brokers,
            topic,
            delivery_timeout_ms,
            &KafkaProperties::default(),
        )
    }

    /// [`KafkaSink::new`] with librdkafka `properties` set after the bridge's own settings
    /// (the refused ones never get here, see [`crate::sink::properties`]).
    ///
    /// # Errors
    /// [`SinkError::Config`] when `topic` is a template that does not parse, or librdkafka
    /// refuses a property or its value (secret values redacted from the message);
    /// [`SinkError::Kafka`] for any other failure to create the producer.
    pub fn with_properties(
        brokers: &str,
        topic: &str,
        delivery_timeout_ms: u64,
        properties: &KafkaProperties,
    ) -> Result<Self, SinkError> {
        let target = KafkaTopic::parse(topic).map_err(SinkError::Config)?;
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5")
            .set("message.timeout.ms", delivery_timeout_ms.max(1).to_string())
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "100000");
        for (k, v) in properties.iter() {
            cfg.set(k, v);
        }
        let producer: SmolProducer = cfg.create().map_err(|e| config_err(properties, e))?;
        Ok(KafkaSink {
            producer,
            brokers: brokers.to_string(),
            topic: target,
            sent_topics: BTreeSet::new(),
            skip: BTreeSet::new(),
            properties: properties.clone(),
            key: KafkaKey::Gateway,
        })
    }

    /// The same sink with message keys of kind `key`.
    pub fn keyed_by(mut self, key: KafkaKey) -> Self {
        self.key = key;
        self
    }

    /// Where records go: a topic, or a template with `{topic}`.
    pub fn topic(&self) -> &KafkaTopic {
        &self.topic
    }

    /// With a topic per Spillway topic: counts `kafka_topics` among the topics this handle
    /// sent the gateway's records to, where a gap record goes (the resume tells it the
    /// topics of the records after the checkpoint, before anything is sent).
    pub fn note_topics<'a>(&mut self, kafka_topics: impl IntoIterator<Item = &'a str>) {
        if !self.topic.is_mapped() {
            return;
        }
        for t in kafka_topics {
            if self.sent_topics.len() >= MAX_GAP_TOPICS {
                return;
            }
            if !self.sent_topics.contains(t) {
                self.sent_topics.insert(t.to_string());
            }
        }
    }

    /// Tells this handle (the drain of one gateway) that its records at `offsets` are in
    /// Kafka already: the resume found them after a hole (records of one gateway in
    /// several partitions are delivered independently, so a crash can leave a later one
    /// delivered and an earlier one not) and checked them against the gateway. When
    /// [`KafkaSink::submit`] meets one, it counts it as delivered without sending it, so
    /// the resend after the hole duplicates nothing. Offsets below a submitted batch's first
    /// are forgotten.
    pub fn skip_delivered(&mut self, offsets: impl IntoIterator<Item = u64>) {
        self.skip.extend(offsets);
    }

    /// Reads the last `window` messages of every partition of `topic` (a Kafka topic) and
    /// collects the records of log `log_id` (header `spillway-log-id`) whose
    /// `spillway-offset` is at least `min_offset`. A topic that does not exist yet holds
    /// nothing. Blocking work runs on `smol::unblock`; the whole scan gives up after
    /// `timeout`.
    pub async fn scan_tail(
        &self,
        topic: &str,
        log_id: u128,
        min_offset: u64,
        window: u64,
        timeout: Duration,
    ) -> Result<TailScan, SinkError> {
        self.scan(topic, None, log_id, min_offset, window, timeout)
            .await
    }

    /// [`KafkaSink::scan_tail`] of Kafka topic `topic` for the records of gateway
    /// `gateway_id`: keyed by gateway id (and with a partitioner whose choice can be
    /// computed, see [`key_partition`]), only the gateway's partition is read, back from
    /// its end until the window holds `window` records of the log (or the partition's
    /// start): the window counts the gateway's records, not the partition's, which many
    /// gateways share.
    pub async fn scan_gateway_tail(
        &self,
        topic: &str,
        gateway_id: &str,
        log_id: u128,
        min_offset: u64,
        window: u64,
        timeout: Duration,
    ) -> Result<TailScan, SinkError> {
        let key = match self.key {
            KafkaKey::Gateway => Some(gateway_id.to_string()),
            KafkaKey::GatewayTopic => None,
        };
        self.scan(topic, key, log_id, min_offset, window, timeout)
            .await
    }

    async fn scan(
        &self,
        topic: &str,
        key: Option<String>,
        log_id: u128,
        min_offset: u64,
        window: u64,
        timeout: Duration,
    ) -> Result<TailScan, SinkError> {
        let brokers = self.brokers.clone();
        let topic = topic.to_string();
        let properties = self.properties.clone();
        smol::unblock(move || {
            scan_tail_blocking(
                &brokers,
                &topic,
                &properties,
                key.as_deref(),
                log_id,
                min_offset,
                window,
                timeout,
            )
        })
        .await
    }

    /// Starts loading the topic's metadata into the producer (on the blocking pool, at
    /// once, whether or not the task is awaited), so that the first batch does not wait for
    /// it: librdkafka otherwise looks a topic up only when the first message for it is
    /// enqueued, and the first delivery report of a run was seen to come up to about 1 s
    /// late. Best-effort: a failure only means the first batch waits. (The idempotent
    /// producer's id is acquired on librdkafka's own timer; nothing here speeds that up.)
    /// With a topic per Spillway topic, nothing is loaded (the topics are not known yet).
    pub fn warm_up(&self, timeout: Duration) -> smol::Task<Result<(), SinkError>> {
        let producer = self.producer.clone();
        let topic = match &self.topic {
            KafkaTopic::Fixed(t) => Some(t.clone()),
            KafkaTopic::Template { .. } => None,
        };
        smol::unblock(move || {
            let Some(topic) = topic else { return Ok(()) };
            producer
                .client()
                .fetch_metadata(Some(&topic), timeout)
                .map(|_| ())
                .map_err(|e| SinkError::Kafka(format!("metadata of {topic:?}: {e}")))
        })
    }

    /// The underlying producer (for tests and the resume scan).
    pub fn producer(&self) -> &SmolProducer {
        &self.producer
    }

    /// Enqueues `records` and waits for every delivery report ([`KafkaSink::submit`],
    /// then [`Pending::settle`]).
    pub async fn deliver(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        let mut p = self.submit(src, records).await;
        p.settle().await;
        p.result()
    }

    /// Enqueues `records` (consecutive, oldest first) in the producer and returns without
    /// waiting for their delivery reports: the drain keeps several batches in flight this
    /// way, and the producer's queue never runs dry between them. When the queue is full,
    /// waits for it to make room (it does as reports arrive or messages time out). An
    /// enqueue error stops the batch there: the records after it are not enqueued, and
    /// [`Pending::result`] reports the failure after the ones before it settled.
    pub async fn submit(&mut self, src: &Source, records: &[OwnedRecord]) -> Pending {
        let log_id = log_id_hex(src.log_id);
        let mut pending = Pending {
            reports: VecDeque::with_capacity(records.len()),
            acked: 0,
            failure: None,
            enqueue_failure: None,
            skipped: (0, 0),
        };
        // The Kafka topic of the last record's Spillway topic (records of one topic come
        // in runs).
        let mut last: Option<(&str, String)> = None;
        // The message key of the last record's topic, and the buffers of its offset and
        // timestamp headers (librdkafka copies header values): no allocation per record
        // for them.
        let mut key: Option<(&str, String)> = None;
        let (mut offset, mut ts_us) = (String::new(), String::new());
        if let Some(first) = records.first()
            && !self.skip.is_empty()
        {
            self.skip = self.skip.split_off(&first.offset);
        }
        for rec in records {
            if self.skip.contains(&rec.offset) {
                pending.reports.push_back(Report::Delivered);
                pending.skipped.0 += 1;
                pending.skipped.1 += rec.payload.len() as u64;
                continue;
            }
            if key.as_ref().is_none_or(|(t, _)| *t != rec.topic) {
                key = Some((
                    rec.topic.as_str(),
                    record_key(self.key, &src.gateway_id, &rec.topic),
                ));
            }
            let msg_key = key.as_ref().map_or("", |(_, k)| k.as_str());
            let kafka_topic: &str = match &self.topic {
                KafkaTopic::Fixed(t) => t,
                t => {
                    if last.as_ref().is_none_or(|(s, _)| *s != rec.topic) {
                        let k = t.for_topic(&rec.topic).into_owned();
                        if self.sent_topics.len() < MAX_GAP_TOPICS && !self.sent_topics.contains(&k)
                        {
                            self.sent_topics.insert(k.clone());
                        }
                        last = Some((rec.topic.as_str(), k));
                    }
                    last.as_ref().map_or("", |(_, k)| k.as_str())
                }
            };
            offset.clear();
            ts_us.clear();
            // Formatting an integer into a String cannot fail.
            let _ = write!(offset, "{}", rec.offset);
            let _ = write!(ts_us, "{}", rec.timestamp_us);
            let sent = self
                .enqueue(|| {
                    FutureRecord::to(kafka_topic)
                        .key(msg_key)
                        .payload(rec.payload.as_slice())
                        .timestamp(i64::try_from(rec.timestamp_us / 1000).unwrap_or(i64::MAX))
                        .headers(message_headers(
                            &src.gateway_id,
                            &log_id,
                            &[
                                (headers::OFFSET, &offset),
                                (headers::TOPIC, &rec.topic),
                                (headers::TIMESTAMP_US, &ts_us),
                            ],
                        ))
                })
                .await;
            match sent {
                Ok(f) => pending.reports.push_back(Report::Sent(f)),
                Err(e) => {
                    pending.enqueue_failure = Some(kafka_err(e));
                    return pending;
                }
            }
        }
        pending
    }

    /// Enqueues the message `build` makes in the producer. While the producer's queue is
    /// full, waits [`QUEUE_FULL_WAIT`] (its own thread drains the queue) and builds the
    /// message again.
    async fn enqueue<'m>(
        &self,
        build: impl Fn() -> FutureRecord<'m, str, [u8]>,
    ) -> Result<DeliveryFuture, KafkaError> {
        loop {
            match self.producer.send_result(build()) {
                Ok(f) => return Ok(f),
                Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    smol::Timer::after(QUEUE_FULL_WAIT).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Sends a gap record for `gap` (empty payload; headers `spillway-gateway`,
    /// `spillway-log-id` and `spillway-gap` = `A..B reason`; keyed like the gateway's other
    /// records) and waits for its delivery report. With a topic per Spillway topic, it goes
    /// to every Kafka topic this handle sent the gateway's records to or was told of
    /// ([`KafkaSink::note_topics`]); when there is none (nothing of the gateway seen since
    /// the bridge started), to none: the gap is then only logged and recorded in the state
    /// file.
    ///
    /// # Errors
    /// The enqueue or delivery failure; the drain retries.
    pub async fn deliver_gap(
        &mut self,
        src: &crate::sink::Source,
        gap: &crate::sink::GapNotice,
    ) -> Result<(), SinkError> {
        let log_id = log_id_hex(src.log_id);
        let value = gap.header();
        // Keyed by gateway id (with `--kafka-key gateway-topic` there is no topic to add).
        let key = src.gateway_id.clone();
        let topics: Vec<String> = match &self.topic {
            KafkaTopic::Fixed(t) => vec![t.clone()],
            KafkaTopic::Template { .. } => self.sent_topics.iter().cloned().collect(),
        };
        if topics.is_empty() {
            log::warn!(
                "gateway {:?} log {log_id}: no Kafka topic of this gateway known yet for the gap record of {value} (the sink maps topics with {}): the gap is recorded in the state file only",
                src.gateway_id,
                self.topic
            );
        }
        let mut reports = Vec::with_capacity(topics.len());
        for topic in &topics {
            let f = self
                .enqueue(|| {
                    FutureRecord::to(topic)
                        .key(key.as_str())
                        .payload(&[] as &[u8])
                        .headers(message_headers(
                            &src.gateway_id,
                            &log_id,
                            &[(headers::GAP, &value)],
                        ))
                })
                .await
                .map_err(kafka_err)?;
            reports.push(f);
        }
        let mut first_err = None;
        for mut f in reports {
            if let Err(e) = Self::report(&mut f).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn report(f: &mut DeliveryFuture) -> Result<(), SinkError> {
        match f.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(kafka_err(e)),
            Err(_) => Err(SinkError::Kafka(
                "delivery report lost (producer closed)".into(),
            )),
        }
    }

    /// Flushes the producer's queue, waiting up to `timeout`.
    pub async fn close(self, timeout: Duration) {
        let p = self.producer;
        let _ = smol::unblock(move || p.flush(timeout)).await;
    }
}

//! The `kafka://HOST:PORT/TOPIC` sink, on librdkafka (the `rdkafka` crate, built from
//! source and linked statically): a [`ThreadedProducer`] whose own thread serves the
//! delivery reports, and smol tasks waiting on whole batches (see "Delivery reports").
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
//! - Delivery reports: every message of a batch carries, as its librdkafka opaque, a
//!   reference to the batch's one shared [`Batch`] state (an `Arc`: a reference count
//!   raised per message, nothing allocated). The producer's report callback
//!   ([`BatchReports`], on the producer's polling thread) counts the batch's outstanding
//!   messages down, keeps the failure at the lowest gateway offset (read back from the
//!   failed message's `spillway-offset` header), and wakes the waiting task once, when the
//!   last report of the batch arrived. With a delivery future per record (a oneshot
//!   channel and a boxed sender: two allocations, freed on the report thread, and a
//!   future polled per record) the drain ran 10-20% slower into a local broker.
//! - A producer in librdkafka's fatal state (the idempotent producer fenced, or its
//!   sequence lost for good, e.g. after the broker stalled past `message.timeout.ms`) fails
//!   every message from then on: [`KafkaSink::fatal_error`] says so, and
//!   [`KafkaSink::recreate`] puts a new producer with the same settings in its place, once
//!   for every handle sharing it (the drain resumes from its checkpoint with the tail scan,
//!   so what the old producer delivered is not sent again).
//! - [`KafkaSink::scan_tail`] reads the last records of every partition of a topic (for
//!   the effectively-once resume, see [`crate::drain`]): it asks each partition for its
//!   watermarks, `assign`s a consumer (no consumer group, nothing committed) at
//!   `high − window`, reads up to the high watermark, and keeps the records whose
//!   `spillway-log-id` header is the log being drained. With a topic per Spillway topic,
//!   the resume scans the Kafka topic of every Spillway topic among the gateway's records
//!   after the checkpoint (`drain::kafka_tail`). The scan itself is in `tail.rs`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use atomic_waker::AtomicWaker;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};

use super::kafka_topic::KafkaTopic;
use super::properties::KafkaProperties;
use super::{DeliverError, KafkaKey, ProducerFailure, SinkError, Source};
use crate::client::{OwnedRecord, log_id_hex};

mod tail;
use tail::scan_tail_blocking;
pub use tail::{TailRecord, TailScan, key_partition};

/// The producer's context: hands each delivery report to the [`Batch`] its message
/// belongs to (librdkafka's logs and errors go to `log`, as with rdkafka's default
/// context).
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchReports;

impl ClientContext for BatchReports {}

impl ProducerContext for BatchReports {
    type DeliveryOpaque = Arc<Batch>;

    fn delivery(&self, report: &DeliveryResult<'_>, batch: Arc<Batch>) {
        batch.report(report);
    }
}

/// The producer type used by the sink: librdkafka's producer with a thread of its own
/// serving the delivery reports (clones share it; the thread ends with the last clone).
pub type SinkProducer = ThreadedProducer<BatchReports>;

/// The shared delivery state of one batch of messages (a [`Pending`] batch, or the gap
/// records of [`KafkaSink::deliver_gap`]): every message of the batch holds a reference to
/// it as its librdkafka opaque, given back with its delivery report.
#[derive(Debug)]
pub struct Batch {
    /// Messages enqueued whose delivery report has not arrived, plus 1 while
    /// [`KafkaSink::submit`] is still enqueueing (so that early reports cannot bring it to
    /// 0 before the last message is enqueued).
    outstanding: AtomicUsize,
    /// The failed report at the lowest gateway offset so far.
    failure: Mutex<Option<Failure>>,
    /// The task waiting in [`Pending::settle`], woken when `outstanding` reaches 0.
    waker: AtomicWaker,
}

/// A failed delivery of a [`Batch`].
#[derive(Debug)]
struct Failure {
    /// The gateway offset of the failed record (its `spillway-offset` header); 0 for a
    /// message without one (a gap record), which fails the whole batch.
    offset: u64,
    /// Why.
    error: SinkError,
}

impl Batch {
    /// A batch with nothing enqueued yet, held open by its submitter (see
    /// [`Batch::outstanding`]).
    fn open() -> Arc<Batch> {
        Arc::new(Batch {
            outstanding: AtomicUsize::new(1),
            failure: Mutex::new(None),
            waker: AtomicWaker::new(),
        })
    }

    /// Counts a message about to be enqueued (before it is: its report may come at once).
    fn add(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one report (or a message that was not enqueued after all, or the submitter's
    /// hold); wakes the waiting task when it was the last.
    fn done(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.waker.wake();
        }
    }

    /// Keeps `error` at gateway offset `offset` if it is the lowest failure so far.
    fn fail(&self, offset: u64, error: SinkError) {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.as_ref().is_none_or(|f| offset < f.offset) {
            *f = Some(Failure { offset, error });
        }
    }

    /// A delivery report of one of the batch's messages (on the producer's thread).
    fn report(&self, report: &DeliveryResult<'_>) {
        if let Err((e, msg)) = report {
            let offset = msg
                .headers()
                .and_then(|h| tail::header_str(h, headers::OFFSET))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            self.fail(offset, kafka_err(e.clone()));
        }
        self.done();
    }

    /// True once every report arrived and the submitter let go.
    fn settled(&self) -> bool {
        self.outstanding.load(Ordering::Acquire) == 0
    }

    /// Waits until [`Batch::settled`]. Cancel-safe (it only waits).
    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.settled() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            if self.settled() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// The lowest failure, taken out.
    fn take_failure(&self) -> Option<Failure> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

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

/// The producer the handles of one sink share, and the settings to make a new one with
/// when it has failed for good ([`KafkaSink::recreate`]).
struct ProducerSlot {
    /// The producer's settings, as first created.
    config: ClientConfig,
    /// The current producer and its generation (1 for the first, one more per recreation).
    current: Mutex<(u64, SinkProducer)>,
}

/// The Kafka sink. Clones share one producer (the drains of a fleet).
#[derive(Clone)]
pub struct KafkaSink {
    /// This handle's producer: the shared one, as of [`KafkaSink::generation`].
    producer: SinkProducer,
    /// The generation of [`KafkaSink::producer`] in [`KafkaSink::slot`].
    generation: u64,
    /// The producer shared by the clones.
    slot: Arc<ProducerSlot>,
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
    /// The reports of the enqueued messages.
    batch: Arc<Batch>,
    /// The gateway offset of every record of the batch that was enqueued or skipped, in
    /// order (what a failure's offset is counted against).
    offsets: Vec<u64>,
    /// Enqueueing stopped with this error at the record of this gateway offset (it and
    /// the records after it were not enqueued).
    enqueue_failure: Option<(u64, SinkError)>,
    /// Records not sent because Kafka holds them already, and their payload bytes.
    skipped: (u64, u64),
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("records", &self.offsets.len())
            .field("batch", &self.batch)
            .field("enqueue_failure", &self.enqueue_failure)
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl Pending {
    /// Waits until every enqueued record has a delivery report (success or failure). Waits
    /// for all of them even after a failure, so that a resend never overtakes a message
    /// of the same batch still queued in the producer.
    ///
    /// Cancel-safe: it only waits; a later call continues.
    pub async fn settle(&mut self) {
        self.batch.wait().await;
    }

    /// Records of the batch not sent because the resume found them in Kafka already
    /// ([`KafkaSink::skip_delivered`]), and their payload bytes: they count as delivered,
    /// not as forwarded.
    pub fn skipped(&self) -> (u64, u64) {
        self.skipped
    }

    /// After [`Pending::settle`]: `Ok` if every record was acknowledged, else the failure
    /// at the lowest gateway offset (a failed delivery report or the enqueue error) and how
    /// many leading records, those below that offset, were acknowledged. Before settling,
    /// an error: delivery reports still outstanding, none counted as acknowledged.
    pub fn result(&mut self) -> Result<(), DeliverError> {
        if !self.batch.settled() {
            return Err(DeliverError {
                delivered: 0,
                error: SinkError::Kafka("delivery reports still outstanding".into()),
            });
        }
        let report = self.batch.take_failure().map(|f| (f.offset, f.error));
        let failure = match (report, self.enqueue_failure.take()) {
            (Some(r), Some(e)) => Some(if e.0 < r.0 { e } else { r }),
            (r, e) => r.or(e),
        };
        match failure {
            None => Ok(()),
            Some((offset, error)) => Err(DeliverError {
                delivered: self.offsets.partition_point(|&o| o < offset),
                error,
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

/// An enqueue error or a failed delivery report as a [`SinkError`]: the delivery timeout
/// is [`SinkError::Timeout`]; an error that leaves the producer unable to send again (see
/// [`producer_failed_for_good`]) is [`SinkError::ProducerFailed`].
fn kafka_err(e: KafkaError) -> SinkError {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageTimedOut) => SinkError::Timeout,
        Some(code) if producer_failed_for_good(code) => {
            SinkError::ProducerFailed(ProducerFailure {
                reason: e.to_string(),
                fenced: fenced(code),
            })
        }
        _ => SinkError::Kafka(e.to_string()),
    }
}

/// True for an error after which the producer delivers nothing more, whatever is resent:
/// librdkafka's fatal error (`__FATAL`, or `__FENCED` it normalizes fencing to), and the
/// broker fencing the producer's id and epoch (`PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`;
/// librdkafka hands these to the application without raising a fatal error when the
/// producer is idempotent and not transactional, and keeps its producer id, so every
/// resend got the same answer).
pub fn producer_failed_for_good(code: RDKafkaErrorCode) -> bool {
    code == RDKafkaErrorCode::Fatal || fenced(code)
}

/// True for the errors of [`producer_failed_for_good`] that mean the broker fenced the
/// producer's id and epoch (`PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`, and `__FENCED`,
/// librdkafka's fatal error for them), rather than another fatal error.
pub fn fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
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
        let producer: SinkProducer = cfg
            .create_with_context(BatchReports)
            .map_err(|e| config_err(properties, e))?;
        let slot = Arc::new(ProducerSlot {
            config: cfg,
            current: Mutex::new((1, producer.clone())),
        });
        Ok(KafkaSink {
            producer,
            generation: 1,
            slot,
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
    pub fn producer(&self) -> &SinkProducer {
        &self.producer
    }

    /// librdkafka's fatal error of this handle's producer, if it has one, as
    /// `REASON (CODE)` with secret values redacted, and whether it is a fencing
    /// ([`fenced`]): such a producer fails every message from then on (enqueue and
    /// delivery), and only a new one ([`KafkaSink::recreate`]) delivers again. `None` while
    /// the producer works (or fails in a way its own retries or a resend can cure).
    pub fn fatal_error(&self) -> Option<ProducerFailure> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| ProducerFailure {
                reason: self.properties.redact(&format!("{reason} ({code:?})")),
                fenced: fenced(code),
            })
    }

    /// Replaces this handle's producer, failed for good ([`KafkaSink::fatal_error`]), by a
    /// new one with the same settings, shared with the other handles: the first handle to
    /// call this (per failed producer) creates it, the others take it up. The old producer
    /// is dropped on the blocking pool (librdkafka purges its queue, waits up to 0.5 s for
    /// the purged reports, and stops its thread). Messages enqueued in the old producer are
    /// not sent by the new one: the caller resends what it did not see acknowledged.
    ///
    /// Returns true if this call created the producer, false if another handle had.
    ///
    /// # Errors
    /// librdkafka refuses to create the producer ([`SinkError::Kafka`]; the settings were
    /// taken once already, so this is a resource failure, worth retrying).
    pub async fn recreate(&mut self) -> Result<bool, SinkError> {
        let slot = Arc::clone(&self.slot);
        let generation = self.generation;
        let properties = self.properties.clone();
        let (created, generation, producer, old) = smol::unblock(move || {
            let mut cur = slot.current.lock().unwrap_or_else(PoisonError::into_inner);
            if cur.0 != generation {
                return Ok((false, cur.0, cur.1.clone(), None));
            }
            let new: SinkProducer = slot.config.create_with_context(BatchReports).map_err(|e| {
                match config_err(&properties, e) {
                    SinkError::Config(m) => SinkError::Kafka(m),
                    e => e,
                }
            })?;
            let old = std::mem::replace(&mut cur.1, new.clone());
            cur.0 += 1;
            Ok::<_, SinkError>((true, cur.0, new, Some(old)))
        })
        .await?;
        let mine = std::mem::replace(&mut self.producer, producer);
        self.generation = generation;
        smol::unblock(move || drop((mine, old))).await;
        Ok(created)
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
    ///
    /// Per record, nothing is allocated here: the key, the Kafka topic and the offset and
    /// timestamp header values are formatted into buffers reused across the batch
    /// (librdkafka copies them), and the delivery opaque is a reference to the batch's
    /// shared [`Batch`].
    pub async fn submit(&mut self, src: &Source, records: &[OwnedRecord]) -> Pending {
        let log_id = log_id_hex(src.log_id);
        let mut pending = Pending {
            batch: Batch::open(),
            offsets: Vec::with_capacity(records.len()),
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
                pending.offsets.push(rec.offset);
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
            let msg = BaseRecord::with_opaque_to(kafka_topic, Arc::clone(&pending.batch))
                .key(msg_key)
                .payload(&rec.payload[..])
                .timestamp(i64::try_from(rec.timestamp_us / 1000).unwrap_or(i64::MAX))
                .headers(message_headers(
                    &src.gateway_id,
                    &log_id,
                    &[
                        (headers::OFFSET, &offset),
                        (headers::TOPIC, &rec.topic),
                        (headers::TIMESTAMP_US, &ts_us),
                    ],
                ));
            if let Err(e) = self.enqueue(&pending.batch, msg).await {
                pending.enqueue_failure = Some((rec.offset, kafka_err(e)));
                break;
            }
            pending.offsets.push(rec.offset);
        }
        // The submitter's hold: from here on the last report settles the batch.
        pending.batch.done();
        pending
    }

    /// Enqueues `msg`, a message of `batch`, in the producer, counting it in the batch.
    /// While the producer's queue is full, waits [`QUEUE_FULL_WAIT`] (its own thread
    /// serves the reports that make room) and tries again.
    ///
    /// # Errors
    /// Any other enqueue error (the message is not enqueued, nor counted).
    async fn enqueue(
        &self,
        batch: &Batch,
        mut msg: BaseRecord<'_, str, [u8], Arc<Batch>>,
    ) -> Result<(), KafkaError> {
        loop {
            batch.add();
            match self.producer.send(msg) {
                Ok(()) => return Ok(()),
                Err((e, back)) => {
                    batch.done();
                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                        return Err(e);
                    }
                    msg = back;
                    smol::Timer::after(QUEUE_FULL_WAIT).await;
                }
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
        let batch = Batch::open();
        let mut enqueue_failure = None;
        for topic in &topics {
            let msg = BaseRecord::with_opaque_to(topic.as_str(), Arc::clone(&batch))
                .key(key.as_str())
                .payload(&[] as &[u8])
                .headers(message_headers(
                    &src.gateway_id,
                    &log_id,
                    &[(headers::GAP, &value)],
                ));
            if let Err(e) = self.enqueue(&batch, msg).await {
                enqueue_failure = Some(kafka_err(e));
                break;
            }
        }
        batch.done();
        // Every enqueued gap record settles before a failure is reported.
        batch.wait().await;
        match batch.take_failure() {
            Some(f) => Err(f.error),
            None => enqueue_failure.map_or(Ok(()), Err),
        }
    }

    /// Flushes the producer's queue, waiting up to `timeout`.
    pub async fn close(self, timeout: Duration) {
        let p = self.producer;
        let _ = smol::unblock(move || p.flush(timeout)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors after which the producer can send nothing more are told apart from those
    /// a resend through it can cure, and the fencings among them from librdkafka's other
    /// fatal errors.
    #[test]
    fn fencing_and_fatal_errors_fail_the_producer_for_good() {
        let err = |code| kafka_err(KafkaError::MessageProduction(code));
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::InvalidProducerEpoch,
            RDKafkaErrorCode::Fenced,
            RDKafkaErrorCode::Fatal,
        ] {
            assert!(
                matches!(err(code), SinkError::ProducerFailed(f)
                    if f.fenced == (code != RDKafkaErrorCode::Fatal)),
                "{code:?}"
            );
        }
        assert!(matches!(
            err(RDKafkaErrorCode::MessageTimedOut),
            SinkError::Timeout
        ));
        for code in [
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::UnknownProducerId,
            RDKafkaErrorCode::OutOfOrderSequenceNumber,
        ] {
            assert!(matches!(err(code), SinkError::Kafka(_)), "{code:?}");
        }
    }
}

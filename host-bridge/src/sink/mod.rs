//! Sinks: where drained records go. [`Sink::submit`] hands a batch over and returns a
//! [`Pending`] that settles only when the sink has acknowledged the records durably (file:
//! written by `submit`, durable at the drain's next [`FileSink::sync`](file::FileSink::sync),
//! which settles it; Kafka: delivery reports, later), and says
//! how many of the leading records were acknowledged when it fails part-way, so the
//! checkpoint never advances past an unacknowledged record. [`Sink::deliver`] does both.

pub mod file;
mod json;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod kafka_topic;
mod line;
pub mod properties;

use serde::Serialize;

use crate::client::{OwnedRecord, log_id_hex};
pub use json::{JsonPayload, JsonRecord, MAX_JSON_DEPTH, is_portable_json};
pub use line::{LineWriter, Rfc3339};

/// Which gateway and log records come from (goes into every output record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The gateway's configured id.
    pub gateway_id: String,
    /// The gateway's log id.
    pub log_id: u128,
}

/// A `--sink` value: `file:DIR` or `kafka://HOST:PORT[,HOST:PORT…]/TOPIC`, read by the
/// shared URI parser. `TOPIC` may be a template with `{topic}` (a Kafka topic per
/// Spillway topic, see [`kafka_topic`]).
pub use spillway_core::cli::uri::{BadUri as BadSink, SinkUri as SinkSpec};

/// Why a Kafka producer can send nothing more ([`SinkError::ProducerFailed`]); shown as
/// its `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerFailure {
    /// librdkafka's message (secret values redacted), as it gave it.
    pub reason: String,
    /// The broker fenced the producer (`PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`, or
    /// librdkafka's `__FENCED`), told by the error code: librdkafka's message then speaks
    /// of a transactional id, though the bridge's producer is idempotent and has none.
    pub fenced: bool,
}

impl std::fmt::Display for ProducerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Why a sink failed. Every kind is retried by the drain loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// File system error.
    #[error("file sink: {0}")]
    Io(#[from] std::io::Error),
    /// Kafka producer error (enqueue or delivery report).
    #[error("kafka: {0}")]
    Kafka(String),
    /// No delivery report within the delivery timeout: unknown, resent.
    #[error("kafka: delivery timed out (outcome unknown, will resend)")]
    Timeout,
    /// The Kafka producer can send nothing more: librdkafka raised a fatal error, or the
    /// broker fences its producer id (`PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`, as it
    /// answered every resend after a broker stalled past the delivery timeout). Resending
    /// through it fails for ever; the drain replaces it by a new producer and resumes.
    #[error("kafka: producer failed for good: {0}")]
    ProducerFailed(ProducerFailure),
    /// This build has no such sink.
    #[error("this build has no {0} sink (cargo feature missing)")]
    Unsupported(&'static str),
    /// The sink's settings are refused (a librdkafka property it does not know, or a value
    /// it does not take; secret values redacted): not retried, exit code 2.
    #[error("kafka: configuration: {0}")]
    Config(String),
    /// Another drain holds the file sink's directory (not retried, exit code 1).
    #[error(
        "file sink directory {} is in use by another drain ({}): two drains into one directory would duplicate every record; stop it, or give this one another --sink directory",
        dir.display(),
        holder.map_or("pid unknown".to_string(), |p| format!("pid {p}"))
    )]
    Locked {
        /// The directory.
        dir: std::path::PathBuf,
        /// The holder's pid, as its lock file says.
        holder: Option<u32>,
    },
}

impl SinkError {
    /// A short label for the `sink_errors_total{kind=…}` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkError::Io(_) => "io",
            SinkError::Kafka(_) | SinkError::ProducerFailed(_) => "kafka",
            SinkError::Timeout => "timeout",
            SinkError::Unsupported(_) => "unsupported",
            SinkError::Config(_) => "config",
            SinkError::Locked { .. } => "locked",
        }
    }
}

/// A delivery that failed after `delivered` leading records were acknowledged.
#[derive(Debug, thiserror::Error)]
#[error("{error} (after {delivered} records acknowledged)")]
pub struct DeliverError {
    /// Records acknowledged before the failure, counted from the first one.
    pub delivered: usize,
    /// The failure.
    #[source]
    pub error: SinkError,
}

/// A batch handed to the sink by [`Sink::submit`] whose acknowledgements may still be
/// outstanding.
#[derive(Debug)]
pub enum Pending {
    /// The outcome is known (file sink); `None` once [`Pending::result`] took it.
    Done(Option<Result<(), DeliverError>>),
    /// File sink: written, not fsynced yet. Never settles by itself: the drain fsyncs the
    /// files ([`file::FileSink::sync`]) and then makes it [`Pending::Done`] with the
    /// outcome ([`Pending::synced`]).
    Unsynced,
    /// Delivery reports to wait for.
    #[cfg(feature = "kafka")]
    Kafka(kafka::Pending),
}

impl Pending {
    /// A file sink's fsync ended with `outcome` (`Err`: its I/O error, copied): an
    /// [`Pending::Unsynced`] batch becomes [`Pending::Done`] with it, every record
    /// acknowledged or none; any other is left as it is.
    pub fn synced(&mut self, outcome: Result<(), &std::io::Error>) {
        if let Pending::Unsynced = self {
            *self = Pending::Done(Some(outcome.map_err(|e| DeliverError {
                delivered: 0,
                error: SinkError::Io(std::io::Error::new(e.kind(), e.to_string())),
            })));
        }
    }

    /// True for a file sink's batch written and not fsynced yet.
    pub fn is_unsynced(&self) -> bool {
        matches!(self, Pending::Unsynced)
    }

    /// True for a Kafka batch: its outcome comes with the producer's delivery reports,
    /// not with a step of the drain's own.
    pub fn awaits_reports(&self) -> bool {
        match self {
            Pending::Done(_) | Pending::Unsynced => false,
            #[cfg(feature = "kafka")]
            Pending::Kafka(_) => true,
        }
    }

    /// Waits until every record of the batch has an outcome. Cancel-safe.
    pub async fn settle(&mut self) {
        match self {
            Pending::Done(_) => {}
            Pending::Unsynced => std::future::pending().await,
            #[cfg(feature = "kafka")]
            Pending::Kafka(k) => k.settle().await,
        }
    }

    /// Records of the batch the sink counted as delivered without sending them (Kafka
    /// holds them already, found by the resume), and their payload bytes.
    pub fn skipped(&self) -> (u64, u64) {
        match self {
            Pending::Done(_) | Pending::Unsynced => (0, 0),
            #[cfg(feature = "kafka")]
            Pending::Kafka(k) => k.skipped(),
        }
    }

    /// After [`Pending::settle`]: `Ok` if every record was acknowledged, else the failure
    /// and how many leading records were acknowledged before it.
    pub fn result(&mut self) -> Result<(), DeliverError> {
        match self {
            Pending::Done(r) => r.take().unwrap_or(Ok(())),
            Pending::Unsynced => Err(DeliverError {
                delivered: 0,
                error: SinkError::Io(std::io::Error::other("written but never synced")),
            }),
            #[cfg(feature = "kafka")]
            Pending::Kafka(k) => k.result(),
        }
    }
}

/// An opened sink.
pub enum Sink {
    /// See [`file::FileSink`] (boxed: it is much larger than the Kafka producer handle).
    File(Box<file::FileSink>),
    /// See [`kafka::KafkaSink`].
    #[cfg(feature = "kafka")]
    Kafka(kafka::KafkaSink),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sink::File(_) => f.write_str("Sink::File"),
            #[cfg(feature = "kafka")]
            Sink::Kafka(_) => f.write_str("Sink::Kafka"),
        }
    }
}

/// What a Kafka message's key is (`--kafka-key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KafkaKey {
    /// The gateway id alone (the default): one gateway's records keep their order in one
    /// partition of a many-partition topic.
    #[default]
    Gateway,
    /// `<gateway id>/<topic>`, what earlier versions did: one gateway's topics spread over
    /// partitions (each topic in order, not the gateway's records across topics).
    GatewayTopic,
}

impl std::str::FromStr for KafkaKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gateway" => Ok(KafkaKey::Gateway),
            "gateway-topic" => Ok(KafkaKey::GatewayTopic),
            _ => Err(format!("bad Kafka key {s:?}: gateway or gateway-topic")),
        }
    }
}

/// Sink settings besides the spec.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// File sink: when a topic's file is closed and the next one begun (`--rotate-bytes`,
    /// `--rotate-interval`, `--partition-by-date`).
    pub rotation: file::Rotation,
    /// Kafka: librdkafka's delivery timeout (`message.timeout.ms`), ms.
    pub kafka_delivery_timeout_ms: u64,
    /// Kafka: librdkafka properties passed through (`-X`, `[kafka]`), set after the
    /// bridge's own (see [`properties`]).
    pub kafka_properties: properties::KafkaProperties,
    /// Kafka: what a message's key is.
    pub kafka_key: KafkaKey,
}

impl Default for SinkOptions {
    fn default() -> Self {
        SinkOptions {
            rotation: file::Rotation::default(),
            kafka_delivery_timeout_ms: 300_000,
            kafka_properties: properties::KafkaProperties::default(),
            kafka_key: KafkaKey::Gateway,
        }
    }
}

impl Sink {
    /// Opens the sink (file: `spec`'s directory is the gateway's directory,
    /// `DIR/<gateway id>/`; creates it and settles what a crash left there; Kafka: creates
    /// the producer; neither needs the destination to be up).
    pub async fn open(spec: &SinkSpec, opts: &SinkOptions) -> Result<Sink, SinkError> {
        match spec {
            SinkSpec::File(dir) => Ok(Sink::File(Box::new(
                file::FileSink::open_async(dir.clone(), opts.rotation).await?,
            ))),
            #[cfg(feature = "kafka")]
            SinkSpec::Kafka { brokers, topic } => {
                if !opts.kafka_properties.is_empty() {
                    log::info!("kafka properties: {}", opts.kafka_properties.summary());
                }
                Ok(Sink::Kafka(
                    kafka::KafkaSink::with_properties(
                        brokers,
                        topic,
                        opts.kafka_delivery_timeout_ms,
                        &opts.kafka_properties,
                    )?
                    .keyed_by(opts.kafka_key),
                ))
            }
            #[cfg(not(feature = "kafka"))]
            SinkSpec::Kafka { .. } => Err(SinkError::Unsupported("kafka")),
        }
    }

    /// Hands `records` (consecutive, oldest first) to the sink and resolves once every one
    /// is acknowledged durably. Not cancel-safe in the sense of knowing what was written:
    /// after a cancel or an error, resend from the checkpoint.
    pub async fn deliver(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        match self {
            Sink::File(f) => f.deliver(src, records).await,
            #[cfg(feature = "kafka")]
            Sink::Kafka(k) => k.deliver(src, records).await,
        }
    }

    /// True if [`Sink::submit`] returns before the records are acknowledged, so that the
    /// drain can keep several batches in flight with its checkpoint saved behind them
    /// (Kafka). The file sink's batches wait in flight for the drain's next fsync
    /// ([`Pending::Unsynced`], see `--checkpoint-interval`).
    pub fn pipelined(&self) -> bool {
        match self {
            Sink::File(_) => false,
            #[cfg(feature = "kafka")]
            Sink::Kafka(_) => true,
        }
    }

    /// Hands `records` (consecutive, oldest first) to the sink and returns what is still
    /// to be acknowledged: Kafka enqueues them and returns at once; the file sink writes
    /// them first and returns [`Pending::Unsynced`], acknowledged by the drain's next
    /// [`file::FileSink::sync`] (or a failed [`Pending::Done`]: then every batch written
    /// since the last sync is lost as well). Not cancel-safe in the sense of knowing what
    /// was written: after a cancel or an error, resend from the checkpoint.
    pub async fn submit(&mut self, src: &Source, records: &[OwnedRecord]) -> Pending {
        match self {
            Sink::File(f) => match f.write(src, records).await {
                Ok(()) => Pending::Unsynced,
                Err(e) => Pending::Done(Some(Err(e))),
            },
            #[cfg(feature = "kafka")]
            Sink::Kafka(k) => Pending::Kafka(k.submit(src, records).await),
        }
    }

    /// Writes `gap` for the records of `src` and waits until it is durable (file: written and
    /// fsynced into every topic's open file, or the file of the empty topic when there is
    /// none yet; Kafka: its delivery report).
    ///
    /// # Errors
    /// The sink's failure; the drain retries.
    pub async fn deliver_gap(&mut self, src: &Source, gap: &GapNotice) -> Result<(), SinkError> {
        match self {
            Sink::File(f) => f.deliver_gap(src, gap).await,
            #[cfg(feature = "kafka")]
            Sink::Kafka(k) => k.deliver_gap(src, gap).await,
        }
    }

    /// Another handle on the same sink for another drain of the process: Kafka shares its
    /// producer; a file sink is per gateway, so `None`.
    pub fn share(&self) -> Option<Sink> {
        match self {
            Sink::File(_) => None,
            #[cfg(feature = "kafka")]
            Sink::Kafka(k) => Some(Sink::Kafka(k.clone())),
        }
    }

    /// Waits for anything the sink still holds (Kafka: the producer's queue), up to
    /// `timeout`.
    pub async fn close(self, timeout: std::time::Duration) {
        match self {
            Sink::File(_) => {}
            #[cfg(feature = "kafka")]
            Sink::Kafka(k) => k.close(timeout).await,
        }
        let _ = timeout;
    }
}

/// A range of offsets the gateway no longer has, as the sinks write it: the NDJSON sink as
/// a gap line in the topic files (no `offset` or `payload` key, so record readers skip it),
/// Kafka as a record with an empty payload and the header `spillway-gap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapNotice {
    /// First lost offset.
    pub from: u64,
    /// First offset after the range.
    pub to: u64,
    /// `dropped` (drop-oldest, or reclaimed), `corrupt`, or `unreported` (skipped by the
    /// gateway without a reason).
    pub reason: &'static str,
}

impl GapNotice {
    /// A notice for `from..to`, with the drain's reason (`dropped-oldest` and `dropped`
    /// become `dropped`).
    pub fn new(from: u64, to: u64, reason: &str) -> Self {
        let reason = match reason {
            "corrupt" => "corrupt",
            "unreported" => "unreported",
            _ => "dropped",
        };
        GapNotice { from, to, reason }
    }

    /// Offsets in the range.
    pub fn count(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }

    /// The NDJSON gap line, `{"gap":{"from":A,"to":B,"count":N,"reason":"…"},
    /// "gateway_id":"…","log_id":"…"}` and a newline.
    pub fn to_line(&self, src: &Source) -> String {
        #[derive(Serialize)]
        struct Range<'a> {
            from: u64,
            to: u64,
            count: u64,
            reason: &'a str,
        }
        #[derive(Serialize)]
        struct Line<'a> {
            gap: Range<'a>,
            gateway_id: &'a str,
            log_id: String,
        }
        let line = Line {
            gap: Range {
                from: self.from,
                to: self.to,
                count: self.count(),
                reason: self.reason,
            },
            gateway_id: &src.gateway_id,
            log_id: log_id_hex(src.log_id),
        };
        // Serializing strings and integers cannot fail.
        let mut s = serde_json::to_string(&line).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The Kafka header value: `A..B reason`.
    pub fn header(&self) -> String {
        format!("{}..{} {}", self.from, self.to, self.reason)
    }
}

/// The largest time RFC 3339 can write (four-digit years), with microseconds.
pub const MAX_RFC3339: &str = "9999-12-31T23:59:59.999999Z";

/// Formats µs since the Unix epoch as RFC 3339 UTC with 6 fractional digits,
/// e.g. `2023-11-14T22:13:20.000000Z`. A time past year 9999 (up to `u64::MAX` µs, about
/// year 586,912) is clamped to [`MAX_RFC3339`].
pub fn rfc3339_us(us: u64) -> String {
    Rfc3339::default().format(us).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON line of a record at offset `offset` of topic `t` (no producer, CRC 0) with
    /// `timestamp_us` and `payload`, from gateway `gw` log 1.
    fn line(offset: u64, timestamp_us: u64, payload: &[u8]) -> String {
        let src = Source {
            gateway_id: "gw".into(),
            log_id: 1,
        };
        let rec = OwnedRecord {
            offset,
            record_crc: 0,
            topic: "t".into(),
            timestamp_us,
            producer: None,
            payload: bytes::Bytes::copy_from_slice(payload),
        };
        JsonRecord::new(&src, &rec).to_line()
    }

    #[test]
    fn rfc3339() {
        assert_eq!(
            rfc3339_us(1_700_000_000_000_000),
            "2023-11-14T22:13:20.000000Z"
        );
        assert_eq!(rfc3339_us(1), "1970-01-01T00:00:00.000001Z");
        // The last microsecond of year 9999, and anything later, clamped.
        assert_eq!(rfc3339_us(253_402_300_799_999_999), MAX_RFC3339);
        assert_eq!(rfc3339_us(253_402_300_800_000_000), MAX_RFC3339);
        assert_eq!(rfc3339_us(u64::MAX), MAX_RFC3339);
    }

    /// A record stamped `u64::MAX` µs (beyond RFC 3339's years) still gets a string
    /// `timestamp` in the file sink and `tail` JSON, never `null`.
    #[test]
    fn json_timestamp_out_of_range_is_clamped_not_null() {
        let v: serde_json::Value = serde_json::from_str(&line(0, u64::MAX, b"x")).unwrap();
        assert_eq!(v["timestamp"], MAX_RFC3339);
        assert_eq!(v["timestamp_us"], u64::MAX);
    }

    #[test]
    fn json_keys_and_encodings() {
        let src = Source {
            gateway_id: "gw-1".into(),
            log_id: 0xAB,
        };
        let rec = OwnedRecord {
            offset: 5,
            record_crc: 1,
            topic: "buoy/sst".into(),
            timestamp_us: 1_700_000_000_000_000,
            producer: None,
            payload: bytes::Bytes::from_static(b"21.5"),
        };
        let line = JsonRecord::new(&src, &rec).to_line();
        assert_eq!(
            line,
            "{\"gateway_id\":\"gw-1\",\"log_id\":\"000000000000000000000000000000ab\",\
             \"offset\":5,\"topic\":\"buoy/sst\",\"timestamp\":\"2023-11-14T22:13:20.000000Z\",\
             \"timestamp_us\":1700000000000000,\"payload\":\"21.5\",\"payload_encoding\":\"utf8\"}\n"
        );
        let bin = OwnedRecord {
            payload: vec![0xff, 0x00, 0x01].into(),
            ..rec
        };
        let v: serde_json::Value =
            serde_json::from_str(&JsonRecord::new(&src, &bin).to_line()).unwrap();
        assert_eq!(v["payload"], "/wAB");
        assert_eq!(v["payload_encoding"], "base64");
        assert_eq!(v.as_object().unwrap().len(), 8);
    }

    /// `n` arrays nested in one another: `[[…]]`.
    fn nested(n: usize) -> String {
        format!("{}{}", "[".repeat(n), "]".repeat(n))
    }

    /// Payloads that look like JSON but that `serde_json` with its default limits (and so
    /// a `jq` or `serde_json` pipeline reading the sink's lines) refuses or would change: a
    /// lone surrogate escape, a number that overflows an `f64`, nesting deeper than a line
    /// can hold. Each is a `utf8` string and its line reads back; earlier versions wrote
    /// them raw as `json` and the line did not read.
    #[test]
    fn json_that_readers_refuse_is_written_as_a_string() {
        let refused = [
            r#"{"a":"\ud800"}"#.to_string(),
            r#"["\udc00"]"#.to_string(),
            r#"{"a":"\ud800\u0041"}"#.to_string(),
            r#"{"\ud800":1}"#.to_string(),
            "[1e400]".to_string(),
            r#"{"n":-1.5e309}"#.to_string(),
            nested(2000),
            nested(MAX_JSON_DEPTH + 1),
            format!(r#"{{"a":{}}}"#, nested(MAX_JSON_DEPTH)),
        ];
        for p in &refused {
            let l = line(0, 0, p.as_bytes());
            let v: serde_json::Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(v["payload_encoding"], "utf8", "{p}");
            assert_eq!(v["payload"].as_str(), Some(p.as_str()));
            assert!(!is_portable_json(p), "{p}");
        }
        // Still `json`, byte for byte: a surrogate pair, a number that underflows to 0 or
        // has more digits than an f64 holds, the deepest nesting a line can hold.
        let kept = [
            r#"{"a":"\ud83d\ude00"}"#.to_string(),
            "[1e-400]".to_string(),
            "[123456789012345678901234567890]".to_string(),
            nested(MAX_JSON_DEPTH),
            format!(r#"{{"a":{}}}"#, nested(MAX_JSON_DEPTH - 1)),
        ];
        for p in &kept {
            let l = line(0, 0, p.as_bytes());
            let v: serde_json::Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(v["payload_encoding"], "json", "{p}");
            assert!(l.contains(&format!(r#""payload":{p},"#)), "{l}");
        }
    }

    /// A JSON object or array on one line is written byte for byte (spacing, key order and
    /// number spelling kept) as `json`; anything else stays a string.
    #[test]
    fn json_payloads_pass_through_byte_for_byte() {
        let line = |p: &[u8]| line(0, 0, p);
        let obj = br#"{ "t" : 21.50, "b":1e2,"a":[1, 2] }"#;
        let l = line(obj);
        assert!(
            l.contains(
                r#""payload":{ "t" : 21.50, "b":1e2,"a":[1, 2] },"payload_encoding":"json""#
            ),
            "{l}"
        );
        assert!(line(b"[1,2]").contains(r#""payload":[1,2],"payload_encoding":"json""#));
        // Not one object or array on one line: a string, as before.
        for p in [
            &b"21.5"[..],
            b"\"s\"",
            b"{\"a\":\n1}",
            b"{\"a\":1} x",
            b"{\"a\":1",
            b" {\"a\":1}",
        ] {
            let v: serde_json::Value = serde_json::from_str(&line(p)).unwrap();
            assert_eq!(
                v["payload_encoding"],
                "utf8",
                "{:?}",
                String::from_utf8_lossy(p)
            );
            assert_eq!(v["payload"].as_str().unwrap().as_bytes(), p);
        }
    }
}

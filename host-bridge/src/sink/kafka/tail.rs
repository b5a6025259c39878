//! The partition-tail scan of the effectively-once resume
//! ([`super::KafkaSink::scan_tail`], [`super::KafkaSink::scan_gateway_tail`]): which
//! partitions to read (all of them, or the one a gateway's key goes to, see
//! [`key_partition`]), the passes back from the end of each, and the records of the
//! drained log they hold ([`TailScan`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

use super::{config_err, headers};
use crate::client::log_id_hex;
use crate::sink::SinkError;
use crate::sink::properties::KafkaProperties;

/// A record of the drained log found in a partition tail: what the resume compares with
/// the gateway's record at the same offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailRecord {
    /// The Kafka partition it is in.
    pub partition: i32,
    /// Its offset in that partition.
    pub kafka_offset: i64,
    /// The `spillway-topic` header.
    pub topic: String,
    /// The `spillway-timestamp-us` header.
    pub timestamp_us: u64,
    /// The message value.
    pub payload: Vec<u8>,
}

/// What the partition tails of the topic hold of one log (see
/// [`KafkaSink::scan_tail`](super::KafkaSink::scan_tail)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailScan {
    /// Records of the log at or above the scan's `min_offset`, by gateway offset (a
    /// duplicate keeps the first one read).
    pub found: BTreeMap<u64, TailRecord>,
    /// The highest `spillway-offset` seen for the log (also below `min_offset`).
    pub highest: Option<u64>,
    /// The lowest `spillway-offset` seen for the log: below `min_offset` means the window
    /// reached back past the checkpoint.
    pub lowest: Option<u64>,
    /// Every partition was read from its low watermark (a wider window finds no more).
    pub whole_topic: bool,
    /// Partitions of the topic (0 when the topic does not exist).
    pub partitions: usize,
    /// Of those, the partitions whose tails were read: 1 when the records are keyed by
    /// gateway id (the key's partition), else all of them.
    pub partitions_read: usize,
    /// Messages read, of any log.
    pub messages_read: u64,
}

impl TailScan {
    /// The end of the run of consecutive offsets found from `from`: every offset in
    /// `from..end` is in the topic. `from` itself when it is not.
    ///
    /// This, not [`TailScan::highest`], is where a resume may start: records of different
    /// keys go to different partitions, and a crash can leave a later offset delivered in
    /// one partition while an earlier one never reached another.
    pub fn contiguous_end(&self, from: u64) -> u64 {
        let mut end = from;
        while self.found.contains_key(&end) {
            end += 1;
        }
        end
    }
}

/// Why a tail scan failed (the drain retries it like any sink failure).
fn scan_err(what: &str, e: KafkaError) -> SinkError {
    SinkError::Kafka(format!("reading the partition tails ({what}): {e}"))
}

/// The value of header `key` of a message, if it has one and it is UTF-8.
pub(super) fn header_str<'a, H: Headers>(h: &'a H, key: &str) -> Option<&'a str> {
    h.iter()
        .find(|x| x.key == key)
        .and_then(|x| x.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// The partition librdkafka's partitioner puts `key` in, among `partitions`, when the
/// partitioner is one whose choice can be computed (`consistent_random`, the default, and
/// `consistent`: CRC-32 of the key; `murmur2_random` and `murmur2`: Kafka's murmur2, as
/// the Java client); `None` otherwise (`random`, `fnv1a`, a custom one).
pub fn key_partition(key: &[u8], partitions: usize, partitioner: Option<&str>) -> Option<i32> {
    let n = u32::try_from(partitions).ok().filter(|&n| n > 0)?;
    let h = match partitioner.unwrap_or("consistent_random") {
        "consistent_random" | "consistent" => spillway_core::log::format::crc32(key),
        "murmur2_random" | "murmur2" => murmur2(key) & 0x7fff_ffff,
        _ => return None,
    };
    i32::try_from(h % n).ok()
}

/// Kafka's murmur2 hash (seed `0x9747b28c`), as its partitioners compute it.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut h: u32 = 0x9747_b28c ^ len;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, &b) in rest.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// The scan consumer's context. Two things librdkafka reports about it are the normal
/// course of a scan, logged at DEBUG instead of as ERROR and WARN lines: the end of a
/// partition (`PartitionEOF`, which the scan asks for, to know where a partition ends),
/// and producer properties it ignores (`CONFWARN`: the consumer is given the `-X`
/// properties the producer has, for the security settings both need).
struct ScanContext;

impl ClientContext for ScanContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "CONFWARN" && log_message.contains("is a producer property") {
            log::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}");
        } else {
            DefaultClientContext.log(level, fac, log_message);
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
            log::debug!("librdkafka: {error}: {reason}");
        } else {
            DefaultClientContext.error(error, reason);
        }
    }
}

impl ConsumerContext for ScanContext {}

/// Where a scan reads: the whole tail scan of one partition is passes from `start` to
/// `end` (`None`: to the end of the partition), each further back than the one before.
struct Pass {
    partition: i32,
    start: i64,
    end: Option<i64>,
}

/// Reads one pass and hands every message to `each`; returns how many messages `each`
/// said were of the log.
fn read_pass(
    consumer: &BaseConsumer<ScanContext>,
    topic: &str,
    pass: &Pass,
    deadline: Instant,
    timeout: Duration,
    each: &mut dyn FnMut(&rdkafka::message::BorrowedMessage<'_>) -> bool,
) -> Result<u64, SinkError> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, pass.partition, Offset::Offset(pass.start))
        .map_err(|e| scan_err("assign", e))?;
    consumer.assign(&tpl).map_err(|e| scan_err("assign", e))?;
    let mut ours = 0u64;
    loop {
        if Instant::now() >= deadline {
            return Err(SinkError::Kafka(format!(
                "reading the partition tails: timed out after {timeout:?} in partition {}",
                pass.partition
            )));
        }
        let Some(m) = consumer.poll(left().min(Duration::from_millis(200))) else {
            continue;
        };
        let m = match m {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(_)) => return Ok(ours),
            Err(e) => return Err(scan_err("fetch", e)),
        };
        if pass.end.is_some_and(|end| m.offset() >= end) {
            return Ok(ours);
        }
        if each(&m) {
            ours += 1;
        }
        if pass.end.is_some_and(|end| m.offset() + 1 >= end) {
            return Ok(ours);
        }
    }
}

/// [`KafkaSink::scan_tail`](super::KafkaSink::scan_tail), blocking.
#[allow(clippy::too_many_arguments)]
pub(super) fn scan_tail_blocking(
    brokers: &str,
    topic: &str,
    properties: &KafkaProperties,
    key: Option<&str>,
    log_id: u128,
    min_offset: u64,
    window: u64,
    timeout: Duration,
) -> Result<TailScan, SinkError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    // The passed-through properties first (security settings), the scan's own over them.
    for (k, v) in properties.iter() {
        cfg.set(k, v);
    }
    let consumer: BaseConsumer<ScanContext> = cfg
        // `assign` only: the group id is never joined and nothing is committed.
        .set("group.id", "spillway-bridge-tail-scan")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        // At the end of a partition, do not let the broker hold the fetch.
        .set("fetch.wait.max.ms", "10")
        .create_with_context(ScanContext)
        .map_err(|e| config_err(properties, e))?;
    let mut scan = TailScan::default();
    let md = consumer
        .fetch_metadata(Some(topic), left())
        .map_err(|e| scan_err("metadata", e))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(scan);
    };
    if let Some(code) = t.error() {
        let code = RDKafkaErrorCode::from(code);
        if code == RDKafkaErrorCode::UnknownTopicOrPartition {
            return Ok(scan);
        }
        return Err(SinkError::Kafka(format!(
            "reading the partition tails (metadata of {topic:?}): {code}"
        )));
    }
    scan.partitions = t.partitions().len();
    scan.whole_topic = true;
    // Keyed by gateway id: the log's records are all in the key's partition, and the
    // window counts the log's records there (16 gateways sharing 4 partitions interleave
    // theirs). Otherwise every partition's last `window` messages.
    let keyed = key
        .and_then(|k| key_partition(k.as_bytes(), scan.partitions, properties.get("partitioner")));
    let partitions: Vec<i32> = match keyed {
        Some(p) => vec![p],
        None => t.partitions().iter().map(|p| p.id()).collect(),
    };
    scan.partitions_read = partitions.len();
    let want = log_id_hex(log_id);
    let mut each = |m: &rdkafka::message::BorrowedMessage<'_>| -> bool {
        scan.messages_read += 1;
        let p = m.partition();
        let Some(h) = m.headers() else { return false };
        if header_str(h, headers::LOG_ID) != Some(want.as_str()) {
            return false;
        }
        let Some(offset) = header_str(h, headers::OFFSET).and_then(|v| v.parse::<u64>().ok())
        else {
            return false;
        };
        scan.highest = scan.highest.max(Some(offset));
        scan.lowest = Some(scan.lowest.map_or(offset, |l| l.min(offset)));
        if offset < min_offset {
            return true;
        }
        let rec = TailRecord {
            partition: p,
            kafka_offset: m.offset(),
            topic: header_str(h, headers::TOPIC)
                .unwrap_or_default()
                .to_string(),
            timestamp_us: header_str(h, headers::TIMESTAMP_US)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            payload: m.payload().unwrap_or_default().to_vec(),
        };
        scan.found.entry(offset).or_insert(rec);
        true
    };
    let window = i64::try_from(window).unwrap_or(i64::MAX);
    let mut whole = true;
    for p in partitions {
        // The high watermark from ListOffsets only places the start of the window: some
        // brokers under-report it (tansu 0.6 answers the last batch's base offset + 1),
        // which only widens the window. The end of the first pass is the end-of-partition
        // event, which comes from the high watermark of the fetch responses.
        let (low, high) = consumer
            .fetch_watermarks(topic, p, left())
            .map_err(|e| scan_err("watermarks", e))?;
        if high <= low {
            // Empty (an under-reported high watermark is still above the low one).
            continue;
        }
        let mut pass = Pass {
            partition: p,
            start: high.saturating_sub(window).max(low),
            end: None,
        };
        let mut ours = 0u64;
        loop {
            ours += read_pass(&consumer, topic, &pass, deadline, timeout, &mut each)?;
            let enough = u64::try_from(window).map_or(true, |w| ours >= w);
            if keyed.is_none() || enough || pass.start <= low {
                break;
            }
            // Further back, twice as far each time, until the window holds `window` of the
            // log's records or the partition's start.
            let span = high.saturating_sub(pass.start).max(1);
            pass.end = Some(pass.start);
            pass.start = pass.start.saturating_sub(span.saturating_mul(2)).max(low);
        }
        whole &= pass.start <= low;
    }
    scan.whole_topic = whole;
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> TailRecord {
        TailRecord {
            partition: 0,
            kafka_offset: 0,
            topic: "t".into(),
            timestamp_us: 0,
            payload: Vec::new(),
        }
    }

    #[test]
    fn contiguous_end_stops_at_the_first_hole() {
        let mut s = TailScan::default();
        assert_eq!(s.contiguous_end(5), 5);
        for o in [5, 6, 7, 9] {
            s.found.insert(o, rec());
        }
        assert_eq!(s.contiguous_end(5), 8);
        assert_eq!(s.contiguous_end(8), 8);
        assert_eq!(s.contiguous_end(9), 10);
        assert_eq!(s.contiguous_end(4), 4);
    }
}

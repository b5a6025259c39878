//! Reading a run's topic back after it was timed: every partition to its end
//! ([`read_back`]), and the check that the topic holds exactly the records one gateway
//! sent, in order ([`verify_topic`], [`Verified`]).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{GATEWAY_ID, PAYLOAD, payload_of};

/// What reading a run's topic back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Records the run had to put into the topic.
    pub expected: u64,
    /// Records read back from the topic.
    pub found: u64,
    /// Records read back that are the ones sent, in their place: the topic's record `i` has
    /// the payload of record `i`, `spillway-offset` header `i` and a key that starts with
    /// the gateway id.
    pub matching: u64,
    /// What is wrong with the run, `None` when its topic holds exactly the records sent.
    pub problem: Option<String>,
}

impl Verified {
    /// Whether the topic holds exactly the records sent, in order.
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// No record and no end of partition for this long ends a read-back.
pub(crate) const READ_BACK_IDLE: Duration = Duration::from_secs(30);

/// Reads partition 0 of `topic` from the beginning to its end and compares it with the
/// `n` records the benchmark sends (see [`Verified::matching`]). Streams: nothing but the
/// counts is kept, so it also checks millions of records.
///
/// # Panics
/// If no consumer can be created or assigned (the broker's address is wrong).
pub fn verify_topic(bootstrap: &str, topic: &str, n: u64) -> Verified {
    verify_topic_sized(bootstrap, topic, n, PAYLOAD)
}

/// [`verify_topic`] for records of `len` payload bytes (`payload_of`).
///
/// # Panics
/// As [`verify_topic`].
pub fn verify_topic_sized(bootstrap: &str, topic: &str, n: u64, len: usize) -> Verified {
    let mut matching = 0u64;
    let mut first_wrong: Option<String> = None;
    let mut i = 0u64;
    let (found, read_error) = read_back(bootstrap, topic, 1, |m| {
        let offset = spillway_offset(m);
        let key_ok = m
            .key()
            .is_some_and(|k| k.starts_with(GATEWAY_ID.as_bytes()));
        let payload_ok = i < n
            && usize::try_from(i).is_ok_and(|i| m.payload() == Some(payload_of(i, len).as_slice()));
        if offset == Some(i) && key_ok && payload_ok {
            matching += 1;
        } else if first_wrong.is_none() {
            first_wrong = Some(format!(
                "record {i} of the topic is not the record sent at that place \
                 (spillway-offset {offset:?}, key ok {key_ok}, payload ok {payload_ok})"
            ));
        }
        i += 1;
    });
    let problem = if found != n {
        Some(format!("{found} records in the topic, {n} sent"))
    } else {
        read_error.or(first_wrong)
    };
    Verified {
        expected: n,
        found,
        matching,
        problem,
    }
}

/// Reads partitions `0..partitions` of `topic` from their beginning to their end (streams:
/// nothing is kept) and hands every message to `each`. Returns how many messages were read
/// and why the read-back stopped before every partition's end, if it did (a read error, or
/// neither a record nor the end of a partition for [`READ_BACK_IDLE`]).
///
/// # Panics
/// If no consumer can be created or assigned (the broker's address is wrong).
pub(crate) fn read_back(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    mut each: impl FnMut(&BorrowedMessage<'_>),
) -> (u64, Option<String>) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "spillway-bench-verify")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("read-back consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    c.assign(&tpl).expect("assign");
    let mut found = 0u64;
    let mut eof = std::collections::HashSet::new();
    let mut last = Instant::now();
    while eof.len() < usize::try_from(partitions).unwrap_or(0) {
        match c.poll(Duration::from_millis(200)) {
            None if last.elapsed() > READ_BACK_IDLE => {
                return (
                    found,
                    Some(format!(
                        "no record and no end of partition for {} s after {found} records",
                        READ_BACK_IDLE.as_secs()
                    )),
                );
            }
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => return (found, Some(format!("reading the topic back: {e}"))),
            Some(Ok(m)) => {
                last = Instant::now();
                found += 1;
                each(&m);
            }
        }
    }
    (found, None)
}

/// The `spillway-offset` header of `m`, if it has one that is a number.
pub(crate) fn spillway_offset(m: &BorrowedMessage<'_>) -> Option<u64> {
    m.headers().and_then(|h| {
        h.iter()
            .find(|x| x.key == "spillway-offset")
            .and_then(|x| x.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<u64>().ok())
    })
}

//! Reading back what the Kafka sink produced, for the Kafka tests: a consumer from the
//! beginning of some partitions, a partition read to its end with each message's gateway
//! offset (header `spillway-offset`), and the record fixture those tests deliver.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use spillway_bridge::client::OwnedRecord;

/// A record at gateway offset `offset` of `topic`, payload `p{offset}`, timestamp
/// 1,700,000,000 s + `offset` µs.
pub fn rec(offset: u64, topic: &str) -> OwnedRecord {
    OwnedRecord {
        offset,
        record_crc: 0,
        topic: topic.into(),
        timestamp_us: 1_700_000_000_000_000 + offset,
        producer: None,
        payload: format!("p{offset}").into_bytes().into(),
    }
}

/// A consumer of `partitions` of `topic` from their beginning; with `eof`, the end of each
/// partition is reported (`KafkaError::PartitionEOF`).
pub fn consumer_from_beginning(
    brokers: &str,
    topic: &str,
    partitions: std::ops::Range<i32>,
    eof: bool,
) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "test")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", if eof { "true" } else { "false" })
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    c
}

/// Every message of partition `partition` of `topic`, in log order (duplicates kept), as
/// (gateway offset from header `spillway-offset`, payload), read up to the end of that
/// partition only (30 s at most, then the test fails).
pub fn partition_messages(brokers: &str, topic: &str, partition: i32) -> Vec<(u64, Vec<u8>)> {
    let c = consumer_from_beginning(brokers, topic, partition..partition + 1, true);
    let t = Instant::now();
    let mut out = Vec::new();
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{topic} partition {partition} not read to the end"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return out,
            // A broker that is down (not this partition's leader) shows up as transport
            // errors: not about this partition.
            Some(Err(_)) => {}
            Some(Ok(m)) => {
                let offset = m
                    .headers()
                    .and_then(|h| h.iter().find(|x| x.key == "spillway-offset"))
                    .and_then(|x| x.value)
                    .expect("spillway-offset header");
                out.push((
                    std::str::from_utf8(offset).unwrap().parse().unwrap(),
                    m.payload().unwrap_or_default().to_vec(),
                ));
            }
        }
    }
}

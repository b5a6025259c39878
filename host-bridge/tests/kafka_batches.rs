//! The Kafka sink's batch accounting against librdkafka's in-process mock cluster: a batch
//! settles on one shared delivery state, so a failed report must still fail the batch at
//! the lowest failed gateway offset even when later records of the batch are acknowledged,
//! and a batch larger than the producer's queue must wait for room and keep its order.
#![cfg(feature = "kafka")]

#[path = "common/kafka_read.rs"]
mod kafka_read;

use std::time::Duration;

use kafka_read::{partition_messages, rec};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use spillway_bridge::client::OwnedRecord;
use spillway_bridge::sink::kafka::KafkaSink;
use spillway_bridge::sink::properties::KafkaProperties;
use spillway_bridge::sink::{SinkError, Source};

fn source() -> Source {
    Source {
        gateway_id: "gw-b".into(),
        log_id: 0xB,
    }
}

/// One batch over two Kafka topics led by two brokers (`out.{topic}`), with gaps between
/// its offsets: offsets 0-3 and 20-22 to `out.b` (broker 2, up), 10-11 to `out.a` (broker
/// 1, down). The reports of 20-22 arrive while 10-11 are still waiting; 10-11 time out. The
/// batch fails at offset 10 with the 4 records before it acknowledged, not at the last
/// report's record and not with the acknowledged 20-22 counted: a resend from 10 loses
/// nothing. Guards the per-batch delivery state, where reports arrive out of offset order.
#[test]
fn a_failed_report_fails_the_batch_at_its_lowest_offset() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(2).unwrap();
    mock.create_topic("out.a", 1, 1).unwrap();
    mock.create_topic("out.b", 1, 1).unwrap();
    mock.partition_leader("out.a", 0, Some(1)).unwrap();
    mock.partition_leader("out.b", 0, Some(2)).unwrap();
    let brokers = mock.bootstrap_servers();
    mock.broker_down(1).unwrap();
    let recs: Vec<OwnedRecord> = [0, 1, 2, 3]
        .map(|o| rec(o, "b"))
        .into_iter()
        .chain([10, 11].map(|o| rec(o, "a")))
        .chain([20, 21, 22].map(|o| rec(o, "b")))
        .collect();
    let e = smol::block_on(async {
        let mut k = KafkaSink::new(&brokers, "out.{topic}", 1500).unwrap();
        let r = k.deliver(&source(), &recs).await;
        k.close(Duration::from_secs(5)).await;
        r
    })
    .expect_err("offsets 10 and 11 cannot be delivered");
    assert_eq!(e.delivered, 4, "{e}");
    assert!(matches!(e.error, SinkError::Timeout), "{e}");
    // The later records were acknowledged all the same: the resend duplicates them, it
    // never skips 10.
    let b: Vec<u64> = partition_messages(&brokers, "out.b", 0)
        .into_iter()
        .map(|(o, _)| o)
        .collect();
    assert_eq!(b, [0, 1, 2, 3, 20, 21, 22]);
}

/// A batch of 300 records through a producer whose queue holds 7 messages: the enqueue
/// meets a full queue again and again, waits for room and enqueues the same message again;
/// every record arrives once, in order, with its own payload and offset header.
#[test]
fn a_batch_larger_than_the_producer_queue_waits_for_room_in_order() {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    mock.create_topic("out", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let mut props = KafkaProperties::default();
    props.set("queue.buffering.max.messages", "7").unwrap();
    let recs: Vec<OwnedRecord> = (0..300).map(|o| rec(o, "t")).collect();
    smol::block_on(async {
        let mut k = KafkaSink::with_properties(&brokers, "out", 10_000, &props).unwrap();
        k.deliver(&source(), &recs).await.unwrap();
        k.close(Duration::from_secs(5)).await;
    });
    let got = partition_messages(&brokers, "out", 0);
    let want: Vec<(u64, Vec<u8>)> = (0..300u64)
        .map(|o| (o, format!("p{o}").into_bytes()))
        .collect();
    assert_eq!(got, want);
}

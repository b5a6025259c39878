//! Kafka sink tests against librdkafka's in-process mock cluster (and, when
//! `SPILLWAY_KAFKA_BROKER=host:port` is set, a real broker).
#![cfg(feature = "kafka")]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::FakeGateway;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::{Offset, TopicPartitionList};
use spillway_bridge::checkpoint::Store;
use spillway_bridge::client::OwnedRecord;
use spillway_bridge::drain::{Drain, DrainConfig, Shutdown};
use spillway_bridge::metrics::Metrics;
use spillway_bridge::progress::Mode;
use spillway_bridge::sink::kafka::KafkaSink;
use spillway_bridge::sink::{Sink, Source};

struct Msg {
    key: String,
    payload: Vec<u8>,
    headers: HashMap<String, String>,
    partition: i32,
}

/// Reads every message of `topic` (partitions 0..parts) from the beginning.
fn consume_all(brokers: &str, topic: &str, parts: i32, want: usize) -> Vec<Msg> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "test")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let t = Instant::now();
    while out.len() < want && t.elapsed() < Duration::from_secs(30) {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let mut headers = HashMap::new();
        if let Some(h) = m.headers() {
            for hd in h.iter() {
                headers.insert(
                    hd.key.to_string(),
                    String::from_utf8(hd.value.unwrap_or_default().to_vec()).unwrap(),
                );
            }
        }
        out.push(Msg {
            key: String::from_utf8(m.key().unwrap_or_default().to_vec()).unwrap(),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers,
            partition: m.partition(),
        });
    }
    out
}

fn rec(offset: u64, topic: &str) -> OwnedRecord {
    OwnedRecord {
        offset,
        record_crc: 0,
        topic: topic.into(),
        timestamp_us: 1_700_000_000_000_000 + offset,
        producer: None,
        payload: format!("p{offset}").into_bytes(),
    }
}

#[test]
fn delivers_with_key_and_headers() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("out", 3, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let src = Source {
        gateway_id: "gw-9".into(),
        log_id: 0xABC,
    };
    let recs: Vec<_> = (0..50)
        .map(|i| rec(i, if i % 2 == 0 { "buoy/sst" } else { "cgm" }))
        .collect();
    smol::block_on(async {
        let mut s = KafkaSink::new(&brokers, "out", 10_000).unwrap();
        s.deliver(&src, &recs).await.unwrap();
    });
    let msgs = consume_all(&brokers, "out", 3, 50);
    assert_eq!(msgs.len(), 50);
    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    let mut key_partition: HashMap<String, i32> = HashMap::new();
    for m in &msgs {
        let off: u64 = m.headers["spillway-offset"].parse().unwrap();
        let topic = &m.headers["spillway-topic"];
        assert_eq!(m.key, format!("gw-9/{topic}"));
        assert_eq!(m.headers["spillway-gateway"], "gw-9");
        assert_eq!(
            m.headers["spillway-log-id"],
            "00000000000000000000000000000abc"
        );
        assert_eq!(
            m.headers["spillway-timestamp-us"],
            (1_700_000_000_000_000 + off).to_string()
        );
        assert_eq!(m.payload, format!("p{off}").into_bytes());
        per_key.entry(m.key.clone()).or_default().push(off);
        // One key, one partition.
        assert_eq!(
            *key_partition.entry(m.key.clone()).or_insert(m.partition),
            m.partition
        );
    }
    for offs in per_key.values() {
        assert!(offs.windows(2).all(|w| w[0] < w[1]), "order kept per key");
    }
}

#[test]
fn a_down_broker_holds_the_checkpoint_until_delivery() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("out", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let gw = FakeGateway::start("gw-k", 0x4B);
    let payloads: Vec<Vec<u8>> = (0..100).map(|i| format!("r{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
    gw.publish("t", &refs);
    mock.broker_down(1).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut c = DrainConfig::new(
        gw.uri().parse().unwrap(),
        format!("kafka://{brokers}/out").parse().unwrap(),
        dir.path().join("state.redb"),
    );
    c.once = true;
    c.progress = Mode::Off;
    c.backoff_initial = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(200);
    // Short delivery timeout so a down broker shows as failures (then resends).
    c.sink_options.kafka_delivery_timeout_ms = 1000;
    let metrics = Metrics::default();
    let m2 = metrics.clone();
    let (_t, stop) = Shutdown::new();
    let handle = std::thread::spawn(move || {
        smol::block_on(async {
            let d = Drain::open(c, m2, stop).await?;
            d.run().await
        })
    });
    // While the broker is down nothing is acknowledged, so nothing is committed.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(metrics.forwarded_records.get(), 0);
    assert_eq!(metrics.committed_offset.get(), 0);
    assert!(
        metrics.retries.get() >= 1,
        "delivery failures must be retried"
    );
    assert_eq!(gw.committed("bridge"), Some(0));
    mock.broker_up(1).unwrap();
    let s = handle.join().unwrap().unwrap();
    assert_eq!(s.records, 100);
    assert_eq!(gw.committed("bridge"), Some(100));
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    assert_eq!(store.load("gw-k", "bridge").unwrap().unwrap().offset, 100);
    // Every record arrived; resends after timeouts may add duplicates, never gaps.
    let msgs = consume_all(&brokers, "out", 1, 100);
    let mut offs: Vec<u64> = msgs
        .iter()
        .map(|m| m.headers["spillway-offset"].parse().unwrap())
        .collect();
    offs.sort_unstable();
    offs.dedup();
    assert_eq!(offs, (0..100).collect::<Vec<_>>());
}

#[test]
fn sink_enum_opens_kafka() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("x", 1, 1).unwrap();
    let spec = format!("kafka://{}/x", mock.bootstrap_servers())
        .parse()
        .unwrap();
    smol::block_on(async {
        let mut s = Sink::open(&spec, &Default::default()).await.unwrap();
        let src = Source {
            gateway_id: "g".into(),
            log_id: 1,
        };
        s.deliver(&src, &[rec(0, "t")]).await.unwrap();
        s.close(Duration::from_secs(5)).await;
    });
}

/// Produces to a real broker when `SPILLWAY_KAFKA_BROKER=host:port` is set (the topic
/// `SPILLWAY_KAFKA_TOPIC`, default `spillway-test`, must exist: some brokers do not
/// auto-create topics). Skipped otherwise.
#[test]
fn real_broker_if_configured() {
    let Ok(broker) = std::env::var("SPILLWAY_KAFKA_BROKER") else {
        eprintln!("SPILLWAY_KAFKA_BROKER not set: skipping the real broker test");
        return;
    };
    let topic = std::env::var("SPILLWAY_KAFKA_TOPIC").unwrap_or_else(|_| "spillway-test".into());
    let src = Source {
        gateway_id: "gw-real".into(),
        log_id: rand_id(),
    };
    let recs: Vec<_> = (0..20).map(|i| rec(i, "t")).collect();
    smol::block_on(async {
        let mut s = KafkaSink::new(&broker, &topic, 30_000).unwrap();
        s.deliver(&src, &recs).await.unwrap();
    });
}

fn rand_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

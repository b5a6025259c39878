//! Kafka sink tests against librdkafka's in-process mock cluster (and, when
//! `SPILLWAY_KAFKA_BROKER=host:port` is set, a real broker): keys, headers and order; the
//! checkpoint held while the broker is down; with several batches in flight, the
//! checkpoint held at the first unacknowledged record while later batches are acknowledged
//! first, and a shutdown bounded by its grace; the effectively-once resume from the
//! partition tails (a crash between delivery and the redb commit, a hole in one
//! partition, messages that do not match the gateway's records); a batch's accounting (a
//! failed report fails the batch at its lowest failed offset even when later records are
//! acknowledged; a batch larger than the producer's queue waits for room, in order); a
//! producer fenced by the broker or in librdkafka's fatal state replaced by a new one.
#![cfg(feature = "kafka")]

mod common;
#[path = "common/kafka_read.rs"]
mod kafka_read;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::wait::wait_until;
use common::{Background, SimGateway, drain_config, run_drain, spawn_drain};
use kafka_read::{consumer_from_beginning, partition_messages, rec};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use spillway_bridge::checkpoint::Store;
use spillway_bridge::client::{Client, FetchReply, OwnedRecord};
use spillway_bridge::drain::{DrainConfig, DrainSummary};
use spillway_bridge::metrics::Metrics;
use spillway_bridge::progress::Mode;
use spillway_bridge::sink::kafka::KafkaSink;
use spillway_bridge::sink::properties::KafkaProperties;
use spillway_bridge::sink::{KafkaKey, Sink, Source};

struct Msg {
    key: String,
    payload: Vec<u8>,
    headers: HashMap<String, String>,
    partition: i32,
}

/// Reads every message of `topic` (partitions 0..parts), up to the end of each partition
/// as the fetch responses report it (not ListOffsets: some brokers under-report it).
fn consume_everything(brokers: &str, topic: &str, parts: i32) -> Vec<Msg> {
    let c = consumer_from_beginning(brokers, topic, 0..parts, true);
    let mut eof = std::collections::HashSet::new();
    let mut out = Vec::new();
    let t = Instant::now();
    while eof.len() < parts as usize {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "partitions not read to the end"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => panic!("consume: {e}"),
            Some(Ok(m)) => out.push(to_msg(&m)),
        }
    }
    out
}

fn to_msg<M: Message>(m: &M) -> Msg {
    let mut headers = HashMap::new();
    if let Some(h) = m.headers() {
        for hd in h.iter() {
            headers.insert(
                hd.key.to_string(),
                String::from_utf8(hd.value.unwrap_or_default().to_vec()).unwrap(),
            );
        }
    }
    Msg {
        key: String::from_utf8(m.key().unwrap_or_default().to_vec()).unwrap(),
        payload: m.payload().unwrap_or_default().to_vec(),
        headers,
        partition: m.partition(),
    }
}

/// Creates `topic` with the admin API (brokers that do not auto-create topics need it).
fn create_topic(brokers: &str, topic: &str, parts: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let t = NewTopic::new(topic, parts, TopicReplication::Fixed(1));
    let res = smol::block_on(admin.create_topics([&t], &AdminOptions::new())).unwrap();
    for r in res {
        r.unwrap_or_else(|(name, e)| panic!("creating topic {name}: {e}"));
    }
}

/// A `--once` drain of `gw` into `kafka://brokers/topic`.
fn kafka_cfg(gw: &SimGateway, brokers: &str, topic: &str, dir: &std::path::Path) -> DrainConfig {
    let mut c = drain_config(gw, &format!("kafka://{brokers}/{topic}"), dir);
    c.sink_options.kafka_delivery_timeout_ms = 10_000;
    c
}

fn run(c: DrainConfig) -> (DrainSummary, Metrics) {
    let m = Metrics::default();
    let s = run_drain(c, &m).unwrap();
    (s, m)
}

/// [`run`] of [`kafka_cfg`] into topic `out`.
fn drain_out(gw: &SimGateway, brokers: &str, dir: &std::path::Path) -> (DrainSummary, Metrics) {
    run(kafka_cfg(gw, brokers, "out", dir))
}

/// A drain of `gw` into `kafka://brokers/out` with `DrainConfig`'s defaults but for no
/// progress display and a backoff from 20 ms to 200 ms (the outage tests' setting).
fn outage_cfg(gw: &SimGateway, brokers: &str, dir: &std::path::Path) -> DrainConfig {
    let mut c = DrainConfig::new(
        gw.uri().parse().unwrap(),
        format!("kafka://{brokers}/out").parse().unwrap(),
        dir.join("state.redb"),
    );
    c.progress = Mode::Off;
    c.backoff_initial = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(200);
    c
}

/// A mock cluster of `brokers` brokers with topic `topic` of `parts` partitions, and its
/// bootstrap servers.
fn mock_cluster(
    brokers: i32,
    topic: &str,
    parts: i32,
) -> (MockCluster<'static, DefaultProducerContext>, String) {
    let mock = MockCluster::new(brokers).unwrap();
    mock.create_topic(topic, parts, 1).unwrap();
    let servers = mock.bootstrap_servers();
    (mock, servers)
}

fn source(gateway_id: &str, log_id: u128) -> Source {
    Source {
        gateway_id: gateway_id.into(),
        log_id,
    }
}

/// Delivers `recs` as `src`'s straight into `kafka://brokers/topic`, past any drain.
fn deliver(brokers: &str, topic: &str, src: &Source, recs: &[OwnedRecord]) {
    smol::block_on(async {
        let mut k = KafkaSink::new(brokers, topic, 10_000).unwrap();
        k.deliver(src, recs).await.unwrap();
    });
}

/// The gateway's records `from..to`, as the bridge fetches them.
fn gateway_records(gw: &SimGateway, from: u64, to: u64) -> Vec<OwnedRecord> {
    smol::block_on(async {
        let mut c = Client::connect(&gw.uri().parse().unwrap(), "test", Duration::from_secs(2))
            .await
            .unwrap();
        let mut out = Vec::new();
        while (out.len() as u64) < to - from {
            let at = from + out.len() as u64;
            let FetchReply::Records { records, .. } =
                c.fetch(None, at, 64 * 1024, Duration::ZERO).await.unwrap()
            else {
                panic!("records gone")
            };
            out.extend(records.into_iter().filter(|r| r.offset < to));
        }
        out
    })
}

fn publish_n(gw: &SimGateway, topics: &[&str], from: usize, n: usize) {
    for i in from..from + n {
        let p = format!("r{i}");
        gw.publish(topics[i % topics.len()], &[p.as_bytes()]);
    }
}

/// Gateway offsets (header `spillway-offset`) of every message, sorted.
fn offsets(msgs: &[Msg]) -> Vec<u64> {
    let mut v: Vec<u64> = msgs
        .iter()
        .map(|m| m.headers["spillway-offset"].parse().unwrap())
        .collect();
    v.sort_unstable();
    v
}

/// Reads every message of `topic` (partitions 0..parts) from the beginning.
fn consume_all(brokers: &str, topic: &str, parts: i32, want: usize) -> Vec<Msg> {
    let c = consumer_from_beginning(brokers, topic, 0..parts, false);
    let mut out = Vec::new();
    let t = Instant::now();
    while out.len() < want && t.elapsed() < Duration::from_secs(30) {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        out.push(to_msg(&m.unwrap()));
    }
    out
}

#[test]
fn delivers_with_key_and_headers() {
    let (_mock, brokers) = mock_cluster(1, "out", 3);
    let src = source("gw-9", 0xABC);
    let recs: Vec<_> = (0..50)
        .map(|i| rec(i, if i % 2 == 0 { "buoy/sst" } else { "cgm" }))
        .collect();
    deliver(&brokers, "out", &src, &recs);
    let msgs = consume_all(&brokers, "out", 3, 50);
    assert_eq!(msgs.len(), 50);
    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    let mut key_partition: HashMap<String, i32> = HashMap::new();
    for m in &msgs {
        let off: u64 = m.headers["spillway-offset"].parse().unwrap();
        // Keyed by gateway id alone: one gateway's records keep their order in one partition.
        assert_eq!(m.key, "gw-9");
        assert!(["buoy/sst", "cgm"].contains(&m.headers["spillway-topic"].as_str()));
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
    let (mock, brokers) = mock_cluster(1, "out", 1);
    let gw = SimGateway::start("gw-k", 0x4B);
    let payloads: Vec<Vec<u8>> = (0..100).map(|i| format!("r{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
    gw.publish("t", &refs);
    mock.broker_down(1).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut c = outage_cfg(&gw, &brokers, dir.path());
    c.once = true;
    // Short delivery timeout so a down broker shows as failures (then resends).
    c.sink_options.kafka_delivery_timeout_ms = 1000;
    c.kafka_resume_timeout = Duration::from_millis(500);
    let Background {
        handle,
        metrics,
        trigger: _trigger,
    } = spawn_drain(c);
    // While the broker is down nothing is acknowledged, so nothing is committed: looked at
    // once the failures were retried.
    wait_until(
        Duration::from_secs(30),
        || (metrics.retries.get() >= 1).then_some(()),
        || "delivery failures must be retried".to_string(),
    );
    assert_eq!(metrics.forwarded_records.get(), 0);
    assert_eq!(metrics.committed_offset.get(), 0);
    assert_eq!(gw.committed("bridge"), Some(0));
    mock.broker_up(1).unwrap();
    let s = handle.join().unwrap().unwrap();
    assert_eq!(s.records, 100);
    assert_eq!(gw.committed("bridge"), Some(100));
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    assert_eq!(store.load("gw-k", "bridge").unwrap().unwrap().offset, 100);
    // Every record arrived; resends after timeouts may add duplicates, never gaps.
    let mut offs = offsets(&consume_all(&brokers, "out", 1, 100));
    offs.dedup();
    assert_eq!(offs, (0..100).collect::<Vec<_>>());
}

/// Gateway offsets (header `spillway-offset`) of partition `partition` of `topic`, in log
/// order (duplicates kept), read up to the end of that partition only.
fn partition_offsets(brokers: &str, topic: &str, partition: i32) -> Vec<u64> {
    let messages = partition_messages(brokers, topic, partition);
    messages.into_iter().map(|(offset, _)| offset).collect()
}

/// Two gateway topics whose keys (`<gateway id>/<topic>`, [`KafkaKey::GatewayTopic`]) the producer's partitioner puts
/// in partitions 0 and 1 of a 2-partition topic, found by producing probes.
fn topics_for_partitions(brokers: &str, gateway_id: &str) -> (String, String) {
    let names: Vec<String> = (0..16).map(|i| format!("t{i}")).collect();
    let src = source(gateway_id, 1);
    let recs: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| rec(i as u64, n))
        .collect();
    smol::block_on(async {
        let mut k = KafkaSink::new(brokers, "probe", 10_000)
            .unwrap()
            .keyed_by(KafkaKey::GatewayTopic);
        k.deliver(&src, &recs).await.unwrap();
    });
    let msgs = consume_everything(brokers, "probe", 2);
    let in_partition = |p: i32| {
        msgs.iter()
            .find(|m| m.partition == p)
            .map(|m| m.headers["spillway-topic"].clone())
            .unwrap_or_else(|| panic!("no probe key landed in partition {p}"))
    };
    (in_partition(0), in_partition(1))
}

/// With several batches in flight, the checkpoint never passes an unacknowledged record.
///
/// Partition 0's leader (broker 1) goes down mid-stream: the next batch, of topic `slow`
/// (partition 0), cannot be delivered, while the batches after it, of topic `fast`
/// (partition 1, broker 2), are acknowledged first. For the whole outage the checkpoint
/// (metrics, the gateway's commit) stays at the first `slow` record even though later
/// offsets are in Kafka, and the failures are retried. After the broker returns,
/// everything arrives, each record in its key's partition, and in each partition the last
/// copy of every record is in offset order (resends repeat a suffix in order, never
/// reorder). Guards against checkpointing the highest acknowledged batch instead of the
/// acknowledged head of the window.
#[test]
fn a_later_batch_acknowledged_first_never_moves_the_checkpoint_past_an_earlier_one() {
    let (mock, brokers) = mock_cluster(2, "out", 2);
    mock.create_topic("probe", 2, 1).unwrap();
    mock.partition_leader("out", 0, Some(1)).unwrap();
    mock.partition_leader("out", 1, Some(2)).unwrap();
    let gw_id = "gw-ooo";
    let (slow, fast) = topics_for_partitions(&brokers, gw_id);
    let gw = SimGateway::start(gw_id, 0x000F);
    // Offsets 0..20: both partitions, while both brokers are up.
    for i in 0..20 {
        let t = if i % 2 == 0 { &slow } else { &fast };
        gw.publish(t, &[format!("r{i}").as_bytes()]);
    }

    let dir = tempfile::tempdir().unwrap();
    let mut c = outage_cfg(&gw, &brokers, dir.path());
    c.max_batch_bytes = 256;
    c.max_in_flight_batches = 4;
    c.poll_wait = Duration::from_millis(50);
    c.sink_options.kafka_delivery_timeout_ms = 800;
    c.kafka_resume_window = 0;
    // One gateway's records in two partitions: keyed by gateway and topic.
    c.sink_options.kafka_key = KafkaKey::GatewayTopic;
    let Background {
        handle,
        metrics,
        trigger,
    } = spawn_drain(c);
    let wait_committed = |o: u64, what: &str| {
        wait_until(
            Duration::from_secs(30),
            || (gw.committed("bridge") == Some(o)).then_some(()),
            || {
                format!(
                    "{what}: gateway commit {:?}, want {o}",
                    gw.committed("bridge")
                )
            },
        );
    };
    wait_committed(20, "before the outage");

    // Broker 1 goes down; offsets 20..26 go to it, 26..86 to broker 2.
    mock.broker_down(1).unwrap();
    let retries_before = metrics.retries.get();
    let publish = |topic: &str, offsets: std::ops::Range<u64>| {
        let payloads: Vec<Vec<u8>> = offsets
            .clone()
            .map(|i| format!("r{i}").into_bytes())
            .collect();
        let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        assert_eq!(gw.publish(topic, &refs), offsets.collect::<Vec<_>>());
    };
    publish(&slow, 20..26);
    publish(&fast, 26..86);
    // Deliberate: watched for 3 s of the outage at least (and until a later batch is in
    // Kafka), the checkpoint never passes the unacknowledged offset 20.
    let t = Instant::now();
    let mut later_delivered = false;
    while t.elapsed() < Duration::from_secs(3) || !later_delivered {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no batch after the failed one was delivered during the outage"
        );
        let committed = metrics.committed_offset.get();
        assert!(
            committed <= 20,
            "checkpoint {committed} passed offset 20, which is not acknowledged"
        );
        let on_gateway = gw.committed("bridge").unwrap();
        assert!(on_gateway <= 20, "gateway commit {on_gateway} passed 20");
        if !later_delivered {
            later_delivered = partition_offsets(&brokers, "out", 1)
                .iter()
                .any(|&o| o >= 26);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metrics.committed_offset.get(), 20);
    assert!(
        metrics.retries.get() > retries_before,
        "the failed delivery must be retried"
    );

    mock.broker_up(1).unwrap();
    wait_committed(86, "after the outage");
    trigger.trigger();
    let s = handle.join().unwrap().unwrap();
    assert_eq!(s.offset, 86);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    assert_eq!(store.load(gw_id, "bridge").unwrap().unwrap().offset, 86);

    let want = |p: &str| -> Vec<u64> {
        (0..86u64)
            .filter(|&i| {
                let t = if i < 20 {
                    if i % 2 == 0 { &slow } else { &fast }
                } else if i < 26 {
                    &slow
                } else {
                    &fast
                };
                t == p
            })
            .collect()
    };
    for (partition, topic) in [(0, &slow), (1, &fast)] {
        let log = partition_offsets(&brokers, "out", partition);
        // The last copy of each record, in log order.
        let mut last: Vec<u64> = Vec::new();
        for (i, o) in log.iter().enumerate() {
            if !log[i + 1..].contains(o) {
                last.push(*o);
            }
        }
        assert_eq!(
            last,
            want(topic),
            "partition {partition}: every record of {topic:?}, last copies in offset order \
             (log: {log:?})"
        );
    }
}

/// A shutdown with batches in flight that the broker never acknowledges (it is down and the
/// delivery timeout is long) exits cleanly once the grace has run out, with the checkpoint
/// where it was; the next run delivers everything.
#[test]
fn shutdown_gives_up_on_unacknowledged_batches_after_the_grace() {
    let (mock, brokers) = mock_cluster(1, "out", 1);
    let gw = SimGateway::start("gw-stop", 0x570);
    publish_n(&gw, &["t"], 0, 50);
    mock.broker_down(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = kafka_cfg(&gw, &brokers, "out", dir.path());
    c.once = false;
    c.max_batch_bytes = 256;
    c.kafka_resume_window = 0;
    c.sink_options.kafka_delivery_timeout_ms = 60_000;
    let grace = Duration::from_millis(500);
    c.shutdown_grace = grace;
    let Background {
        handle,
        metrics,
        trigger,
    } = spawn_drain(c);
    // Batches are in flight once the drain fetches past the first one (the fetcher hands
    // each batch over before it asks for the next).
    wait_until(
        Duration::from_secs(30),
        || (gw.fetched_from() > 0).then_some(()),
        || "the drain fetched no batch".to_string(),
    );
    let t = Instant::now();
    trigger.trigger();
    let s = handle.join().unwrap().unwrap();
    // The grace (waited out: a batch was unacknowledged), the producer's final flush (5 s
    // at most) and the final commit.
    assert!(
        t.elapsed() >= grace && t.elapsed() < Duration::from_secs(8),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.offset, 0);
    assert_eq!(metrics.committed_offset.get(), 0);
    assert_eq!(gw.committed("bridge"), Some(0));

    mock.broker_up(1).unwrap();
    let (s, _) = drain_out(&gw, &brokers, dir.path());
    assert_eq!(s.offset, 50);
    let mut offs = offsets(&consume_everything(&brokers, "out", 1));
    offs.dedup();
    assert_eq!(offs, (0..50).collect::<Vec<_>>());
}

#[test]
fn sink_enum_opens_kafka() {
    let (_mock, brokers) = mock_cluster(1, "x", 1);
    let spec = format!("kafka://{brokers}/x").parse().unwrap();
    smol::block_on(async {
        let mut s = Sink::open(&spec, &Default::default()).await.unwrap();
        let src = source("g", 1);
        s.deliver(&src, &[rec(0, "t")]).await.unwrap();
        s.close(Duration::from_secs(5)).await;
    });
}

/// A crash after Kafka acknowledged records and before redb saved their checkpoint
/// (simulated by putting an older checkpoint back): the next start finds the records in
/// the partition tail, checks them against the gateway, and resumes after them, so the
/// topic holds every offset exactly once. A window of 4 messages is too small and grows.
#[test]
fn resume_from_the_partition_tail_sends_nothing_twice() {
    let (_mock, brokers) = mock_cluster(1, "out", 1);
    let gw = SimGateway::start("gw-eo", 0xE0);
    let dir = tempfile::tempdir().unwrap();
    publish_n(&gw, &["a", "b"], 0, 40);
    assert_eq!(drain_out(&gw, &brokers, dir.path()).0.records, 40);
    let state = dir.path().join("state.redb");
    let load = || {
        Store::open(&state)
            .unwrap()
            .load("gw-eo", "bridge")
            .unwrap()
            .unwrap()
    };
    let at_40 = load();
    publish_n(&gw, &["a", "b"], 40, 60);
    assert_eq!(drain_out(&gw, &brokers, dir.path()).0.records, 60);
    let at_100 = load();
    // The crash: Kafka has 40..100, redb still says 40.
    Store::open(&state)
        .unwrap()
        .save("gw-eo", "bridge", &at_40)
        .unwrap();

    let mut c = kafka_cfg(&gw, &brokers, "out", dir.path());
    c.kafka_resume_window = 4;
    let (s, m) = run(c);
    assert_eq!(s.records, 0, "nothing sent again");
    assert_eq!(s.offset, 100);
    assert_eq!(m.sink_resumed.get(), 60);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let cp = store.load("gw-eo", "bridge").unwrap().unwrap();
    assert_eq!(cp.offset, 100);
    assert_eq!(cp.last_crc, at_100.last_crc, "CRC chain continues");
    let resumes = store.sink_resumes(0xE0).unwrap();
    assert_eq!(resumes.len(), 1);
    assert_eq!((resumes[0].from, resumes[0].to), (40, 100));
    assert_eq!((resumes[0].verified, resumes[0].highest_in_sink), (60, 99));
    assert_eq!(gw.committed("bridge"), Some(100));
    drop(store);

    // Later records still flow, and the resume check at 100 uses the CRC taken above.
    publish_n(&gw, &["a", "b"], 100, 10);
    assert_eq!(drain_out(&gw, &brokers, dir.path()).0.records, 10);
    let msgs = consume_everything(&brokers, "out", 1);
    assert_eq!(offsets(&msgs), (0..110).collect::<Vec<_>>(), "each once");
}

/// Offsets 10..20 reached Kafka except 15 (another partition, say): the resume moves the
/// checkpoint over the consecutive run 10..15 only, so 15 is not lost; 16..19, found after
/// the hole and checked against the gateway, are not sent again.
#[test]
fn a_hole_resends_only_the_missing_offset() {
    let (_mock, brokers) = mock_cluster(1, "out", 3);
    let gw = SimGateway::start("gw-hole", 0x401E);
    let dir = tempfile::tempdir().unwrap();
    publish_n(&gw, &["a", "b", "c"], 0, 10);
    assert_eq!(drain_out(&gw, &brokers, dir.path()).0.records, 10);
    publish_n(&gw, &["a", "b", "c"], 10, 10);
    // Kafka gets 10..20 but 15; redb stays at 10 (the crash).
    let src = source("gw-hole", 0x401E);
    let recs: Vec<_> = gateway_records(&gw, 10, 20)
        .into_iter()
        .filter(|r| r.offset != 15)
        .collect();
    deliver(&brokers, "out", &src, &recs);
    let (s, m) = drain_out(&gw, &brokers, dir.path());
    assert_eq!(s.records, 1, "only 15 sent");
    assert_eq!(m.sink_resumed.get(), 9, "10..15 and 16..20 found");
    assert_eq!(s.offset, 20);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let r = &store.sink_resumes(0x401E).unwrap()[0];
    assert_eq!((r.from, r.to, r.highest_in_sink), (10, 15, 19));
    let offs = offsets(&consume_everything(&brokers, "out", 3));
    assert_eq!(offs, (0..20).collect::<Vec<_>>(), "each once");
    let cp = store.load("gw-hole", "bridge").unwrap().unwrap();
    assert_eq!(cp.records, 20);
}

/// Messages that carry this log id but not the gateway's records (payloads differ) are
/// not trusted: the drain resumes at its checkpoint and sends everything after it.
#[test]
fn messages_that_differ_from_the_gateway_are_not_trusted() {
    let (_mock, brokers) = mock_cluster(1, "out", 1);
    let gw = SimGateway::start("gw-x", 0x5EED);
    let dir = tempfile::tempdir().unwrap();
    publish_n(&gw, &["t"], 0, 10);
    assert_eq!(drain_out(&gw, &brokers, dir.path()).0.records, 10);
    publish_n(&gw, &["t"], 10, 10);
    let src = source("gw-x", 0x5EED);
    let forged: Vec<_> = gateway_records(&gw, 10, 20)
        .into_iter()
        .map(|mut r| {
            r.payload = bytes::Bytes::from_static(b"not this");
            r
        })
        .collect();
    deliver(&brokers, "out", &src, &forged);
    let (s, m) = drain_out(&gw, &brokers, dir.path());
    assert_eq!(s.records, 10);
    assert_eq!(m.sink_resumed.get(), 0);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    assert!(store.sink_resumes(0x5EED).unwrap().is_empty());
}

/// The scan reads only the tail window of each partition and only this log's records;
/// a topic that does not exist holds nothing.
#[test]
fn scan_tail_reads_each_partition_tail() {
    let (_mock, brokers) = mock_cluster(1, "out", 2);
    let mine = source("g", 7);
    let other = source("g", 8);
    let recs: Vec<_> = (0..30)
        .map(|i| rec(i, if i % 2 == 0 { "even" } else { "odd" }))
        .collect();
    smol::block_on(async {
        let mut k = KafkaSink::new(&brokers, "out", 10_000).unwrap();
        k.deliver(&mine, &recs).await.unwrap();
        k.deliver(&other, &recs[..5]).await.unwrap();
        let s = k
            .scan_tail("out", 7, 20, 1000, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(s.partitions, 2);
        assert_eq!(s.messages_read, 35);
        assert!(s.whole_topic);
        assert_eq!(s.highest, Some(29));
        assert_eq!(s.lowest, Some(0));
        assert_eq!(
            s.found.keys().copied().collect::<Vec<_>>(),
            (20..30).collect::<Vec<_>>()
        );
        assert_eq!(s.found[&21].topic, "odd");
        assert_eq!(s.found[&21].payload, b"p21");
        assert_eq!(s.contiguous_end(20), 30);
        // A window of 3 messages per partition: the other log's 5 came last.
        let s = k
            .scan_tail("out", 7, 0, 3, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(!s.whole_topic);
        assert!(
            s.found.is_empty() || s.lowest.unwrap() >= 26,
            "{:?}",
            s.lowest
        );
        let none = KafkaSink::new(&brokers, "absent", 10_000).unwrap();
        let s = none
            .scan_tail("absent", 7, 0, 10, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(s.found.is_empty());
    });
}

/// Against a real broker when `SPILLWAY_KAFKA_BROKER=host:port` is set (`.ci/run` starts
/// one): creates a fresh topic with the admin API, delivers records, reads back exactly
/// those records in order with their headers, and scans the partition tail. Skipped
/// otherwise.
#[test]
fn real_broker_if_configured() {
    let Ok(broker) = std::env::var("SPILLWAY_KAFKA_BROKER") else {
        eprintln!("SPILLWAY_KAFKA_BROKER not set: skipping the real broker test");
        return;
    };
    let topic = format!("spillway-sink-{:x}", rand_id());
    create_topic(&broker, &topic, 1);
    let log_id = rand_id();
    let src = source("gw-real", log_id);
    let n = 200u64;
    let recs: Vec<_> = (0..n).map(|i| rec(i, "t")).collect();
    smol::block_on(async {
        let mut s = KafkaSink::new(&broker, &topic, 30_000).unwrap();
        s.deliver(&src, &recs).await.unwrap();
        let scan = s
            .scan_tail(&topic, log_id, 150, 100, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(scan.partitions, 1);
        // At least the window; more where the broker under-reports the high watermark.
        assert!(
            (100..=n).contains(&scan.messages_read),
            "{}",
            scan.messages_read
        );
        assert_eq!(scan.highest, Some(n - 1));
        assert!(scan.lowest.is_some_and(|l| l <= 100), "{:?}", scan.lowest);
        assert_eq!(
            scan.found.keys().copied().collect::<Vec<_>>(),
            (150..n).collect::<Vec<_>>()
        );
        assert_eq!(scan.contiguous_end(150), n);
        s.close(Duration::from_secs(5)).await;
    });
    let msgs = consume_everything(&broker, &topic, 1);
    assert_eq!(msgs.len() as u64, n, "exactly the records sent");
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.headers["spillway-offset"], i.to_string(), "in order");
        assert_eq!(m.headers["spillway-log-id"], format!("{log_id:032x}"));
        assert_eq!(m.headers["spillway-gateway"], "gw-real");
        assert_eq!(m.headers["spillway-topic"], "t");
        assert_eq!(m.key, "gw-real");
        assert_eq!(m.payload, format!("p{i}").into_bytes());
    }
    let absent = KafkaSink::new(&broker, &format!("{topic}-absent"), 30_000).unwrap();
    let scan = smol::block_on(absent.scan_tail(
        &format!("{topic}-absent"),
        log_id,
        0,
        10,
        Duration::from_secs(10),
    ))
    .unwrap();
    assert_eq!(scan.partitions, 0);
}

fn rand_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A gap becomes a record with an empty payload and the header `spillway-gap` = `A..B
/// reason`, keyed by the gateway id like the gateway's records, without an offset header.
#[test]
fn a_gap_is_a_record_with_an_empty_payload_and_a_gap_header() {
    let (_mock, brokers) = mock_cluster(1, "out", 2);
    let src = source("gw-gap", 0x9a9);
    smol::block_on(async {
        let mut s = KafkaSink::new(&brokers, "out", 10_000).unwrap();
        s.deliver(&src, &[rec(0, "t"), rec(1, "t")]).await.unwrap();
        s.deliver_gap(
            &src,
            &spillway_bridge::sink::GapNotice::new(2, 7, "dropped-oldest"),
        )
        .await
        .unwrap();
        s.deliver(&src, &[rec(7, "t")]).await.unwrap();
    });
    let msgs = consume_everything(&brokers, "out", 2);
    assert_eq!(msgs.len(), 4);
    assert!(
        msgs.iter()
            .all(|m| m.key == "gw-gap" && m.partition == msgs[0].partition)
    );
    let gap = &msgs[2];
    assert!(gap.payload.is_empty());
    assert_eq!(gap.headers["spillway-gap"], "2..7 dropped");
    assert_eq!(gap.headers["spillway-gateway"], "gw-gap");
    assert_eq!(
        gap.headers["spillway-log-id"],
        "000000000000000000000000000009a9"
    );
    assert!(!gap.headers.contains_key("spillway-offset"));
    assert_eq!(msgs[3].headers["spillway-offset"], "7");
}

/// `kafka://…/out.{topic}`: each Spillway topic goes to its own Kafka topic (`a/x` to
/// `out.a_x`, `b y` to `out.b_y`). A crash that left every later record of `a/x` in Kafka
/// and none of `b y`: the resume reads both topics, moves the checkpoint to the first
/// missing record and sends only the missing ones. A gap record goes to both topics.
#[test]
fn a_topic_template_maps_each_topic_and_resumes_over_all_of_them() {
    let (mock, brokers) = mock_cluster(1, "out.a_x", 2);
    mock.create_topic("out.b_y", 2, 1).unwrap();
    let gw = SimGateway::start("gw-map", 0x3a9);
    let dir = tempfile::tempdir().unwrap();
    let topics = ["a/x", "b y"];
    publish_n(&gw, &topics, 0, 40);
    let cfg = || kafka_cfg(&gw, &brokers, "out.{topic}", dir.path());
    assert_eq!(run(cfg()).0.records, 40);
    publish_n(&gw, &topics, 40, 20);
    // The crash: Kafka got 40..60 of `a/x` (even offsets), none of `b y`; redb says 40.
    let src = source("gw-map", 0x3a9);
    let evens: Vec<_> = gateway_records(&gw, 40, 60)
        .into_iter()
        .filter(|r| r.offset % 2 == 0)
        .collect();
    deliver(&brokers, "out.{topic}", &src, &evens);
    let (s, m) = run(cfg());
    assert_eq!(s.records, 10, "only the odd offsets sent");
    assert_eq!(m.sink_resumed.get(), 10);
    assert_eq!(s.offset, 60);
    // A gap goes to every Kafka topic of the gateway's records.
    smol::block_on(async {
        let mut k = KafkaSink::new(&brokers, "out.{topic}", 10_000).unwrap();
        k.deliver(&src, &gateway_records(&gw, 58, 60))
            .await
            .unwrap();
        k.deliver_gap(
            &src,
            &spillway_bridge::sink::GapNotice::new(60, 62, "dropped"),
        )
        .await
        .unwrap();
    });
    for (k, kafka_topic) in ["out.a_x", "out.b_y"].iter().enumerate() {
        let msgs = consume_everything(&brokers, kafka_topic, 2);
        let (gaps, recs): (Vec<_>, Vec<_>) = msgs
            .iter()
            .partition(|m| m.headers.contains_key("spillway-gap"));
        assert_eq!(gaps.len(), 1, "{kafka_topic}");
        let mut offs: Vec<u64> = recs
            .iter()
            .map(|m| {
                assert_eq!(m.headers["spillway-topic"], topics[k]);
                m.headers["spillway-offset"].parse().unwrap()
            })
            .collect();
        // 58 or 59 was sent twice on purpose above, for the gap record's topics.
        offs.pop();
        let want: Vec<u64> = (0..60).filter(|o| o % 2 == k as u64).collect();
        assert_eq!(offs, want, "{kafka_topic}: each once, in order");
    }
    // A template Kafka would refuse is a configuration error.
    assert!(matches!(
        KafkaSink::new(&brokers, "a+{topic}", 10_000),
        Err(spillway_bridge::sink::SinkError::Config(_))
    ));
}

/// One batch over two Kafka topics led by two brokers (`out.{topic}`), with gaps between
/// its offsets: offsets 0-3 and 20-22 to `out.b` (broker 2, up), 10-11 to `out.a` (broker
/// 1, down). The reports of 20-22 arrive while 10-11 are still waiting; 10-11 time out. The
/// batch fails at offset 10 with the 4 records before it acknowledged, not at the last
/// report's record and not with the acknowledged 20-22 counted: a resend from 10 loses
/// nothing. Guards the per-batch delivery state, where reports arrive out of offset order.
#[test]
fn a_failed_report_fails_the_batch_at_its_lowest_offset() {
    let (mock, brokers) = mock_cluster(2, "out.a", 1);
    mock.create_topic("out.b", 1, 1).unwrap();
    mock.partition_leader("out.a", 0, Some(1)).unwrap();
    mock.partition_leader("out.b", 0, Some(2)).unwrap();
    mock.broker_down(1).unwrap();
    let recs: Vec<OwnedRecord> = [0, 1, 2, 3]
        .map(|o| rec(o, "b"))
        .into_iter()
        .chain([10, 11].map(|o| rec(o, "a")))
        .chain([20, 21, 22].map(|o| rec(o, "b")))
        .collect();
    let e = smol::block_on(async {
        let mut k = KafkaSink::new(&brokers, "out.{topic}", 1500).unwrap();
        let r = k.deliver(&source("gw-b", 0xB), &recs).await;
        k.close(Duration::from_secs(5)).await;
        r
    })
    .expect_err("offsets 10 and 11 cannot be delivered");
    assert_eq!(e.delivered, 4, "{e}");
    assert!(
        matches!(e.error, spillway_bridge::sink::SinkError::Timeout),
        "{e}"
    );
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
    let (_mock, brokers) = mock_cluster(1, "out", 1);
    let mut props = KafkaProperties::default();
    props.set("queue.buffering.max.messages", "7").unwrap();
    let recs: Vec<OwnedRecord> = (0..300).map(|o| rec(o, "t")).collect();
    smol::block_on(async {
        let mut k = KafkaSink::with_properties(&brokers, "out", 10_000, &props).unwrap();
        k.deliver(&source("gw-b", 0xB), &recs).await.unwrap();
        k.close(Duration::from_secs(5)).await;
    });
    let got = partition_messages(&brokers, "out", 0);
    let want: Vec<(u64, Vec<u8>)> = (0..300u64)
        .map(|o| (o, format!("p{o}").into_bytes()))
        .collect();
    assert_eq!(got, want);
}

/// The broker answers a produce request with `PRODUCER_FENCED` (as a broker stalled past
/// `message.timeout.ms` answered every resend of the bridge's idempotent producer, whose
/// producer id librdkafka keeps): the failure says the producer is done for, a new one
/// takes over (once for every handle sharing it), and delivers.
#[test]
fn a_fenced_producer_is_replaced_once_for_every_handle_and_delivers_again() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use spillway_bridge::sink::SinkError;
    let (mock, brokers) = mock_cluster(1, "out", 1);
    let src = source("gw-f", 0xF);
    smol::block_on(async {
        let mut a = KafkaSink::new(&brokers, "out", 10_000).unwrap();
        let mut b = a.clone();
        a.deliver(&src, &[rec(0, "t")]).await.unwrap();
        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
        );
        let e = a
            .deliver(&src, &[rec(1, "t"), rec(2, "t")])
            .await
            .unwrap_err();
        assert_eq!(e.delivered, 0);
        assert!(
            matches!(&e.error, SinkError::ProducerFailed(m)
                if m.fenced && m.reason.contains("ProducerFenced")),
            "{e}"
        );
        assert!(a.recreate().await.unwrap(), "the first handle creates it");
        assert!(!b.recreate().await.unwrap(), "the second takes it up");
        assert!(a.fatal_error().is_none());
        a.deliver(&src, &[rec(1, "t"), rec(2, "t")]).await.unwrap();
        b.deliver(&src, &[rec(3, "t")]).await.unwrap();
    });
    let offs: Vec<u64> = consume_everything(&brokers, "out", 1)
        .iter()
        .map(|m| m.headers["spillway-offset"].parse().unwrap())
        .collect();
    assert_eq!(offs, [0, 1, 2, 3], "each once, in order");
}

/// librdkafka's own fatal error (raised here with its test hook, as its idempotent producer
/// raises it when a sequence is lost for good): `fatal_error` reports it, every delivery
/// fails with `ProducerFailed`, and a new producer delivers.
#[test]
fn a_producer_in_librdkafkas_fatal_state_is_reported_and_replaced() {
    use rdkafka::bindings::{rd_kafka_resp_err_t, rd_kafka_test_fatal_error};
    use rdkafka::producer::Producer;
    use spillway_bridge::sink::SinkError;
    let (_mock, brokers) = mock_cluster(1, "out", 1);
    let src = source("gw-x", 0xE);
    smol::block_on(async {
        let mut k = KafkaSink::new(&brokers, "out", 10_000).unwrap();
        k.deliver(&src, &[rec(0, "t")]).await.unwrap();
        assert!(k.fatal_error().is_none());
        // SAFETY: the producer's handle is alive (owned by `k`) and the reason is a
        // NUL-terminated string that outlives the call.
        let raised = unsafe {
            rd_kafka_test_fatal_error(
                k.producer().client().native_ptr(),
                rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                c"sequence lost in a test".as_ptr(),
            )
        };
        assert_eq!(raised, rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        let why = k.fatal_error().expect("fatal error reported");
        assert!(
            why.reason.contains("sequence lost in a test") && !why.fenced,
            "{why:?}"
        );
        let e = k.deliver(&src, &[rec(1, "t")]).await.unwrap_err();
        assert!(matches!(e.error, SinkError::ProducerFailed(_)), "{e}");
        assert!(k.recreate().await.unwrap());
        assert!(k.fatal_error().is_none());
        k.deliver(&src, &[rec(1, "t")]).await.unwrap();
    });
    let offs = offsets(&consume_everything(&brokers, "out", 1));
    assert_eq!(offs, [0, 1]);
}

/// A drain whose produce request is answered `PRODUCER_FENCED` replaces the producer
/// (counted), resumes through the tail scan and delivers every record once, in order; with
/// `--once` it ends with exit 0 well inside its retry budget (before, every resend failed
/// the same way until the budget ran out).
#[test]
fn a_drain_replaces_a_fenced_producer_and_delivers_everything_once() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let (mock, brokers) = mock_cluster(1, "out", 1);
    let gw = SimGateway::start("gw-fenced", 0x90);
    publish_n(&gw, &["t"], 0, 300);
    let dir = tempfile::tempdir().unwrap();
    let mut c = kafka_cfg(&gw, &brokers, "out", dir.path());
    c.retry_for = Some(Duration::from_secs(20));
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
    );
    let t = Instant::now();
    let (s, m) = run(c);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(s.offset, 300);
    assert_eq!(m.producers_recreated.get(), 1);
    // The whole partition, read to its end: in partition order, each record once.
    let offs: Vec<u64> = consume_everything(&brokers, "out", 1)
        .iter()
        .map(|m| m.headers["spillway-offset"].parse().unwrap())
        .collect();
    assert_eq!(offs, (0..300).collect::<Vec<u64>>(), "each once, in order");
}

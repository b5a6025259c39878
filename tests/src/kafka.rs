//! A Kafka broker for end-to-end tests and benchmarks: the real broker named by
//! `SPILLWAY_KAFKA_BROKER=host:port` (`scripts/kafka-broker.sh start` runs tansu on
//! 127.0.0.1:19092), librdkafka's in-process mock cluster, or a broker process of the test's
//! own ([`BrokerProcess`], for a test that pauses or stops it); plus topic creation and a
//! consumer that reads whole partitions.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The environment variable naming a real broker (`host:port`).
pub const BROKER_ENV: &str = "SPILLWAY_KAFKA_BROKER";

/// A broker to test against.
pub enum Broker {
    /// A broker process reached at this address.
    Real(String),
    /// librdkafka's mock cluster, alive as long as this value.
    Mock(MockCluster<'static, DefaultProducerContext>),
}

impl Broker {
    /// The real broker of `SPILLWAY_KAFKA_BROKER`, if set.
    pub fn real() -> Option<Broker> {
        std::env::var(BROKER_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .map(Broker::Real)
    }

    /// A fresh mock cluster with one broker.
    pub fn mock() -> Broker {
        Broker::Mock(MockCluster::new(1).expect("mock cluster"))
    }

    /// The real broker if configured, otherwise a mock cluster.
    pub fn real_or_mock() -> Broker {
        Broker::real().unwrap_or_else(Broker::mock)
    }

    /// Bootstrap servers.
    pub fn bootstrap(&self) -> String {
        match self {
            Broker::Real(s) => s.clone(),
            Broker::Mock(m) => m.bootstrap_servers(),
        }
    }

    /// The bridge's `--sink` URI for `topic` on this broker: `kafka://BOOTSTRAP/TOPIC`.
    pub fn sink_uri(&self, topic: &str) -> String {
        format!("kafka://{}/{topic}", self.bootstrap())
    }

    /// What this is, for messages: `tansu at 127.0.0.1:19092` style.
    pub fn describe(&self) -> String {
        match self {
            Broker::Real(s) => format!("broker process at {s}"),
            Broker::Mock(m) => format!("librdkafka mock cluster at {}", m.bootstrap_servers()),
        }
    }

    /// Creates a topic with a unique name starting with `prefix` (so reruns against a
    /// long-lived broker never collide) and returns its name.
    pub fn new_topic(&self, prefix: &str, partitions: i32) -> String {
        let name = unique_name(prefix);
        self.create_topic(&name, partitions);
        name
    }

    /// Creates the topic `name` with `partitions` partitions.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        match self {
            Broker::Mock(m) => m
                .create_topic(name, partitions, 1)
                .expect("mock create topic"),
            Broker::Real(b) => create_topic(b, name, partitions),
        }
    }
}

/// The broker binary `scripts/kafka-broker.sh` installed (`scripts/kafka-broker.sh bin`).
///
/// # Panics
/// When it is not installed (`scripts/kafka-broker.sh install`).
pub fn broker_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let out = Command::new(root.join("scripts/kafka-broker.sh"))
        .arg("bin")
        .current_dir(&root)
        .output()
        .expect("scripts/kafka-broker.sh bin");
    assert!(
        out.status.success(),
        "no broker binary: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A broker process of the test's own (the binary of [`broker_bin`], in memory) on a free
/// port of 127.0.0.1, never the shared one: a test may pause it (`SIGSTOP`) or kill it.
/// Killed on drop.
pub struct BrokerProcess {
    /// The process.
    pub process: crate::process::ChildProcess,
    /// Its port.
    pub port: u16,
}

impl BrokerProcess {
    /// Starts the broker and waits (up to 20 s) until its port accepts connections.
    ///
    /// # Panics
    /// When it cannot be started or does not listen in time.
    pub fn start() -> BrokerProcess {
        let port = crate::gateway::free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(broker_bin())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the broker");
        let process = crate::process::ChildProcess::new(child);
        crate::wait::wait_until(
            Duration::from_secs(20),
            || std::net::TcpStream::connect(("127.0.0.1", port)).ok(),
            || format!("the broker does not listen on {port}"),
        );
        BrokerProcess { process, port }
    }

    /// Its bootstrap servers, `127.0.0.1:PORT`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// `prefix` and the current time in hex nanoseconds: a name that reruns against a
/// long-lived broker never meet again.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{nanos:x}")
}

/// Creates `topic` with the admin API (tansu does not auto-create topics).
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let res =
        smol::block_on(admin.create_topics([&t], &AdminOptions::new())).expect("create topics");
    for r in res {
        if let Err((name, e)) = r {
            panic!("creating topic {name}: {e}");
        }
    }
}

/// One consumed message.
#[derive(Debug, Clone)]
pub struct KMsg {
    /// Partition.
    pub partition: i32,
    /// Offset in the partition.
    pub kafka_offset: i64,
    /// Key as text.
    pub key: String,
    /// Value.
    pub payload: Vec<u8>,
    /// Headers as text.
    pub headers: HashMap<String, String>,
}

impl KMsg {
    /// The `spillway-offset` header as a number.
    pub fn spillway_offset(&self) -> u64 {
        self.headers["spillway-offset"]
            .parse()
            .expect("spillway-offset is a number")
    }
}

/// Reads every message of `topic` (partitions `0..partitions`) from the beginning up to
/// the end of each partition as the fetch responses report it (ListOffsets is not used:
/// tansu 0.6 under-reports it). Uses `assign`, no consumer group.
pub fn consume_all(brokers: &str, topic: &str, partitions: i32) -> Vec<KMsg> {
    consume_all_with(brokers, topic, partitions, &[])
}

/// [`consume_all`] with extra librdkafka properties (e.g. `security.protocol=ssl`).
pub fn consume_all_with(
    brokers: &str,
    topic: &str,
    partitions: i32,
    properties: &[(&str, &str)],
) -> Vec<KMsg> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers)
        .set("group.id", "spillway-tests")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    for (k, v) in properties {
        cfg.set(*k, *v);
    }
    let c: BaseConsumer = cfg.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    c.assign(&tpl).expect("assign");
    let mut eof = HashSet::new();
    let mut out = Vec::new();
    let t = Instant::now();
    while eof.len() < usize::try_from(partitions).unwrap_or(0) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "topic {topic} not read to the end in 60 s"
        );
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => panic!("consuming {topic}: {e}"),
            Some(Ok(m)) => {
                let mut headers = HashMap::new();
                if let Some(h) = m.headers() {
                    for x in h.iter() {
                        headers.insert(
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push(KMsg {
                    partition: m.partition(),
                    kafka_offset: m.offset(),
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    payload: m.payload().unwrap_or_default().to_vec(),
                    headers,
                });
            }
        }
    }
    out
}

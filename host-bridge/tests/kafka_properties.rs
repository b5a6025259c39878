//! librdkafka properties passed through (`drain -X KEY=VALUE`, the `[kafka]` table):
//! `compression.type=lz4` reaches the broker (the record batches it stores say lz4, read
//! with a raw Fetch request, not through librdkafka's consumer, which decompresses
//! silently); the properties the effectively-once delivery depends on are refused with
//! exit 2 from the flag and from the config file; an unknown property exits 2; a secret
//! value never appears in the bridge's output.
#![cfg(feature = "kafka")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use spillway_bridge::client::OwnedRecord;
use spillway_bridge::sink::Source;
use spillway_bridge::sink::kafka::KafkaSink;
use spillway_bridge::sink::properties::KafkaProperties;

fn records(n: u64) -> Vec<OwnedRecord> {
    (0..n)
        .map(|i| OwnedRecord {
            offset: i,
            record_crc: 0,
            topic: "buoy/sst".into(),
            timestamp_us: 1_700_000_000_000_000 + i,
            producer: None,
            // Compressible: the same reading over and over.
            payload: format!(
                "{{\"sst_c\":14.25,\"seq\":{i},\"pad\":\"{}\"}}",
                "x".repeat(200)
            )
            .into_bytes()
            .into(),
        })
        .collect()
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&i16::try_from(s.len()).unwrap().to_be_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// A cursor over a Kafka response, big-endian.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take(2).try_into().unwrap())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = usize::try_from(self.i16()).unwrap();
        String::from_utf8(self.take(n).to_vec()).unwrap()
    }
}

/// The compression codec (attributes bits 0..3: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) of
/// every record batch the broker at `broker` holds in partition 0 of `topic`, read with a
/// Fetch v4 request from offset 0.
fn stored_codecs(broker: &str, topic: &str) -> Vec<i16> {
    let mut body = Vec::new();
    body.extend_from_slice(&1i16.to_be_bytes()); // Fetch
    body.extend_from_slice(&4i16.to_be_bytes()); // v4
    body.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    put_str(&mut body, "spillway-test");
    body.extend_from_slice(&(-1i32).to_be_bytes()); // replica id
    body.extend_from_slice(&100i32.to_be_bytes()); // max wait, ms
    body.extend_from_slice(&1i32.to_be_bytes()); // min bytes
    body.extend_from_slice(&(8i32 << 20).to_be_bytes()); // max bytes
    body.push(0); // isolation level
    body.extend_from_slice(&1i32.to_be_bytes()); // one topic
    put_str(&mut body, topic);
    body.extend_from_slice(&1i32.to_be_bytes()); // one partition
    body.extend_from_slice(&0i32.to_be_bytes()); // partition 0
    body.extend_from_slice(&0i64.to_be_bytes()); // from offset 0
    body.extend_from_slice(&(8i32 << 20).to_be_bytes()); // partition max bytes
    let mut s = TcpStream::connect(broker).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&i32::try_from(body.len()).unwrap().to_be_bytes())
        .unwrap();
    s.write_all(&body).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut resp = vec![0u8; usize::try_from(i32::from_be_bytes(len)).unwrap()];
    s.read_exact(&mut resp).unwrap();
    let mut r = Rd(&resp);
    assert_eq!(r.i32(), 7, "correlation id");
    let _throttle = r.i32();
    assert_eq!(r.i32(), 1, "topics");
    assert_eq!(r.string(), topic);
    assert_eq!(r.i32(), 1, "partitions");
    assert_eq!(r.i32(), 0, "partition");
    assert_eq!(r.i16(), 0, "error code");
    let _high = r.i64();
    let _last_stable = r.i64();
    let aborted = r.i32();
    for _ in 0..aborted.max(0) {
        r.take(16);
    }
    let n = usize::try_from(r.i32()).unwrap();
    let mut batches = Rd(r.take(n));
    let mut codecs = Vec::new();
    // A fetch may end with a partial batch: stop there.
    while batches.0.len() >= 23 {
        let _base = batches.i64();
        let len = usize::try_from(batches.i32()).unwrap();
        if batches.0.len() < len {
            break;
        }
        let mut b = Rd(batches.take(len));
        let _epoch = b.i32();
        assert_eq!(b.take(1)[0], 2, "record batch magic");
        let _crc = b.i32();
        codecs.push(b.i16() & 7);
    }
    codecs
}

fn deliver_with(props: &KafkaProperties, brokers: &str, topic: &str) {
    let mut sink = KafkaSink::with_properties(brokers, topic, 30_000, props).unwrap();
    let src = Source {
        gateway_id: "gw-x".into(),
        log_id: 0x5eed,
    };
    smol::block_on(async {
        sink.deliver(&src, &records(200)).await.unwrap();
        sink.close(Duration::from_secs(5)).await;
    });
}

/// `-X compression.type=lz4` is set on the producer: the broker stores lz4 batches, where
/// the bridge's defaults store uncompressed ones.
#[test]
fn compression_type_lz4_reaches_the_broker() {
    let mock = MockCluster::new(1).unwrap();
    let brokers = mock.bootstrap_servers();
    mock.create_topic("plain", 1, 1).unwrap();
    mock.create_topic("lz4", 1, 1).unwrap();
    deliver_with(&KafkaProperties::default(), &brokers, "plain");
    let lz4 =
        KafkaProperties::from_table_and_flags(None, &["compression.type=lz4".into()]).unwrap();
    deliver_with(&lz4, &brokers, "lz4");
    let plain = stored_codecs(&brokers, "plain");
    let compressed = stored_codecs(&brokers, "lz4");
    eprintln!("record batches stored: {plain:?} without properties, {compressed:?} with lz4");
    assert!(
        !plain.is_empty() && plain.iter().all(|&c| c == 0),
        "{plain:?}"
    );
    assert!(
        !compressed.is_empty() && compressed.iter().all(|&c| c == 3),
        "{compressed:?}"
    );
}

/// Runs `spillway-bridge drain` with `args` into a Kafka sink nobody listens on and returns
/// its exit code and stderr; the drain never reaches a gateway (it fails before).
fn drain(args: &[&str], config: Option<&str>) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.redb");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spillway-bridge"));
    if let Some(text) = config {
        let p = dir.path().join("bridge.toml");
        std::fs::write(&p, text).unwrap();
        cmd.arg("--config").arg(p);
    }
    let out = cmd
        .args([
            "drain",
            "--gateway",
            "tcp://127.0.0.1:9",
            "--sink",
            "kafka://127.0.0.1:9/t",
            "--once",
            "--retry-for",
            "1s",
            "--state",
        ])
        .arg(&state)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn properties_the_guarantee_depends_on_are_refused_with_exit_2() {
    for key in [
        "enable.idempotence",
        "acks",
        "max.in.flight.requests.per.connection",
        "transactional.id",
    ] {
        let (code, err) = drain(&["-X", &format!("{key}=1")], None);
        assert_eq!(code, 2, "-X {key}: {err}");
        assert!(err.contains(key), "{err}");
        let (code, err) = drain(&[], Some(&format!("[kafka]\n\"{key}\" = \"1\"\n")));
        assert_eq!(code, 2, "[kafka] {key}: {err}");
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn an_unknown_property_exits_2_and_secrets_are_never_printed() {
    let (code, err) = drain(
        &["-X", "no.such.property=1"],
        Some("[kafka]\n\"sasl.password\" = \"hunter2-secret\"\n\"sasl.username\" = \"alice\"\n"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no.such.property"), "{err}");
    assert!(err.contains("<redacted>") && err.contains("alice"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

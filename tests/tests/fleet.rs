//! One bridge, many gateways, on the real binaries: 16 `spillway` gateway processes with
//! records already stored, one `spillway-bridge drain` of all of them into a 4-partition
//! Kafka topic (librdkafka's mock cluster, or the broker of `SPILLWAY_KAFKA_BROKER`) and,
//! in a second test, into the file sink. The bridge is killed with SIGKILL twice, each time
//! after its first delivery of that run (seen in its metrics), then drains to the end with
//! `--once`. Every record of every gateway arrives once, in order per gateway; the runs
//! after a kill resumed from checkpoints (their logs and metrics say so). A third test
//! drains into a Kafka topic per Spillway topic (`kafka://HOST:PORT/PREFIX.{topic}`), one
//! topic name with characters Kafka refuses, through two kill -9s. Also: two gateways
//! announcing one id are refused with exit 2 naming both, and `publish` refuses several
//! gateways.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use spillway_core::wire::AckLevel;
use spillway_tests::bridge::{
    metric_sum, publish_args, run_bridge_usage_error, sink_files, spawn_bridge,
};
use spillway_tests::client::{Reply, connect, next_reply, send_publish};
use spillway_tests::gateway::free_port;
use spillway_tests::kafka::{Broker, consume_all, unique_name};
use spillway_tests::process::ChildProcess;
use spillway_tests::{GatewayProcess, bridge_bin, run_bridge};

const GATEWAYS: usize = 16;
const PER_GATEWAY: usize = 600;

struct Fleet {
    _gateways: Vec<GatewayProcess>,
    uris: Vec<String>,
}

/// Starts `n` gateways with ids `fleet-0`.. (`same_id`: all with that one id) and stores
/// `per` records in each (`"<id> <i>"` on topics `a` and `b`, alternately by line).
fn start_fleet(dir: &Path, n: usize, per: usize, same_id: Option<&str>) -> Fleet {
    let t0 = Instant::now();
    let mut gateways = Vec::new();
    let mut uris = Vec::new();
    for i in 0..n {
        let port = free_port();
        let id = same_id.map_or(format!("fleet-{i}"), str::to_string);
        let args: Vec<String> = vec![
            "--image".into(),
            dir.join(format!("gw{i}.img")).display().to_string(),
            "--size".into(),
            "4M".into(),
            "--listen".into(),
            format!("tcp://127.0.0.1:{port}"),
            "--gateway-id".into(),
            id.clone(),
        ];
        gateways.push(GatewayProcess::start(&args, 1));
        uris.push(format!("tcp://127.0.0.1:{port}"));
    }
    eprintln!("{n} gateways started in {:.1?}", t0.elapsed());
    let threads: Vec<_> = uris
        .iter()
        .enumerate()
        .filter(|_| per > 0)
        .map(|(i, uri)| {
            let uri = uri.clone();
            let dir = dir.to_path_buf();
            std::thread::spawn(move || {
                for (topic, parity) in [("a", 0), ("b", 1)] {
                    let p = dir.join(format!("in-{i}-{topic}.txt"));
                    let text: String = (0..per)
                        .filter(|k| k % 2 == parity)
                        .map(|k| format!("fleet-{i} {k}\n"))
                        .collect();
                    std::fs::write(&p, text).unwrap();
                    let out = run_bridge(
                        &[publish_args(&uri, topic), vec![&p.display().to_string()]].concat(),
                    );
                    assert!(
                        out.status.success(),
                        "publish: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    Fleet {
        _gateways: gateways,
        uris,
    }
}

/// The payload of offset `o` of gateway `gw`: topic `a` (even lines) was published first,
/// then topic `b` (odd lines).
fn expected_payload(gw: &str, o: u64) -> String {
    let half = (PER_GATEWAY / 2) as u64;
    let k = if o < half { 2 * o } else { 2 * (o - half) + 1 };
    format!("{gw} {k}")
}

fn drain_args(fleet: &Fleet, sink: &str, state: &Path, consumer: &str) -> Vec<String> {
    let mut args: Vec<String> = vec!["drain".into()];
    for u in &fleet.uris {
        args.extend(["--gateway".into(), u.clone()]);
    }
    args.extend([
        "--sink".into(),
        sink.into(),
        "--state".into(),
        state.display().to_string(),
        "--consumer".into(),
        consumer.into(),
        "--max-batch-bytes".into(),
        "2048".into(),
        "--prefetch".into(),
        "2".into(),
        "--progress".into(),
        "off".into(),
    ]);
    args
}

/// Runs the drain `args` twice, each time killed with SIGKILL right after its first
/// delivery (its `forwarded_records` metric above 0), then once more with `--once` to the
/// end. Returns the three runs' logs.
fn drain_with_two_kills(dir: &Path, args: &[String], t0: Instant) -> Vec<String> {
    let mut logs = Vec::new();
    for k in 0..2 {
        let port = free_port();
        let mut a = args.to_vec();
        a.extend(["--metrics".into(), format!("127.0.0.1:{port}")]);
        let log = dir.join(format!("bridge-{k}.log"));
        let mut child: ChildProcess = spawn_bridge(&bridge_bin(), &a, &log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let forwarded =
                metric_sum(port, "spillway_bridge_forwarded_records_total").unwrap_or(0.0);
            if forwarded > 0.0 {
                eprintln!(
                    "run {k}: killed after {forwarded} records forwarded, {:.1?} into the test",
                    t0.elapsed()
                );
                break;
            }
            assert!(
                child.is_running(),
                "{}",
                std::fs::read_to_string(&log).unwrap()
            );
            assert!(Instant::now() < deadline, "no delivery within 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill();
        logs.push(std::fs::read_to_string(&log).unwrap_or_default());
    }
    let mut a = args.to_vec();
    a.push("--once".into());
    let strs: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = run_bridge(&strs);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "final --once run: {text}");
    logs.push(text);
    logs
}

/// How many times `needle` stands in the logs of all the runs.
fn count_in(logs: &[String], needle: &str) -> usize {
    logs.iter().map(|l| l.matches(needle).count()).sum()
}

/// Runs 2 and 3 started from checkpoints saved by the killed runs before them.
fn assert_resumed(logs: &[String]) {
    for (k, log) in logs.iter().enumerate().skip(1) {
        let resumed = log.matches("resuming consumer").count();
        eprintln!("run {k}: {resumed} gateways resumed from a stored checkpoint");
        assert!(
            resumed > 0,
            "run {k} did not resume from a checkpoint:\n{log}"
        );
    }
}

#[test]
fn one_bridge_drains_16_gateways_into_4_kafka_partitions_through_two_kill_9s() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let fleet = start_fleet(dir.path(), GATEWAYS, PER_GATEWAY, None);
    eprintln!(
        "{GATEWAYS} gateways with {PER_GATEWAY} records each in {:.1?}",
        t0.elapsed()
    );
    let broker = Broker::real_or_mock();
    let topic = broker.new_topic("spillway-fleet", 4);
    let sink = format!("kafka://{}/{topic}", broker.bootstrap());
    let args = drain_args(&fleet, &sink, &dir.path().join("k.redb"), "kafka");
    let logs = drain_with_two_kills(dir.path(), &args, t0);
    assert_resumed(&logs);
    let resumed_from_topic: usize = count_in(&logs, "already holds offsets");

    let msgs = consume_all(&broker.bootstrap(), &topic, 4);
    let mut per_gateway: BTreeMap<String, Vec<(i32, u64, Vec<u8>)>> = BTreeMap::new();
    for m in &msgs {
        per_gateway
            .entry(m.headers["spillway-gateway"].clone())
            .or_default()
            .push((m.partition, m.spillway_offset(), m.payload.clone()));
        assert_eq!(m.key, m.headers["spillway-gateway"], "keyed by gateway id");
    }
    assert_eq!(per_gateway.len(), GATEWAYS);
    let mut partitions_used = std::collections::BTreeSet::new();
    for (gw, recs) in &per_gateway {
        let offsets: Vec<u64> = recs.iter().map(|r| r.1).collect();
        assert_eq!(
            offsets,
            (0..PER_GATEWAY as u64).collect::<Vec<_>>(),
            "{gw}: every record once, in order"
        );
        let parts: std::collections::BTreeSet<i32> = recs.iter().map(|r| r.0).collect();
        assert_eq!(parts.len(), 1, "{gw}: one partition");
        partitions_used.extend(parts);
        for (_, o, payload) in recs {
            assert_eq!(payload, &expected_payload(gw, *o).into_bytes());
        }
    }
    eprintln!(
        "{} messages in {} partitions of {} ({}), every record once and in order per gateway; {resumed_from_topic} gateway resumes found records already in the topic; {:.1?} in all",
        msgs.len(),
        partitions_used.len(),
        topic,
        broker.describe(),
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "{:.1?}",
        t0.elapsed()
    );
}

/// The Spillway topics of the mapped-topics test, and the Kafka topics they map to under
/// `PREFIX.{topic}` (characters outside `[a-zA-Z0-9._-]` become `_`, as README says).
const MAPPED: [(&str, &str); 2] = [
    ("buoy/sst", "buoy_sst"),
    ("cgm glucose/\u{b5}mol", "cgm_glucose__mol"),
];

/// Stores `per` records `"<id> <o>"` in the gateway at `uri`, topic `MAPPED[o % 2]`: every
/// fetched batch holds both topics.
fn store_interleaved(uri: &str, id: &str, per: usize) {
    let mut c = connect(uri).unwrap();
    for o in 0..per {
        let payload = format!("{id} {o}");
        send_publish(
            &mut c,
            MAPPED[o % 2].0,
            payload.as_bytes(),
            AckLevel::Durable,
        )
        .unwrap();
    }
    for _ in 0..per {
        let r = next_reply(&mut c).unwrap();
        assert!(matches!(r, (_, Reply::Ack(_))), "{r:?}");
    }
}

#[test]
fn a_kafka_topic_per_spillway_topic_through_two_kill_9s() {
    const N: usize = 4;
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let fleet = start_fleet(dir.path(), N, 0, None);
    std::thread::scope(|s| {
        for (i, uri) in fleet.uris.iter().enumerate() {
            s.spawn(move || store_interleaved(uri, &format!("fleet-{i}"), PER_GATEWAY));
        }
    });
    let broker = Broker::real_or_mock();
    let prefix = unique_name("spillway-mapped");
    let kafka_topics: Vec<String> = MAPPED
        .iter()
        .map(|(_, k)| format!("{prefix}.{k}"))
        .collect();
    for t in &kafka_topics {
        broker.create_topic(t, 2);
    }
    let sink = format!("kafka://{}/{prefix}.{{topic}}", broker.bootstrap());
    let args = drain_args(&fleet, &sink, &dir.path().join("m.redb"), "mapped");
    let logs = drain_with_two_kills(dir.path(), &args, t0);
    assert_resumed(&logs);
    let resumed_from_topic: usize = count_in(&logs, "already holds offsets");
    let after_hole: usize = count_in(&logs, "after a hole at");

    let mut per_gateway: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (k, kafka_topic) in kafka_topics.iter().enumerate() {
        let msgs = consume_all(&broker.bootstrap(), kafka_topic, 2);
        // Per gateway, in this Kafka topic: one partition, offsets rising.
        let mut seen: BTreeMap<String, (i32, u64)> = BTreeMap::new();
        for m in &msgs {
            let gw = m.headers["spillway-gateway"].clone();
            let o = m.spillway_offset();
            assert_eq!(
                m.headers["spillway-topic"], MAPPED[k].0,
                "{kafka_topic}: only its Spillway topic"
            );
            assert_eq!(o % 2, k as u64, "{gw} offset {o} in {kafka_topic}");
            assert_eq!(m.payload, format!("{gw} {o}").into_bytes());
            if let Some((p, last)) = seen.get(&gw) {
                assert_eq!(*p, m.partition, "{gw}: one partition of {kafka_topic}");
                assert!(*last < o, "{gw} in {kafka_topic}: {o} after {last}");
            }
            seen.insert(gw.clone(), (m.partition, o));
            per_gateway.entry(gw).or_default().push(o);
        }
        eprintln!("{kafka_topic}: {} messages", msgs.len());
    }
    assert_eq!(per_gateway.len(), N);
    for (gw, mut offsets) in per_gateway {
        offsets.sort_unstable();
        assert_eq!(
            offsets,
            (0..PER_GATEWAY as u64).collect::<Vec<_>>(),
            "{gw}: every record once"
        );
    }
    eprintln!(
        "{N} gateways into {kafka_topics:?} ({}): every record once, in order per gateway and topic; {resumed_from_topic} gateway resumes found records already in the topics, {after_hole} of them after a hole; {:.1?} in all",
        broker.describe(),
        t0.elapsed()
    );

    // A template with a character Kafka refuses around {topic} is a usage error.
    let mut bad = drain_args(
        &fleet,
        &format!("kafka://{}/a+{{topic}}", broker.bootstrap()),
        &dir.path().join("bad.redb"),
        "mapped",
    );
    bad.push("--once".into());
    let strs: Vec<&str> = bad.iter().map(String::as_str).collect();
    let err = run_bridge_usage_error(&strs);
    assert!(err.contains("a+{topic}"), "{err}");
}

#[test]
fn one_bridge_drains_16_gateways_into_files_through_two_kill_9s() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let fleet = start_fleet(dir.path(), GATEWAYS, PER_GATEWAY, None);
    let out = dir.path().join("out");
    let sink = format!("file:{}", out.display());
    let args = drain_args(&fleet, &sink, &dir.path().join("f.redb"), "files");
    let logs = drain_with_two_kills(dir.path(), &args, t0);
    assert_resumed(&logs);
    let mut gateway_dirs = 0;
    for i in 0..GATEWAYS {
        let gw = format!("fleet-{i}");
        let gdir = out.join(&gw);
        let files = sink_files(&gdir);
        assert!(!files.is_empty(), "{}: no files", gdir.display());
        // Per topic, lines in file order; merged by offset they must be 0..PER_GATEWAY once.
        let mut all = Vec::new();
        let mut last = None;
        let mut topic_dir: Option<&Path> = None;
        for path in &files {
            let name = path.strip_prefix(&gdir).unwrap().display().to_string();
            if topic_dir != path.parent() {
                // Files of one topic are in offset order, across files.
                topic_dir = path.parent();
                last = None;
            }
            for line in std::fs::read_to_string(path).unwrap().lines() {
                let j: serde_json::Value = serde_json::from_str(line).unwrap();
                let o = j["offset"].as_u64().unwrap();
                assert_eq!(j["gateway_id"], gw.as_str());
                assert_eq!(j["payload"], expected_payload(&gw, o).as_str());
                assert!(last.is_none_or(|l| l < o), "{gw}/{name}: in order");
                last = Some(o);
                all.push(o);
            }
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..PER_GATEWAY as u64).collect::<Vec<_>>(),
            "{gw}: every record once"
        );
        gateway_dirs += 1;
    }
    eprintln!(
        "{gateway_dirs} gateway directories under {}, every record once and in order; {:.1?} in all",
        out.display(),
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "{:.1?}",
        t0.elapsed()
    );

    // A second bridge into the same directory is refused at once, naming the holder.
    let port = free_port();
    let mut a = args.clone();
    a.extend([
        "--metrics".into(),
        format!("127.0.0.1:{port}"),
        "--log-level".into(),
        "info".into(),
    ]);
    let log = dir.path().join("holder.log");
    let mut holder = spawn_bridge(&bridge_bin(), &a, &log).unwrap();
    // It holds the directory once its drains resume (after the lock is taken).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("resuming consumer")
    {
        assert!(Instant::now() < deadline, "the first bridge did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its own state file: only the sink directory is shared.
    let mut other = drain_args(&fleet, &sink, &dir.path().join("other.redb"), "files");
    other.push("--once".into());
    let strs: Vec<&str> = other.iter().map(String::as_str).collect();
    let second = run_bridge(&strs);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&out.display().to_string()) && err.contains(&format!("pid {}", holder.pid())),
        "{err}"
    );
    holder.kill();
}

#[test]
fn two_gateways_announcing_one_id_are_refused_and_publish_takes_one_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = start_fleet(dir.path(), 2, 0, Some("cloned-card"));
    let sink = format!("file:{}", dir.path().join("out").display());
    let mut args = drain_args(&fleet, &sink, &dir.path().join("s.redb"), "bridge");
    args.push("--once".into());
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = run_bridge_usage_error(&strs);
    assert!(
        err.contains(&fleet.uris[0]) && err.contains(&fleet.uris[1]) && err.contains("cloned-card"),
        "{err}"
    );
    let out = run_bridge(&[
        "publish",
        "--gateway",
        &fleet.uris[0],
        "--gateway",
        &fleet.uris[1],
        "--topic",
        "t",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

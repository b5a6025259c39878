//! A broker that stalls (SIGSTOP) longer than the bridge's delivery timeout, then comes
//! back: the bridge's idempotent producer is answered `PRODUCER_FENCED` for every resend
//! after that, and earlier versions never delivered again (the drain stuck at one offset
//! until restarted; SIGTERM then spent the whole shutdown grace resending). The drain must
//! replace the producer by itself and deliver every record once, in order, with nothing
//! the old producer delivered sent twice (the tail scan skips it).
//!
//! Needs the broker binary of `scripts/kafka-broker.sh`; runs its own broker process on a
//! free port (it is paused), and is skipped, with a line saying so, when
//! `SPILLWAY_KAFKA_BROKER` is unset, like the other real-broker tests.

use std::path::Path;
use std::time::{Duration, Instant};

use spillway_tests::bridge::{bridge_bin, drain_args, metric_sum, publish_args, spawn_bridge};
use spillway_tests::gateway::{free_port, small_gateway};
use spillway_tests::kafka::{BROKER_ENV, BrokerProcess, consume_all};
use spillway_tests::wait::wait_until;
use spillway_tests::{GatewayProcess, run_bridge};

const GATEWAY_ID: &str = "fenced-gw";

fn start_gateway(dir: &Path) -> (GatewayProcess, String) {
    small_gateway(dir, &["--size", "4M", "--gateway-id", GATEWAY_ID])
}

/// Publishes `reading FROM` .. `reading TO-1`, durably.
fn publish(gw: &str, dir: &Path, from: usize, to: usize) {
    let input = dir.join(format!("in-{from}.txt"));
    let text: String = (from..to).map(|i| format!("reading {i}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = run_bridge(
        &[
            publish_args(gw, "buoy/sst"),
            vec!["--ack", "durable", &input.display().to_string()],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_drain_recovers_by_itself_from_a_producer_fenced_after_a_broker_stall() {
    if std::env::var(BROKER_ENV).map_or(true, |s| s.is_empty()) {
        eprintln!("{BROKER_ENV} not set: skipping the fenced-producer test");
        return;
    }
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start();
    let topic = "spillway-fenced";
    spillway_tests::kafka::create_topic(&broker.bootstrap(), topic, 1);
    let (_g, gw) = start_gateway(dir.path());
    let (n1, n) = (2000, 4000);
    publish(&gw, dir.path(), 0, n1);

    let sink = format!("kafka://{}/{topic}", broker.bootstrap());
    let state = dir.path().join("state.redb").display().to_string();
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let mut args: Vec<String> = drain_args(&gw, &sink, &state)
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(
        [
            "--metrics",
            &metrics_addr,
            "--kafka-delivery-timeout-ms",
            "2000",
            "--backoff-max-ms",
            "1000",
        ]
        .map(String::from),
    );
    let log = dir.path().join("drain.log");
    let mut drain = spawn_bridge(&bridge_bin(), &args, &log).unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let metric = |name: &str| metric_sum(metrics, name).unwrap_or(-1.0);
    let committed = || metric("spillway_bridge_committed_offset");
    wait_until(
        Duration::from_secs(15),
        || (committed() >= n1 as f64).then_some(()),
        || format!("first {n1} records not delivered: {}", log_text()),
    );

    // The broker stalls while more records come: their delivery times out (twice, past
    // the 2 s delivery timeout), then it comes back.
    broker.process.signal(libc::SIGSTOP);
    publish(&gw, dir.path(), n1, n);
    let timeouts = || metric("spillway_bridge_sink_errors_total{kind=\"timeout\"}");
    wait_until(
        Duration::from_secs(15),
        || (timeouts() >= 2.0).then_some(()),
        || format!("no delivery timed out: {}", log_text()),
    );
    broker.process.signal(libc::SIGCONT);
    let resumed = Instant::now();

    wait_until(
        Duration::from_secs(20),
        || (committed() >= n as f64).then_some(()),
        || format!("the drain did not recover: {}", log_text()),
    );
    let recovered = resumed.elapsed();
    let recreated = metric("spillway_bridge_kafka_producers_recreated_total");
    eprintln!(
        "recovered {recovered:.1?} after the broker resumed; producers recreated: {recreated}"
    );
    let text = log_text();
    assert!(
        recreated >= 1.0 && text.contains("kafka producer failed for good"),
        "the stall did not fence the producer (the test proves nothing): {text}"
    );

    // SIGTERM is prompt (earlier versions spent the 30 s shutdown grace).
    let t = Instant::now();
    let status = drain.stop(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        log_text()
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    let msgs = consume_all(&broker.bootstrap(), topic, 1);
    let offsets: Vec<u64> = msgs.iter().map(|m| m.spillway_offset()).collect();
    assert_eq!(
        offsets,
        (0..n as u64).collect::<Vec<_>>(),
        "each record once, in order"
    );
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.payload, format!("reading {i}").into_bytes());
    }
    eprintln!("whole test {:.1?}", t0.elapsed());
}

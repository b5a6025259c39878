//! The bridge into Kafka over TLS: a broker process behind `stunnel4`, which terminates TLS
//! with a certificate made for the run (the broker advertises the stunnel port, so every
//! connection librdkafka makes after the bootstrap goes through TLS too). The bridge gets
//! the broker's CA through `-X ssl.ca.location=…` and checks the host name; the records are
//! read back over TLS. A bridge given the wrong CA delivers nothing, says why, and leaves
//! the gateway's committed offset where it was.
//!
//! Needs the broker binary of `scripts/kafka-broker.sh` (the test is skipped, with a line
//! saying so, when `SPILLWAY_KAFKA_BROKER` is unset, like the other real-broker tests) and
//! `stunnel4` (`scripts/install-deps.sh`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spillway_tests::bridge::{committed_offset, drain_args, gateway_next_offset, publish_args};
use spillway_tests::gateway::{free_port, small_gateway};
use spillway_tests::kafka::{BROKER_ENV, broker_bin, consume_all_with};
use spillway_tests::pki::Pki;
use spillway_tests::process::ChildProcess;
use spillway_tests::{GatewayProcess, run_bridge};

const GATEWAY_ID: &str = "tls-kafka-gw";

fn wait_for_port(port: u16, what: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what} not listening on {port} within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A broker on `plain` that advertises `tls`, and stunnel on `tls` forwarding to it.
struct TlsBroker {
    _broker: ChildProcess,
    _stunnel: ChildProcess,
    plain: u16,
    tls: u16,
}

impl TlsBroker {
    fn start(dir: &Path, pki: &Pki) -> TlsBroker {
        let (plain, tls) = (free_port(), free_port());
        let broker = Command::new(broker_bin())
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{plain}"),
                "--advertised-listener-url",
                &format!("tcp://localhost:{tls}"),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the broker");
        let broker = ChildProcess::new(broker);
        let conf = dir.join("stunnel.conf");
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\nsyslog = no\n\n[kafka]\naccept = 127.0.0.1:{tls}\n\
                 connect = 127.0.0.1:{plain}\ncert = {}\nkey = {}\n",
                pki.gw_cert.display(),
                pki.gw_key.display()
            ),
        )
        .expect("stunnel config");
        let stunnel = Command::new("stunnel4")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("stunnel4 (scripts/install-deps.sh installs it)");
        let stunnel = ChildProcess::new(stunnel);
        wait_for_port(plain, "the broker");
        wait_for_port(tls, "stunnel");
        TlsBroker {
            _broker: broker,
            _stunnel: stunnel,
            plain,
            tls,
        }
    }

    /// Creates `topic` over the plaintext port (the broker's own CLI).
    fn create_topic(&self, topic: &str) {
        let out = Command::new(broker_bin())
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.plain),
                "--partitions",
                "1",
                topic,
            ])
            .output()
            .expect("topic create");
        assert!(
            out.status.success(),
            "topic create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn start_gateway(dir: &Path) -> (GatewayProcess, String) {
    small_gateway(dir, &["--size", "4M", "--gateway-id", GATEWAY_ID])
}

fn publish(gw: &str, dir: &Path, n: usize) {
    let input = dir.join("in.txt");
    let text: String = (0..n).map(|i| format!("reading {i}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = run_bridge(
        &[
            publish_args(gw, "buoy/sst"),
            vec![&input.display().to_string()],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The gateway's committed offset of the `bridge` consumer.
fn committed(gw: &str) -> u64 {
    let out = run_bridge(&["status", "--gateway", gw, "--json"]);
    assert!(out.status.success());
    committed_offset(&out.stdout, "bridge")
}

#[test]
fn drains_into_kafka_over_tls_and_refuses_a_broker_certificate_from_another_ca() {
    if std::env::var(BROKER_ENV).map_or(true, |s| s.is_empty()) {
        eprintln!("{BROKER_ENV} not set: skipping the Kafka-over-TLS test");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::make(dir.path());
    let broker = TlsBroker::start(dir.path(), &pki);
    let topic = "spillway-tls";
    broker.create_topic(topic);
    let (_g, gw) = start_gateway(dir.path());
    let n = 500;
    publish(&gw, dir.path(), n);
    assert_eq!(gateway_next_offset(&gw), n as u64);

    let sink = format!("kafka://localhost:{}/{topic}", broker.tls);
    let drain = |ca: &Path, state: &str, extra: &[&str]| {
        let ca = format!("ssl.ca.location={}", ca.display());
        let state = dir.path().join(state).display().to_string();
        let mut args = drain_args(&gw, &sink, &state);
        args.extend(["--once", "-X", "security.protocol=ssl", "-X", &ca]);
        args.extend_from_slice(extra);
        run_bridge(&args)
    };

    // The wrong CA: librdkafka's handshake fails, nothing is delivered or committed, and
    // the bridge gives up after --retry-for, naming the certificate problem.
    let out = drain(
        &pki.other_ca,
        "wrong.redb",
        &["--retry-for", "5s", "--kafka-delivery-timeout-ms", "4000"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a drain with the wrong CA succeeded: {err}"
    );
    assert!(
        err.to_lowercase().contains("certificate") || err.to_lowercase().contains("ssl"),
        "the refusal does not say why: {err}"
    );
    assert_eq!(committed(&gw), 0, "nothing committed with the wrong CA");

    // The right CA: every record once, in order, read back over TLS.
    let out = drain(&pki.ca, "right.redb", &[]);
    assert!(
        out.status.success(),
        "drain over TLS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ca = pki.ca.display().to_string();
    let msgs = consume_all_with(
        &format!("localhost:{}", broker.tls),
        topic,
        1,
        &[("security.protocol", "ssl"), ("ssl.ca.location", &ca)],
    );
    assert_eq!(msgs.len(), n, "exactly the records published");
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.spillway_offset(), i as u64, "in order");
        assert_eq!(m.payload, format!("reading {i}").into_bytes());
    }
    assert_eq!(committed(&gw), n as u64);
}

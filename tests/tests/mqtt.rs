//! The MQTT listener end to end, with real MQTT clients against the real `spillway`:
//! `mosquitto_pub` (Debian `mosquitto-clients`, installed by `scripts/install-deps.sh`) at
//! QoS 0, 1 and 2 over MQTT 3.1.1 and 5.0; an over-long topic answered with a reason code;
//! subscriptions refused; and hostile clients (truncated packets, absurd CONNECT lengths,
//! 1,000 idle connections, a client that never reads) beside a QoS 1 publisher that must
//! finish while the gateway's peak RSS stays under 64 MiB.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spillway_tests::GatewayProcess;
use spillway_tests::bridge::tail_everything;
use spillway_tests::gateway::{assert_metrics, free_port, http_get, image_in};
use spillway_tests::process::output_with_stdin;
use spillway_tests::wait::wait_until;

/// A gateway with an MQTT listener on `mqtt` and a framed one on `tcp` (for `tail`).
fn start_gateway(dir: &Path, mqtt: u16, tcp: u16, extra: &[&str]) -> GatewayProcess {
    let mut args = image_in(
        dir,
        &[
            "--size",
            "4M",
            "--listen",
            &format!("mqtt://127.0.0.1:{mqtt}"),
            "--listen",
            &format!("tcp://127.0.0.1:{tcp}"),
        ],
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    GatewayProcess::start(&args, 2)
}

/// [`start_gateway`] on free ports with a metrics endpoint: the process and its MQTT, TCP
/// and metrics ports.
fn gateway_with_metrics(dir: &Path) -> (GatewayProcess, u16, u16, u16) {
    let (mqtt, tcp, m) = (free_port(), free_port(), free_port());
    let g = start_gateway(dir, mqtt, tcp, &["--metrics", &format!("127.0.0.1:{m}")]);
    (g, mqtt, tcp, m)
}

/// `mosquitto_pub -l` of `lines` (one message per line) at `qos`, protocol `version`
/// (`mqttv311` or `mqttv5`), with `extra` arguments; returns its exit status and stderr.
fn mosquitto_pub(
    port: u16,
    version: &str,
    qos: u8,
    topic: &str,
    lines: &str,
    extra: &[&str],
) -> (bool, String) {
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-V", version])
        .args(["-q", &qos.to_string(), "-t", topic, "-l"])
        .args(extra);
    let out = output_with_stdin(
        &mut cmd,
        lines.as_bytes(),
        "mosquitto_pub (Debian mosquitto-clients; scripts/install-deps.sh installs it)",
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every stored record as `(topic, payload)`, from the first offset.
fn stored(tcp: u16) -> Vec<(String, String)> {
    let gw = format!("tcp://127.0.0.1:{tcp}");
    tail_everything(&gw, "json")
        .lines()
        .map(|l| {
            let j: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                j["topic"].as_str().unwrap().to_string(),
                j["payload"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn mosquitto_pub_at_qos_0_1_and_2_stores_every_message_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, mqtt, tcp, m) = gateway_with_metrics(dir.path());
    let mut want = Vec::new();
    for version in ["mqttv311", "mqttv5"] {
        for qos in 0..=2u8 {
            let topic = format!("sensors/{version}/q{qos}");
            let lines: String = (0..50).map(|i| format!("{version}-q{qos}-{i}\n")).collect();
            let (ok, err) = mosquitto_pub(mqtt, version, qos, &topic, &lines, &[]);
            assert!(
                ok,
                "mosquitto_pub {version} QoS {qos}: {err}\n{}",
                gw.log_text()
            );
            want.extend(lines.lines().map(|l| (topic.clone(), l.to_string())));
        }
    }
    // QoS 0 has no acknowledgement: wait until the last QoS 0 record is there.
    let got = wait_until(
        Duration::from_secs(10),
        || Some(stored(tcp)).filter(|got| got.len() >= want.len()),
        || format!("{} records stored, {:?} are", want.len(), stored(tcp)),
    );
    assert_eq!(got, want);
    assert_metrics(
        m,
        &[
            "spillway_listener_connections_total{kind=\"mqtt\"} 6",
            "spillway_mqtt_publishes_total{qos=\"0\"} 100",
            "spillway_mqtt_publishes_total{qos=\"1\"} 100",
            "spillway_mqtt_publishes_total{qos=\"2\"} 100",
            "spillway_mqtt_duplicates_total 0",
        ],
    );
}

#[test]
fn an_mqtt5_topic_over_255_bytes_gets_reason_code_0x90_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (mqtt, tcp) = (free_port(), free_port());
    let gw = start_gateway(dir.path(), mqtt, tcp, &[]);
    let long = "t".repeat(300);
    for qos in [1u8, 2] {
        let (_, err) = mosquitto_pub(mqtt, "mqttv5", qos, &long, "x\n", &[]);
        assert!(err.contains("Topic Name invalid"), "QoS {qos}: {err}");
    }
    // The connection and the gateway go on: a good publish after them is stored.
    let (ok, err) = mosquitto_pub(mqtt, "mqttv5", 1, "ok", "after\n", &[]);
    assert!(ok, "{err}\n{}", gw.log_text());
    assert_eq!(stored(tcp), vec![("ok".to_string(), "after".to_string())]);
}

#[test]
fn subscriptions_are_refused_with_the_protocols_failure_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (mqtt, tcp) = (free_port(), free_port());
    let _gw = start_gateway(dir.path(), mqtt, tcp, &[]);
    for version in ["mqttv311", "mqttv5"] {
        let out = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-V", version])
            .args(["-t", "sensors/#", "-C", "1", "-W", "5"])
            .output()
            .expect("mosquitto_sub");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("All subscription requests were denied"),
            "{version}: {err}"
        );
    }
}

/// An MQTT remaining length (variable byte integer).
fn remaining_length(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

/// An MQTT 3.1.1 CONNECT of `client` with a clean session and no keep-alive (test input,
/// written out so that hostile variants can be cut from it).
fn connect_packet(client: &str) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 0];
    body.extend_from_slice(&(client.len() as u16).to_be_bytes());
    body.extend_from_slice(client.as_bytes());
    let mut p = vec![0x10];
    remaining_length(body.len(), &mut p);
    p.extend_from_slice(&body);
    p
}

/// An MQTT 3.1.1 PUBLISH at QoS 1 with packet id `pid`.
fn publish_packet(topic: &str, pid: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&pid.to_be_bytes());
    body.extend_from_slice(payload);
    let mut p = vec![0x32];
    remaining_length(body.len(), &mut p);
    p.extend_from_slice(&body);
    p
}

/// `VmHWM` (peak resident set) of process `pid`, bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// The hostile-inputs campaign: 1,000 idle MQTT connections (connected, then silent),
/// truncated packets, CONNECTs with absurd lengths and a client that publishes at QoS 1
/// and never reads its PUBACKs, all at once, beside a `mosquitto_pub -q 1` of 2,000
/// messages that must finish with every message stored, while the gateway stays up and
/// its peak RSS stays under 64 MiB.
#[test]
fn hostile_mqtt_clients_leave_the_gateway_up_small_and_serving_a_qos1_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let (mqtt, tcp) = (free_port(), free_port());
    let mut gw = start_gateway(dir.path(), mqtt, tcp, &["--max-connections", "1100"]);
    let addr = ("127.0.0.1", mqtt);

    // 1,000 idle connections, each with a session.
    let mut idle = Vec::new();
    for i in 0..1000 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&connect_packet(&format!("idle-{i}"))).unwrap();
        idle.push(s);
    }
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut connack = [0u8; 4];
        s.read_exact(&mut connack).unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0]);
    }

    // Truncated packets: every prefix of a CONNECT, and of a PUBLISH after a good CONNECT.
    let connect = connect_packet("cut");
    for cut in 1..connect.len() {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&connect[..cut]).unwrap();
    }
    let publish = publish_packet("cut/topic", 7, b"payload");
    for cut in 1..publish.len() {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&connect_packet(&format!("cut-{cut}"))).unwrap();
        s.write_all(&publish[..cut]).unwrap();
    }
    // Absurd lengths: a remaining length of 268,435,455 bytes (the largest MQTT has), a
    // five-byte remaining length, a client id longer than the packet.
    for bad in [
        vec![
            0x10, 0xFF, 0xFF, 0xFF, 0x7F, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 0,
        ],
        vec![0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F],
        vec![
            0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 0, 0xFF, 0xFF,
        ],
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&bad);
        let _ = s.write_all(&[0u8; 4096]);
    }

    // A client that publishes at QoS 1 and never reads (for at most 5 s).
    let flooder = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        s.write_all(&connect_packet("never-reads")).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let mut sent = 0u32;
        while Instant::now() < until && sent < 20_000 {
            let pid = (sent % 65_535 + 1) as u16;
            if s.write_all(&publish_packet("flood", pid, b"0123456789"))
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        (s, sent)
    });

    // Beside them, a well-behaved QoS 1 publisher finishes.
    let lines: String = (0..2000).map(|i| format!("m{i}\n")).collect();
    let started = Instant::now();
    let (ok, err) = mosquitto_pub(mqtt, "mqttv311", 1, "good", &lines, &["-i", "good"]);
    assert!(ok, "{err}\n{}", gw.log_text());
    let took = started.elapsed();
    let (_flood_socket, sent) = flooder.join().unwrap();
    assert!(
        gw.try_wait().is_none(),
        "the gateway died:\n{}",
        gw.log_text()
    );
    let good: Vec<String> = stored(tcp)
        .into_iter()
        .filter(|(t, _)| t == "good")
        .map(|(_, p)| p)
        .collect();
    let want: Vec<String> = lines.lines().map(str::to_string).collect();
    assert_eq!(good, want);
    // The absurd lengths were seen as such.
    assert!(
        gw.log_text().contains("PacketTooLarge"),
        "{}",
        gw.log_text()
    );
    let peak = peak_rss(gw.pid());
    eprintln!(
        "QoS 1 publisher: 2,000 messages in {took:?} beside 1,000 idle connections and a flooder that sent {sent} publishes without reading; gateway peak RSS {:.1} MiB",
        peak as f64 / 1048576.0
    );
    assert!(peak < 64 * 1024 * 1024, "peak RSS {peak} bytes");
    drop(idle);
}

/// The Python with `paho-mqtt` (`SPILLWAY_TEST_PYTHON`, set by `scripts/test.sh`, which
/// installs it into the tests' venv), else a `python3` that imports it; `None` (the test is
/// skipped, and says so) outside CI when there is neither.
fn paho_python() -> Option<String> {
    if let Ok(p) = std::env::var("SPILLWAY_TEST_PYTHON") {
        return Some(p);
    }
    let importable = Command::new("python3")
        .args(["-c", "import paho.mqtt.client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if importable {
        return Some("python3".into());
    }
    assert!(
        std::env::var("CI").is_err(),
        "paho-mqtt is missing: run the tests through scripts/test.sh"
    );
    eprintln!("skipped: no paho-mqtt (scripts/test.sh installs it into the tests' venv)");
    None
}

/// A `tests/mqtt/paho_publish.py` run; its stdout lines are collected as they come.
struct Paho {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Paho {
    /// `pace_ms`: the script's pause after every 20 messages (0: none); `version`: 3 (MQTT
    /// 3.1.1) or 5.
    fn start(
        python: &str,
        port: u16,
        client: &str,
        qos: u8,
        count: u32,
        pace_ms: u32,
        version: u8,
    ) -> Paho {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mqtt/paho_publish.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(["127.0.0.1", &port.to_string(), client, client])
            .args([qos.to_string(), count.to_string(), pace_ms.to_string()])
            .arg(version.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start paho_publish.py");
        let out = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                keep.lock().unwrap().push(l);
            }
        });
        Paho { child, lines }
    }

    fn said(&self, line: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l == line)
    }

    fn acked(&self) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("acked "))
            .count()
    }
}

/// paho-mqtt clients with persistent sessions (MQTT 3.1.1 with clean session off, MQTT 5
/// with clean start off and a session expiry) publish a numbered stream at QoS 1 and at
/// QoS 2; the gateway is killed with SIGKILL in the middle and
/// started again on the same image; the clients reconnect and resend what was not
/// acknowledged (DUP=1). Every message is acknowledged in the end, and the log holds each
/// exactly once: what was stored before the kill but not yet acknowledged is recognised as
/// a resend from the records read back at start.
///
/// The QoS 2 client has 20,000 messages queued: after the reconnect paho sends its whole
/// queue before the PUBRELs of the first ones, so the session holds thousands of packet
/// ids reserved at once (a quota of 4,096 refused it on every reconnect, for ever). paho
/// also sends what it published while disconnected ahead of its resends, so the order is
/// checked up to the kill: everything acknowledged before it is the log's prefix, in order.
/// The MQTT 5 clients, too, resend more than any receive maximum after the reconnect: one
/// announced made the codec disconnect them on every reconnect, for ever.
#[test]
fn paho_persistent_sessions_survive_a_kill_9_with_every_message_stored_once_in_order() {
    let Some(python) = paho_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mqtt, tcp, m) = (free_port(), free_port(), free_port());
    let metrics_arg = format!("127.0.0.1:{m}");
    let mut gw = start_gateway(dir.path(), mqtt, tcp, &["--metrics", &metrics_arg]);
    // (client id, QoS, messages, pause in ms after every 20, MQTT version)
    let clients = [
        ("paho-q1", 1u8, 3000u32, 2, 3u8),
        ("paho-q2", 2, 20_000, 0, 3),
        ("paho5-q1", 1, 3000, 0, 5),
        ("paho5-q2", 2, 5000, 0, 5),
    ];
    let mut runs: Vec<Paho> = clients
        .iter()
        .map(|&(c, q, n, pace, v)| Paho::start(&python, mqtt, c, q, n, pace, v))
        .collect();
    // Generous: a loaded 2-core machine runs this beside the other tests.
    let deadline = Instant::now() + Duration::from_secs(120);
    // The kill comes once the QoS 2 client has its whole stream queued in paho, so that
    // the reconnect sends thousands of messages at once.
    while runs.iter().any(|r| r.acked() < 300) || !runs[1].said("queued") {
        assert!(
            Instant::now() < deadline,
            "no progress: acknowledged {:?}, QoS 2 stream queued: {}\n{}",
            runs.iter().map(Paho::acked).collect::<Vec<_>>(),
            runs[1].said("queued"),
            gw.log_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    gw.kill();
    let before: Vec<usize> = runs.iter().map(Paho::acked).collect();
    let gw = start_gateway(dir.path(), mqtt, tcp, &["--metrics", &metrics_arg]);
    for r in &mut runs {
        let status = r.child.wait().unwrap();
        assert!(status.success(), "{status}:\n{}", gw.log_text());
    }
    let all = stored(tcp);
    for ((r, &(client, _, count, _, _)), &acked_before) in runs.iter().zip(&clients).zip(&before) {
        let last = r.lines.lock().unwrap().last().cloned();
        assert_eq!(last.as_deref(), Some("done"));
        assert_eq!(r.acked(), count as usize, "{client}");
        let got: Vec<String> = all
            .iter()
            .filter(|(t, _)| t == client)
            .map(|(_, p)| p.clone())
            .collect();
        let want: Vec<String> = (1..=count).map(|n| format!("{client}-{n:06}")).collect();
        assert_eq!(
            got.len(),
            want.len(),
            "{client}: stored {} of {count}",
            got.len()
        );
        assert_eq!(got[..acked_before], want[..acked_before], "{client}");
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, want, "{client}: each message once");
    }
    let text = http_get(m, "/metrics");
    let dups = text
        .lines()
        .find(|l| l.starts_with("spillway_mqtt_duplicates_total"))
        .unwrap_or("")
        .to_string();
    eprintln!(
        "killed after {before:?} acknowledgements; after the restart: {dups}; {}",
        gw.log_lines(&["read back"]).join(" ")
    );
}

/// An MQTT 3.1.1 CONNECT of `client` with a persistent session (clean session 0) and no
/// keep-alive.
fn persistent_connect_packet(client: &str) -> Vec<u8> {
    let mut p = connect_packet(client);
    // The connect flags follow the remaining length (one byte here) and the 7 bytes of the
    // protocol name and level.
    let flags = 2 + 7;
    assert_eq!(p[flags], 0x02, "clean session flag");
    p[flags] = 0x00;
    p
}

/// Connects `client` with a persistent session; returns the socket and the CONNACK's
/// return code (0 accepted, 3 server unavailable).
fn persistent_connect(port: u16, client: &str) -> (TcpStream, u8) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&persistent_connect_packet(client)).unwrap();
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).unwrap();
    assert_eq!(connack[..2], [0x20, 2], "CONNACK of {client}: {connack:?}");
    (s, connack[3])
}

/// Publishes `payload` to `topic` at QoS 1 with packet id `pid` (DUP set when `dup`) and
/// waits for its PUBACK.
fn publish_acked(s: &mut TcpStream, topic: &str, pid: u16, payload: &[u8], dup: bool) {
    let mut p = publish_packet(topic, pid, payload);
    if dup {
        p[0] |= 0x08;
    }
    s.write_all(&p).unwrap();
    let mut puback = [0u8; 4];
    s.read_exact(&mut puback).unwrap();
    let [hi, lo] = pid.to_be_bytes();
    assert_eq!(puback, [0x40, 2, hi, lo]);
}

/// Sends DISCONNECT and waits until the gateway closed the socket (by then it has handed
/// the connection's end to the log thread, before any later CONNECT).
fn disconnect(mut s: TcpStream) {
    s.write_all(&[0xE0, 0]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
}

/// The session table is full (64 persistent sessions): a new persistent session is
/// refused with return code 3 (server unavailable) as long as every disconnected session
/// has stored a QoS 1 message its client could still resend, and a resend into one of them
/// afterwards is still recognised; a session that never stored anything makes room.
#[test]
fn a_full_session_table_refuses_new_sessions_and_never_evicts_one_that_could_resend() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, mqtt, tcp, m) = gateway_with_metrics(dir.path());
    // 63 sessions that each stored one message, and one that stored nothing.
    for i in 0..63 {
        let client = format!("stored-{i}");
        let (mut s, rc) = persistent_connect(mqtt, &client);
        assert_eq!(rc, 0, "{client}:\n{}", gw.log_text());
        publish_acked(&mut s, "evict/t", 1, client.as_bytes(), false);
        disconnect(s);
    }
    let (s, rc) = persistent_connect(mqtt, "empty");
    assert_eq!(rc, 0);
    disconnect(s);

    // The empty session makes room for a new one, which stores a message too.
    let (mut s, rc) = persistent_connect(mqtt, "newcomer");
    assert_eq!(
        rc,
        0,
        "the session that stored nothing was not evicted:\n{}",
        gw.log_text()
    );
    publish_acked(&mut s, "evict/t", 1, b"newcomer", false);
    disconnect(s);

    // Now every session could see a resend: the next one is refused, and so is the one
    // that was evicted.
    for client in ["latecomer", "empty"] {
        let (_s, rc) = persistent_connect(mqtt, client);
        assert_eq!(
            rc,
            3,
            "{client} was admitted into a full table:\n{}",
            gw.log_text()
        );
    }
    // A clean session needs no room in the table.
    let mut s = TcpStream::connect(("127.0.0.1", mqtt)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&connect_packet("clean-one")).unwrap();
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    disconnect(s);

    // Every stored session kept its state: a resend of its message is acknowledged and not
    // stored again.
    for client in ["stored-0", "stored-62", "newcomer"] {
        let (mut s, rc) = persistent_connect(mqtt, client);
        assert_eq!(rc, 0);
        publish_acked(&mut s, "evict/t", 1, client.as_bytes(), true);
        disconnect(s);
    }
    assert_metrics(
        m,
        &[
            "spillway_mqtt_duplicates_total 3",
            "spillway_mqtt_publishes_total{qos=\"1\"} 64",
            "spillway_ingest_errors_total{reason=\"mqtt_sessions_full\"} 2",
        ],
    );
    let got = stored(tcp);
    assert_eq!(got.len(), 64, "{got:?}");
}

/// An MQTT 5 CONNECT of `client` with a clean start, no keep-alive and no properties.
fn connect_packet_v5(client: &str) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 0, 0];
    body.extend_from_slice(&(client.len() as u16).to_be_bytes());
    body.extend_from_slice(client.as_bytes());
    let mut p = vec![0x10];
    remaining_length(body.len(), &mut p);
    p.extend_from_slice(&body);
    p
}

/// An MQTT 5 PUBLISH at `qos` (packet id `pid` unless QoS 0), no properties.
fn publish_packet_v5(topic: &str, qos: u8, pid: u16, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(topic.as_bytes());
    if qos > 0 {
        body.extend_from_slice(&pid.to_be_bytes());
    }
    body.push(0);
    body.extend_from_slice(payload);
    let mut p = vec![0x30 | (qos << 1)];
    remaining_length(body.len(), &mut p);
    p.extend_from_slice(&body);
    p
}

/// Reads one packet with a one-byte remaining length: its first byte and body, or `None`
/// when the gateway closed the connection first.
fn read_small_packet(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).ok()?;
    assert!(head[1] < 128, "a packet of {} bytes or more", head[1]);
    let mut body = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut body).ok()?;
    Some((head[0], body))
}

/// A listener whose `roles=` lack `publish` refuses every PUBLISH with the protocol's
/// "not authorized" and stores nothing: MQTT 5 QoS 1 and 2 get reason code 0x87 in the
/// PUBACK and PUBREC (and the connection goes on), QoS 0 a DISCONNECT with 0x87; MQTT 3.1.1
/// is disconnected without a PUBACK. Each refusal is counted; a listener with the default
/// roles beside it stores as usual.
#[test]
fn an_mqtt_listener_without_the_publish_role_refuses_publishes_as_not_authorized() {
    let dir = tempfile::tempdir().unwrap();
    let (mqtt, tcp, m, open) = (free_port(), free_port(), free_port(), free_port());
    let args: Vec<String> = [
        "--image".to_string(),
        dir.path().join("gw.img").display().to_string(),
        "--size".into(),
        "4M".into(),
        "--listen".into(),
        format!("mqtt://127.0.0.1:{mqtt}?roles=consume,admin"),
        "--listen".into(),
        format!("mqtt://127.0.0.1:{open}"),
        "--listen".into(),
        format!("tcp://127.0.0.1:{tcp}"),
        "--metrics".into(),
        format!("127.0.0.1:{m}"),
    ]
    .to_vec();
    let gw = GatewayProcess::start(&args, 3);
    let connect = |packet: Vec<u8>| {
        let mut s = TcpStream::connect(("127.0.0.1", mqtt)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(&packet).unwrap();
        let (kind, body) = read_small_packet(&mut s).expect("CONNACK");
        assert_eq!(kind, 0x20);
        assert_eq!(body[1], 0, "CONNACK refused: {body:?}");
        s
    };

    // MQTT 5, QoS 1 then QoS 2 on one connection: reason code 0x87 each, still connected.
    let mut s = connect(connect_packet_v5("v5-client"));
    s.write_all(&publish_packet_v5("denied/t", 1, 11, b"one"))
        .unwrap();
    let (kind, body) = read_small_packet(&mut s).expect("PUBACK");
    assert_eq!((kind, &body[..3]), (0x40, &[0, 11, 0x87][..]), "{body:?}");
    s.write_all(&publish_packet_v5("denied/t", 2, 12, b"two"))
        .unwrap();
    let (kind, body) = read_small_packet(&mut s).expect("PUBREC");
    assert_eq!((kind, &body[..3]), (0x50, &[0, 12, 0x87][..]), "{body:?}");
    // QoS 0: DISCONNECT with 0x87, then the connection closes.
    s.write_all(&publish_packet_v5("denied/t", 0, 0, b"zero"))
        .unwrap();
    let (kind, body) = read_small_packet(&mut s).expect("DISCONNECT");
    assert_eq!((kind, body.first()), (0xE0, Some(&0x87)), "{body:?}");
    assert!(read_small_packet(&mut s).is_none());

    // MQTT 3.1.1 has no such code: closed without a PUBACK.
    let mut s = connect(connect_packet("v311-client"));
    s.write_all(&publish_packet("denied/t", 7, b"three"))
        .unwrap();
    assert!(
        read_small_packet(&mut s).is_none(),
        "a 3.1.1 PUBLISH on a listener without publish was answered"
    );

    // The listener with the default roles stores.
    let (ok, err) = mosquitto_pub(open, "mqttv311", 1, "allowed/t", "kept\n", &[]);
    assert!(ok, "{err}\n{}", gw.log_text());
    assert_eq!(
        stored(tcp),
        vec![("allowed/t".to_string(), "kept".to_string())]
    );
    assert_metrics(m, &["spillway_refused_total{reason=\"forbidden\"} 4"]);
}

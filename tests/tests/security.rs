//! Credentials, roles and TLS on the real binaries: the safe defaults at start; wrong and
//! missing tokens; client certificates from a wrong CA or expired, and a gateway
//! certificate from a wrong CA; a plaintext client on a TLS port and a TLS client on a
//! plaintext port; a `publish`-only credential that tries to commit, delete and fetch.
//! Each refusal is checked on both sides (the bridge's message, the gateway's log), in
//! the gateway's metrics, and in what the log holds afterwards (nothing stored, nothing
//! committed). Certificates are made at run time (`spillway_tests::pki`).
//!
//! The listeners that require credentials bind `0.0.0.0` (a non-loopback address is what
//! makes a listener require them); the tests only ever connect to them through
//! `localhost`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_tests::bridge::publish_args;
use spillway_tests::gateway::{GatewayProcess, free_port, http_get, run_cli};
use spillway_tests::pki::{Pki, make_token};
use spillway_tests::run_bridge;
use spillway_tests::wait::wait_until;

/// The gateway's certificates and two tokens: `bridge` (every role) and `sensor`
/// (`publish` only).
struct Setup {
    dir: tempfile::TempDir,
    pki: Pki,
    bridge_token: PathBuf,
    sensor_token: PathBuf,
    config: PathBuf,
}

impl Setup {
    fn new(client_ca: bool) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::make(dir.path());
        let bridge_token = dir.path().join("bridge.token");
        let sensor_token = dir.path().join("sensor.token");
        let mut text = format!(
            "tls-cert = {:?}\ntls-key = {:?}\n",
            pki.gw_cert.display().to_string(),
            pki.gw_key.display().to_string()
        );
        if client_ca {
            text += &format!(
                "tls-client-ca = {:?}\n",
                pki.client_ca.display().to_string()
            );
        }
        text += &make_token(&bridge_token, "bridge", "publish,consume,admin");
        text += &make_token(&sensor_token, "sensor", "publish");
        let config = dir.path().join("gw.toml");
        std::fs::write(&config, text).unwrap();
        Setup {
            dir,
            pki,
            bridge_token,
            sensor_token,
            config,
        }
    }

    fn image(&self) -> PathBuf {
        self.dir.path().join("gw.img")
    }

    /// Starts the gateway with a listener on a free port at each of `bases` (`SCHEME://HOST`)
    /// and a metrics endpoint on another: the process, the listeners' ports and the metrics
    /// port.
    fn start_on<const N: usize>(&self, bases: [&str; N]) -> (GatewayProcess, [u16; N], u16) {
        let ports = bases.map(|_| free_port());
        let metrics = free_port();
        let listeners: Vec<String> = bases
            .iter()
            .zip(ports)
            .map(|(b, p)| format!("{b}:{p}"))
            .collect();
        (self.start(&listeners, metrics), ports, metrics)
    }

    /// Starts the gateway with `listeners` and a metrics port.
    fn start(&self, listeners: &[String], metrics: u16) -> GatewayProcess {
        let mut args: Vec<String> = vec![
            "--config".into(),
            self.config.display().to_string(),
            "--image".into(),
            self.image().display().to_string(),
            "--size".into(),
            "1M".into(),
            "--metrics".into(),
            format!("127.0.0.1:{metrics}"),
        ];
        for l in listeners {
            args.extend(["--listen".into(), l.clone()]);
        }
        GatewayProcess::start(&args, listeners.len())
    }

    /// `tail --format raw` of the TLS listener on `port` with the bridge's token, which must
    /// succeed: its stdout.
    fn tail_raw(&self, port: u16) -> String {
        let gw = format!("tls://localhost:{port}");
        let token = self.bridge_token.display().to_string();
        let (code, out, err) = self.bridge(
            &["tail", "--gateway", &gw, "--format", "raw"],
            &["--token-file", &token],
        );
        assert_eq!(code, 0, "{err}");
        out
    }

    /// `spillway-bridge ARGS --tls-ca CA` (plus `extra`); (exit code, stdout, stderr).
    fn bridge(&self, args: &[&str], extra: &[&str]) -> (i32, String, String) {
        let ca = self.pki.ca.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--tls-ca", &ca]);
        all.extend(extra);
        let out = run_bridge(&all);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The gateway's next offset and the `bridge` consumer's committed offset, read with
    /// the `bridge` token.
    fn offsets(&self, gw: &str) -> (u64, u64) {
        let token = self.bridge_token.display().to_string();
        let (code, out, err) = self.bridge(
            &[
                "status",
                "--gateway",
                gw,
                "--json",
                "--state",
                "/nonexistent/x.redb",
            ],
            &["--token-file", &token],
        );
        assert_eq!(code, 0, "status: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let committed = v["consumers"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == "bridge"))
            .and_then(|c| c["committed_offset"].as_u64())
            .unwrap_or(0);
        (v["stats"]["next_offset"].as_u64().unwrap(), committed)
    }
}

/// `spillway_refused_total{reason="REASON"}` from the metrics port.
fn refused(metrics: u16, reason: &str) -> u64 {
    let text = http_get(metrics, "/metrics");
    let key = format!("spillway_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn input(dir: &Path, n: usize) -> String {
    let p = dir.join("in.txt");
    std::fs::write(&p, (0..n).map(|i| format!("r {i}\n")).collect::<String>()).unwrap();
    p.display().to_string()
}

#[test]
fn unsafe_listener_settings_exit_2_before_the_image_is_touched() {
    let s = Setup::new(false);
    let img = s.image().display().to_string();
    let port = free_port();
    let plain = format!("tcp://0.0.0.0:{port}");
    let (code, _, err) = run_cli(&["run", "--image", &img, "--listen", &plain]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&plain) && err.contains("allow-insecure=true") && err.contains("tls://"),
        "the error names the listener and the fixes: {err}"
    );
    let tls = format!("tls://127.0.0.1:{port}");
    let (code, _, err) = run_cli(&["run", "--image", &img, "--listen", &tls]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--tls-cert and --tls-key"), "{err}");
    // A non-loopback TLS listener with nobody able to present a credential.
    let (cert, key) = (
        s.pki.gw_cert.display().to_string(),
        s.pki.gw_key.display().to_string(),
    );
    // The same for MQTT, whose clients present tokens as passwords (and the error names
    // that listener).
    for (scheme, names_it) in [("tls", false), ("mqtts", true)] {
        let open = format!("{scheme}://0.0.0.0:{port}");
        let (code, _, err) = run_cli(&[
            "run",
            "--image",
            &img,
            "--listen",
            &open,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("[[credential]]"), "{err}");
        assert!(!names_it || err.contains(&open), "{err}");
    }
    assert!(!s.image().exists(), "the image was not created");
}

#[test]
fn wrong_or_missing_tokens_are_refused_counted_and_store_nothing() {
    let s = Setup::new(false);
    let (g, [port], metrics) = s.start_on(["tls://0.0.0.0"]);
    let gw = format!("tls://localhost:{port}");
    let file = input(s.dir.path(), 10);
    let wrong = s.dir.path().join("wrong.token");
    std::fs::write(&wrong, "0123456789abcdef0123456789abcdef\n").unwrap();
    let mut perm = std::fs::metadata(&wrong).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
    std::fs::set_permissions(&wrong, perm).unwrap();
    let wrong = wrong.display().to_string();

    let (code, _, err) = s.bridge(
        &[publish_args(&gw, "t"), vec!["--retry-for", "1s", &file]].concat(),
        &["--token-file", &wrong],
    );
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("Unauthorized") && err.contains("credential not accepted"),
        "{err}"
    );
    g.wait_for_log("credential not accepted", 1);

    let (code, _, err) = s.bridge(&["status", "--gateway", &gw], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("requires a credential"), "{err}");
    g.wait_for_log("no credential", 1);

    assert_eq!(s.offsets(&gw), (0, 0), "nothing stored, nothing committed");
    // The publish tried more than once within its --retry-for.
    assert!(refused(metrics, "unauthorized") >= 2);
}

#[test]
fn wrong_ca_and_expired_certificates_fail_the_handshake_on_both_sides() {
    let s = Setup::new(true);
    let (g, [port], metrics) = s.start_on(["tls://0.0.0.0"]);
    let gw = format!("tls://localhost:{port}");
    let p = |p: &Path| p.display().to_string();

    // A client certificate from the client CA admits the bridge without a token.
    let (cert, key) = (p(&s.pki.client_cert), p(&s.pki.client_key));
    let (code, _, err) = s.bridge(
        &["status", "--gateway", &gw],
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    assert_eq!(code, 0, "a valid client certificate: {err}");

    let mut failures = 0;
    for (what, cert, key) in [
        ("expired", p(&s.pki.expired_cert), p(&s.pki.expired_key)),
        ("from another CA", p(&s.pki.other_cert), p(&s.pki.other_key)),
    ] {
        let (code, _, err) = s.bridge(
            &["status", "--gateway", &gw],
            &["--tls-cert", &cert, "--tls-key", &key],
        );
        assert_ne!(code, 0, "a client certificate {what} was accepted");
        assert!(
            err.contains("TLS") || err.contains("alert"),
            "{what}: {err}"
        );
        failures += 1;
        g.wait_for_log("TLS handshake", 1);
    }
    assert!(
        !g.log_lines(&["Expired", "expired"]).is_empty(),
        "the gateway says why:\n{}",
        g.log_text()
    );

    // The bridge does not trust a gateway whose certificate another CA signed.
    let other = p(&s.pki.other_ca);
    let token = p(&s.bridge_token);
    let out = run_bridge(&[
        "status",
        "--gateway",
        &gw,
        "--tls-ca",
        &other,
        "--token-file",
        &token,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("UnknownIssuer"), "{err}");
    failures += 1;

    wait_until(
        Duration::from_secs(10),
        || (refused(metrics, "tls_handshake") >= failures).then_some(()),
        || g.log_text(),
    );
    assert_eq!(s.offsets(&gw), (0, 0));
}

/// A TLS client beyond `--max-connections` is told so after its TLS handshake (the
/// gateway's `Error`, seq 0, names the flag), not left to guess from a closed connection.
#[test]
fn a_tls_client_beyond_max_connections_is_told_so() {
    let s = Setup::new(false);
    let port = free_port();
    let listen = format!("tls://127.0.0.1:{port}");
    let args: Vec<String> = [
        "--config",
        &s.config.display().to_string(),
        "--image",
        &s.image().display().to_string(),
        "--size",
        "1M",
        "--max-connections",
        "1",
        "--listen",
        &listen,
    ]
    .map(String::from)
    .to_vec();
    let _g = GatewayProcess::start(&args, 1);
    // The bridge binary is found (and built if need be) before the slot is taken: the
    // holder keeps it for only 10 s.
    spillway_tests::bridge_bin();
    // A socket that never starts its TLS handshake holds the one slot (for up to 10 s); the
    // gateway accepts in order, so the bridge comes second.
    let _holder = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let token = s.bridge_token.display().to_string();
    let (code, _, err) = s.bridge(
        &["status", "--gateway", &format!("tls://localhost:{port}")],
        &["--token-file", &token],
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("gateway at --max-connections"), "{err}");
}

#[test]
fn plaintext_and_tls_clients_on_the_wrong_port_are_told_so() {
    let s = Setup::new(false);
    let (g, [tls_port, tcp_port], metrics) = s.start_on(["tls://127.0.0.1", "tcp://127.0.0.1"]);
    let token = s.bridge_token.display().to_string();
    // (the gateway named, what the client says, what the gateway logs)
    for (gateway, says, logged) in [
        (
            format!("tcp://127.0.0.1:{tls_port}"),
            "a tls:// port?",
            format!("TLS handshake on tls://127.0.0.1:{tls_port} failed"),
        ),
        (
            format!("tls://localhost:{tcp_port}"),
            "handshake failed",
            "a TLS client on a plaintext listener".to_string(),
        ),
    ] {
        let (code, _, err) = s.bridge(
            &["status", "--gateway", &gateway],
            &["--token-file", &token],
        );
        assert_ne!(code, 0);
        assert!(err.contains(says), "{err}");
        g.wait_for_log(&logged, 1);
    }
    assert_eq!(refused(metrics, "tls_handshake"), 2);
}

#[test]
fn a_publish_only_credential_cannot_commit_delete_or_fetch() {
    let s = Setup::new(false);
    let (_g, [port], metrics) = s.start_on(["tls://0.0.0.0"]);
    let gw = format!("tls://localhost:{port}");
    let sensor = s.sensor_token.display().to_string();
    let as_sensor = ["--token-file", sensor.as_str()];
    let file = input(s.dir.path(), 20);
    let (code, _, err) = s.bridge(&[publish_args(&gw, "t"), vec![&file]].concat(), &as_sensor);
    assert_eq!(code, 0, "the sensor publishes: {err}");
    assert_eq!(s.offsets(&gw), (20, 0));

    let state = s.dir.path().join("s.redb").display().to_string();
    let sink = format!("file:{}", s.dir.path().join("out").display());
    for args in [
        vec!["consumers", "delete", "bridge", "--force", "--gateway", &gw],
        vec!["tail", "--gateway", &gw],
        vec![
            "drain",
            "--gateway",
            &gw,
            "--sink",
            &sink,
            "--state",
            &state,
            "--once",
            "--progress",
            "off",
            "--retry-for",
            "1s",
        ],
    ] {
        let (code, _, err) = s.bridge(&args, &as_sensor);
        assert_ne!(code, 0, "{args:?} succeeded for a publish-only credential");
        assert!(err.contains("Forbidden"), "{args:?}: {err}");
    }
    assert_eq!(s.offsets(&gw), (20, 0), "nothing committed");
    let token = s.bridge_token.display().to_string();
    let (_, out, _) = s.bridge(&["consumers", "--gateway", &gw], &["--token-file", &token]);
    assert!(out.contains("bridge"), "the consumer is still there: {out}");
    assert!(refused(metrics, "forbidden") >= 3);
}

/// `mqtts://` is the MQTT listener over the same TLS as `tls://`: `mosquitto_pub` with the
/// test CA publishes, a plaintext MQTT client on that port is refused in the handshake.
#[test]
fn mqtts_carries_mqtt_publishes_over_tls() {
    let s = Setup::new(false);
    let (g, [mqtts, port], _) = s.start_on(["mqtts://127.0.0.1", "tls://127.0.0.1"]);
    let ca = s.pki.ca.display().to_string();
    let pub_ = |extra: &[&str]| {
        std::process::Command::new("mosquitto_pub")
            .args(["-h", "localhost", "-p", &mqtts.to_string()])
            .args([
                "-t",
                "buoy/sst",
                "-m",
                "21.5",
                "-q",
                "1",
                "-i",
                "mqtts-test",
            ])
            .args(extra)
            .output()
            .expect("mosquitto_pub (Debian mosquitto-clients; scripts/install-deps.sh installs it)")
    };
    let out = pub_(&["--cafile", &ca]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pub_(&[]);
    assert!(!out.status.success(), "plaintext MQTT on the TLS port");
    g.wait_for_log(
        &format!("TLS handshake on mqtts://127.0.0.1:{mqtts} failed"),
        1,
    );
    let out = s.tail_raw(port);
    assert_eq!(out, "21.5\n");
}

/// An MQTT client presents a token as its password (and the credential's name as its user
/// name) on a non-loopback `mqtts://` listener, which needs no `--tls-client-ca` once
/// credentials are configured: the right token stores (MQTT 5 and 3.1.1); a wrong token, a
/// user name that is not the token's credential, a missing password and a credential
/// without `publish` get the CONNACK refusals (0x86 / 0x87, 3.1.1 return codes 4 / 5,
/// as `mosquitto_pub` reports them), each counted, nothing stored. An empty user name
/// leaves the token alone to name the credential. On a loopback `mqtt://`
/// listener a client without a password is anonymous, and a password given is checked.
#[test]
fn mqtt_passwords_are_tokens_checked_refused_and_counted() {
    let s = Setup::new(false);
    let reader_token = s.dir.path().join("reader.token");
    let mut text = std::fs::read_to_string(&s.config).unwrap();
    text += &make_token(&reader_token, "reader", "consume");
    std::fs::write(&s.config, text).unwrap();
    let (_g, [mqtts, mqtt, port], metrics) =
        s.start_on(["mqtts://0.0.0.0", "mqtt://127.0.0.1", "tls://0.0.0.0"]);
    let ca = s.pki.ca.display().to_string();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap().trim().to_string();
    let (sensor, reader) = (read(&s.sensor_token), read(&reader_token));
    // (exit status, stderr) of one QoS 1 `mosquitto_pub` of `message`.
    let publish = |tls: bool, version: &str, message: &str, login: &[&str]| {
        let mut cmd = std::process::Command::new("mosquitto_pub");
        cmd.args([
            "-h",
            "localhost",
            "-V",
            version,
            "-q",
            "1",
            "-t",
            "buoy/sst",
        ])
        .args(["-m", message, "-i", "auth-test"]);
        if tls {
            cmd.args(["-p", &mqtts.to_string(), "--cafile", &ca]);
        } else {
            cmd.args(["-p", &mqtt.to_string()]);
        }
        let out = cmd.args(login).output().expect(
            "mosquitto_pub (Debian mosquitto-clients; scripts/install-deps.sh installs it)",
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_lowercase(),
        )
    };
    let stored = [
        "mqtt5 token",
        "mqtt311 token",
        "empty user name",
        "loopback",
    ];
    for (version, message, login) in [
        ("mqttv5", stored[0], &["-u", "sensor", "-P", &sensor][..]),
        ("mqttv311", stored[1], &["-u", "sensor", "-P", &sensor][..]),
        ("mqttv311", stored[2], &["-u", "", "-P", &sensor][..]),
    ] {
        let (ok, err) = publish(true, version, message, login);
        assert!(ok, "{message}: {err}");
    }
    let (ok, err) = publish(false, "mqttv5", stored[3], &[]);
    assert!(ok, "anonymous on loopback: {err}");
    // A password without a user name: MQTT 3.1.1 forbids it and the codec refuses it in
    // MQTT 5 too, as a protocol error (not a credential refusal).
    let (ok, _) = publish(true, "mqttv5", "no user name", &["-P", &sensor]);
    assert!(!ok, "a password without a user name");

    let wrong = "0123456789abcdef0123456789abcdef";
    let bad = "bad user name or password";
    let not_authorized = "not author"; // mosquitto spells 3.1.1's "not authorised"
    let refusals: &[(bool, &str, &[&str], &str)] = &[
        (true, "mqttv5", &["-u", "sensor", "-P", wrong], bad),
        (true, "mqttv311", &["-u", "sensor", "-P", wrong], bad),
        (true, "mqttv5", &["-u", "bridge", "-P", &sensor], bad),
        (true, "mqttv5", &[], not_authorized),
        (true, "mqttv311", &[], not_authorized),
        (
            true,
            "mqttv5",
            &["-u", "reader", "-P", &reader],
            not_authorized,
        ),
        (
            true,
            "mqttv311",
            &["-u", "reader", "-P", &reader],
            not_authorized,
        ),
        (false, "mqttv5", &["-u", "sensor", "-P", wrong], bad),
        (false, "mqttv311", &["-u", "bridge", "-P", wrong], bad),
    ];
    for (i, (tls, version, login, why)) in refusals.iter().enumerate() {
        let (ok, err) = publish(*tls, version, &format!("refused {i}"), login);
        assert!(!ok, "refusal {i} ({version} {login:?}) was accepted");
        assert!(err.contains(why), "refusal {i}: {why:?} expected: {err}");
    }
    assert_eq!(refused(metrics, "unauthorized"), refusals.len() as u64);

    let out = s.tail_raw(port);
    assert_eq!(
        out,
        stored.map(|m| format!("{m}\n")).concat(),
        "only the admitted"
    );
}

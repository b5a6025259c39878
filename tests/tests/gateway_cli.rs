//! What a user of the real `spillway` binary sees: help texts and exit codes, log levels,
//! warnings of dropped lines in line mode, the metrics endpoint, the full log (in the
//! metrics, the log and `spillway-bridge status`), locks, ports, late serial devices,
//! `validate`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use spillway_core::wire::{AckLevel, ErrorCode};
use spillway_tests::bridge::run_bridge;
use spillway_tests::client::{ClientError, Wait, connect, refusal, wait_for_records};
use spillway_tests::gateway::{
    GatewayProcess, assert_metrics, free_port, http_get, image_in, run_cli, spillway_bin,
};
use spillway_tests::process::{ChildProcess, output_with_stdin};
use spillway_tests::wait::wait_until;

/// A fresh image `DIR/gw.img` of 1 MiB with 4 KiB erase blocks, gateway id `cli-gw`.
fn image_args(dir: &Path) -> Vec<String> {
    image_in(
        dir,
        &[
            "--size",
            "1M",
            "--erase-size",
            "4K",
            "--gateway-id",
            "cli-gw",
        ],
    )
}

fn args(dir: &Path, extra: &[String]) -> Vec<String> {
    let mut a = image_args(dir);
    a.extend(extra.iter().cloned());
    a
}

/// [`image_args`] and a `--listen` for each of `uris`.
fn listening(dir: &Path, uris: &[String]) -> Vec<String> {
    let mut a = image_args(dir);
    for u in uris {
        a.extend(["--listen".to_string(), u.clone()]);
    }
    a
}

#[test]
fn help_opens_with_the_purpose_and_each_subcommand_lists_its_exit_codes() {
    let (code, out, _) = run_cli(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("Spillway gateway: keeps the messages of sensors"),
        "{out}"
    );
    for (sub, codes) in [
        ("run", &["0 ", "1 ", "2 ", "3 "][..]),
        ("inspect", &["0 ", "2 ", "3 ", "4 "][..]),
        ("validate", &["0 ", "2 ", "3 "][..]),
    ] {
        let (code, out, _) = run_cli(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}");
        let tail = out
            .split("Exit codes:")
            .nth(1)
            .unwrap_or_else(|| panic!("{sub} --help lists no exit codes:\n{out}"));
        for c in codes {
            assert!(tail.contains(&format!("  {c}")), "{sub}: {c}in {tail}");
        }
    }
    let (_, run_help, _) = run_cli(&["run", "--help"]);
    assert!(run_help.contains("--log-level"), "{run_help}");
    assert!(run_help.contains("line-timeout-ms"), "{run_help}");
}

/// `--log-level warn` hides the info lines; RUST_LOG, when set, wins over the flag.
#[test]
fn log_level_flag_and_rust_log_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let lines_port = free_port();
    let a = args(
        dir.path(),
        &[
            "--listen".into(),
            format!("tcp://127.0.0.1:{port}"),
            "--listen".into(),
            format!("tcp://127.0.0.1:{lines_port}?mode=lines"),
            "--log-level".into(),
            "warn".into(),
        ],
    );
    let mut child = Command::new(spillway_bin())
        .arg("run")
        .args(&a)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut child = ChildProcess::new(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    // Serving (no "listening on" line tells): the framed listener answers.
    let mut c = wait_until(
        Duration::from_secs(30),
        || connect(&format!("127.0.0.1:{port}")).ok(),
        || "the gateway never served".into(),
    );
    c.publish("t", None, b"x", AckLevel::Buffered, None)
        .wait()
        .unwrap();
    // A warning still goes out.
    let mut s = TcpStream::connect(("127.0.0.1", lines_port)).unwrap();
    s.write_all(b" starts with a blank\n").unwrap();
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no warning logged: {seen:?}"));
        let done = line.contains("line dropped");
        seen.push(line);
        if done {
            break;
        }
    }
    assert!(
        seen.iter().all(|l| !l.contains(" INFO ")),
        "info lines under --log-level warn: {seen:?}"
    );
    child.stop(Duration::from_secs(10));

    // RUST_LOG=info (set by the harness) wins over --log-level error: the info lines that
    // the harness waits for appear.
    let port = free_port();
    let g = GatewayProcess::start(
        &args(
            dir.path(),
            &[
                "--listen".into(),
                format!("tcp://127.0.0.1:{port}"),
                "--log-level".into(),
                "error".into(),
            ],
        ),
        1,
    );
    assert!(!g.log_lines(&["listening on"]).is_empty());

    // A bad value is a usage error.
    let (code, _, err) = run_cli(&["run", "--log-level", "loud"]);
    assert_eq!(code, 2, "{err}");
}

/// Every kind of dropped line is warned about, naming the configured limit; a burst of
/// one kind gives one warning (rate limited), and the good lines around them are stored.
#[test]
fn dropped_lines_are_warned_once_per_burst_naming_the_configured_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (pf, pw, pl) = (free_port(), free_port(), free_port());
    let g = GatewayProcess::start(
        &args(
            dir.path(),
            &[
                "--listen".into(),
                format!("tcp://127.0.0.1:{pf}"),
                "--listen".into(),
                format!("tcp://127.0.0.1:{pw}?mode=lines"),
                "--listen".into(),
                format!("tcp://127.0.0.1:{pl}?mode=lines&topic=buoy/sst"),
                "--max-record-bytes".into(),
                "256".into(),
            ],
        ),
        3,
    );
    let mut words = TcpStream::connect(("127.0.0.1", pw)).unwrap();
    let mut fixed = TcpStream::connect(("127.0.0.1", pl)).unwrap();
    // Fixed topic: 300 bytes is over the payload limit of 256.
    fixed.write_all(&[b'x'; 300]).unwrap();
    fixed.write_all(b"\n21.5\n").unwrap();
    let too_long = g.wait_for_log("longer than 256 bytes, --max-record-bytes is 256", 1);
    assert_eq!(too_long.len(), 1);
    // Topic word: a topic and a 300-byte payload fit the line buffer but not the record.
    words.write_all(b"t ").unwrap();
    words.write_all(&[b'y'; 300]).unwrap();
    words.write_all(b"\n").unwrap();
    g.wait_for_log("a payload of 300 bytes, --max-record-bytes is 256", 1);
    // A line over the topic word's room too.
    words.write_all(&[b'z'; 600]).unwrap();
    words.write_all(b"\n").unwrap();
    g.wait_for_log("a payload of at most 256 bytes, --max-record-bytes", 1);
    // Five lines without a topic word: one warning.
    for _ in 0..5 {
        words.write_all(b" 5.4\n").unwrap();
    }
    // A topic that is not UTF-8.
    words.write_all(b"\xff\xfe 5.5\ncgm/glucose 5.6\n").unwrap();
    g.wait_for_log("topic word is not UTF-8", 1);
    let mut c = connect(&format!("127.0.0.1:{pf}")).unwrap();
    let got = wait_for_records(&mut c, 2);
    let got: Vec<(&str, &[u8])> = got
        .iter()
        .map(|r| (r.topic.as_str(), &r.payload[..]))
        .collect();
    assert_eq!(
        got,
        vec![("buoy/sst", &b"21.5"[..]), ("cgm/glucose", &b"5.6"[..])]
    );
    assert_eq!(
        g.log_lines(&["line has no topic"]).len(),
        1,
        "a burst of one kind is warned once:\n{}",
        g.log_text()
    );
}

/// `t=20.3`, three seconds of silence, then `t=20.4\n` stores `t=20.4` alone: the partial
/// line is dropped with a warning after `line-timeout-ms`, never glued to the next one.
#[test]
fn a_partial_line_followed_by_silence_is_dropped_not_glued_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (pf, pl) = (free_port(), free_port());
    let g = GatewayProcess::start(
        &listening(
            dir.path(),
            &[
                format!("tcp://127.0.0.1:{pf}"),
                format!("tcp://127.0.0.1:{pl}?mode=lines&topic=sensor&line-timeout-ms=300"),
            ],
        ),
        2,
    );
    let mut s = TcpStream::connect(("127.0.0.1", pl)).unwrap();
    s.write_all(b"t=20.3").unwrap();
    let w = g.wait_for_log("partial line of 6 bytes dropped", 1);
    assert!(w[0].contains("no newline within 300 ms"), "{w:?}");
    s.write_all(b"t=20.4\n").unwrap();
    let mut c = connect(&format!("127.0.0.1:{pf}")).unwrap();
    let recs = wait_for_records(&mut c, 1);
    let payloads: Vec<&[u8]> = recs.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, vec![&b"t=20.4"[..]]);
    // A bad value is a usage error naming the key.
    let (code, _, err) = run_cli(&[
        "validate",
        "--config",
        write_config(
            dir.path(),
            "listen = [\"tcp://:1?mode=lines&line-timeout-ms=0\"]\n",
        )
        .to_str()
        .unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line-timeout-ms"), "{err}");
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("c.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// `spillway validate --config FILE` of the config `text` written to `DIR/c.toml`: (exit
/// code, stdout, stderr).
fn validate(dir: &Path, text: &str) -> (i32, String, String) {
    let cfg = write_config(dir, text);
    run_cli(&["validate", "--config", cfg.to_str().unwrap()])
}

/// The metrics are served on `/metrics` only, with the image's used and free bytes; a log
/// that fills up under `reject-new` sets `spillway_full` and logs one warning naming the
/// consumer that holds the space, and one more when it accepts records again.
#[test]
fn metrics_path_gauges_and_the_full_log_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let (port, pm) = (free_port(), free_port());
    let g = GatewayProcess::start(
        &[
            "--image".into(),
            dir.path().join("gw.img").display().to_string(),
            "--size".into(),
            "128K".into(),
            "--erase-size".into(),
            "4K".into(),
            "--buffer-bytes".into(),
            "8K".into(),
            // Uniform payloads: compressed, they would never fill the log.
            "--compression".into(),
            "none".into(),
            "--listen".into(),
            format!("tcp://127.0.0.1:{port}"),
            "--metrics".into(),
            format!("127.0.0.1:{pm}"),
        ],
        2,
    );
    assert!(http_get(pm, "/").starts_with("HTTP/1.1 404"));
    assert!(http_get(pm, "/metricsx").starts_with("HTTP/1.1 404"));
    assert_metrics(
        pm,
        &[
            "spillway_capacity_bytes 131072",
            "spillway_used_bytes ",
            "spillway_free_bytes ",
            "spillway_full 0",
        ],
    );
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    let payload = vec![b'p'; 2000];
    let mut stored = 0u64;
    let last = loop {
        match c
            .publish("fill", None, &payload, AckLevel::Durable, None)
            .wait()
        {
            Ok(a) => stored = a.offset + 1,
            Err(ClientError::Gateway {
                code: ErrorCode::Full,
                ..
            }) => break stored,
            other => panic!("{other:?}"),
        }
        assert!(stored < 1000, "never full");
    };
    // More refusals: still one warning.
    for _ in 0..3 {
        let r = c
            .publish("fill", None, &payload, AckLevel::Durable, None)
            .wait();
        assert_eq!(refusal(r), ErrorCode::Full);
    }
    let full = g.wait_for_log("the log is full", 1);
    assert!(full[0].contains("consumer \"bridge\""), "{full:?}");
    assert_metrics(pm, &["spillway_full 1"]);
    // `spillway-bridge status` says so too, naming the consumer that holds the space.
    let gw = format!("tcp://127.0.0.1:{port}");
    let out = run_bridge(&["status", "--gateway", &gw]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("free; FULL: new records are refused until consumer \"bridge\""),
        "{text}"
    );
    // One parenthesis for the consumer: its offset and what it is.
    assert!(
        text.contains(", the lowest; the pre-registered consumer of a fresh image: run spillway-bridge drain) commits or is deleted"),
        "{text}"
    );
    assert!(!text.contains(") ("), "{text}");
    let out = run_bridge(&["status", "--gateway", &gw, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["full"], true, "{v}");
    let (cap, used) = (
        v["stats"]["capacity_bytes"].as_u64().unwrap(),
        v["stats"]["used_bytes"].as_u64().unwrap(),
    );
    assert_eq!(v["stats"]["free_bytes"].as_u64(), Some(cap - used), "{v}");
    c.commit("bridge", last).wait().unwrap();
    c.publish("fill", None, &payload, AckLevel::Durable, None)
        .wait()
        .unwrap();
    g.wait_for_log("the log accepts records again", 1);
    assert_metrics(pm, &["spillway_full 0"]);
    let out = run_bridge(&["status", "--gateway", &gw, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["full"], false, "{v}");
    assert_eq!(g.log_lines(&["the log is full"]).len(), 1);
}

/// A second gateway on a locked image is told that it is locked and by which process,
/// even with geometry flags that disagree with the image (the lock is what matters);
/// `validate` of a config naming that image warns of the lock, naming the process.
#[test]
fn a_locked_image_names_the_process_that_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let g = GatewayProcess::start(
        &listening(dir.path(), &[format!("tcp://127.0.0.1:{port}")]),
        1,
    );
    let img = dir.path().join("gw.img").display().to_string();
    let other = format!("tcp://127.0.0.1:{}", free_port());
    for extra in [&[][..], &["--erase-size", "8K"][..]] {
        let mut a = vec!["run", "--image", &img, "--listen", &other];
        a.extend_from_slice(extra);
        let (code, _, err) = run_cli(&a);
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains(&format!("is locked by process {}", g.pid())),
            "{extra:?}: {err}"
        );
        assert!(!err.contains("geometry disagrees"), "{err}");
    }
    // validate reports the lock as a warning, as it does a port in use.
    let (code, out, err) = validate(
        dir.path(),
        &format!("image = \"{img}\"\nlisten = [\"{other}\"]\n"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 warning(s)"), "{out}");
    assert!(
        err.contains(&format!("is locked by process {}", g.pid())) && err.contains("exit 3"),
        "{err}"
    );
}

/// A port in use is found before anything is created on disk: no image, no file aside.
#[test]
fn a_port_in_use_fails_the_start_before_the_image_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let (code, _, err) = run_cli(&[
        "run",
        "--image",
        &dir.path().join("gw.img").display().to_string(),
        "--size",
        "1M",
        "--listen",
        &format!("tcp://127.0.0.1:{port}"),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on tcp://127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.contains("in use"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "created on disk: {left:?}");
}

/// A serial device that is absent at start (a USB adapter enumerating late) is waited for:
/// the gateway serves its other listeners, and once the device appears it is opened and its
/// lines are stored.
#[test]
fn a_serial_device_absent_at_start_is_waited_for() {
    use serialport::{SerialPort, TTYPort};
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("ttyLATE");
    let port = free_port();
    let serial = format!("serial://{}?baud=9600&mode=lines&topic=late", dev.display());
    let g = GatewayProcess::start(
        &args(
            dir.path(),
            &[
                "--listen".into(),
                format!("tcp://127.0.0.1:{port}"),
                "--serial".into(),
                serial.clone(),
            ],
        ),
        1,
    );
    let w = g.wait_for_log("waiting for it", 1);
    assert!(w[0].contains(&dev.display().to_string()), "{w:?}");
    let (mut master, slave) = TTYPort::pair().expect("pty pair");
    std::os::unix::fs::symlink(slave.name().expect("pty name"), &dev).unwrap();
    g.wait_for_log(&format!("listening on {serial}"), 1);
    master.write_all(b"19.25\n").unwrap();
    master.flush().unwrap();
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    let recs = wait_for_records(&mut c, 1);
    let r = &recs[0];
    assert_eq!((r.topic.as_str(), &r.payload[..]), ("late", &b"19.25"[..]));
    drop(slave);
}

/// `validate` refuses what `run` would refuse (an existing image of another geometry) and
/// warns of what `run` would meet (an absent serial device, a port in use).
#[test]
fn validate_checks_the_image_geometry_and_warns_of_devices_and_ports() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut g = GatewayProcess::start(
        &listening(dir.path(), &[format!("tcp://127.0.0.1:{port}")]),
        1,
    );
    g.terminate();
    let img = dir.path().join("gw.img").display().to_string();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();
    let base = format!("image = \"{img}\"\nlisten = [\"tcp://127.0.0.1:{busy_port}\"]\n");
    let (code, _, err) = validate(dir.path(), &format!("{base}erase-size = \"8K\"\n"));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("erase size 8192 (image: 4096)"), "{err}");
    let (code, out, err) = validate(
        dir.path(),
        &format!(
            "{base}erase-size = \"4K\"\nserial = [\"serial:///dev/spillway-absent?mode=lines\"]\n"
        ),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 warning(s)"), "{out}");
    assert!(
        err.contains("serial device /dev/spillway-absent does not exist"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "tcp://127.0.0.1:{busy_port}: cannot listen there now"
        )),
        "{err}"
    );
}

/// Mistakes with the listener URIs and the image path get messages that name the fix:
/// every listener scheme, `mqtts://` for a plaintext MQTT listener on a non-loopback
/// address, and the image file for a directory.
#[test]
fn listener_and_image_mistakes_name_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run_cli(&["run", "--image", "/tmp/x.img", "--listen", "foo://x:1"]);
    assert_eq!(code, 2, "{err}");
    for scheme in ["tcp://", "tls://", "unix://", "mqtt://", "mqtts://"] {
        assert!(err.contains(scheme), "{scheme} missing: {err}");
    }
    // A parameter a listener does not take: the message names the listener forms, not
    // the bridge's (which include serial ports).
    for uri in [
        "mqtt://127.0.0.1:1883?mode=lines",
        "tcp://127.0.0.1:7878?bogus=1",
    ] {
        let (code, _, err) = run_cli(&["run", "--image", "/tmp/x.img", "--listen", uri]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("unknown parameter") && err.contains("mqtts://IP:PORT"),
            "{err}"
        );
        assert!(!err.contains("serial:"), "{err}");
    }
    let img = dir.path().join("gw.img");
    let (code, _, err) = run_cli(&[
        "run",
        "--image",
        img.to_str().unwrap(),
        "--listen",
        "mqtt://0.0.0.0:1883",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Use mqtts://0.0.0.0:1883"), "{err}");
    assert!(
        !img.exists(),
        "nothing is created before the config is valid"
    );
    let port = free_port();
    let (code, _, err) = run_cli(&[
        "run",
        "--image",
        dir.path().to_str().unwrap(),
        "--listen",
        &format!("tcp://127.0.0.1:{port}"),
    ]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("is a directory: --image names the flash image file"),
        "{err}"
    );
    let (code, out, _) = run_cli(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("mqtt://IP:PORT") && out.contains("mqtts://IP:PORT"),
        "{out}"
    );
}

/// Runs `BIN ARGS` with `stdin_text` on its standard input; (exit code, stdout, stderr).
fn run_with_stdin(bin: &Path, args: &[&str], stdin_text: &str) -> (i32, String, String) {
    let out = output_with_stdin(
        Command::new(bin).args(args),
        stdin_text.as_bytes(),
        "the binary",
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config file that can be read only once (a pipe: `--config <(printf …)`, here
/// `/dev/stdin`) is read once and used, by both binaries: `validate` names an unknown key
/// in it, `run` takes its image and listener, and the bridge's `status` its gateway (they
/// read it twice before and met an empty file the second time: defaults, or "ok").
#[test]
fn a_config_file_read_from_a_pipe_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run_with_stdin(
        &spillway_bin(),
        &["validate", "--config", "/dev/stdin"],
        "frobnicate = 1\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("key `frobnicate`"), "{err}");
    let img = dir.path().join("pipe.img");
    let port = free_port();
    let config = format!(
        "image = \"{}\"\nsize = \"1M\"\nlisten = [\"tcp://127.0.0.1:{port}\"]\ngateway-id = \"piped\"\n",
        img.display()
    );
    let (code, out, err) = run_with_stdin(
        &spillway_bin(),
        &["validate", "--config", "/dev/stdin"],
        &config,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("image {} will be created", img.display())),
        "{out}"
    );
    let mut child = Command::new(spillway_bin())
        .args(["run", "--config", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    let mut gw = ChildProcess::new(child);
    // Serving: the framed listener answers a handshake (the port is bound before the image
    // is created, so a bare TCP connect can come first).
    wait_until(
        Duration::from_secs(20),
        || {
            assert!(gw.try_wait().is_none(), "spillway run exited");
            connect(&format!("127.0.0.1:{port}")).ok()
        },
        || "the gateway never served".into(),
    );
    assert!(
        img.exists(),
        "the image of the piped config was not created"
    );
    let (code, out, err) = run_with_stdin(
        &spillway_tests::bridge::bridge_bin(),
        &["--config", "/dev/stdin", "status", "--json"],
        &format!("gateway = \"127.0.0.1:{port}\"\n"),
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["gateway_id"], "piped", "{out}");
    gw.kill();
}

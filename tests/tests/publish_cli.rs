//! `spillway-bridge publish` as a new user meets it, against the real gateway: a topic
//! and a producer id checked once, records from `-m`, a line over the gateway's limit named with both sizes
//! and passed over, an input that cannot be opened named, refusals of a full gateway
//! warned about once, not once per record, CRLF line endings, JSON payloads and timestamps
//! from a field; and what every subcommand shares: its `--help`, the `HOST:PORT` gateway
//! spelling, file errors that name the path, flags that are config keys. `tail`, `drain`,
//! `status` and `consumers` on their own are in `tail_drain_cli.rs`.

use std::path::Path;

use spillway_tests::bridge::{drain_args, publish_args, run_bridge};
use spillway_tests::client::{connect, read_log};
use spillway_tests::gateway::{free_port, small_gateway};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_empty_topic_is_one_usage_error() {
    let out = run_bridge(&[publish_args("tcp://127.0.0.1:1", ""), vec!["-m", "x"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--topic must be 1 to 255 bytes"), "{err}");
}

/// A producer id from 2^63 up is the gateway's own (its MQTT sessions'): a usage error,
/// given as a flag or in the config file, before anything is sent, naming the flag or the
/// key as it was given.
#[test]
fn a_producer_id_of_the_gateway_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bridge.toml");
    std::fs::write(&config, "producer-id = \"18446744073709551615\"\n").unwrap();
    let config = config.display().to_string();
    for extra in [
        vec!["--producer-id", "9223372036854775808"],
        vec!["--config", &config],
    ] {
        let from_file = extra[0] == "--config";
        let args = [
            publish_args("tcp://127.0.0.1:1", "t"),
            extra,
            vec!["-m", "x"],
        ]
        .concat();
        let out = run_bridge(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("ids from 2^63"), "{err}");
        // Named as given: the flag, or the file's key (it used to name the flag for both).
        if from_file {
            assert!(
                err.contains(&format!(
                    "key `producer-id` = 18446744073709551615 in {config}"
                )) && !err.contains("--producer-id"),
                "{err}"
            );
        } else {
            assert!(err.contains("--producer-id 9223372036854775808:"), "{err}");
        }
    }
}

#[test]
fn messages_from_the_command_line_and_lines_over_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &["--max-record-bytes", "4K"]);
    let out = run_bridge(
        &[
            publish_args(&gw, "m/t"),
            vec!["-m", "first", "-m", "two\nlines"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // A 300,000-byte line between two short ones: named with both sizes, passed over.
    let input = dir.path().join("in.txt");
    let mut text = b"before\n".to_vec();
    text.extend(std::iter::repeat_n(b'x', 300_000));
    text.extend_from_slice(b"\nafter\n");
    std::fs::write(&input, &text).unwrap();
    let out = run_bridge(&[publish_args(&gw, "m/t"), vec![input.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("input line 2 is 300000 bytes, the gateway takes at most 4096; not sent"),
        "{err}"
    );
    let got = payloads(&gw);
    assert_eq!(
        got,
        vec![
            b"first".to_vec(),
            b"two\nlines".to_vec(),
            b"before".to_vec(),
            b"after".to_vec()
        ]
    );
    // An input that cannot be opened is named.
    let missing = dir.path().join("missing.txt");
    let out = run_bridge(&[publish_args(&gw, "m/t"), vec![missing.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "cannot open input {}: No such file",
            missing.display()
        )),
        "{err}"
    );
}

/// CRLF input (a file written on Windows) is taken line by line as LF input is: the `\r`
/// before each `\n` is part of the line ending, not of the payload; a `\r` elsewhere in a
/// line, and in a `-m` message, is kept.
#[test]
fn crlf_line_endings_are_not_part_of_the_payload() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let input = dir.path().join("crlf.txt");
    std::fs::write(&input, b"one\r\ntwo\r\n\r\nbare\rcr\nlast\r\n").unwrap();
    let out = run_bridge(&[publish_args(&gw, "t"), vec![input.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_bridge(&[publish_args(&gw, "t"), vec!["-m", "as given\r\n"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let got = payloads(&gw);
    let want: [&[u8]; 6] = [b"one", b"two", b"", b"bare\rcr", b"last", b"as given\r\n"];
    assert_eq!(got, want);
}

/// A full gateway refuses every record of each pipelined window; `publish` warns once for
/// all of them (then at most every 10 s), not once per record.
#[test]
fn a_full_gateway_is_warned_about_once_not_per_record() {
    let dir = tempfile::tempdir().unwrap();
    // Uniform lines: compressed, they would never fill the log.
    let (_g, gw) = small_gateway(
        dir.path(),
        &[
            "--size",
            "128K",
            "--buffer-bytes",
            "8K",
            "--compression",
            "none",
        ],
    );
    let input = dir.path().join("in.txt");
    let line = "p".repeat(2000);
    let text: String = (0..400).map(|_| format!("{line}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = run_bridge(
        &[
            publish_args(&gw, "fill"),
            vec!["--retry-for", "1s", input.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let warnings = err.lines().filter(|l| l.contains("gateway full")).count();
    assert_eq!(warnings, 1, "{err}");
    // The warning names the consumer that holds the space, and what it is.
    assert!(
        err.contains("consumer \"bridge\" (committed offset 0, the lowest; the pre-registered consumer of a fresh image"),
        "{err}"
    );
    // The summary is printed once.
    for once in [
        "records read ",
        "stopped before the end of the input",
        "to continue: spillway-bridge publish",
    ] {
        let n = err.lines().filter(|l| l.starts_with(once)).count();
        assert_eq!(n, 1, "{once:?} printed {n} times:\n{err}");
    }
}

/// SIGTERM or SIGINT stops a publish with its summary (what was acknowledged, the
/// producer, the command that continues it) and the shell's exit code for the signal.
#[test]
fn a_signalled_publish_prints_its_summary_and_exits_128_plus_the_signal() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use spillway_tests::bridge::{bridge_bin, gateway_next_offset};
    use spillway_tests::process::signal;

    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    for (sig, want) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let before = gateway_next_offset(&gw);
        let mut p = Command::new(bridge_bin())
            .args(["publish", "--gateway", &gw, "--topic", "t"])
            .args(["--producer-id", "5", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Three lines, and the input stays open.
        let mut stdin = p.stdin.take().unwrap();
        stdin.write_all(b"a\nb\nc\n").unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while gateway_next_offset(&gw) < before + 3 {
            assert!(Instant::now() < deadline, "publish made no progress");
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(&p, sig);
        let out = p.wait_with_output().unwrap();
        drop(stdin);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(want), "{err}");
        assert!(err.contains("acknowledged 3 (0 duplicates)"), "{err}");
        assert!(err.contains("producer 5 session"), "{err}");
        assert!(
            err.contains("first input line not acknowledged: 4"),
            "{err}"
        );
        assert!(
            err.contains("to continue: spillway-bridge publish")
                && err.contains("--producer-id 5 --resume"),
            "{err}"
        );
    }
}

/// Every regular file under `dir`, recursively, sorted by path.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A payload that is one JSON object or array on one line reaches the file sink (and
/// `tail`) as that JSON value, byte for byte, with `payload_encoding: "json"`; anything
/// else is a string as before.
#[test]
fn json_payloads_reach_the_file_sink_and_tail_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let obj = r#"{"t": 21.50,  "unit":"°C","n":[1,2e3]}"#;
    let arr = r#"[ {"a":1}, null ]"#;
    let out = run_bridge(
        &[
            publish_args(&gw, "j"),
            vec!["-m", obj, "-m", arr, "-m", "21.5", "-m", "{broken"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("s.redb");
    let out = run_bridge(
        &[
            drain_args(&gw, &sink, state.to_str().unwrap()),
            vec!["--once"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut text = String::new();
    for f in files_under(&dir.path().join("out")) {
        text.push_str(&std::fs::read_to_string(f).unwrap());
    }
    let tail = run_bridge(&["tail", "--gateway", &gw]);
    assert!(tail.status.success(), "{}", stderr(&tail));
    for (what, text) in [
        ("sink", text),
        ("tail", String::from_utf8(tail.stdout).unwrap()),
    ] {
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{what}: {text}");
        assert!(
            lines[0].contains(&format!(r#""payload":{obj},"payload_encoding":"json""#)),
            "{what}: {}",
            lines[0]
        );
        assert!(
            lines[1].contains(&format!(r#""payload":{arr},"payload_encoding":"json""#)),
            "{what}: {}",
            lines[1]
        );
        for (l, p) in [(lines[2], "21.5"), (lines[3], "{broken")] {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["payload"], p, "{what}");
            assert_eq!(v["payload_encoding"], "utf8", "{what}");
        }
    }
}

/// Each subcommand's `--help` lists its own exit codes; `spillway --help` opens with what
/// the gateway is for.
#[test]
fn each_subcommand_lists_its_own_exit_codes() {
    let help = |args: &[&str]| {
        let out = run_bridge(args);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let drain = help(&["drain", "--help"]);
    assert!(
        drain.contains("Exit codes:") && drain.contains("3  resume check failed"),
        "{drain}"
    );
    assert!(!drain.contains("130, 143"), "{drain}");
    let publish = help(&["publish", "--help"]);
    assert!(
        publish.contains("130, 143  stopped by SIGINT, SIGTERM"),
        "{publish}"
    );
    assert!(!publish.contains("resume check"), "{publish}");
    for sub in ["tail", "status", "consumers"] {
        let h = help(&[sub, "--help"]);
        assert!(h.contains("Exit codes:"), "{sub}: {h}");
        assert!(
            !h.contains("resume check") && !h.contains("130, 143"),
            "{sub}: {h}"
        );
    }
    let (code, out, _) = spillway_tests::gateway::run_cli(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("Spillway gateway: keeps the messages of sensors"),
        "{out}"
    );
    for sub in ["run", "inspect", "validate", "token"] {
        let (code, out, _) = spillway_tests::gateway::run_cli(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}");
        assert!(out.contains("Exit codes:"), "{sub}: {out}");
    }
}

/// Every `--gateway` takes `HOST:PORT` as `tcp://HOST:PORT`; the log id is printed the
/// same way (32 hex digits) by the gateway, `inspect`, `status` and `tail`.
#[test]
fn host_port_gateways_and_one_spelling_of_the_log_id() {
    let dir = tempfile::tempdir().unwrap();
    let (g, gw) = small_gateway(dir.path(), &[]);
    let bare = gw.strip_prefix("tcp://").unwrap().to_string();
    let out = run_bridge(&[publish_args(&bare, "t"), vec!["-m", "x"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_bridge(&["status", "--gateway", &bare, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let log_id = status["log_id"].as_str().unwrap().to_string();
    assert_eq!(log_id.len(), 32, "{log_id}");
    let out = run_bridge(&["consumers", "--gateway", &bare]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_bridge(&["tail", "--gateway", &bare]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["log_id"], log_id.as_str());
    let state = dir.path().join("s.redb");
    let sink = format!("file:{}", dir.path().join("out").display());
    let out = run_bridge(
        &[
            drain_args(&bare, &sink, state.to_str().unwrap()),
            vec!["--once"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // The gateway's own log: every "log <hex>" it printed is the same 32 digits.
    let text = g.log_text();
    let printed: Vec<&str> = text
        .split("log ")
        .skip(1)
        .map(|rest| rest.strip_prefix("id ").unwrap_or(rest))
        .filter_map(|rest| rest.split(|c: char| !c.is_ascii_hexdigit()).next())
        .filter(|w| w.len() >= 8)
        .collect();
    assert!(!printed.is_empty(), "{text}");
    assert!(
        printed.iter().all(|w| *w == log_id),
        "{printed:?} vs {log_id}: {text}"
    );
    drop(g);
    let (code, out, err) = spillway_tests::gateway::run_cli(&[
        "inspect",
        dir.path().join("gw.img").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["log_id"], log_id.as_str());
}

/// `publish --timestamp-field NAME` stamps each record from its JSON payload (RFC 3339 or
/// µs since the epoch; without a usable field the gateway stamps it, with a warning), and
/// several input files are read one after the other as one input; a missing one is named
/// before anything is sent.
#[test]
fn timestamps_from_a_field_and_several_input_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(
        &a,
        "{\"ts\":\"2023-11-14T22:13:20.5Z\",\"v\":1}\n{\"ts\":1600000000000000,\"v\":2}\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "{\"v\":3}\n{\"ts\":\"2001-02-03T04:05:06+01:00\",\"v\":4}\n",
    )
    .unwrap();
    let missing = dir.path().join("nope.jsonl");
    let out = run_bridge(
        &[
            publish_args(&gw, "s"),
            vec![a.to_str().unwrap(), missing.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "cannot open input {}: No such file",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        spillway_tests::bridge::gateway_next_offset(&gw),
        0,
        "nothing sent"
    );
    let before_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let out = run_bridge(
        &[
            publish_args(&gw, "s"),
            vec![
                "--timestamp-field",
                "ts",
                a.to_str().unwrap(),
                b.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("input line 3 (")
            && err.contains("b.jsonl line 1): --timestamp-field: no field \"ts\""),
        "{err}"
    );
    let out = run_bridge(&["tail", "--gateway", &gw]);
    assert!(out.status.success(), "{}", stderr(&out));
    let recs: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 4);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r["payload"]["v"], i as u64 + 1, "in input order: {r}");
    }
    assert_eq!(recs[0]["timestamp_us"], 1_700_000_000_500_000u64);
    assert_eq!(recs[0]["timestamp"], "2023-11-14T22:13:20.500000Z");
    assert_eq!(recs[1]["timestamp_us"], 1_600_000_000_000_000u64);
    assert!(
        recs[2]["timestamp_us"].as_u64().unwrap() >= before_us,
        "gateway-stamped"
    );
    assert_eq!(recs[3]["timestamp"], "2001-02-03T03:05:06.000000Z");
}

/// Errors that involve a file name the path and the OS reason: a sink path that is a file,
/// a state file that cannot be created, an image that cannot be created.
#[test]
fn file_errors_name_the_path_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"x").unwrap();
    let state = dir.path().join("s.redb");
    let out = run_bridge(
        &[
            drain_args(
                "tcp://127.0.0.1:1",
                &format!("file:{}", file.display()),
                state.to_str().unwrap(),
            ),
            vec!["--once", "--retry-for", "1s"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "cannot create the sink directory {}",
            file.display()
        )) && stderr(&out).contains("File exists"),
        "{}",
        stderr(&out)
    );
    let bad_state = dir.path().join("none/s.redb");
    let out = run_bridge(
        &[
            drain_args(
                "tcp://127.0.0.1:1",
                &format!("file:{}", dir.path().join("out").display()),
                bad_state.to_str().unwrap(),
            ),
            vec!["--once", "--retry-for", "1s"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&bad_state.display().to_string())
            && stderr(&out).contains("No such file or directory"),
        "{}",
        stderr(&out)
    );
    let image = dir.path().join("none/gw.img");
    let (code, _, err) = spillway_tests::gateway::run_cli(&[
        "run",
        "--image",
        image.to_str().unwrap(),
        "--size",
        "1M",
        "--erase-size",
        "4K",
        "--listen",
        "tcp://127.0.0.1:0",
    ]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!("cannot create flash image {}", image.display()))
            && err.contains("No such file or directory"),
        "{err}"
    );
}

/// A directory given as input is refused before anything is sent, naming it; a publish
/// that never reached the gateway says to run the same command again, not to resume a
/// session that was never opened.
#[test]
fn a_directory_input_and_a_gateway_never_reached_get_the_right_advice() {
    let dir = tempfile::tempdir().unwrap();
    let gw = format!("tcp://127.0.0.1:{}", free_port());
    let out = run_bridge(&[publish_args(&gw, "t"), vec![dir.path().to_str().unwrap()]].concat());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot open input {}", dir.path().display()))
            && err.contains("is a directory"),
        "{err}"
    );
    assert!(
        !err.contains("Connection refused"),
        "nothing is sent: {err}"
    );
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "a\nb\n").unwrap();
    let out = run_bridge(
        &[
            publish_args(&gw, "t"),
            vec!["--retry-for", "1s", input.to_str().unwrap()],
        ]
        .concat(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("stopped before anything was stored: run the same command again"),
        "{err}"
    );
    assert!(!err.contains("--resume"), "{err}");
}

/// Every flag `publish --help` documents is a config key too (`topic`, `ack`,
/// `producer-id`, `retry-for`, `timestamp-field`), and so are drain's `retry-for` and
/// tail's `follow`, `count` and `format` (publish's `topic` key does not filter tail); a
/// flag still wins over its key, a bad value names its key, and `--producer-id`'s help
/// says it is a number.
#[test]
fn every_documented_flag_is_a_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let cfg = dir.path().join("b.toml");
    std::fs::write(
        &cfg,
        format!(
            "gateway = \"{gw}\"\ntopic = \"from/file\"\nack = \"buffered\"\nproducer-id = 4242\nretry-for = \"30s\"\ntimestamp-field = \"ts\"\n"
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"ts\":\"2026-11-30T12:00:00Z\",\"v\":1}\n").unwrap();
    let out = run_bridge(&["--config", c, "publish", input.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("producer 4242"), "{err}");
    // The flag wins over the key.
    let out = run_bridge(&["--config", c, "publish", "--topic", "from/flag", "-m", "x"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_bridge(&["--config", c, "tail", "--format", "%t %T %s\\n"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        lines[0], "from/file 1796040000000 {\"ts\":\"2026-11-30T12:00:00Z\",\"v\":1}",
        "{text}"
    );
    assert!(
        lines[1].starts_with("from/flag ") && lines[1].ends_with(" x"),
        "{text}"
    );
    // The bridge's log level is a key too: a payload without its timestamp field is
    // warned about at the default level, and not at `error`.
    for (level, warned) in [("", true), ("log-level = \"error\"\n", false)] {
        std::fs::write(
            &cfg,
            format!("gateway = \"{gw}\"\ntopic = \"t\"\ntimestamp-field = \"ts\"\n{level}"),
        )
        .unwrap();
        // Without RUST_LOG, which run_bridge sets and which would win over the key.
        let out = std::process::Command::new(spillway_tests::bridge::bridge_bin())
            .args(["--config", c, "publish", "-m", "{\"v\":1}"])
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert_eq!(err.contains("WARN"), warned, "{level:?}: {err}");
    }
    // tail's keys: a count and a format.
    std::fs::write(
        &cfg,
        format!("gateway = \"{gw}\"\ncount = 1\nformat = \"%t\\n\"\n"),
    )
    .unwrap();
    let out = run_bridge(&["--config", c, "tail"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from/file\n");
    // drain's retry-for: a gateway that is not there is given up on after it.
    std::fs::write(
        &cfg,
        format!(
            "gateway = \"127.0.0.1:{}\"\nretry-for = \"1s\"\nonce = true\n",
            free_port()
        ),
    )
    .unwrap();
    let sink = format!("file:{}", dir.path().join("o").display());
    let state = dir.path().join("s.redb").display().to_string();
    let started = std::time::Instant::now();
    let out = run_bridge(&[
        "--config",
        c,
        "drain",
        "--sink",
        &sink,
        "--state",
        &state,
        "--progress",
        "off",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("made no progress for"), "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // A bad value names its key.
    for (bad, key) in [
        ("producer-id = \"sensor-7\"\n", "producer-id"),
        ("ack = \"all\"\n", "ack"),
        ("retry-for = \"soon\"\n", "retry-for"),
    ] {
        std::fs::write(&cfg, bad).unwrap();
        let out = run_bridge(&["--config", c, "publish", "-m", "x"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(&format!("key `{key}`")), "{bad}: {err}");
    }
    let help = run_bridge(&["publish", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("a number from 0 to 9223372036854775807"),
        "{help}"
    );
}

/// The payloads of every record in the log of the gateway at `gw` (`tcp://…`), in order.
fn payloads(gw: &str) -> Vec<Vec<u8>> {
    let mut c = connect(gw.trim_start_matches("tcp://")).unwrap();
    read_log(&mut c, 0)
        .unwrap()
        .into_iter()
        .map(|r| r.payload.to_vec())
        .collect()
}

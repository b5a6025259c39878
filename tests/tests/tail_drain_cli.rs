//! `spillway-bridge tail`, `drain`, `status` and `consumers` as a new user meets them,
//! against the real gateway: `tail` with kcat's habits and past the end, `--from` an offset
//! over a checkpoint or a time, what the bridge consumer is, and a port that is not a
//! Spillway listener named as such at once. `publish` and what every subcommand shares
//! are in `publish_cli.rs`.

use spillway_core::wire::Request;
use spillway_tests::bridge::{
    drain_args, publish_args, resume_offsets, run_bridge, run_bridge_within, sink_files,
    spawn_bridge_lines, wait_for_line,
};
use spillway_tests::client::{Reply, Wait, connect, next_reply};
use spillway_tests::gateway::{GatewayProcess, free_port, small_gateway};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `tail` with kcat's habits: `--from -N` (both spellings), `--count`, `--format` with
/// kcat's tokens, `--topic` with MQTT wildcards.
#[test]
fn tail_from_the_end_with_count_template_and_topic_filters() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    for (topic, msg) in [
        ("a/b/c", "one"),
        ("a/x/c", "two"),
        ("z", "three"),
        ("a/b", "four"),
    ] {
        let out = run_bridge(&[publish_args(&gw, topic), vec!["-m", msg]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let tail = |extra: &[&str]| {
        let mut a = vec!["tail", "--gateway", gw.as_str()];
        a.extend_from_slice(extra);
        let out = run_bridge(&a);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        tail(&["--from", "-2", "--format", "%t %o %s\\n"]),
        "z 2 three\na/b 3 four\n"
    );
    assert_eq!(tail(&["--from=-1", "--format", "raw"]), "four\n");
    assert_eq!(
        tail(&["--topic", "a/+/c", "--format", "%s\\n"]),
        "one\ntwo\n"
    );
    assert_eq!(
        tail(&["--topic", "a/#", "--count", "2", "--format", "%o,"]),
        "0,1,"
    );
    assert_eq!(
        tail(&["--topic", "z", "--topic", "a/b", "--format", "%t\\t%s\\n"]),
        "z\tthree\na/b\tfour\n"
    );
    let stamp = tail(&["--from", "-1", "--format", "%T"]);
    let ms: u64 = stamp.parse().unwrap();
    assert!(ms > 1_600_000_000_000, "{stamp} is not ms since the epoch");
    let out = run_bridge(&["tail", "--gateway", &gw, "--format", "%q"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = run_bridge(&["tail", "--gateway", &gw, "--topic", "a/b#"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // drain takes -N as tail does: the last N offsets, in both spellings; -N beyond the
    // start of the log starts at its first offset.
    for (from, want) in [("-2", 2), ("=-1", 1), ("-99", 4)] {
        let sink = dir.path().join(format!("sink{from}"));
        let sink_uri = format!("file:{}", sink.display());
        let state = dir.path().join(format!("s{from}.redb"));
        let state = state.to_str().unwrap();
        let mut args = drain_args(&gw, &sink_uri, state);
        let joined = format!("--from{from}");
        match from.strip_prefix('=') {
            Some(_) => args.push(&joined),
            None => args.extend(["--from", from]),
        }
        args.push("--once");
        let out = run_bridge(&args);
        assert!(out.status.success(), "{from}: {}", stderr(&out));
        let mut offsets = offsets_where(&sink, |_| true);
        offsets.sort();
        assert_eq!(offsets, (4 - want..4).collect::<Vec<u64>>(), "{from}");
    }
    let out = run_bridge(
        &drain_args(&gw, "file:x", "x.redb")
            .into_iter()
            .chain(["--from", "-x", "--once"])
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("-N"), "{}", stderr(&out));
}

/// `tail --from` past the end of the log exits 1 the same way with and without --follow.
#[test]
fn tail_from_past_the_end_is_the_same_with_and_without_follow() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let out = run_bridge(&[publish_args(&gw, "t"), vec!["-m", "a", "-m", "b"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    for follow in [false, true] {
        let mut args = vec!["tail", "--gateway", &gw, "--from", "10"];
        if follow {
            args.push("--follow");
        }
        let out = run_bridge(&args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "follow {follow}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("--from 10 is past the end of log")
                && stderr(&out).contains("its next offset is 2"),
            "follow {follow}: {}",
            stderr(&out)
        );
        assert!(out.stdout.is_empty());
    }
    // The next offset itself is not past the end: nothing to print, exit 0.
    let out = run_bridge(&["tail", "--gateway", &gw, "--from", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `drain --from` with a checkpoint in the state file: one warning naming both offsets;
/// `--retry-for` bounds a drain without --once too and names the gateway; a publish with
/// `--retry-for 0s` makes one attempt.
#[test]
fn drain_from_over_a_checkpoint_warns_once_and_retry_for_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let out = run_bridge(
        &[
            publish_args(&gw, "t"),
            vec!["--retry-for", "0s", "-m", "a", "-m", "b", "-m", "c"],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "--retry-for 0s: one attempt: {}",
        stderr(&out)
    );
    let state = dir.path().join("s.redb");
    let sink = format!("file:{}", dir.path().join("out").display());
    let drain = |extra: &[&str]| {
        let mut args = [
            drain_args(&gw, &sink, state.to_str().unwrap()),
            vec!["--once"],
        ]
        .concat();
        args.extend_from_slice(extra);
        run_bridge(&args)
    };
    let out = drain(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = drain(&["--from", "earliest"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let warns: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--from earliest"))
        .collect();
    assert_eq!(warns.len(), 1, "{err}");
    assert!(
        warns[0].contains("WARN")
            && warns[0].contains("(offset 0)")
            && warns[0].contains("at offset 3"),
        "{err}"
    );
    // Unreachable: --retry-for bounds the drain with and without --once, naming the gateway.
    for once in [true, false] {
        let t0 = std::time::Instant::now();
        let mut args = [
            drain_args("127.0.0.1:1", &sink, state.to_str().unwrap()),
            vec!["--retry-for", "1s"],
        ]
        .concat();
        if once {
            args.push("--once");
        }
        let out = run_bridge(&args);
        assert_eq!(out.status.code(), Some(1), "once {once}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("gateway tcp://127.0.0.1:1 made no progress for"),
            "once {once}: {}",
            stderr(&out)
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(20));
    }
}

/// Runs the bridge with `args` until it logged a line containing `failure` `times` times,
/// checks that it is still running (it retries, it did not give up) and kills it.
fn keeps_retrying(args: &[&str], failure: &str, times: usize) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut child, rx) = spawn_bridge_lines(&args, &[]);
    let mut seen = Vec::new();
    for _ in 0..times {
        wait_for_line(&rx, failure, &mut seen);
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited: {}",
        seen.join("\n")
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The offsets of the lines of every sink file under `dir` of topic directory `topic`,
/// in file and line order.
fn topic_offsets(dir: &std::path::Path, topic: &str) -> Vec<u64> {
    offsets_where(dir, |f| {
        f.parent().and_then(|p| p.file_name()) == Some(topic.as_ref())
    })
}

/// The offsets of the lines of the sink files under `dir` that `keep` takes, in file and
/// line order.
fn offsets_where(dir: &std::path::Path, keep: impl Fn(&std::path::Path) -> bool) -> Vec<u64> {
    sink_files(dir)
        .iter()
        .filter(|f| keep(f))
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["offset"]
                        .as_u64()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `drain --once` into a sink directory it cannot write gives up after `--retry-for`
/// (it retried for ever before), exit 1, naming the sink and the path that failed; the
/// checkpoint stays after the last record written, and the next drain, once the sink can
/// be written, resumes there and writes every record once. Without `--once` the sink is
/// retried past `--retry-for`, as documented. The obstacle is a file where the new
/// topic's directory goes (it fails for root as well, unlike a mode of 0555, which root
/// ignores).
#[test]
fn drain_once_gives_up_on_a_sink_it_cannot_write_past_retry_for() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &["--gateway-id", "gw"]);
    let publish = |topic: &str, msgs: &[&str]| {
        let mut args = publish_args(&gw, topic);
        for m in msgs {
            args.extend(["-m", m]);
        }
        let out = run_bridge(&args);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    let out_dir = dir.path().join("out");
    let sink = format!("file:{}", out_dir.display());
    let state = dir.path().join("s.redb").display().to_string();
    let once = |extra: &[&str]| {
        let mut args = drain_args(&gw, &sink, &state);
        args.push("--once");
        args.extend_from_slice(extra);
        run_bridge_within(&args, std::time::Duration::from_secs(30))
            .unwrap_or_else(|| panic!("drain {args:?} still running after 30 s"))
    };
    publish("a", &["0", "1"]);
    let out = once(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Offset 2 goes to topic b, whose directory cannot be made; offset 3 to topic a.
    let blocked = out_dir.join("gw").join("b");
    std::fs::write(&blocked, b"in the way").unwrap();
    publish("b", &["2"]);
    publish("a", &["3"]);
    let started = std::time::Instant::now();
    let out = once(&["--retry-for", "2s"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}: {err}",
        started.elapsed()
    );
    let sink_dir = out_dir.join("gw");
    for want in [
        format!("sink file:{}: no progress for", sink_dir.display()),
        "--retry-for".to_string(),
        blocked.display().to_string(),
    ] {
        assert!(err.contains(&want), "{want:?} not in: {err}");
    }
    assert_eq!(topic_offsets(&out_dir, "a"), [0, 1], "{err}");
    // Without --once: retried past --retry-for (at least 6 failures: 1.5 s of backoff).
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--retry-for", "1s"]);
    keeps_retrying(&args, "sink failed at offset 2", 6);
    // The sink can be written again: resumed at offset 2, every record once.
    std::fs::remove_file(&blocked).unwrap();
    let out = once(&[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(resume_offsets(&err), [2], "{err}");
    assert_eq!(topic_offsets(&out_dir, "a"), [0, 1, 3], "{err}");
    assert_eq!(topic_offsets(&out_dir, "b"), [2], "{err}");
}

/// The gateway's own sink directory (`DIR/<gateway id>`) that cannot be made (a file is in
/// its way) is a sink failure like a topic's: retried without `--once`, given up after
/// `--retry-for` with `--once` with an error naming the path; once the way is clear,
/// every record arrives once.
#[test]
fn a_gateway_directory_that_cannot_be_made_is_retried_like_any_sink_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &["--gateway-id", "gw"]);
    let out = run_bridge(&[publish_args(&gw, "a"), vec!["-m", "0", "-m", "1"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let blocked = out_dir.join("gw");
    std::fs::write(&blocked, b"in the way").unwrap();
    let sink = format!("file:{}", out_dir.display());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--once", "--retry-for", "2s"]);
    let started = std::time::Instant::now();
    let out = run_bridge_within(&args, std::time::Duration::from_secs(30))
        .expect("drain --once still running after 30 s");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(2)
            && started.elapsed() < std::time::Duration::from_secs(15),
        "took {:?}: {err}",
        started.elapsed()
    );
    for want in [
        "no progress for",
        "--retry-for",
        &blocked.display().to_string(),
    ] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    // Without --once: retried (three failures seen), still running.
    let args = drain_args(&gw, &sink, &state);
    keeps_retrying(&args, "while opening the sink directory", 3);
    std::fs::remove_file(&blocked).unwrap();
    let mut args = drain_args(&gw, &sink, &state);
    args.push("--once");
    let out = run_bridge(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(topic_offsets(&out_dir, "a"), [0, 1], "{err}");
}

/// `tail` pointed at a port that is not a Spillway listener says so and exits 1 within a
/// few seconds (the Welcome timeout is 2 s; it waited 10 s before): a line-mode port and
/// the metrics port say nothing, an MQTT port closes on the Hello's bytes.
#[test]
fn a_port_that_is_not_a_spillway_listener_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, mqtt, metrics) = (free_port(), free_port(), free_port());
    let args: Vec<String> = [
        "--image",
        &dir.path().join("gw.img").display().to_string(),
        "--size",
        "1M",
        "--listen",
        &format!("tcp://127.0.0.1:{lines}?mode=lines&topic=t"),
        "--listen",
        &format!("mqtt://127.0.0.1:{mqtt}"),
        "--metrics",
        &format!("127.0.0.1:{metrics}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _g = GatewayProcess::start(&args, 2);
    // Built (if it needs to be) before anything is timed.
    assert!(run_bridge(&["--version"]).status.success());
    for (port, what) in [
        (lines, "does not speak the Spillway protocol"),
        (metrics, "does not speak the Spillway protocol"),
        (mqtt, "not a Spillway listener"),
    ] {
        let started = std::time::Instant::now();
        let out = run_bridge(&["tail", "--gateway", &format!("127.0.0.1:{port}")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{port}: {err}");
        assert!(err.contains(what), "{port}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(8),
            "{port}: took {:?}",
            started.elapsed()
        );
    }
}

/// `consumers` and `status` (when the log is not full) say in one line what the consumer
/// `bridge` they list is: the one every fresh image is created with.
#[test]
fn consumers_and_status_say_what_the_bridge_consumer_is() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &[]);
    let state = dir.path().join("s.redb").display().to_string();
    for args in [
        vec!["consumers", "--gateway", gw.as_str()],
        vec![
            "status",
            "--gateway",
            gw.as_str(),
            "--state",
            state.as_str(),
        ],
    ] {
        let out = run_bridge(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let notes = text
            .lines()
            .filter(|l| l.contains("\"bridge\" is registered with every fresh image"))
            .count();
        assert_eq!(notes, 1, "{args:?}: {text}");
    }
    // Without the consumer, no note.
    let out = run_bridge(&["consumers", "--gateway", &gw, "delete", "bridge", "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_bridge(&["consumers", "--gateway", &gw]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("registered with every fresh image"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `drain` (with and without `--once`) and `publish` pointed at a port that is not a
/// Spillway listener give up at once instead of retrying for `--retry-for` (5 minutes, or
/// for ever without `--once`): they name the condition and exit 1 within a few seconds. In
/// a drain of several gateways that one counts as not drained (exit 1) and the real
/// gateway is drained to its end. A port where nothing listens is still retried.
#[test]
fn drain_and_publish_give_up_at_once_on_a_port_that_is_not_a_spillway_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, metrics) = (free_port(), free_port());
    let (_g, gw) = small_gateway(
        dir.path(),
        &[
            "--listen",
            &format!("tcp://127.0.0.1:{lines}?mode=lines&topic=t"),
            "--metrics",
            &format!("127.0.0.1:{metrics}"),
        ],
    );
    let out = run_bridge(
        &[
            publish_args(&gw, "t"),
            vec!["-m", "a", "-m", "b", "-m", "c"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let limit = std::time::Duration::from_secs(8);
    let not_spillway = |out: &std::process::Output, what: &str| {
        let err = stderr(out);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.contains("does not speak the Spillway protocol"),
            "{what}: {err}"
        );
        assert!(err.contains("not a Spillway listener"), "{what}: {err}");
        assert!(!err.contains("retrying"), "{what}: {err}");
    };
    let state = dir.path().join("s.redb").display().to_string();
    for (port, once) in [(lines, true), (metrics, false)] {
        let sink = format!("file:{}", dir.path().join(format!("o{port}")).display());
        let bad = format!("127.0.0.1:{port}");
        let mut args = drain_args(&bad, &sink, &state);
        if once {
            args.push("--once");
        }
        let out = run_bridge_within(&args, limit)
            .unwrap_or_else(|| panic!("drain {args:?} still running after {limit:?}"));
        not_spillway(&out, &format!("drain once={once}"));
        // The sink directory it made (empty) is not left behind.
        assert!(
            !dir.path().join(format!("o{port}")).exists(),
            "drain once={once}"
        );
    }
    // Several gateways: the real one is drained, the line-mode port is not.
    let fleet_out = dir.path().join("fleet");
    let sink = format!("file:{}", fleet_out.display());
    let bad = format!("127.0.0.1:{lines}");
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--gateway", &bad, "--once"]);
    let out = run_bridge_within(&args, limit).expect("fleet drain still running");
    not_spillway(&out, "fleet drain");
    let drained: usize = spillway_tests::bridge::sink_files(&fleet_out)
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    assert_eq!(drained, 3, "{}", stderr(&out));
    // publish: at once, whatever --retry-for says.
    for port in [lines, metrics] {
        let bad = format!("127.0.0.1:{port}");
        let args = [
            "publish",
            "--gateway",
            &bad,
            "--topic",
            "t",
            "--retry-for",
            "1m",
            "-m",
            "hi",
        ];
        let out = run_bridge_within(&args, limit).expect("publish still running");
        not_spillway(&out, &format!("publish to {port}"));
        assert!(
            !stderr(&out).contains("run the same command again"),
            "{}",
            stderr(&out)
        );
    }
    // A port where nothing listens is retried, as before.
    let closed = format!("127.0.0.1:{}", free_port());
    let args = [
        "publish",
        "--gateway",
        &closed,
        "--topic",
        "t",
        "--retry-for",
        "1s",
        "-m",
        "hi",
    ];
    let out = run_bridge_within(&args, limit).expect("publish still running");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("retrying"), "{}", stderr(&out));
}

/// A gateway stopped or killed just as it accepted a connection closes it before its
/// Welcome, as an MQTT port does; when it comes back on the same port, `publish` and
/// `drain --once` (started as it went down, before any Welcome from it) retry and finish
/// instead of exiting "not a Spillway listener". Each has a port of its own, which first
/// reads the Hello of one connection and closes it unanswered, then refuses connections,
/// then serves.
#[test]
fn publish_and_drain_retry_a_gateway_that_closed_their_first_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (pub_port, drain_port) = (free_port(), free_port());
    let closers =
        [pub_port, drain_port].map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).unwrap());
    let gw = format!("tcp://127.0.0.1:{pub_port}");
    let gw2 = format!("tcp://127.0.0.1:{drain_port}");
    let state = dir.path().join("s.redb").display().to_string();
    let sink = format!("file:{}", dir.path().join("out").display());
    let publish = spillway_tests::bridge::spawn_bridge_piped(
        &[
            publish_args(&gw, "t"),
            vec!["--retry-for", "1m", "-m", "a", "-m", "b"],
        ]
        .concat(),
    );
    let mut drain_cmd = drain_args(&gw2, &sink, &state);
    drain_cmd.extend(["--once", "--retry-for", "1m"]);
    let drain = spillway_tests::bridge::spawn_bridge_piped(&drain_cmd);
    for closer in closers {
        // The client's Hello is read, then the connection closed: the client waits for
        // a Welcome that never comes.
        let (mut c, _) = closer.accept().unwrap();
        let _ = std::io::Read::read(&mut c, &mut [0u8; 64]).unwrap();
        drop(c);
    }
    let _g = GatewayProcess::start(
        &spillway_tests::gateway::image_in(
            dir.path(),
            &[
                "--erase-size",
                "4K",
                "--size",
                "1M",
                "--listen",
                &gw,
                "--listen",
                &gw2,
            ],
        ),
        2,
    );
    for (what, child) in [("publish", publish), ("drain --once", drain)] {
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{what}: {err}");
        assert!(!err.contains("not retried"), "{what}: {err}");
        assert!(err.contains("before a Welcome"), "{what}: {err}");
        assert!(err.contains("retrying"), "{what}: {err}");
    }
    let stored = spillway_tests::bridge::tail_everything(&gw, "raw");
    assert_eq!(stored.lines().collect::<Vec<_>>(), ["a", "b"]);
}

/// `tail --from TIME` and `drain --from TIME` start at the first offset, in offset order,
/// whose record is stamped at or after the time, found by the gateway (more than one
/// `FindOffset` step here: over 64 KiB of older records come first). Stamps set with
/// `publish --timestamp-field` out of order do not move the start, and records after it
/// stamped earlier are printed too; a time before every record starts at the first one,
/// one after every record prints nothing; a time that is no RFC 3339 time is a usage error.
#[test]
fn tail_and_drain_from_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = small_gateway(dir.path(), &["--size", "4M"]);
    let input = dir.path().join("in.jsonl");
    let pad = "p".repeat(200);
    let mut lines = String::new();
    let old = 1_600u64;
    for i in 0..old {
        lines += &format!(
            "{{\"ts\":\"2026-11-30T11:{:02}:{:02}Z\",\"v\":{i},\"pad\":\"{pad}\"}}\n",
            i / 60 % 60,
            i % 60
        );
    }
    // Offsets old.. : 12:00, 11:30 (earlier, after it), 12:30, 12:00:00.5.
    for (v, ts) in [
        (old, "2026-11-30T12:00:00Z"),
        (old + 1, "2026-11-30T11:30:00Z"),
        (old + 2, "2026-11-30T12:30:00Z"),
        (old + 3, "2026-11-30T12:00:00.5Z"),
    ] {
        lines += &format!("{{\"ts\":\"{ts}\",\"v\":{v}}}\n");
    }
    std::fs::write(&input, lines).unwrap();
    let out = run_bridge(
        &[
            publish_args(&gw, "buoy/sst"),
            vec!["--timestamp-field", "ts", input.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(spillway_tests::bridge::gateway_next_offset(&gw), old + 4);
    // More than one request's worth of records lies before the answer.
    let mut c = connect(&gw).unwrap();
    c.send_request(|seq| Request::FindOffset {
        seq,
        timestamp_us: 1_796_040_000_000_000,
        from_offset: 0,
    })
    .wait()
    .unwrap();
    let first = next_reply(&mut c).unwrap();
    assert!(
        matches!(first, (_, Reply::FoundOffset { done: false, offset }) if offset > 0 && offset < old),
        "{first:?}"
    );
    let tail_from = |from: &str| {
        let out = run_bridge(&["tail", "--gateway", &gw, "--from", from, "--format", "%o\n"]);
        assert!(out.status.success(), "--from {from}: {}", stderr(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse::<u64>().unwrap())
            .collect::<Vec<u64>>()
    };
    let all_late: Vec<u64> = (old..old + 4).collect();
    assert_eq!(tail_from("2026-11-30T12:00:00Z"), all_late);
    assert_eq!(tail_from("2026-11-30T13:00:00+01:00"), all_late);
    assert_eq!(tail_from("2026-11-30T11:45:00Z"), all_late);
    assert_eq!(tail_from("2026-11-30T12:00:00.1Z"), vec![old + 2, old + 3]);
    assert_eq!(tail_from("2026-11-30T12:30:00.000001Z"), Vec::<u64>::new());
    assert_eq!(tail_from("2026-11-30T11:00:10Z")[..2], [10, 11]);
    assert_eq!(tail_from("2020-01-01T00:00:00Z").len() as u64, old + 4);
    let out = run_bridge(&["tail", "--gateway", &gw, "--from", "2026-11-30 noon"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("RFC 3339"), "{}", stderr(&out));

    // drain --from TIME: the first record delivered is the first stamped at or after it.
    let sink_dir = dir.path().join("out");
    let out = run_bridge(
        &[
            drain_args(
                &gw,
                &format!("file:{}", sink_dir.display()),
                dir.path().join("s.redb").to_str().unwrap(),
            ),
            vec!["--from", "2026-11-30T12:00:00.1Z", "--once"],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut offsets = Vec::new();
    for f in spillway_tests::bridge::sink_files(&sink_dir) {
        let text = std::fs::read_to_string(f).unwrap();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            if let Some(o) = v["offset"].as_u64() {
                offsets.push(o);
            }
        }
    }
    offsets.sort();
    assert_eq!(offsets, vec![old + 2, old + 3], "{}", stderr(&out));
}

//! A gateway that takes the bridge's connections and makes no progress, end to end with the
//! real `spillway` gateway behind a proxy that rewrites its fetch replies
//! (`spillway_tests::proxy`) and the real `spillway-bridge`: `drain --once` gives up after
//! `--retry-for` on a gateway that answers every fetch with an error reply, with no records
//! below the end of its log, or never (within about `--retry-for` plus one reply timeout);
//! a drain without `--once` keeps retrying; `tail` gives up the same way. Each failure
//! names the gateway and its last error.

use std::path::Path;
use std::time::{Duration, Instant};

use spillway_tests::bridge::{
    drain_args, drain_once_within, publish_args, run_bridge_within, spawn_bridge_lines,
};
use spillway_tests::gateway::{free_port, image_in};
use spillway_tests::process::ChildProcess;
use spillway_tests::proxy::{
    Rewrite, fetch_damaged, fetch_empty, fetch_fails, fetch_unanswered, reply_proxy,
};
use spillway_tests::{GatewayProcess, run_bridge};

/// A gateway in `dir` holding the 10 records `a 0` to `a 9` of topic `t`: the process and
/// its `127.0.0.1:PORT`.
fn gateway_with_records(dir: &Path) -> (GatewayProcess, String) {
    let port = free_port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let g = GatewayProcess::start(&image_in(dir, &["--listen", &listen]), 1);
    let input = dir.join("a.txt");
    let text: String = (0..10).map(|i| format!("a {i}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let out = run_bridge(&[publish_args(&listen, "t"), vec![input.to_str().unwrap()]].concat());
    assert!(
        out.status.success(),
        "publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (g, format!("127.0.0.1:{port}"))
}

/// [`gateway_with_records`] behind a proxy that rewrites its replies with `rewrite`: the
/// gateway process and the proxy's URI.
fn gateway_behind(dir: &Path, rewrite: fn(&[u8]) -> Rewrite) -> (GatewayProcess, String) {
    let (g, addr) = gateway_with_records(dir);
    (g, reply_proxy(addr, rewrite))
}

/// [`drain_once_within`] 20 s.
fn drain_once(
    dir: &Path,
    gw: &str,
    config: Option<&str>,
    extra: &[&str],
) -> (i32, String, Duration) {
    drain_once_within(dir, gw, config, extra, Duration::from_secs(20))
}

/// A gateway that answers every fetch with an error reply (`Internal`) used to be fetched
/// again for ever by `drain --once`: the retry budget ran only across reconnects, and an
/// error reply keeps the connection. It counts as a failed fetch now: exit 1 after
/// `--retry-for`, naming the gateway and its error; each warning names the gateway.
#[test]
fn drain_once_gives_up_on_a_gateway_that_answers_every_fetch_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_behind(dir.path(), fetch_fails);
    let (code, err, took) = drain_once(dir.path(), &gw, None, &["--retry-for", "2s"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("gateway {gw} made no progress for"))
            && err.contains("(--retry-for): gateway error Internal: flash read failed (proxy)"),
        "{err}"
    );
    let refused = format!("gateway {gw} refused the fetch from offset 0: gateway error Internal");
    let warnings = err.matches(&refused).count();
    // The backoff grows: a handful of fetches in 2 s, not thousands.
    assert!((2..=15).contains(&warnings), "{warnings} warnings: {err}");
    assert!(took < Duration::from_secs(10), "{took:?}: {err}");
}

/// Without `--once` (and without `--retry-for`) a drain keeps fetching from a gateway whose
/// every fetch fails, with backoff, as from one it cannot reach, and stops at SIGTERM
/// with exit 0.
#[test]
fn a_drain_without_once_keeps_retrying_a_gateway_whose_every_fetch_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_behind(dir.path(), fetch_fails);
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("s.redb").display().to_string();
    let args: Vec<String> = [
        drain_args(&gw, &sink, &state),
        vec!["--backoff-max-ms", "400"],
    ]
    .concat()
    .into_iter()
    .map(String::from)
    .collect();
    let (child, rx) = spawn_bridge_lines(&args, &[]);
    let mut child = ChildProcess::new(child);
    let refused = format!("gateway {gw} refused the fetch from offset 0");
    let (mut seen, mut count) = (Vec::new(), 0);
    // Past the 2 s the --once test gives up after, with a 400 ms delay at most.
    let deadline = Instant::now() + Duration::from_secs(20);
    while count < 10 {
        assert!(Instant::now() < deadline, "{count} warnings: {seen:#?}");
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            count += usize::from(line.contains(&refused));
            seen.push(line);
        }
        assert!(child.try_wait().is_none(), "the drain ended: {seen:#?}");
    }
    assert!(
        !seen.iter().any(|l| l.contains("made no progress")),
        "{seen:#?}"
    );
    let status = child
        .stop(Duration::from_secs(10))
        .expect("drain stops at SIGTERM");
    assert_eq!(status.code(), Some(0));
}

/// A gateway that answers every fetch validly but empty, while its log (the next offset it
/// announced) holds records past the fetch offset, used to be fetched again at once, about
/// 3,000 times a second, silently. It is no progress now: fetched again after a backoff,
/// warned about with the offsets, and given up after `--retry-for` with exit 1.
#[test]
fn drain_once_backs_off_and_gives_up_on_a_gateway_that_answers_empty_below_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_behind(dir.path(), fetch_empty);
    let (code, err, took) = drain_once(dir.path(), &gw, None, &["--retry-for", "2s"]);
    assert_eq!(code, 1, "{err}");
    let what =
        "answered the fetch from offset 0 with no records, though the log's next offset is 10";
    assert!(
        err.contains(&format!("gateway {gw}: {what}; fetching again in")),
        "{err}"
    );
    assert!(
        err.contains(&format!("gateway {gw} made no progress for")) && err.contains(what),
        "{err}"
    );
    let warnings = err.matches("fetching again in").count();
    assert!((2..=15).contains(&warnings), "{warnings} warnings: {err}");
    assert!(took < Duration::from_secs(10), "{took:?}: {err}");
}

/// A gateway that took the connection, answered the handshake and then never answered a
/// fetch used to be given up long after `--retry-for`: the budget started only at the first
/// reply timeout, and ran out at the second. It counts from when the unanswered fetch was
/// sent now, so `drain --once` gives up within about `--retry-for` plus one reply timeout
/// (here 1 s plus 3 s and the 0.5 s long-poll wait; it took about 7.5 s).
#[test]
fn drain_once_gives_up_on_a_gateway_that_never_answers_within_its_budget_and_one_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_behind(dir.path(), fetch_unanswered);
    let (code, err, took) = drain_once(
        dir.path(),
        &gw,
        Some("reply-timeout-ms = 3000\n"),
        &["--retry-for", "1s"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("gateway {gw} made no progress for"))
            && err.contains("(--retry-for): no reply within"),
        "{err}"
    );
    assert!(took < Duration::from_secs(6), "{took:?}: {err}");
}

/// `tail` (without `--follow`) used to reconnect for ever to a gateway whose every fetch
/// reply is bad, and to end at once, without naming the gateway, at an error reply. Both
/// are retried with backoff for the retry budget (the config file's `retry-for`, else
/// drain's default), then it exits 1 naming the gateway and the last error.
#[test]
fn tail_gives_up_on_a_gateway_whose_every_fetch_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, addr) = gateway_with_records(dir.path());
    let bad = reply_proxy(addr.clone(), fetch_damaged);
    let failing = reply_proxy(addr, fetch_fails);
    let cfg = dir.path().join("tail.toml");
    std::fs::write(&cfg, "retry-for = \"2s\"\n").unwrap();
    let cfg = cfg.display().to_string();
    spillway_tests::bridge_bin();
    for (gw, last_error) in [
        (&bad, "end of buffer"),
        (
            &failing,
            "gateway error Internal: flash read failed (proxy)",
        ),
    ] {
        let started = Instant::now();
        let out = run_bridge_within(
            &["--config", &cfg, "tail", "--gateway", gw],
            Duration::from_secs(20),
        )
        .expect("tail still retrying after 20 s");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{gw}: {err}");
        let gave_up = err
            .lines()
            .find(|l| l.contains("made no progress for"))
            .unwrap_or_else(|| panic!("{gw}: {err}"));
        assert!(
            gave_up.contains(&format!("gateway {gw} made no progress for"))
                && gave_up.contains(last_error),
            "{gw}: {err}"
        );
        assert!(err.matches("reconnecting in").count() >= 2, "{gw}: {err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{gw}: {err}");
        assert!(out.stdout.is_empty(), "{gw}");
    }
}

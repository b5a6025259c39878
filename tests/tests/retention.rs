//! Who may release retention, and conditions the binaries used to misreport, end to end
//! with the real `spillway` gateway and `spillway-bridge`: a drain whose consumer the
//! gateway refuses fails; the last consumer is kept unless forced and what is reclaimed
//! unread is counted; `drain --once` gives up on an unreachable gateway, and on one whose
//! every fetch reply is bad; a drain started
//! at the gateway's committed offset reports it; records stored under a higher
//! `--max-record-bytes` stay fetchable.

use std::path::Path;
use std::time::Duration;

use spillway_tests::bridge::{
    drain_args, drain_once_within, publish_args, run_bridge_ok, run_bridge_within,
    spawn_bridge_lines, spawn_bridge_piped, wait_for_line,
};
use spillway_tests::gateway::{free_port, image_in};
use spillway_tests::process::signal;
use spillway_tests::proxy::{fetch_damaged, reply_proxy};
use spillway_tests::{GatewayProcess, Wait, connect, run_bridge};

fn gateway_args(dir: &Path, port: u16, extra: &[&str]) -> Vec<String> {
    let listen = format!("tcp://127.0.0.1:{port}");
    let mut v = image_in(dir, &["--listen", &listen, "--gateway-id", "ret-gw"]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A gateway on a free port with `gateway_args(dir, port, extra)`: the process, its port
/// and its URI.
fn start_gateway(dir: &Path, extra: &[&str]) -> (GatewayProcess, u16, String) {
    let port = free_port();
    let g = GatewayProcess::start(&gateway_args(dir, port, extra), 1);
    (g, port, format!("tcp://127.0.0.1:{port}"))
}

fn write_input(dir: &Path, name: &str, lines: impl Iterator<Item = String>) -> String {
    let p = dir.join(name);
    let text: String = lines.map(|l| l + "\n").collect();
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn publish(gw: &str, file: &str) {
    let out = run_bridge(&[publish_args(gw, "t"), vec![file]].concat());
    assert!(
        out.status.success(),
        "publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn drain_once(gw: &str, dir: &Path, state: &str, consumer: &str) -> std::process::Output {
    let sink = format!("file:{}", dir.join("out").display());
    let state = dir.join(state).display().to_string();
    run_bridge(
        &[
            drain_args(gw, &sink, &state),
            vec!["--once", "--consumer", consumer],
        ]
        .concat(),
    )
}

/// [`drain_once`], which must succeed; its stderr.
fn drain_once_ok(gw: &str, dir: &Path, state: &str, consumer: &str) -> String {
    let out = drain_once(gw, dir, state, consumer);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

fn stats(gw: &str) -> serde_json::Value {
    let out = run_bridge(&["status", "--gateway", gw, "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["stats"].clone()
}

/// A drain whose consumer the gateway refuses (its table of 8 consumers is full) used to
/// exit 0 as if done, its consumer never holding retention. It fails with exit 1 and says
/// how to free a slot.
#[test]
fn a_drain_whose_consumer_is_refused_exits_1_and_says_how_to_free_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, port, gw) = start_gateway(dir.path(), &[]);
    publish(
        &gw,
        &write_input(dir.path(), "in.txt", (0..10).map(|i| format!("r {i}"))),
    );
    // `bridge` exists from the start; 7 more fill the table.
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    for i in 0..7 {
        c.commit(&format!("c{i}"), 1).wait().unwrap();
    }
    let out = drain_once(&gw, dir.path(), "s.redb", "one-too-many");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("consumers delete"), "{err}");
    assert!(err.contains("at most 8"), "{err}");
    // Nothing holds retention in its name.
    let out = run_bridge(&["consumers", "--gateway", &gw, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!v.to_string().contains("one-too-many"), "{v}");
}

/// Deleting the gateway's last consumer is refused without `--force` (with none, nothing
/// holds retention). Forced, the gateway then reclaims records nobody read when it needs
/// room under `reject-new`, and counts each of them as dropped (it counted none before).
#[test]
fn the_last_consumer_is_kept_unless_forced_and_records_reclaimed_unread_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, _, gw) = start_gateway(
        dir.path(),
        &[
            "--size",
            "128K",
            "--erase-size",
            "4K",
            "--buffer-bytes",
            "8K",
            "--max-record-bytes",
            "1K",
            "--full",
            "reject-new",
            // Alike lines: compressed, they would not fill the log.
            "--compression",
            "none",
        ],
    );

    let out = run_bridge(&["consumers", "--gateway", &gw, "delete", "bridge"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("last consumer") && err.contains("--force"),
        "{err}"
    );
    let out = run_bridge_ok(&["consumers", "--gateway", &gw, "delete", "bridge", "--force"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "deleted consumer \"bridge\"\n"
    );

    // About 190 KB of records into a 120 KB log: the oldest segments are reclaimed.
    let lines = (0..4000).map(|i| format!("reading {i:05} {}", "x".repeat(20)));
    publish(&gw, &write_input(dir.path(), "in.txt", lines));
    let s = stats(&gw);
    let first = s["first_offset"].as_u64().unwrap();
    assert!(first > 0, "nothing was reclaimed: {s}");
    // One mount, no crash: every offset below the first offset held one record.
    assert_eq!(s["records_dropped"].as_u64(), Some(first), "{s}");
}

/// Two `consumers delete` without `--force`, run at once on a gateway with two consumers,
/// one each: exactly one succeeds and one consumer stays, every time. (When the bridge
/// checked by listing first, both could pass the check and delete both.) The gateway
/// checks and deletes in one request; its refusal is reported like the bridge's own.
#[test]
fn concurrent_deletes_never_remove_the_last_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, port, gw) = start_gateway(dir.path(), &[]);
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    for round in 0..10 {
        // `bridge` and `c2`, whichever of them the last round left.
        c.commit("bridge", 0).wait().unwrap();
        c.commit("c2", 0).wait().unwrap();
        let a = spawn_bridge_piped(&["consumers", "--gateway", &gw, "delete", "bridge"]);
        let b = spawn_bridge_piped(&["consumers", "--gateway", &gw, "delete", "c2"]);
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let codes = [a.status.code(), b.status.code()];
        let refused = if codes == [Some(0), Some(1)] { &b } else { &a };
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            codes == [Some(0), Some(1)] || codes == [Some(1), Some(0)],
            "round {round}: exit codes {codes:?}: {err}"
        );
        assert!(
            err.contains("last consumer") && err.contains("--force"),
            "round {round}: {err}"
        );
        let left = c.consumers().wait().unwrap();
        assert_eq!(left.len(), 1, "round {round}: {left:?}");
    }
}

/// `drain --once` against a gateway that is down retried for ever; it gives up after its
/// retry budget with exit 1 and says why.
#[test]
fn drain_once_gives_up_on_an_unreachable_gateway_after_its_retry_budget() {
    let dir = tempfile::tempdir().unwrap();
    let gw = format!("tcp://127.0.0.1:{}", free_port());
    let (code, err, took) = drain_once_within(
        dir.path(),
        &gw,
        None,
        &["--retry-for", "1s"],
        Duration::from_secs(20),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no progress for") && err.contains("--retry-for"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// `drain --once` against a gateway that takes every connection and whose every fetch
/// reply is bad gives up after its retry budget with exit 1, as for an unreachable one:
/// each reconnect used to start the budget and the backoff over, and it retried for ever,
/// about 12 times a second. Nothing is written and nothing is committed.
#[test]
fn drain_once_gives_up_on_a_gateway_whose_every_fetch_fails_after_its_retry_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, port, _) = start_gateway(dir.path(), &[]);
    publish(
        &format!("tcp://127.0.0.1:{port}"),
        &write_input(dir.path(), "a.txt", (0..10).map(|i| format!("a {i}"))),
    );
    // Every reply holding records announces one record more than it holds.
    let gw = reply_proxy(format!("127.0.0.1:{port}"), fetch_damaged);
    let (code, err, took) = drain_once_within(
        dir.path(),
        &gw,
        None,
        &["--retry-for", "2s", "--consumer", "hostile"],
        Duration::from_secs(30),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no progress for") && err.contains("end of buffer"),
        "{err}"
    );
    // The backoff grows across the reconnects instead of starting over each time.
    let reconnects = err.matches("reconnecting in").count();
    assert!(
        (1..=12).contains(&reconnects),
        "{reconnects} reconnects: {err}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    let entries: usize = std::fs::read_dir(dir.path().join("out"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(entries, 0, "the sink directory holds nothing");
}

/// A gateway in `dir` holding the records `a 0` to `a 9`, which consumer `audit` drained
/// into `DIR/out` with the state file `DIR/first.redb`: the process and its URI.
fn gateway_drained_by_audit(dir: &Path) -> (GatewayProcess, String) {
    let (g, _, gw) = start_gateway(dir, &[]);
    publish(
        &gw,
        &write_input(dir, "a.txt", (0..10).map(|i| format!("a {i}"))),
    );
    drain_once_ok(&gw, dir, "first.redb", "audit");
    (g, gw)
}

/// A drain (without `--once`) stopped by SIGTERM before anything new arrived reports the
/// checkpoint it started from, whether that came from its state file or from the gateway's
/// committed offset: it said "checkpoint at offset 0".
#[test]
fn a_drain_stopped_before_new_records_reports_the_checkpoint_it_started_from() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_drained_by_audit(dir.path());
    let sink = format!("file:{}", dir.path().join("out").display());
    // A new state file (starts at the gateway's committed offset), then the same one again
    // (resumes from its own checkpoint).
    for (state, says) in [
        ("second.redb", "starting at offset 10"),
        ("second.redb", "resuming consumer \"audit\" at offset 10"),
    ] {
        let state = dir.path().join(state).display().to_string();
        let args: Vec<String> = [drain_args(&gw, &sink, &state), vec!["--consumer", "audit"]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (mut child, rx) = spawn_bridge_lines(&args, &[]);
        let mut seen = Vec::new();
        wait_for_line(&rx, says, &mut seen);
        signal(&child, libc::SIGTERM);
        let status = child.wait().unwrap();
        // The channel ends with the drain's stderr.
        seen.extend(rx.iter());
        let err = seen.join("\n");
        assert!(status.success(), "{err}");
        assert!(err.contains("checkpoint at offset 10"), "{err}");
    }
}

/// A drain whose state file has no checkpoint starts at the gateway's committed offset for
/// its consumer, and reports that checkpoint.
#[test]
fn a_drain_started_at_the_gateways_committed_offset_reports_that_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_drained_by_audit(dir.path());

    // A new state file: nothing new on the gateway.
    let err = drain_once_ok(&gw, dir.path(), "second.redb", "audit");
    assert!(err.contains("starting at offset 10"), "{err}");
    assert!(err.contains("checkpoint at offset 10"), "{err}");

    // Another new state file, with new records: it forwards exactly those.
    publish(
        &gw,
        &write_input(dir.path(), "b.txt", (0..5).map(|i| format!("b {i}"))),
    );
    let err = drain_once_ok(&gw, dir.path(), "third.redb", "audit");
    assert!(err.contains("forwarded 5 records"), "{err}");
    assert!(err.contains("checkpoint at offset 15"), "{err}");
}

/// Records stored under a higher `--max-record-bytes` stay fetchable after a restart at a
/// lower one (the fetch limit is not the ingest limit): the bridge used to retry them for
/// ever. A record that the gateway cannot send at all (stored with a larger RAM buffer than
/// it now has) ends the drain with exit 1 and the reason, not a retry loop.
#[test]
fn records_stored_under_a_higher_record_limit_stay_fetchable_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let big = &[
        "--size",
        "4M",
        "--buffer-bytes",
        "256K",
        "--max-record-bytes",
        "100K",
    ];
    let mut g = GatewayProcess::start(&gateway_args(dir.path(), port, big), 1);
    let gw = format!("tcp://127.0.0.1:{port}");
    let lines = (0..4).map(|i| format!("large-{i} {}", "y".repeat(90_000)));
    publish(&gw, &write_input(dir.path(), "big.txt", lines));
    assert!(g.terminate().success());

    // Restarted with the default record limit (4K), same RAM buffer.
    let lower = &["--buffer-bytes", "256K", "--max-record-bytes", "4K"];
    let mut g = GatewayProcess::start(&gateway_args(dir.path(), port, lower), 1);
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("s.redb").display().to_string();
    let drain = |state: &str, consumer: &str| {
        let args = [
            drain_args(&gw, &sink, state),
            vec!["--once", "--consumer", consumer],
        ]
        .concat();
        let out = run_bridge_within(&args, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("spillway-bridge {args:?} still running after 30 s"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = drain(&state, "bridge");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("forwarded 4 records"), "{err}");
    assert!(g.terminate().success());

    // Restarted with a RAM buffer too small for them: a clear error, exit 1, at once.
    let small = &["--buffer-bytes", "64K", "--max-record-bytes", "4K"];
    let _g = GatewayProcess::start(&gateway_args(dir.path(), port, small), 1);
    let other = dir.path().join("other.redb").display().to_string();
    let (code, err) = drain(&other, "other");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot send the record at offset 0"), "{err}");
}

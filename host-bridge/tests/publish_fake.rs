//! `spillway-bridge publish` (the real binary) against the in-process gateway: streaming
//! input, and lines the gateway rejects.

mod common;

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::FakeGateway;

fn bridge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spillway-bridge"))
}

fn spawn_publish(gw: &FakeGateway, extra: &[&str]) -> Child {
    bridge()
        .args(["publish", "--gateway", &gw.uri(), "--topic", "app"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the gateway's next offset reaches `n`, or panics after `within`.
fn wait_for_offset(gw: &FakeGateway, n: u64, within: Duration, what: &str) {
    let t = Instant::now();
    while gw.next_offset() < n {
        assert!(
            t.elapsed() < within,
            "{what}: next offset {}",
            gw.next_offset()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn finish(mut c: Child) -> (Output, String) {
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

/// The `tail -F app.log | spillway-bridge publish -` case: each line is stored while the
/// writer still holds the pipe open. Before, publish read the whole input first and sent
/// nothing until the pipe closed.
#[test]
fn publish_streams_lines_before_the_input_ends() {
    let gw = FakeGateway::start("gw-s", 0x5151);
    let mut c = spawn_publish(&gw, &["-"]);
    let mut stdin = c.stdin.take().unwrap();
    for i in 0..3u64 {
        writeln!(stdin, "line {i}").unwrap();
        stdin.flush().unwrap();
        wait_for_offset(
            &gw,
            i + 1,
            Duration::from_secs(10),
            "a line was not stored while the input stayed open",
        );
        // A pause longer than --retry-for's default would be (waiting for input is not
        // a failure to make progress).
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c.try_wait().unwrap().is_none(), "publish ended early");
    drop(stdin);
    let (out, err) = finish(c);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("records read 3, sent 3, acknowledged 3"),
        "{err}"
    );
    assert!(err.contains("first offset 0, last offset 2"), "{err}");
}

/// Waiting on a silent input longer than `--retry-for` is not a failure.
#[test]
fn publish_waits_for_slow_input_beyond_retry_for() {
    let gw = FakeGateway::start("gw-w", 0x5252);
    let mut c = spawn_publish(&gw, &["--retry-for", "200ms"]);
    let mut stdin = c.stdin.take().unwrap();
    writeln!(stdin, "a").unwrap();
    stdin.flush().unwrap();
    wait_for_offset(&gw, 1, Duration::from_secs(10), "first line");
    std::thread::sleep(Duration::from_millis(600));
    writeln!(stdin, "b").unwrap();
    drop(stdin);
    let (out, err) = finish(c);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("acknowledged 2"), "{err}");
}

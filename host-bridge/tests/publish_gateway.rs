//! `spillway-bridge publish` (the real binary) against the real gateway in process
//! (`common::SimGateway`): streaming input, and lines over the gateway's record limit.

mod common;

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::SimGateway;
use common::wait::wait_until;

fn bridge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spillway-bridge"))
}

fn spawn_publish(gw: &SimGateway, extra: &[&str]) -> Child {
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
fn wait_for_offset(gw: &SimGateway, n: u64, within: Duration, what: &str) {
    wait_until(
        within,
        || (gw.next_offset() >= n).then_some(()),
        || format!("{what}: next offset {}", gw.next_offset()),
    );
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
    let gw = SimGateway::start("gw-s", 0x5151);
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
        // Deliberate: a pause longer than --retry-for's default would be (waiting for
        // input is not a failure to make progress).
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
    let gw = SimGateway::start("gw-w", 0x5252);
    let mut c = spawn_publish(&gw, &["--retry-for", "200ms"]);
    let mut stdin = c.stdin.take().unwrap();
    writeln!(stdin, "a").unwrap();
    stdin.flush().unwrap();
    wait_for_offset(&gw, 1, Duration::from_secs(10), "first line");
    // Deliberate: the input stays silent three times as long as --retry-for, and publish
    // keeps waiting for it.
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        c.try_wait().unwrap().is_none(),
        "publish ended on a silent input"
    );
    writeln!(stdin, "b").unwrap();
    drop(stdin);
    let (out, err) = finish(c);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("acknowledged 2"), "{err}");
}

/// A line over the gateway's record size in the middle of the input is logged with its
/// line number, counted as rejected, and publishing goes on: the lines after it (pipelined
/// in the same window) are stored and counted as acknowledged; the exit code is 1. Before,
/// the first rejection aborted publish and miscounted the stored lines after it. The real
/// gateway opens a producer session (protocol version 3), in which publish checks a line
/// against the `Welcome`'s record limit itself and never sends it (a sequence the gateway
/// refused would stall the session): rejected, not sent.
#[test]
fn a_rejected_line_is_counted_and_publish_goes_on() {
    let gw = SimGateway::start("gw-r", 0x5353);
    let mut c = spawn_publish(&gw, &["-"]);
    let mut stdin = c.stdin.take().unwrap();
    let big = "x".repeat(5000);
    let mut input = String::from("a\n");
    input.push_str(&big);
    input.push('\n');
    for i in 0..100 {
        input.push_str(&format!("after {i}\n"));
    }
    input.push_str(&big);
    input.push_str("\nlast\n");
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let (out, err) = finish(c);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for line in [2, 103] {
        assert!(
            err.contains(&format!(
                "input line {line} is 5000 bytes, the gateway takes at most 4096; not sent"
            )),
            "{err}"
        );
    }
    assert!(
        err.contains("records read 104, sent 102, acknowledged 102 (0 duplicates), rejected 2"),
        "{err}"
    );
    assert!(err.contains("first offset 0, last offset 101"), "{err}");
    assert_eq!(
        gw.next_offset(),
        102,
        "every line but the rejected ones stored"
    );
}

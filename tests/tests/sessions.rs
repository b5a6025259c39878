//! Producer sessions end to end, on the real `spillway` gateway and `spillway-bridge
//! publish`: a rerun with the same producer id stores every line (the first-day report:
//! it used to lose them as "duplicates"), an interrupted publish continues with the printed
//! `--resume` command and stores every line once, and a session's resends are still
//! deduplicated after a gateway restart.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use spillway_tests::bridge::{
    assert_log_holds_lines_once_in_order, gateway_next_offset, publish_args, spawn_bridge_piped,
    tail_everything,
};
use spillway_tests::gateway::image_in;
use spillway_tests::process::{output_with_stdin, signal};
use spillway_tests::wait::wait_until;
use spillway_tests::{GatewayProcess, bridge_bin, run_bridge};

fn start_gateway(dir: &Path, port: u16) -> GatewayProcess {
    let listen = format!("tcp://127.0.0.1:{port}");
    GatewayProcess::start(&image_in(dir, &["--size", "4M", "--listen", &listen]), 1)
}

/// `publish --producer-id ID` of `input` given on stdin, with `extra` arguments.
/// The epoch `publish` printed after `label` (as in "producer 7, session 12"): epochs are
/// the gateway's journal entry numbers, so tests compare them and never expect a value.
fn epoch_after(stderr: &str, label: &str) -> u32 {
    stderr
        .split(label)
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {label:?}N in: {stderr}"))
}

fn publish_stdin(gw: &str, id: &str, input: &str, extra: &[&str]) -> Output {
    let mut cmd = Command::new(bridge_bin());
    cmd.args(publish_args(gw, "t"))
        .args(["--producer-id", id])
        .args(extra);
    output_with_stdin(&mut cmd, input.as_bytes(), "spillway-bridge publish")
}

/// Every record's payload, from the first offset (`tail --format raw`).
fn stored(gw: &str) -> Vec<String> {
    tail_everything(gw, "raw")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The first-day report: `printf 'a1\na2\na3\n' | publish --producer-id 7`, then
/// `printf 'b1\nb2\nb3\nb4\n' | publish --producer-id 7`. The second run used to report
/// "acknowledged 4 (3 duplicates)" and the log held `a1 a2 a3 b4`: b1..b3 were lost. Each
/// run now opens its own producer session and every line is stored.
#[test]
fn a_rerun_with_the_same_producer_id_stores_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let _gateway = start_gateway(dir.path(), port);
    let a = publish_stdin(&gw, "7", "a1\na2\na3\n", &[]);
    let a_err = String::from_utf8_lossy(&a.stderr);
    assert!(a.status.success(), "{a_err}");
    let first = epoch_after(&a_err, "producer 7, session ");
    let b = publish_stdin(&gw, "7", "b1\nb2\nb3\nb4\n", &[]);
    let b_err = String::from_utf8_lossy(&b.stderr);
    assert!(b.status.success(), "{b_err}");
    assert!(b_err.contains("acknowledged 4 (0 duplicates)"), "{b_err}");
    assert!(
        epoch_after(&b_err, "producer 7 session ") > first,
        "{a_err}\n{b_err}"
    );
    assert_eq!(
        stored(&gw),
        ["a1", "a2", "a3", "b1", "b2", "b3", "b4"],
        "every line of both runs stored"
    );
}

/// An interrupted publish (SIGINT) prints the exact `--resume` command; running it with
/// the same input skips the lines the gateway stored and sends the rest: every line is
/// stored once, in order. A resend inside a session is deduplicated after a gateway
/// restart too (the resumed run resends what the gateway stored before the restart but did
/// not acknowledge).
#[test]
fn an_interrupted_publish_resumes_and_stores_every_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let mut gateway = start_gateway(dir.path(), port);
    let n = 30_000;
    let input = dir.path().join("in.txt");
    let text: String = (0..n).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let input = input.display().to_string();
    let publisher = spawn_bridge_piped(
        &[
            &publish_args(&gw, "t")[..],
            &["--producer-id", "31337", &input],
        ]
        .concat(),
    );
    wait_until(
        Duration::from_secs(60),
        || (gateway_next_offset(&gw) >= 3_000).then_some(()),
        || "publisher made no progress".into(),
    );
    signal(&publisher, libc::SIGINT);
    let out = publisher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an interrupted publish is not a success: {err}"
    );
    let epoch = epoch_after(&err, "producer 31337, session ");
    let cmd = err
        .lines()
        .find_map(|l| l.split("to continue: ").nth(1))
        .unwrap_or_else(|| panic!("no resume command printed: {err}"))
        .to_string();
    assert_eq!(
        cmd,
        format!(
            "spillway-bridge publish --gateway {gw} --topic t --producer-id 31337 --resume {input}"
        )
    );
    // The gateway restarts between the two runs: the session and its dedup survive.
    gateway.stop(Duration::from_secs(10));
    let _gateway = start_gateway(dir.path(), port);
    let args: Vec<&str> = cmd.split(' ').skip(1).collect();
    let resumed = run_bridge(&args);
    let rerr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{rerr}");
    assert!(rerr.contains(&format!("session {epoch} resumed")), "{rerr}");
    assert_log_holds_lines_once_in_order(&gw, "line", n);
}

/// A line over the gateway's max record size (4 KiB by default) is refused before it is
/// sent and gets no sequence number: the lines after it are stored (the gateway takes only
/// the next sequence, so a refused sequence used to hold up every later line until
/// `--retry-for` ran out), and a `--resume` of the same input skips exactly the stored lines.
#[test]
fn a_line_over_the_record_limit_does_not_hold_up_the_lines_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let _gateway = start_gateway(dir.path(), port);
    let input = format!("first\n{}\nafter-1\nafter-2\n", "x".repeat(5000));
    let out = publish_stdin(&gw, "9", &input, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a refused line exits 1: {err}");
    assert!(
        err.contains("input line 2 is 5000 bytes, the gateway takes at most 4096"),
        "{err}"
    );
    assert!(
        err.contains("read 4, sent 3,"),
        "the refused line is not sent: {err}"
    );
    assert_eq!(stored(&gw), ["first", "after-1", "after-2"]);
    // The same input again under --resume: the three numbered lines are stored already.
    let again = publish_stdin(&gw, "9", &input, &["--resume"]);
    let again_err = String::from_utf8_lossy(&again.stderr);
    assert!(
        again_err.contains("skipping the first 3 input lines"),
        "{again_err}"
    );
    assert_eq!(stored(&gw), ["first", "after-1", "after-2"], "{again_err}");
    assert!(
        again_err.contains("sent 0,"),
        "nothing sent again: {again_err}"
    );
}

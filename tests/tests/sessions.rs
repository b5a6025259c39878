//! Producer sessions end to end, on the real `spillway` gateway and `spillway-bridge
//! publish`: a rerun with the same producer id stores every line (the first-day report:
//! it used to lose them as "duplicates"), an interrupted publish continues with the printed
//! `--resume` command and stores every line once, and a session's resends are still
//! deduplicated after a gateway restart.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use spillway_tests::bridge::{
    assert_log_holds_lines_once_in_order, gateway_next_offset, publish_args, spawn_bridge_piped,
    tail_everything,
};
use spillway_tests::client::Wait;
use spillway_tests::gateway::image_in;
use spillway_tests::process::{output_with_stdin, signal};
use spillway_tests::wait::wait_until;
use spillway_tests::{GatewayProcess, bridge_bin, run_bridge};

fn start_gateway(dir: &Path, port: u16) -> GatewayProcess {
    start_gateway_with(dir, port, &[])
}

/// [`start_gateway`] with `extra` flags.
fn start_gateway_with(dir: &Path, port: u16, extra: &[&str]) -> GatewayProcess {
    let listen = format!("tcp://127.0.0.1:{port}");
    let flags = [&["--size", "4M", "--listen", &listen][..], extra].concat();
    GatewayProcess::start(&image_in(dir, &flags), 1)
}

/// A gateway on a new 4 MiB image in a new temporary directory, with `extra` flags: the
/// directory, the gateway's port and `tcp://` address, and the gateway.
fn new_gateway(extra: &[&str]) -> (tempfile::TempDir, u16, String, GatewayProcess) {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let gateway = start_gateway_with(dir.path(), port, extra);
    (dir, port, gw, gateway)
}

/// Opens sessions of `MAX_PRODUCERS` other ids (1000 on) on the gateway at `port`, which
/// pushes every earlier producer id out of its producer table.
fn crowd_out_producers(port: u16) {
    let mut other = spillway_tests::client::connect(&format!("127.0.0.1:{port}")).unwrap();
    for id in 1000..1000 + spillway_core::log::MAX_PRODUCERS as u64 {
        other.open_session(id, false).wait().unwrap();
    }
}

/// Waits (up to 60 s) until the log at `gw` ends at offset `n` or later; `what` names
/// what was to be stored when it does not.
fn wait_for_offset(gw: &str, n: u64, what: &str) {
    wait_until(
        Duration::from_secs(60),
        || (gateway_next_offset(gw) >= n).then_some(()),
        || format!("{what} not stored"),
    );
}

/// Writes `text` to `DIR/in.txt`, publishes that file to `gw` with `--producer-id ID` and
/// interrupts the publish (SIGINT) once the log holds 3000 records; returns the input's
/// path and the publish's output.
fn interrupted_file_publish(dir: &Path, gw: &str, id: &str, text: &str) -> (String, Output) {
    let input = dir.join("in.txt");
    std::fs::write(&input, text).unwrap();
    let input = input.display().to_string();
    let publisher =
        spawn_bridge_piped(&[&publish_args(gw, "t")[..], &["--producer-id", id, &input]].concat());
    wait_for_offset(gw, 3_000, "the first 3000 lines");
    (input, interrupt(publisher))
}

/// Interrupts `publisher` (SIGINT) and returns its output once it exits.
fn interrupt(publisher: Child) -> Output {
    signal(&publisher, libc::SIGINT);
    publisher.wait_with_output().unwrap()
}

/// `publish --topic t ARGS` reading its stdin, which the test writes as it goes (take it
/// with `child.stdin.take()`); stdout and stderr piped.
fn spawn_publish_stdin(gw: &str, args: &[&str]) -> Child {
    Command::new(bridge_bin())
        .args(publish_args(gw, "t"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start spillway-bridge publish")
}

/// Lines `PREFIX<i>` for `i` in `range`, each ended by a newline.
fn numbered(prefix: &str, range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("{prefix}{i}\n")).collect()
}

/// The lines of [`numbered`], without their newlines.
fn numbered_lines(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// The resume command `publish` printed (after "to continue: ").
fn resume_command_in(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.split("to continue: ").nth(1))
        .unwrap_or_else(|| panic!("no resume command printed: {stderr}"))
        .to_string()
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
    let (_dir, _, gw, _gateway) = new_gateway(&[]);
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
    let (dir, port, gw, mut gateway) = new_gateway(&[]);
    let n = 30_000;
    let text: String = (0..n).map(|i| format!("line {i}\n")).collect();
    let (input, out) = interrupted_file_publish(dir.path(), &gw, "31337", &text);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an interrupted publish is not a success: {err}"
    );
    let epoch = epoch_after(&err, "producer 31337, session ");
    let cmd = resume_command_in(&err);
    assert_eq!(
        cmd,
        format!(
            "spillway-bridge publish --gateway {gw} --topic t --producer-id 31337 --resume --max-record-bytes 4096 {input}"
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

/// Found by a break-it run: the lines a `--resume` skips were counted under the gateway's
/// record limit at the time of the resume, so after a restart with a higher
/// `--max-record-bytes` the printed command stored lines twice (one per oversize line in
/// the skipped part) and said "no duplicates". The printed command now carries the limit
/// the interrupted run numbered lines under.
#[test]
fn a_resume_after_the_gateway_raised_its_record_limit_stores_every_line_once() {
    let (dir, port, gw, mut gateway) = new_gateway(&[]);
    let n = 20_000;
    let line = |i: usize| {
        if i % 1000 == 500 {
            format!("big {i} {}", "x".repeat(5000))
        } else {
            format!("line {i}")
        }
    };
    let text: String = (0..n).map(|i| line(i) + "\n").collect();
    let (_, out) = interrupted_file_publish(dir.path(), &gw, "312", &text);
    let err = String::from_utf8_lossy(&out.stderr);
    let cmd = resume_command_in(&err);
    assert!(cmd.contains(" --max-record-bytes 4096 "), "{cmd}");
    // The gateway comes back taking records of up to 8 KiB.
    gateway.stop(Duration::from_secs(10));
    let _gateway = start_gateway_with(dir.path(), port, &["--max-record-bytes", "8K"]);
    let args: Vec<&str> = cmd.split(' ').skip(1).collect();
    let resumed = run_bridge(&args);
    let rerr = String::from_utf8_lossy(&resumed.stderr);
    // The oversize lines are still refused here, as in the first run: exit 1.
    assert_eq!(resumed.status.code(), Some(1), "{rerr}");
    let want: Vec<String> = (0..n).filter(|i| i % 1000 != 500).map(line).collect();
    assert_eq!(stored(&gw), want, "every line up to 4 KiB once, in order");
}

/// A line over the gateway's max record size (4 KiB by default) is refused before it is
/// sent and gets no sequence number: the lines after it are stored (the gateway takes only
/// the next sequence, so a refused sequence used to hold up every later line until
/// `--retry-for` ran out), and a `--resume` of the same input skips exactly the stored lines.
#[test]
fn a_line_over_the_record_limit_does_not_hold_up_the_lines_after_it() {
    let (_dir, _, gw, _gateway) = new_gateway(&[]);
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

/// A live publisher whose producer id the gateway forgets (sessions of `MAX_PRODUCERS`
/// other ids push it out of the producer table) is answered `UnknownSession`; it opens a
/// new session (one warning naming both epochs) and resends from its first line not
/// acknowledged, so every line is stored once, in order. Before, it stopped with exit 1
/// ("another publisher owns the producer id now"), and a `tail -F | publish` pipeline died
/// with it. Interrupted later, it prints the exact `--resume` command: the new session's
/// sequences count from the input line where it began, and the command says so.
#[test]
fn a_publisher_whose_id_the_gateway_forgot_opens_a_new_session_and_goes_on() {
    let (_dir, port, gw, _gateway) = new_gateway(&[]);
    let mut publisher = spawn_publish_stdin(&gw, &["--producer-id", "7"]);
    let mut input = publisher.stdin.take().unwrap();
    input.write_all(numbered("a", 0..50).as_bytes()).unwrap();
    wait_for_offset(&gw, 50, "the first lines");
    crowd_out_producers(port);
    input.write_all(numbered("b", 0..50).as_bytes()).unwrap();
    wait_until(
        Duration::from_secs(60),
        || (stored(&gw).len() >= 100).then_some(()),
        || {
            format!(
                "the lines after the eviction were not stored: {:?}",
                stored(&gw)
            )
        },
    );
    // Interrupted while it waits for more input.
    let out = interrupt(publisher);
    drop(input);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("another publisher owns"), "{err}");
    let e1 = epoch_after(&err, "producer 7, session ");
    assert!(
        err.contains(&format!("session {e1} cannot go on: the gateway forgot it")),
        "{err}"
    );
    let e2 = epoch_after(&err, "; opened session ");
    assert_ne!(e1, e2, "{err}");
    assert!(err.contains("input line 51 is its sequence 1"), "{err}");
    assert!(
        err.contains(&format!(
            "producer 7 session {e2} from input line 51 (after session {e1})"
        )),
        "{err}"
    );
    let want = [numbered_lines("a", 0..50), numbered_lines("b", 0..50)].concat();
    assert_eq!(stored(&gw), want);
    assert_eq!(
        resume_command_in(&err),
        format!(
            "spillway-bridge publish --gateway {gw} --topic t --producer-id 7 --resume --max-record-bytes 4096 -  # the same input on stdin, from its line 51 on"
        )
    );
    // As the command says: the input from line 51 on, with more lines after it.
    let rest = numbered("b", 0..50) + &numbered("c", 0..10);
    let resumed = publish_stdin(&gw, "7", &rest, &["--resume"]);
    let rerr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{rerr}");
    assert!(rerr.contains(&format!("session {e2} resumed")), "{rerr}");
    let mut want = want;
    want.extend(numbered_lines("c", 0..10));
    assert_eq!(stored(&gw), want, "{rerr}");
}

/// A buffered publish across a gateway kill -9: the lines the gateway had acknowledged as
/// buffered and not yet written are lost (as documented), and `publish` says which input
/// lines they were, goes on at once with the lines after them (a new session: the gateway
/// takes an earlier sequence next than the first line not acknowledged), exits 1, and its
/// summary no longer counts the lost lines as stored. Before, every later line was refused
/// as out of sequence until `--retry-for` ran out, and the summary named no loss.
#[test]
fn a_buffered_publish_across_a_gateway_crash_names_the_lost_lines_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    // Records wait in RAM until a durable request (a linger of an hour).
    let slow = ["--linger-ms", "3600000"];
    let (publisher, mut input, mut gateway) =
        buffered_publish_with_acknowledged_lines(dir.path(), port, "8", "30s");
    gateway.kill();
    let _gateway = start_gateway_with(dir.path(), port, &slow);
    input.write_all(numbered("c", 0..20).as_bytes()).unwrap();
    drop(input);
    let out = publisher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "lost lines exit 1: {err}");
    // 50 or 51: the marker's acknowledgement may or may not have left before the kill.
    assert!(
        err.contains("record(s) it had acknowledged as buffered (input lines 1–5"),
        "{err}"
    );
    assert!(
        err.contains("acknowledged as buffered and lost by the gateway before they reached flash (input lines 1–5"),
        "{err}"
    );
    assert!(err.contains("are durable (checked at the end)"), "{err}");
    let after: Vec<String> = stored(&gw)
        .into_iter()
        .filter(|l| !l.starts_with('a'))
        .collect();
    let mut want: Vec<String> = numbered_lines("c", 0..20);
    if after.first().is_some_and(|l| l == "marker") {
        want.insert(0, "marker".into());
    }
    assert_eq!(after, want, "{err}");
}

/// The largest producer id `--help` names, 2^63 - 1, publishes (the ids above it are the
/// gateway's own: a usage error, in `publish_cli.rs`, which also shows that they get
/// through the merge of the flags with the config file, where they once failed with "u64
/// value was too large").
#[test]
fn the_largest_producer_id_publishes() {
    let (_dir, _, gw, _gateway) = new_gateway(&[]);
    let max = (u64::MAX >> 1).to_string();
    let out = publish_stdin(&gw, &max, "one\n", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("producer {max}, session ")), "{err}");
    assert_eq!(stored(&gw), ["one"]);
}

/// A publish whose input is quiet for longer than the gateway's `--idle-timeout-ms` goes on
/// when the input does: the gateway closes the silent connection, `publish` connects again
/// and the session continues, every line stored once.
#[test]
fn a_publish_outlives_the_gateway_closing_its_idle_connection() {
    let (_dir, _, gw, gateway) = new_gateway(&["--idle-timeout-ms", "1000"]);
    let mut publisher = spawn_publish_stdin(&gw, &["--producer-id", "9"]);
    let mut input = publisher.stdin.take().unwrap();
    input.write_all(b"before\n").unwrap();
    gateway.wait_for_log("nothing received for", 1);
    input.write_all(b"after\n").unwrap();
    drop(input);
    let out = publisher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(stored(&gw), ["before", "after"], "{err}");
}

/// The QA report F: a publish interrupted after line 150 of 300 printed its `--resume`
/// command ("skips the lines the gateway stored: no duplicates"); sessions of 88 other ids
/// then pushed its id out of the gateway's producer table, and the printed command warned
/// "no session to resume", sent all 300 lines and exited 0: lines 1..150 were stored twice.
/// A `--resume` that finds no session now sends nothing and exits 1, saying why it cannot
/// know what to skip and how to go on.
#[test]
fn a_resume_whose_session_the_gateway_forgot_sends_nothing() {
    let (_dir, port, gw, _gateway) = new_gateway(&[]);
    let all = numbered("line", 0..300);
    let mut publisher = spawn_publish_stdin(&gw, &["--producer-id", "31337", "-"]);
    let mut input = publisher.stdin.take().unwrap();
    input
        .write_all(numbered("line", 0..150).as_bytes())
        .unwrap();
    wait_for_offset(&gw, 150, "the first 150 lines");
    let out = interrupt(publisher);
    drop(input);
    let err = String::from_utf8_lossy(&out.stderr);
    let cmd = resume_command_in(&err);
    assert_eq!(
        cmd,
        format!(
            "spillway-bridge publish --gateway {gw} --topic t --producer-id 31337 --resume --max-record-bytes 4096 -  # the same input on stdin"
        )
    );
    crowd_out_producers(port);
    // The printed command, with the whole input on stdin again.
    let resumed = publish_stdin(&gw, "31337", &all, &["--resume", "-"]);
    let rerr = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(1), "{rerr}");
    assert!(
        rerr.contains("the gateway has no session of the id to resume"),
        "{rerr}"
    );
    assert!(rerr.contains("nothing was sent"), "{rerr}");
    assert!(
        rerr.contains(&format!("spillway-bridge tail --gateway {gw} --topic t")),
        "{rerr}"
    );
    assert!(rerr.contains("sent 0,"), "{rerr}");
    assert!(!rerr.contains("to continue: "), "{rerr}");
    let want: Vec<String> = numbered_lines("line", 0..150);
    assert_eq!(stored(&gw), want, "nothing stored twice: {rerr}");
}

/// A buffered publish (records wait in the gateway's RAM for an hour) whose lines were
/// acknowledged, then the gateway is killed (-9) and restarted, sessions of
/// `MAX_PRODUCERS` other ids push the publisher's id out of its producer table, and more
/// input comes. Starts `--ack buffered --producer-id ID --retry-for RETRY` on stdin, writes
/// 50 lines and a marker and waits until they are stored; returns the publisher, its
/// stdin, and the gateway (still running).
fn buffered_publish_with_acknowledged_lines(
    dir: &Path,
    port: u16,
    id: &str,
    retry: &str,
) -> (Child, std::process::ChildStdin, GatewayProcess) {
    let gw = format!("tcp://127.0.0.1:{port}");
    let gateway = start_gateway_with(dir, port, &["--linger-ms", "3600000"]);
    let mut publisher = spawn_publish_stdin(
        &gw,
        &[
            "--producer-id",
            id,
            "--ack",
            "buffered",
            "--retry-for",
            retry,
        ],
    );
    let mut input = publisher.stdin.take().unwrap();
    input.write_all(numbered("a", 0..50).as_bytes()).unwrap();
    wait_for_offset(&gw, 50, "the first lines");
    // `publish` sends a batch once the one before it is answered: when the marker is
    // stored, the 50 lines before it were acknowledged.
    input.write_all(b"marker\n").unwrap();
    wait_for_offset(&gw, 51, "the marker");
    (publisher, input, gateway)
}

/// The QA report G: lines acknowledged as buffered, a gateway kill -9 that lost them, and
/// then the gateway forgot the session (sessions of 88 other ids): `publish` opened a new
/// session, resent the rest and exited 0 with "durable (checked at the end)", never naming
/// the lost lines. Once the session is forgotten nothing tells which of them reached flash,
/// so the lines acknowledged before the reconnect and not known durable are named as
/// possibly lost, and it exits 1.
#[test]
fn buffered_lines_of_a_session_forgotten_after_a_crash_are_named_as_possibly_lost() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let (publisher, mut input, mut gateway) =
        buffered_publish_with_acknowledged_lines(dir.path(), port, "91", "30s");
    gateway.kill();
    let _gateway = start_gateway_with(dir.path(), port, &["--linger-ms", "3600000"]);
    // `publish` connects again only for its next line: the id is forgotten by then.
    crowd_out_producers(port);
    input.write_all(numbered("c", 0..20).as_bytes()).unwrap();
    drop(input);
    let out = publisher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "possibly lost lines exit 1: {err}"
    );
    assert!(err.contains("cannot go on: the gateway forgot it"), "{err}");
    // 50 or 51: the marker's acknowledgement may or may not have left before the kill.
    assert!(
        err.contains("record(s) acknowledged as buffered (input lines 1–5"),
        "{err}"
    );
    assert!(
        err.contains("are not known durable and may be lost"),
        "{err}"
    );
    assert!(
        err.contains(
            "acknowledged as buffered and not known durable, possibly lost (input lines 1–5"
        ),
        "{err}"
    );
    let after: Vec<String> = stored(&gw)
        .into_iter()
        .filter(|l| l.starts_with('c'))
        .collect();
    let want: Vec<String> = numbered_lines("c", 0..20);
    assert_eq!(after, want, "{err}");
}

/// A buffered publish that gives up (the gateway killed and gone, `--retry-for 1s`) used
/// to print "acknowledged 51" with no word that none of them was known durable (and the
/// kill lost them all): the summary now says how many of the acknowledged were only
/// buffered and not known durable, and which input lines.
#[test]
fn a_buffered_publish_that_gives_up_says_what_is_not_known_durable() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let (publisher, mut input, mut gateway) =
        buffered_publish_with_acknowledged_lines(dir.path(), port, "91", "1s");
    gateway.kill();
    input.write_all(b"after\n").unwrap();
    drop(input);
    let out = publisher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("giving up after"), "{err}");
    assert!(
        err.contains("of the acknowledged only as buffered, not known durable (input lines 1–5"),
        "{err}"
    );
    assert!(
        err.contains("loses them (the command below resends any the gateway lost)"),
        "{err}"
    );
}

/// A stand-in gateway (protocol version 3) that answers every `OpenSession` with `text`
/// as a `BadRequest`, on a thread; returns its `tcp://` address.
fn gateway_refusing_sessions(text: &'static str) -> String {
    use spillway_core::wire::{
        ErrorCode, Request, Response, WelcomeV3, decode_message, encode_frame,
    };
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut frame = Vec::new();
            let mut byte = [0u8; 1];
            while conn.read(&mut byte).is_ok_and(|n| n == 1) {
                if byte[0] != 0 {
                    frame.push(byte[0]);
                    continue;
                }
                if frame.is_empty() {
                    continue;
                }
                let mut out = vec![0u8; 1024];
                let n = match decode_message::<Request>(&mut frame) {
                    Ok(Request::Hello { .. }) => encode_frame(
                        &(
                            Response::Welcome {
                                protocol_version: 3,
                                log_id: 1,
                                gateway_id: "stand-in",
                                max_record_bytes: 4096,
                                max_frame_bytes: 8192,
                            },
                            WelcomeV3 { producer_window: 4 },
                        ),
                        &mut out,
                    ),
                    Ok(Request::OpenSession { seq, .. }) => encode_frame(
                        &Response::Error {
                            seq,
                            code: ErrorCode::BadRequest,
                            message: text,
                        },
                        &mut out,
                    ),
                    _ => return,
                }
                .unwrap();
                frame.clear();
                if conn.write_all(&out[..n]).is_err() {
                    break;
                }
            }
        }
    });
    addr
}

/// When the gateway has no session epoch left (its journal used every 32-bit one) it
/// refuses the session with `BadRequest`; `publish` used to end with "stopped before
/// anything was stored: run the same command again", which can only meet the same
/// refusal. It now gives the gateway's reason instead.
#[test]
fn a_refused_session_gives_the_gateways_reason_not_a_rerun() {
    let text = "no session epoch is left for producer 5: the journal has used every 32-bit epoch; format the log again";
    let gw = gateway_refusing_sessions(text);
    let out = publish_stdin(&gw, "5", "one\n", &["--retry-for", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "stopped before anything was stored: the gateway refused the producer session (BadRequest {text}); running the same command again meets the same answer"
        )),
        "{err}"
    );
    assert!(!err.contains("run the same command again"), "{err}");
    assert!(!err.contains("--resume"), "{err}");
}

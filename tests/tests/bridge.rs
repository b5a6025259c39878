//! End-to-end tests of `spillway-bridge` with the real `spillway` gateway: publish, drain to
//! files and to Kafka (librdkafka's mock cluster, a real TCP listener in this process, and
//! a real broker process when `SPILLWAY_KAFKA_BROKER` is set), tail and status; kill -9
//! while draining (files and Kafka: no duplicates); a sink outage; a replaced
//! gateway image. The publish/drain/tail/status test and the kill -9 drain test run twice:
//! over plaintext TCP and over TLS with a token ([`Link`]).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use spillway_tests::bridge::{
    assert_log_holds_lines_once_in_order, committed_offset, drain_args, gateway_next_offset,
    metric_sum, publish_args, resume_offsets, run_bridge_ok, run_bridge_usage_error, sink_files,
    spawn_bridge_piped,
};
use spillway_tests::gateway::{free_port, image_in};
use spillway_tests::kafka::{Broker, KMsg, consume_all};
use spillway_tests::pki::TlsSetup;
use spillway_tests::process::ChildProcess;
use spillway_tests::wait::wait_until;
use spillway_tests::{GatewayProcess, bridge_bin, run_bridge};

const GATEWAY_ID: &str = "e2e-gw";

/// How the bridge reaches the gateway: the same scenario over plaintext TCP, or over TLS
/// (the gateway's certificate checked against the test CA for the name `localhost`) with
/// the bridge's token in its `Hello`.
enum Link {
    Tcp,
    Tls(Box<TlsSetup>),
}

impl Link {
    /// TLS with certificates and a token made in `dir`.
    fn tls(dir: &Path) -> Link {
        Link::Tls(Box::new(TlsSetup::new(dir)))
    }

    /// The gateway's listener URI and the URI the bridge connects to.
    fn uris(&self, port: u16) -> (String, String) {
        match self {
            Link::Tcp => {
                let u = format!("tcp://127.0.0.1:{port}");
                (u.clone(), u)
            }
            Link::Tls(_) => (
                format!("tls://127.0.0.1:{port}"),
                format!("tls://localhost:{port}"),
            ),
        }
    }

    /// The bridge's flags for this link.
    fn bridge_args(&self) -> Vec<String> {
        match self {
            Link::Tcp => Vec::new(),
            Link::Tls(t) => t.bridge_args(),
        }
    }

    /// `spillway-bridge ARGS` and this link's flags, run to completion.
    fn run(&self, args: &[&str]) -> std::process::Output {
        let extra = self.bridge_args();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(extra.iter().map(String::as_str));
        run_bridge(&all)
    }

    /// Starts the gateway on `port` with this link's listener.
    fn start_gateway(&self, dir: &Path, port: u16) -> GatewayProcess {
        let listen = self.uris(port).0;
        let mut args = image_in(
            dir,
            &[
                "--size",
                "4M",
                "--listen",
                &listen,
                "--gateway-id",
                GATEWAY_ID,
            ],
        );
        if let Link::Tls(t) = self {
            args.extend(t.gateway_args());
        }
        GatewayProcess::start(&args, 1)
    }

    /// [`Link::start_gateway`] on a free port: the process and the URI the bridge
    /// connects to.
    fn gateway(&self, dir: &Path) -> (GatewayProcess, String) {
        let port = free_port();
        (self.start_gateway(dir, port), self.uris(port).1)
    }
}

fn start_gateway(dir: &Path, port: u16) -> GatewayProcess {
    Link::Tcp.start_gateway(dir, port)
}

/// [`start_gateway`] on a free port: the process and its URI.
fn gateway(dir: &Path) -> (GatewayProcess, String) {
    Link::Tcp.gateway(dir)
}

/// The file sink of a drain in `dir`: its directory `DIR/out`, its `file:` URI, and the
/// drain's state file `DIR/s.redb`.
fn file_sink_in(dir: &Path) -> (std::path::PathBuf, String, String) {
    let sink_dir = dir.join("out");
    let sink = format!("file:{}", sink_dir.display());
    (sink_dir, sink, dir.join("s.redb").display().to_string())
}

/// The last run of a kill -9 test: `ARGS --once` to the end, which must succeed and must
/// have resumed from a checkpoint that a killed run saved (every offset it resumed at is
/// past 0); the offsets are added to `resumed_at`. Returns its stderr.
fn last_run_resumed(mut args: Vec<&str>, resumed_at: &mut Vec<u64>) -> String {
    args.push("--once");
    let out = run_bridge_ok(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = resume_offsets(&err);
    assert!(!last.is_empty() && last.iter().all(|&o| o > 0), "{err}");
    resumed_at.extend(last);
    err
}

/// One round of a kill -9 test of a drain of `total` records: starts the drain `args` with
/// `--metrics` on a free port and its stderr in `log`, waits (20 s at most) until this run
/// has forwarded records (its `spillway_bridge_forwarded_records_total` above 0) or its
/// checkpoint is already at `total` (nothing left to forward), waits `extra` more, and
/// SIGKILLs it. Prints round `run`'s resume offset (0 when it started without a checkpoint),
/// records forwarded and checkpoint offset, the last two as last read before the kill: the
/// kill landed part-way when that checkpoint is below `total`. Returns the resume offset
/// and that last checkpoint offset read.
fn kill_9_once_forwarding(
    run: usize,
    args: &[&str],
    log: &Path,
    total: u64,
    extra: Duration,
) -> (u64, u64) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--metrics", addr.as_str()]);
    let mut c = spawn_logged(&a, log);
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    // (forwarded, checkpoint) once this run forwarded something or has nothing to forward.
    let progress = || {
        let forwarded = metric_sum(port, "spillway_bridge_forwarded_records_total")?;
        let committed = metric_sum(port, "spillway_bridge_committed_offset")?;
        (forwarded > 0.0 || committed >= total as f64).then_some([forwarded, committed])
    };
    let mut seen = wait_until(
        Duration::from_secs(20),
        || {
            assert!(c.is_running(), "the drain exited: {}", read_log());
            progress()
        },
        || format!("no record forwarded: {}", read_log()),
    );
    // Deliberate: a random moment after the first deliveries of this run.
    std::thread::sleep(extra);
    if let Some(p) = progress() {
        seen = p;
    }
    c.kill();
    let resumed = resume_offsets(&read_log()).first().copied().unwrap_or(0);
    let [forwarded, checkpoint] = seen;
    eprintln!(
        "run {run}: resumed at {resumed}, killed after {forwarded} forwarded, checkpoint {checkpoint}"
    );
    (resumed, checkpoint as u64)
}

/// A kill -9 test's loop: `kills` rounds of [`kill_9_once_forwarding`] on the drain `args`
/// (round `k`'s stderr in `dir/bridge-k.log`), each `0..extra_ms` ms after its run's
/// first deliveries, with `after_kill(k)` called after each. Before each round whose
/// backlog (records published minus the last checkpoint read) is under [`BACKLOG_LOW`],
/// it publishes [`BACKLOG_CHUNK`] more records to topic `t` with `publish`, numbered on
/// from the last (`r <offset>`), so every round has records left to forward however fast
/// this machine drains. Returns the records published and the offset each restart
/// resumed at, each beside the records published when it started.
fn kill_9_rounds(
    dir: &Path,
    args: &[&str],
    kills: usize,
    extra_ms: u64,
    publish: &dyn Fn(&str),
    mut after_kill: impl FnMut(usize),
) -> (u64, Vec<(u64, u64)>) {
    let seed: u64 = spillway_tests::env_number("SPILLWAY_SEED").unwrap_or_else(rand::random);
    eprintln!("seed {seed} (set SPILLWAY_SEED to replay)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut published, mut checkpoint) = (0u64, 0u64);
    let mut restarts = Vec::new();
    for k in 0..kills {
        if published.saturating_sub(checkpoint) < BACKLOG_LOW {
            let next = published + BACKLOG_CHUNK;
            publish(&write_range(dir, published..next, "r"));
            published = next;
        }
        let log = dir.join(format!("bridge-{k}.log"));
        let extra = Duration::from_millis(rng.random_range(0..extra_ms));
        let (resumed, read) = kill_9_once_forwarding(k, args, &log, published, extra);
        if k > 0 {
            restarts.push((resumed, published));
        }
        checkpoint = read;
        after_kill(k);
    }
    (published, restarts)
}

/// Records a kill -9 round tops the backlog up by ([`kill_9_rounds`]).
const BACKLOG_CHUNK: u64 = 2000;
/// The backlog under which a kill -9 round is topped up first ([`kill_9_rounds`]). On
/// the slowest and fastest machines seen a run forwarded 0 to 450 records before its kill.
const BACKLOG_LOW: u64 = 1500;

/// Asserts that at least half of the restarts of a kill -9 test, each a (resume offset,
/// records published when it started) pair, resumed part-way: at a checkpoint strictly
/// between 0 and what was published, so that the kill before it landed while records
/// were still left to forward.
fn assert_most_restarts_part_way(restarts: &[(u64, u64)]) {
    let part_way = restarts.iter().filter(|&&(o, n)| o > 0 && o < n).count();
    eprintln!("{part_way} of {} restarts resumed part-way", restarts.len());
    assert!(
        part_way * 2 >= restarts.len(),
        "only {part_way} of {} restarts resumed part-way: {restarts:?}",
        restarts.len()
    );
}

/// Writes lines `<prefix> <i>` for each `i` in `range` to `dir/<prefix>-<start>.txt` and
/// returns its path.
fn write_range(dir: &Path, range: std::ops::Range<u64>, prefix: &str) -> String {
    let p = dir.join(format!("{prefix}-{}.txt", range.start));
    let text: String = range.map(|i| format!("{prefix} {i}\n")).collect();
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn write_input(dir: &Path, n: usize, prefix: &str) -> String {
    let p = dir.join(format!("{prefix}.txt"));
    let text: String = (0..n).map(|i| format!("{prefix} {i}\n")).collect();
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn publish(gw: &str, topic: &str, file: &str) {
    publish_over(&Link::Tcp, gw, topic, file);
}

fn publish_over(link: &Link, gw: &str, topic: &str, file: &str) {
    let out = link.run(&[publish_args(gw, topic), vec![file]].concat());
    assert!(
        out.status.success(),
        "publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every line of the file sink: (offset, payload), sorted by offset (duplicates kept).
fn read_files(out: &Path) -> Vec<(u64, String)> {
    let mut v = Vec::new();
    for path in sink_files(out) {
        let text = std::fs::read_to_string(path).unwrap();
        for line in text.lines() {
            let j: serde_json::Value = serde_json::from_str(line).expect("whole JSON lines");
            if j.get("gap").is_some() {
                continue;
            }
            v.push((
                j["offset"].as_u64().unwrap(),
                j["payload"].as_str().unwrap().to_string(),
            ));
        }
    }
    v.sort_by_key(|x| x.0);
    v
}

fn spawn_bridge(args: &[&str]) -> Child {
    Command::new(bridge_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `spillway-bridge ARGS` in the background, its stderr (at `info`) written to `log`.
fn spawn_logged(args: &[&str], log: &Path) -> ChildProcess {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    spillway_tests::bridge::spawn_bridge(&bridge_bin(), &args, log).unwrap()
}

fn sigterm_and_wait(c: Child) -> i32 {
    spillway_tests::process::stop(c, Duration::from_secs(30))
        .expect("spillway-bridge did not stop on SIGTERM")
        .code()
        .unwrap_or(-1)
}

/// The gateway's committed offset for `bridge` (via `status --json`).
fn gateway_committed(gw: &str) -> u64 {
    gateway_committed_over(&Link::Tcp, gw)
}

fn gateway_committed_over(link: &Link, gw: &str) -> u64 {
    let out = link.run(&[
        "status",
        "--gateway",
        gw,
        "--state",
        "/nonexistent/x.redb",
        "--json",
    ]);
    committed_offset(&out.stdout, "bridge")
}

/// Two tests of the scenario `fn(dir, link)`: `$tcp` over plain TCP, `$tls` over TLS with
/// certificates and a token made in its directory.
macro_rules! over_tcp_and_tls {
    ($(#[$doc:meta])* $scenario:ident: $tcp:ident, $tls:ident) => {
        $(#[$doc])*
        #[test]
        fn $tcp() {
            let dir = tempfile::tempdir().unwrap();
            $scenario(dir.path(), &Link::Tcp);
        }

        $(#[$doc])*
        #[test]
        fn $tls() {
            let dir = tempfile::tempdir().unwrap();
            let link = Link::tls(dir.path());
            $scenario(dir.path(), &link);
        }
    };
}

over_tcp_and_tls!(
    /// Publish a file, drain it to files, tail it and read the status.
    publish_drain_tail_status_over: publish_drain_tail_status,
    publish_drain_tail_status_over_tls_with_a_token
);

fn publish_drain_tail_status_over(dir: &Path, link: &Link) {
    let (_g, gw) = link.gateway(dir);
    let n = 1000;
    let input = write_input(dir, n, "sst");
    let out = link.run(&[publish_args(&gw, "buoy/sst"), vec![&input]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("acknowledged {n}")), "{err}");
    assert!(err.contains("first offset 0, last offset 999"), "{err}");

    let (sink_dir, sink, state) = file_sink_in(dir);
    let mut args = drain_args(&gw, &sink, &state);
    args.push("--once");
    let t = Instant::now();
    let out = link.run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("drained {n} records to files in {:?}", t.elapsed());
    let lines = read_files(&sink_dir);
    assert_eq!(lines.len(), n);
    for (i, (off, payload)) in lines.iter().enumerate() {
        assert_eq!(*off, i as u64);
        assert_eq!(payload, &format!("sst {i}"));
    }
    assert!(
        sink_dir
            .join(GATEWAY_ID)
            .join("buoy%2Fsst/00000000000000000000.jsonl.open")
            .exists(),
        "{:?}",
        sink_files(&sink_dir)
    );

    let out = link.run(&["tail", "--gateway", &gw, "--format", "raw"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, std::fs::read_to_string(&input).unwrap());
    let out = link.run(&[
        "tail",
        "--gateway",
        &gw,
        "--from",
        "998",
        "--format",
        "json",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["gateway_id"], GATEWAY_ID);
    assert_eq!(rows[1]["offset"], 999);
    assert_eq!(rows[0].as_object().unwrap().len(), 8);

    let out = link.run(&["status", "--gateway", &gw, "--state", &state]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(GATEWAY_ID), "{text}");
    assert!(text.contains("lag 0 offsets"), "{text}");
    // The limits the Welcome announced, at the defaults: the 64 KiB frame is raised to
    // carry the largest record the default RAM buffer holds.
    assert!(
        text.contains("limits       record 4096 bytes  frame 66137 bytes"),
        "{text}"
    );
    assert_eq!(gateway_committed_over(link, &gw), n as u64);
}

over_tcp_and_tls!(
    /// 25 kill -9 of a file-sink drain, each a random 0-20 ms after that run's first
    /// deliveries (at least half of them must land while records are left to forward; the
    /// backlog is topped up before any run that could drain it all), with
    /// a downstream job taking every closed file away after each kill: no record lost, and
    /// none written twice (each restart cuts the files back to the checkpoint's synced
    /// lengths before it resends, and a file is closed only once a checkpoint covers it, so
    /// nothing taken away is sent again).
    kill_9_while_draining_loses_nothing_over: kill_9_while_draining_loses_nothing,
    kill_9_while_draining_over_tls_loses_nothing
);

fn kill_9_while_draining_loses_nothing_over(dir: &Path, link: &Link) {
    let (_g, gw) = link.gateway(dir);
    let (sink_dir, sink, state) = file_sink_in(dir);
    let extra = link.bridge_args();
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(extra.iter().map(String::as_str));
    // Small batches, a few to a group checkpoint: many checkpoints, many chances to die in
    // between, with batches written and not synced yet; small files: many rotations (a
    // rename each), some cut short by a kill, some files filled between two checkpoints.
    args.extend([
        "--max-batch-bytes",
        "1024",
        "--prefetch",
        "2",
        "--checkpoint-bytes",
        "1K",
        "--rotate-bytes",
        "16K",
    ]);
    let picked = dir.join("picked");
    std::fs::create_dir_all(&picked).unwrap();
    let mut taken = 0;
    let kills = 25;
    let take_closed_files = |_| {
        for path in sink_files(&sink_dir) {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.ends_with(".jsonl") {
                std::fs::rename(&path, picked.join(&name)).unwrap();
                taken += 1;
            }
        }
    };
    let (n, mut restarts) = kill_9_rounds(
        dir,
        &args,
        kills,
        20,
        &|file| publish_over(link, &gw, "t", file),
        take_closed_files,
    );
    let mut resumed_at = Vec::new();
    last_run_resumed(args, &mut resumed_at);
    restarts.extend(resumed_at.iter().map(|&o| (o, n)));
    let mut lines = read_files(&sink_dir);
    lines.extend(read_files(&picked));
    lines.sort_by_key(|l| l.0);
    let mut distinct: Vec<u64> = lines.iter().map(|l| l.0).collect();
    distinct.dedup();
    assert_eq!(distinct, (0..n).collect::<Vec<_>>(), "no record lost");
    for (off, payload) in &lines {
        assert_eq!(payload, &format!("r {off}"));
    }
    let dups = lines.len() - n as usize;
    let files = sink_files(&sink_dir);
    eprintln!(
        "{kills} kills over {n} records: {dups} duplicate lines, {} files left, {taken} taken away; the restarts resumed at {restarts:?}",
        files.len()
    );
    assert_eq!(dups, 0, "no record written twice");
    assert_layout(&sink_dir.join(GATEWAY_ID).join("t"), false);
    assert_most_restarts_part_way(&restarts);
}

/// Checks the files of one topic directory: each named `<first offset, 20 digits>.jsonl`
/// (or `.jsonl.open`) by its first record's offset, at most one open and that one the
/// newest, and, with `by_date`, each in the `YYYY-MM-DD` directory of its first record's
/// UTC date. Returns the closed files' paths relative to `topic_dir`.
fn assert_layout(topic_dir: &Path, by_date: bool) -> Vec<String> {
    let files = sink_files(topic_dir);
    assert!(!files.is_empty(), "{}: no files", topic_dir.display());
    let mut closed = Vec::new();
    let mut newest_open = None;
    let mut firsts = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(topic_dir).unwrap().display().to_string();
        let name = path.file_name().unwrap().to_str().unwrap();
        let (digits, open) = match name.strip_suffix(".jsonl.open") {
            Some(d) => (d, true),
            None => (name.strip_suffix(".jsonl").unwrap(), false),
        };
        assert_eq!(digits.len(), 20, "{rel}");
        let first: u64 = digits.parse().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let line: serde_json::Value =
            serde_json::from_str(text.lines().next().expect("not empty")).unwrap();
        assert_eq!(line["offset"], first, "{rel}: named by its first record");
        let date = &line["timestamp"].as_str().unwrap()[..10];
        let expected = if by_date {
            format!("{date}/{name}")
        } else {
            name.to_string()
        };
        assert_eq!(rel, expected);
        if open {
            assert!(newest_open.is_none(), "two open files: {files:?}");
            newest_open = Some(first);
        } else {
            closed.push(rel);
        }
        firsts.push(first);
    }
    if let Some(o) = newest_open {
        assert_eq!(Some(&o), firsts.iter().max(), "the open file is the newest");
    }
    closed
}

/// A downstream job moves every closed file away after each drain: the next drains never
/// write a file under a name it took (the earlier layout started over at `00000000`).
#[test]
fn file_names_never_repeat_after_the_closed_files_were_moved_away() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (_g, gw) = gateway(dir);
    let (sink_dir, sink, state) = file_sink_in(dir);
    let picked = dir.join("picked");
    std::fs::create_dir_all(&picked).unwrap();
    let topic_dir = sink_dir.join(GATEWAY_ID).join("t");
    let mut taken: Vec<String> = Vec::new();
    let per_round = 300;
    for round in 0..3 {
        let input = write_input(dir, per_round, &format!("r{round}"));
        publish(&gw, "t", &input);
        let mut args = drain_args(&gw, &sink, &state);
        args.extend(["--once", "--rotate-bytes", "4K"]);
        run_bridge_ok(&args);
        let closed = assert_layout(&topic_dir, false);
        assert!(closed.len() >= 2, "round {round}: {closed:?}");
        for name in closed {
            assert!(
                !taken.contains(&name),
                "round {round}: {name} written again"
            );
            std::fs::rename(topic_dir.join(&name), picked.join(&name)).unwrap();
            taken.push(name);
        }
    }
    let mut offsets: Vec<u64> = read_files(&picked)
        .into_iter()
        .chain(read_files(&sink_dir))
        .map(|l| l.0)
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..3 * per_round as u64).collect::<Vec<_>>());
    eprintln!(
        "{} closed files taken in 3 rounds, no name twice",
        taken.len()
    );
}

/// A drain that resends what the files hold already (a new state file, so no checkpoint
/// and no synced lengths to cut back to) writes none of it again, and does not count it as
/// forwarded: the summary and the forwarded counters say 0, the duplicate check's line
/// says how many it skipped.
#[test]
fn records_the_files_held_already_are_not_counted_as_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (_g, gw) = gateway(dir);
    let (sink_dir, sink, state) = file_sink_in(dir);
    let n = 300;
    publish(&gw, "t", &write_input(dir, n, "d"));
    let first = run_bridge_ok(&[drain_args(&gw, &sink, &state), vec!["--once"]].concat());
    let said = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        said(&first).contains(&format!("forwarded {n} records")),
        "{}",
        said(&first)
    );
    let state2 = dir.join("s2.redb").display().to_string();
    let again = [
        drain_args(&gw, &sink, &state2),
        vec!["--once", "--consumer", "again", "--from", "earliest"],
    ]
    .concat();
    let second = run_bridge_ok(&again);
    let text = said(&second);
    assert!(text.contains("forwarded 0 records (0 bytes)"), "{text}");
    assert!(
        text.contains("skipped"),
        "the duplicates are reported: {text}"
    );
    let offsets: Vec<u64> = read_files(&sink_dir).into_iter().map(|l| l.0).collect();
    assert_eq!(
        offsets,
        (0..n as u64).collect::<Vec<_>>(),
        "each record once"
    );
}

/// `--rotate-interval` (flag) closes a file that stays below `--rotate-bytes` while the
/// drain is idle, and `partition-by-date` (config key) puts it under the UTC date of its
/// first record.
#[test]
fn rotate_interval_closes_an_idle_file_under_its_date_directory() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (_g, gw) = gateway(dir);
    let (sink_dir, sink, state) = file_sink_in(dir);
    let config = dir.join("bridge.toml");
    std::fs::write(
        &config,
        "partition-by-date = true\nrotate-bytes = \"64M\"\n",
    )
    .unwrap();
    let config = config.display().to_string();
    publish(&gw, "t", &write_input(dir, 50, "a"));
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--config", &config, "--rotate-interval", "1s"]);
    let c = spawn_bridge(&args);
    let topic_dir = sink_dir.join(GATEWAY_ID).join("t");
    let t = Instant::now();
    // Wait for the drain to write all 50 records and close their file.
    let done = loop {
        let files = sink_files(&topic_dir);
        if read_files(&sink_dir).len() == 50
            && !files.is_empty()
            && files
                .iter()
                .all(|p| p.extension().is_some_and(|e| e == "jsonl"))
        {
            break true;
        }
        if t.elapsed() > Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let files = sink_files(&topic_dir);
    assert_eq!(sigterm_and_wait(c), 0);
    assert!(done, "not closed within 30 s: {files:?}");
    let closed = assert_layout(&topic_dir, true);
    assert_eq!(closed.len(), 1, "{closed:?}");
    eprintln!("closed {:?} after {:.1?}", closed, t.elapsed());
    assert_eq!(
        read_files(&sink_dir)
            .iter()
            .map(|l| l.0)
            .collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
}

#[test]
fn replaced_image_is_refused_by_the_resume_check() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    args.push("--once");
    {
        let _g = start_gateway(dir.path(), port);
        publish(&gw, "t", &write_input(dir.path(), 10, "a"));
        assert!(run_bridge(&args).status.success());
    }
    std::fs::remove_file(dir.path().join("gw.img")).unwrap();
    let _g = start_gateway(dir.path(), port);
    publish(&gw, "t", &write_input(dir.path(), 3, "b"));
    let out = run_bridge(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("log id"), "{err}");
    assert!(err.contains("--accept-new-log"), "{err}");
    // Refused into a sink directory of its own: the directories it made are gone again.
    let fresh = dir.path().join("fresh").join("out");
    let fresh_sink = format!("file:{}", fresh.display());
    let refused = [drain_args(&gw, &fresh_sink, &state), vec!["--once"]].concat();
    let out = run_bridge(&refused);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(!dir.path().join("fresh").exists(), "{err}");
    args.push("--accept-new-log");
    let out = run_bridge(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // With the flag set, the warning says what happens instead of asking for the flag.
    assert!(
        err.contains("--accept-new-log is set: starting over"),
        "{err}"
    );
    assert!(!err.contains("rerun with --accept-new-log"), "{err}");
    let lines = read_files(&dir.path().join("out"));
    assert_eq!(lines.len(), 13);
}

/// Publishes `n` records durably, drains them with `drain --once` into a fresh topic of
/// `broker`, and reads back exactly `n` messages in order, with their offsets, key and
/// headers.
fn drain_to_kafka_exactly_in_order(broker: &Broker) {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    let n = 1000;
    publish(&gw, "buoy/sst", &write_input(dir.path(), n, "k"));
    let topic = broker.new_topic("spillway-e2e", 1);
    let sink = format!("kafka://{}/{topic}", broker.bootstrap());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    args.push("--once");
    let t = Instant::now();
    run_bridge_ok(&args);
    eprintln!(
        "drained {n} records to Kafka ({}) in {:?}",
        broker.describe(),
        t.elapsed()
    );
    let msgs = consume_all(&broker.bootstrap(), &topic, 1);
    assert_eq!(msgs.len(), n, "exactly the records published");
    let log_id = msgs[0].headers["spillway-log-id"].clone();
    assert_eq!(log_id.len(), 32);
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.kafka_offset, i as i64);
        assert_eq!(m.spillway_offset(), i as u64, "in order");
        assert_eq!(m.payload, format!("k {i}").into_bytes());
        // Keyed by gateway id alone.
        assert_eq!(m.key, GATEWAY_ID);
        assert_eq!(m.headers["spillway-gateway"], GATEWAY_ID);
        assert_eq!(m.headers["spillway-log-id"], log_id);
        assert_eq!(m.headers["spillway-topic"], "buoy/sst");
        let ts: u64 = m.headers["spillway-timestamp-us"].parse().unwrap();
        assert!(ts > 1_600_000_000_000_000, "{ts}");
    }
}

#[test]
fn drains_to_kafka_exactly_in_order() {
    drain_to_kafka_exactly_in_order(&Broker::mock());
}

/// The same against the broker process of `SPILLWAY_KAFKA_BROKER` (`.ci/run` starts tansu).
#[test]
fn drains_to_a_real_kafka_broker_exactly_in_order() {
    let Some(broker) = Broker::real() else {
        eprintln!("SPILLWAY_KAFKA_BROKER not set: skipping the real broker test");
        return;
    };
    drain_to_kafka_exactly_in_order(&broker);
}

/// kill -9 the bridge 20 times while it drains into Kafka (the real broker when
/// `SPILLWAY_KAFKA_BROKER` is set, else the mock cluster), each a random 0-5 ms after that
/// run's first deliveries (at least half of them must land while records are left to
/// forward; the backlog is topped up before any run that could drain it all), then let it
/// finish: every offset is in the topic exactly once, counted by (log
/// id, offset). Without the resume from the partition tails, each kill between a delivery
/// and its redb commit left a duplicate batch.
#[test]
fn kill_9_while_draining_into_kafka_sends_nothing_twice() {
    let broker = Broker::real_or_mock();
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    let topic = broker.new_topic("spillway-kill", 1);
    let sink = format!("kafka://{}/{topic}", broker.bootstrap());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--max-batch-bytes", "1024", "--prefetch", "2"]);
    let kills = 20;
    let mut resumed_runs = 0;
    let count_tail_reads = |k: usize| {
        let log = dir.path().join(format!("bridge-{k}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("already holds offsets") {
            resumed_runs += 1;
        }
    };
    let (n, mut restarts) = kill_9_rounds(
        dir.path(),
        &args,
        kills,
        5,
        &|file| publish(&gw, "t", file),
        count_tail_reads,
    );
    let mut resumed_at = Vec::new();
    let err = last_run_resumed(args, &mut resumed_at);
    restarts.extend(resumed_at.iter().map(|&o| (o, n)));
    // It also read the partition's tail for records delivered but not checkpointed.
    assert!(
        err.contains("messages from the tails of 1 of its 1 partitions"),
        "{err}"
    );
    let msgs = consume_all(&broker.bootstrap(), &topic, 1);
    let mut count: HashMap<(String, u64), usize> = HashMap::new();
    for m in &msgs {
        assert_eq!(m.payload, format!("r {}", m.spillway_offset()).into_bytes());
        *count
            .entry((m.headers["spillway-log-id"].clone(), m.spillway_offset()))
            .or_default() += 1;
    }
    let dups: Vec<_> = count.iter().filter(|(_, c)| **c > 1).collect();
    eprintln!(
        "{kills} kills into {} over {n} records: {} messages, {} distinct (log id, offset), {} duplicated; {resumed_runs} runs resumed from the partition tail; the restarts resumed at {restarts:?}",
        broker.describe(),
        msgs.len(),
        count.len(),
        dups.len()
    );
    assert_eq!(count.len() as u64, n, "no record lost");
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    let in_order: Vec<u64> = msgs.iter().map(KMsg::spillway_offset).collect();
    assert_eq!(in_order, (0..n).collect::<Vec<_>>(), "in order");
    assert_most_restarts_part_way(&restarts);
}

#[test]
fn backlog_drains_after_a_sink_outage_without_new_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    let n = 500;
    publish(&gw, "t", &write_input(dir.path(), n, "o"));
    let broker = Broker::mock();
    let Broker::Mock(mock) = &broker else {
        unreachable!()
    };
    mock.create_topic("spillway", 1, 1).unwrap();
    mock.broker_down(1).unwrap();
    let sink = format!("kafka://{}/spillway", mock.bootstrap_servers());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    // No partition-tail scan at the start (it would wait out its 10 s timeout against the
    // down broker): the outage meets deliveries, which time out and are resent.
    args.extend([
        "--kafka-delivery-timeout-ms",
        "1000",
        "--backoff-max-ms",
        "500",
        "--kafka-resume-window",
        "0",
        // Small batches and one prefetched: the window and the fetcher's queue are full
        // long before the backlog's end, so the fetcher waits to hand a batch over.
        "--max-batch-bytes",
        "1K",
        "--prefetch",
        "1",
    ]);
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    args.extend(["--metrics", &metrics_addr]);
    let child = spawn_bridge(&args);
    // Two deliveries to the sink have failed: nothing is committed.
    let t = Instant::now();
    wait_until(
        Duration::from_secs(30),
        || metric_sum(metrics, "spillway_bridge_sink_errors_total").filter(|&n| n >= 2.0),
        || "fewer than two sink failures counted while the broker is down".to_string(),
    );
    eprintln!("two sink failures {:?} after the start", t.elapsed());
    assert_eq!(
        gateway_committed(&gw),
        0,
        "nothing acknowledged while the sink is down"
    );
    // Records published during the outage show in the lag: the gauges follow the log
    // while the fetcher waits for room, the time a lag alert exists for.
    let more = 100;
    publish(&gw, "t", &write_input(dir.path(), more, "o2"));
    let total = (n + more) as f64;
    wait_until(
        Duration::from_secs(20),
        || {
            let next = metric_sum(metrics, "spillway_bridge_gateway_next_offset")?;
            let lag = metric_sum(metrics, "spillway_bridge_lag_offsets")?;
            (next == total && lag == total).then_some(())
        },
        || {
            format!(
                "the next-offset and lag gauges did not reach {total} during the outage: {:?}, {:?}",
                metric_sum(metrics, "spillway_bridge_gateway_next_offset"),
                metric_sum(metrics, "spillway_bridge_lag_offsets")
            )
        },
    );
    let n = n + more;
    mock.broker_up(1).unwrap();
    let t = Instant::now();
    while gateway_committed(&gw) < n as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "backlog did not drain"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "backlog of {n} drained {:?} after the sink came back",
        t.elapsed()
    );
    assert_eq!(sigterm_and_wait(child), 0);
    let msgs = consume_all(&broker.bootstrap(), "spillway", 1);
    let mut offs: Vec<u64> = msgs.iter().map(KMsg::spillway_offset).collect();
    offs.sort_unstable();
    offs.dedup();
    assert_eq!(offs, (0..n as u64).collect::<Vec<_>>());
}

/// A Kafka broker that goes down leaves batches in flight with no delivery report while
/// librdkafka retries on its own (silently, until its delivery timeout): after 15 s the
/// drain says so, naming the sink, the first offset waiting and how much waits; when the
/// broker is back, it logs that reports came again, and every record lands once.
#[test]
fn a_stalled_kafka_sink_is_warned_about_and_its_end_logged() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    let n = 200;
    publish(&gw, "t", &write_input(dir.path(), n, "s"));
    let broker = Broker::mock();
    let Broker::Mock(mock) = &broker else {
        unreachable!()
    };
    mock.create_topic("spillway", 1, 1).unwrap();
    let sink = format!("kafka://{}/spillway", mock.bootstrap_servers());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args: Vec<String> = drain_args(&gw, &sink, &state)
        .into_iter()
        .map(String::from)
        .collect();
    // No partition-tail scan at the start (it would wait out its timeout against the down
    // broker); the default delivery timeout (5 min) outlasts the test: no failure, only
    // silence.
    args.extend(["--kafka-resume-window".into(), "0".into()]);
    mock.broker_down(1).unwrap();
    let t = Instant::now();
    let (child, rx) = spillway_tests::bridge::spawn_bridge_lines(&args, &[]);
    let mut seen = Vec::new();
    // 15 s after the first batch was handed over, which follows the producer's warm-up
    // (up to 2 s against a down broker): 40 s leaves room for a slow machine.
    spillway_tests::bridge::wait_for_line_within(
        &rx,
        "no delivery report for offsets from 0",
        &mut seen,
        Duration::from_secs(40),
    );
    let warned = t.elapsed();
    let line = seen.last().cloned().unwrap_or_default();
    assert!(
        line.contains(&sink) && line.contains("records in") && line.contains("WARN"),
        "{line}"
    );
    assert!(warned >= Duration::from_secs(15), "warned after {warned:?}");
    mock.broker_up(1).unwrap();
    spillway_tests::bridge::wait_for_line(&rx, "delivery reports came again after", &mut seen);
    wait_until(
        Duration::from_secs(30),
        || (gateway_committed(&gw) >= n as u64).then_some(()),
        || {
            format!(
                "not drained after the broker came back:\n{}",
                seen.join("\n")
            )
        },
    );
    assert_eq!(sigterm_and_wait(child), 0);
    let msgs = consume_all(&broker.bootstrap(), "spillway", 1);
    let offs: Vec<u64> = msgs.iter().map(KMsg::spillway_offset).collect();
    assert_eq!(
        offs,
        (0..n as u64).collect::<Vec<_>>(),
        "each record once, in order"
    );
}

/// `publish --ack durable` rides out a gateway crash: it reconnects and resends what was not
/// acknowledged with the same producer id and sequences. Resends older than the gateway's
/// per-producer window come back as "already stored", so the publish completes, and the log
/// holds every input line exactly once, in order.
#[test]
fn publish_survives_a_gateway_kill_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let port = spillway_tests::gateway::free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let n = 60_000;
    let input = write_input(dir.path(), n, "k");
    let mut gateway = start_gateway(dir.path(), port);
    let mut publisher = spawn_bridge_piped(
        &[
            &publish_args(&gw, "k")[..],
            &[
                "--ack",
                "durable",
                "--producer-id",
                "77",
                "--retry-for",
                "30s",
                &input,
            ],
        ]
        .concat(),
    );
    // Kill the gateway three times while the publisher is under way, restarting it each time.
    let deadline = Instant::now() + Duration::from_secs(60);
    for mark in [5_000, 25_000, 45_000] {
        wait_until(
            deadline.saturating_duration_since(Instant::now()),
            || {
                if let Some(status) = publisher.try_wait().unwrap() {
                    let mut err = String::new();
                    let _ = std::io::Read::read_to_string(
                        &mut publisher.stderr.take().unwrap(),
                        &mut err,
                    );
                    panic!("publish exited with {status} before the last restart: {err}");
                }
                (gateway_next_offset(&gw) >= mark).then_some(())
            },
            || "publisher made no progress".into(),
        );
        gateway.kill();
        // Deliberate: the gateway stays down a moment, so the publisher meets a refused
        // connection before it reconnects.
        std::thread::sleep(Duration::from_millis(100));
        gateway = start_gateway(dir.path(), port);
        // The restart mounted through the crash recovery.
        assert!(
            gateway.log_text().contains("not clean"),
            "{}",
            gateway.log_text()
        );
    }
    let out = publisher.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "publish failed after the restart: {stderr}"
    );
    // Every line once, in input order (offsets may skip the crashed run's lease).
    assert_log_holds_lines_once_in_order(&gw, "k", n);
}

/// The bridge turns transparent huge pages off for itself (`THP_enabled: 0` in its
/// `/proc/PID/status`) before it does anything else: with them, each of its threads'
/// first allocation faulted in a zeroed 2 MiB page (see `no_transparent_huge_pages` in
/// the bridge's `main.rs`). Skipped where the kernel does not report the flag.
#[test]
fn the_bridge_runs_without_transparent_huge_pages() {
    if !std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.contains("THP_enabled:")) {
        eprintln!("this kernel does not report THP_enabled: skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("s.redb");
    let sink = format!("file:{}", dir.path().join("out").display());
    // No gateway listens there: the drain waits and retries until stopped.
    let gw = format!("tcp://127.0.0.1:{}", free_port());
    let child = spawn_bridge(&drain_args(&gw, &sink, state.to_str().unwrap()));
    let status = format!("/proc/{}/status", child.id());
    let flag = || {
        std::fs::read_to_string(&status)
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:").map(|v| v.trim().to_string()))
    };
    wait_until(
        Duration::from_secs(10),
        || flag().filter(|v| v == "0"),
        || format!("THP_enabled of the bridge: {:?}", flag()),
    );
    sigterm_and_wait(child);
}

/// `consumers` lists the real gateway's consumers with committed offset and lag, and
/// `--delete` removes one (saying whether it existed), so a consumer that stopped draining
/// no longer holds back retention.
#[test]
fn consumers_lists_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    publish(&gw, "t", &write_input(dir.path(), 10, "c"));
    let sink = format!("file:{}", dir.path().join("out").display());
    for (consumer, state) in [("bridge", "a.redb"), ("old-bridge", "b.redb")] {
        let state = dir.path().join(state).display().to_string();
        let mut args = drain_args(&gw, &sink, &state);
        args.extend(["--once", "--consumer", consumer]);
        run_bridge_ok(&args);
    }
    publish(&gw, "t", &write_input(dir.path(), 5, "d"));

    let out = run_bridge(&["consumers", "--gateway", &gw]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.contains(&vec!["bridge", "10", "5"]), "{text}");
    assert!(rows.contains(&vec!["old-bridge", "10", "5"]), "{text}");

    let out = run_bridge(&["consumers", "--gateway", &gw, "--delete", "old-bridge"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "deleted consumer \"old-bridge\"\n"
    );
    let out = run_bridge(&["consumers", "--gateway", &gw, "--delete", "old-bridge"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "consumer \"old-bridge\" did not exist\n"
    );

    let out = run_bridge(&["consumers", "--gateway", &gw, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bridge"]);
    assert_eq!(v["consumers"][0]["lag_offsets"], 5);

    let help = run_bridge(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("consumers"));
}

/// A `drain --once` with nothing new to forward reports the checkpoint it holds (not
/// "offset 0") and commits it again on the gateway, so a gateway that lost the commit (a
/// crash or a failed journal write before persisting it; here: the consumer deleted) does
/// not hold retention back until new records arrive.
#[test]
fn an_idle_drain_once_reports_its_checkpoint_and_repairs_the_gateway_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    publish(&gw, "t", &write_input(dir.path(), 10, "i"));
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("a.redb").display().to_string();
    let mut args = drain_args(&gw, &sink, &state);
    args.extend(["--once", "--consumer", "audit"]);
    run_bridge_ok(&args);

    let out = run_bridge(&["consumers", "--gateway", &gw, "--delete", "audit"]);
    assert!(out.status.success());
    let out = run_bridge(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("checkpoint at offset 10"), "{err}");
    let out = run_bridge(&["consumers", "--gateway", &gw]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().take(2).eq(["audit", "10"])),
        "{text}"
    );
}

/// A bad `--rotate-interval` (flag or key) is a usage error naming the flag or key, before
/// anything is created on disk.
#[test]
fn a_bad_rotate_interval_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let sink = format!("file:{}", out_dir.display());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args("tcp://127.0.0.1:1", &sink, &state);
    args.extend(["--once", "--rotate-interval", "soon"]);
    let err = run_bridge_usage_error(&args);
    assert!(
        err.contains("--rotate-interval") && err.contains("soon"),
        "{err}"
    );
    let config = dir.path().join("b.toml");
    std::fs::write(&config, "rotate-interval = \"0s\"\n").unwrap();
    let config = config.display().to_string();
    let mut args = drain_args("tcp://127.0.0.1:1", &sink, &state);
    args.extend(["--once", "--config", &config]);
    let err = run_bridge_usage_error(&args);
    assert!(err.contains("rotate-interval"), "{err}");
    std::fs::write(dir.path().join("b.toml"), "rotate-interval = []\n").unwrap();
    let err = run_bridge_usage_error(&args);
    assert!(err.contains("rotate-interval"), "{err}");
    assert!(!out_dir.exists(), "nothing created");
}

/// `status --state` on a state file a running drain holds: exit 4, and the checkpoints
/// section says on stdout why it is empty (it was blank, the reason only on stderr).
#[test]
fn status_says_why_a_held_state_file_was_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway(dir.path());
    publish(&gw, "t", &write_input(dir.path(), 10, "s"));
    let (_, sink, state) = file_sink_in(dir.path());
    let drain = spawn_bridge(&drain_args(&gw, &sink, &state));
    let t = Instant::now();
    let out = wait_until(
        Duration::from_secs(20),
        || {
            let out = run_bridge(&["status", "--gateway", &gw, "--state", &state]);
            (out.status.code() == Some(4)).then_some(out)
        },
        || "status never found the state file held by the drain".to_string(),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("checkpoints (state file)\n  not read: ") && text.contains("running drain"),
        "{text}"
    );
    eprintln!(
        "status saw the held state file {:?} after the drain's start",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(sigterm_and_wait(drain), 0);
    eprintln!("the drain stopped {:?} after SIGTERM", t.elapsed());
}

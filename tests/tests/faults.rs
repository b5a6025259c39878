//! Storage faults on the real binaries, injected with the `LD_PRELOAD` shim
//! (`tests/faultfs`): a failed `fdatasync` of the image in the middle of a durable
//! `spillway-bridge publish`, with the kernel dropping or keeping the failed pages, and a
//! failed write of the image, under a
//! supervisor loop that restarts the gateway when it exits 1; and the systemd notifications
//! (`READY=1`, `WATCHDOG=1` from the log thread, which a hung sync stops).
//!
//! `SPILLWAY_FAULT_LINES=N` sets the lines published by the failed-sync tests (default
//! 20,000).

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spillway_core::wire::AckLevel;
use spillway_tests::bridge_bin;
use spillway_tests::client::{connect, read_log, send_publish};
use spillway_tests::faultfs::{Kept, faultfs_env, faultfs_hang_env, faultfs_write_env, reboot};
use spillway_tests::gateway::{GatewayProcess, free_port};

/// Flags of a gateway on `dir/gw.img` (8 MiB, 4 KiB erase blocks) listening on `addr`.
fn gateway_args(dir: &Path, addr: &str) -> Vec<String> {
    [
        "--image",
        &dir.join("gw.img").display().to_string(),
        "--size",
        "8M",
        "--erase-size",
        "4K",
        "--gateway-id",
        "faults",
        "--listen",
        &format!("tcp://{addr}"),
    ]
    .map(String::from)
    .to_vec()
}

/// The number in `text` right after `label ` (e.g. `acknowledged 20000`).
fn count_after(text: &str, label: &str) -> Option<u64> {
    let at = text.rfind(&format!("{label} "))? + label.len() + 1;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A gateway's image in `dir`, created and formatted without faults by a run that stopped
/// cleanly: the gateway's arguments (listening on a free port) and its address.
fn image_created_cleanly(dir: &Path) -> (Vec<String>, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let args = gateway_args(dir, &addr);
    let mut g = GatewayProcess::start(&args, 1);
    assert!(g.terminate().success(), "{}", g.log_text());
    (args, addr)
}

/// The storage fault of a run.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The image's 5th `fdatasync` fails with EIO; the kernel drops or keeps the pages.
    Sync(Kept),
    /// The image's 20th write fails with EIO and writes nothing.
    Write,
}

/// Publishes `lines` lines durably with producer id 77 while the image suffers `fault`,
/// restarting the gateway each time it exits 1; then reboots (the image holds only what
/// reached the disk) and checks that every line publish counted as acknowledged is stored
/// exactly once, in order.
fn fault_loses_nothing_acknowledged(fault: Fault) {
    let lines: usize = spillway_tests::env_number("SPILLWAY_FAULT_LINES").unwrap_or(20_000);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("faultfs.state");
    // Without faults, so the failing sync is one of the publish's group commits.
    let (args, addr) = image_created_cleanly(dir.path());
    let (env, fired) = match fault {
        Fault::Sync(kept) => (
            faultfs_env("gw.img", &state, kept, Some(5)),
            "faultfs: sync #5 of",
        ),
        Fault::Write => (
            faultfs_write_env("gw.img", &state, 20),
            "faultfs: write #20 of",
        ),
    };

    let input = dir.path().join("lines.txt");
    let text: String = (1..=lines).map(|i| format!("line-{i:06}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let publish_log = dir.path().join("publish.log");
    let mut g = GatewayProcess::start_with_env(&args, 1, &env);
    let mut publish = Command::new(bridge_bin())
        .args(["publish", "--gateway", &format!("tcp://{addr}")])
        .args(["--topic", "e", "--producer-id", "77", "--retry-for", "30s"])
        .arg(&input)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&publish_log).unwrap())
        .spawn()
        .unwrap();

    // The supervisor: a gateway that exits 1 (a storage failure) is started again.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut logs = String::new();
    let mut restarts = 0;
    let published = loop {
        if let Some(status) = publish.try_wait().unwrap() {
            break status;
        }
        if let Some(status) = g.try_wait() {
            logs.push_str(&g.log_text());
            assert_eq!(
                status.code(),
                Some(1),
                "gateway exited with {status}:\n{logs}"
            );
            restarts += 1;
            g = GatewayProcess::start_with_env(&args, 1, &env);
        }
        assert!(Instant::now() < deadline, "publish did not finish:\n{logs}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let publish_text = std::fs::read_to_string(&publish_log).unwrap();
    // The last line is the summary ("records read …, acknowledged N …").
    let summary = publish_text.lines().last().unwrap_or_default().to_string();
    assert!(
        published.success(),
        "publish failed:\n{summary}\ngateway:\n{logs}"
    );
    assert!(g.terminate().success(), "{}", g.log_text());
    logs.push_str(&g.log_text());
    assert!(
        logs.contains(fired) && logs.contains("fails with EIO"),
        "the fault never fired:\n{logs}"
    );
    assert!(
        restarts >= 1,
        "the gateway never exited after the failed sync:\n{logs}"
    );
    assert!(
        publish_text.contains("gateway storage failed, resending"),
        "publish was never answered StorageFailed:\n{summary}"
    );
    let acknowledged = count_after(&summary, "acknowledged").expect("publish summary");
    assert_eq!(acknowledged, lines as u64, "{summary}");

    // Reboot: the image now holds what the disk holds.
    let rebooted = reboot(&state);
    let g = GatewayProcess::start(&args, 1);
    let mut c = connect(&addr).unwrap();
    let stored: Vec<String> = read_log(&mut c, 0)
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect();
    drop(g);
    let expected: Vec<String> = (1..=lines).map(|i| format!("line-{i:06}")).collect();
    if stored != expected {
        let set: std::collections::BTreeSet<&String> = stored.iter().collect();
        let missing = expected.iter().filter(|l| !set.contains(l)).count();
        let first_missing = expected.iter().find(|l| !set.contains(l));
        panic!(
            "{} of {lines} acknowledged lines stored ({} distinct): {missing} missing (first {first_missing:?}), {} duplicates; in order: {}\n{rebooted}\npublish: {summary}\n{} restarts",
            stored.len(),
            set.len(),
            stored.len() - set.len(),
            stored.windows(2).all(|w| w[0] < w[1]),
            restarts,
        );
    }
    println!(
        "{fault:?}: {lines} lines acknowledged and stored once, in order, after {restarts} restart(s); {}",
        rebooted.trim()
    );
}

#[test]
fn failed_sync_with_dropped_pages_loses_no_acknowledged_record() {
    fault_loses_nothing_acknowledged(Fault::Sync(Kept::Dropped));
}

#[test]
fn failed_sync_with_kept_pages_loses_no_acknowledged_record() {
    fault_loses_nothing_acknowledged(Fault::Sync(Kept::Kept));
}

#[test]
fn failed_image_write_loses_no_acknowledged_record() {
    fault_loses_nothing_acknowledged(Fault::Write);
}

/// Collects the datagrams sent to `sock` until `done` says enough or `within` passes.
fn notifications(
    sock: &UnixDatagram,
    within: Duration,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) && Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            got.extend(
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .map(str::to_string),
            );
        }
    }
    got
}

/// `READY=1` once listening, `WATCHDOG=1` pings from the log thread's loop while it is idle
/// (watchdog 200 ms: a ping at least every 100 ms), and none once a sync hangs.
#[test]
fn systemd_hears_ready_and_watchdog_pings_that_a_hung_sync_stops() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let args = gateway_args(dir.path(), &addr);
    // Every sync of the image hangs once `hang` exists (created after READY).
    let hang = dir.path().join("hang");
    let mut env = faultfs_hang_env("gw.img", &hang);
    env.push(("NOTIFY_SOCKET".into(), sock_path.display().to_string()));
    env.push(("WATCHDOG_USEC".into(), "200000".into()));
    let mut g = GatewayProcess::start_with_env(&args, 1, &env);
    let pings = |m: &[String]| m.iter().filter(|l| *l == "WATCHDOG=1").count();
    let got = notifications(&sock, Duration::from_secs(10), |m| {
        m.iter().any(|l| l == "READY=1") && pings(m) >= 5
    });
    assert!(got.iter().any(|l| l == "READY=1"), "{got:?}");
    assert!(pings(&got) >= 5, "{got:?}");

    // A durable publish: its group commit's sync hangs in the log thread; the pings stop.
    std::fs::write(&hang, b"").unwrap();
    let mut c = connect(&addr).unwrap();
    for i in 0..2u32 {
        let _ = send_publish(&mut c, "w", format!("r{i}").as_bytes(), AckLevel::Durable);
    }
    let hung = Instant::now() + Duration::from_secs(10);
    while !g.log_text().contains("hangs") {
        assert!(Instant::now() < hung, "no sync hung:\n{}", g.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Drain what was sent before the hang, then listen for a second.
    let _ = notifications(&sock, Duration::from_millis(150), |_| false);
    let after = notifications(&sock, Duration::from_secs(1), |_| false);
    assert_eq!(pings(&after), 0, "pings while a sync hangs: {after:?}");
    assert!(
        g.try_wait().is_none(),
        "the gateway exited:\n{}",
        g.log_text()
    );
    g.kill();
}

/// The shipped systemd unit restarts on failure (not on a usage error) and is watched.
#[test]
fn systemd_unit_restarts_on_failure_and_has_a_watchdog() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/spillway.service"),
    )
    .unwrap();
    for line in [
        "Type=notify",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "WatchdogSec=30s",
    ] {
        assert!(unit.lines().any(|l| l.trim() == line), "missing {line}");
    }
}

/// A storage failure while the gateway opens its image (the 1st `fdatasync`, which opening
/// does before it drops the cached pages) is a run-time failure: exit 1, so a supervisor
/// restarts it, with the OS reason in the message; not exit 3 ("image unusable"), which
/// would tell an operator the image is bad. Guards against every open error being exit 3.
#[test]
fn a_failed_sync_while_opening_the_image_exits_1_with_the_os_reason() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("faultfs.state");
    let (args, _) = image_created_cleanly(dir.path());

    let out = Command::new(spillway_tests::gateway::spillway_bin())
        .arg("run")
        .args(&args)
        .envs(faultfs_env("gw.img", &state, Kept::Dropped, Some(1)))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("faultfs: sync #1 of"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Input/output error"), "{stderr}");

    // The fault fired once: the next start opens the image and serves.
    let mut g = GatewayProcess::start_with_env(
        &args,
        1,
        &faultfs_env("gw.img", &state, Kept::Dropped, Some(1)),
    );
    assert!(g.terminate().success(), "{}", g.log_text());
}

//! The uplink cap, `drain --max-bytes-per-sec`, through the real binaries: a drain of 600 KB
//! of payloads under a 200 KiB/s cap takes at least the time the cap allows after its
//! one-second burst, and forwards every record once; the cap is shared by the gateways of
//! one drain, records the file sink holds already do not count against it, and a bad cap
//! is a usage error.

use std::path::Path;
use std::time::{Duration, Instant};

use spillway_tests::bridge::{
    drain_args, gateway_next_offset, publish_args, run_bridge_ok, run_bridge_usage_error,
    sink_files,
};
use spillway_tests::gateway::free_port;
use spillway_tests::{GatewayProcess, run_bridge};

/// Records of 200 payload bytes published to each gateway.
const RECORDS: usize = 3000;

/// A gateway with `RECORDS` records of 200 bytes on topic `t`; its URI.
fn gateway_with_records(dir: &Path, id: &str) -> (GatewayProcess, String) {
    let port = free_port();
    let gw = format!("tcp://127.0.0.1:{port}");
    let args: Vec<String> = [
        "--image",
        &dir.join(format!("{id}.img")).display().to_string(),
        "--size",
        "4M",
        "--listen",
        &gw,
        "--gateway-id",
        id,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let g = GatewayProcess::start(&args, 1);
    let input = dir.join(format!("{id}.txt"));
    let text: String = (0..RECORDS).map(|i| format!("{i:0200}\n")).collect();
    std::fs::write(&input, text).unwrap();
    run_bridge_ok(&[publish_args(&gw, "t"), vec![input.to_str().unwrap()]].concat());
    assert!(gateway_next_offset(&gw) >= RECORDS as u64);
    (g, gw)
}

/// Every payload line in the sink directory, sorted.
fn sink_lines(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = sink_files(dir)
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    lines.sort();
    lines
}

/// Runs `drain --once --max-bytes-per-sec 200K` of `gateways` into `dir/out`, which must
/// succeed; how long it took and the payload lines in the sink, sorted.
fn capped_drain(dir: &Path, gateways: &[&str]) -> (Duration, Vec<String>) {
    let sink = format!("file:{}", dir.join("out").display());
    let state = dir.join("s.redb").display().to_string();
    let mut args = drain_args(gateways[0], &sink, &state);
    for g in &gateways[1..] {
        args.extend(["--gateway", g]);
    }
    args.extend(["--once", "--max-bytes-per-sec", "200K"]);
    let start = Instant::now();
    let out = run_bridge(&args);
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (took, sink_lines(&dir.join("out")))
}

/// Seconds the cap needs for `bytes` after its burst of one second's worth.
fn capped_secs(bytes: u64, per_sec: u64) -> f64 {
    bytes.saturating_sub(per_sec) as f64 / per_sec as f64
}

#[test]
fn a_capped_drain_takes_the_time_the_cap_allows_and_forwards_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path(), "cap-gw");
    let (took, lines) = capped_drain(dir.path(), &[&gw]);
    assert_eq!(lines.len(), RECORDS, "every record once");
    let want = capped_secs(RECORDS as u64 * 200, 200 * 1024);
    eprintln!(
        "capped drain of {RECORDS} x 200 B at 200 KiB/s: {took:?} (the cap allows no less than {want:.2} s)"
    );
    assert!(took.as_secs_f64() >= want * 0.95, "{took:?} < {want:.2} s");
    assert!(took < Duration::from_secs(60));
}

#[test]
fn one_cap_is_shared_by_every_gateway_of_a_drain() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a) = gateway_with_records(dir.path(), "cap-a");
    let (_b, b) = gateway_with_records(dir.path(), "cap-b");
    let (took, lines) = capped_drain(dir.path(), &[&a, &b]);
    assert_eq!(
        lines.len(),
        2 * RECORDS,
        "every record of both gateways once"
    );
    // Both gateways' bytes count against one cap: twice the time one gateway would need.
    let want = capped_secs(2 * RECORDS as u64 * 200, 200 * 1024);
    eprintln!("two gateways under one 200 KiB/s cap: {took:?} (no less than {want:.2} s)");
    assert!(took.as_secs_f64() >= want * 0.95, "{took:?} < {want:.2} s");
    assert!(took < Duration::from_secs(60));
}

/// Records the file sink holds already (a drain from a fresh state file and another
/// consumer into the same directory resends them all) are acknowledged without being
/// written and do not go out: the cap does not count them. Counted, the 600 KB would take
/// 35 s at 16 KiB/s after its burst.
#[test]
fn records_the_files_hold_already_do_not_count_against_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let (_g, gw) = gateway_with_records(dir.path(), "cap-dup");
    let sink = format!("file:{}", dir.path().join("out").display());
    let first = dir.path().join("first.redb").display().to_string();
    run_bridge_ok(&[drain_args(&gw, &sink, &first), vec!["--once"]].concat());
    assert_eq!(sink_lines(&dir.path().join("out")).len(), RECORDS);

    let again = dir.path().join("again.redb").display().to_string();
    let args = [
        drain_args(&gw, &sink, &again),
        vec![
            "--once",
            "--consumer",
            "again",
            "--max-bytes-per-sec",
            "16K",
        ],
    ]
    .concat();
    let start = Instant::now();
    let out = run_bridge(&args);
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("forwarded 0 records"), "{err}");
    assert_eq!(
        sink_lines(&dir.path().join("out")).len(),
        RECORDS,
        "no record twice"
    );
    let counted = capped_secs(RECORDS as u64 * 200, 16 * 1024);
    assert!(
        took.as_secs_f64() < counted / 2.0,
        "{took:?}: the cap held back records the files hold (counted, they take {counted:.1} s)"
    );
}

#[test]
fn a_cap_of_zero_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let sink = format!("file:{}", dir.path().join("out").display());
    let state = dir.path().join("s.redb").display().to_string();
    let mut args = drain_args("tcp://127.0.0.1:1", &sink, &state);
    args.extend(["--once", "--max-bytes-per-sec", "0"]);
    let err = run_bridge_usage_error(&args);
    assert!(err.contains("--max-bytes-per-sec"), "{err}");
}

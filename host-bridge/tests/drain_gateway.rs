//! Drain tests against the real gateway in process (`common::SimGateway`: the gateway
//! logic and the log on a simulated flash, the wire protocol over TCP): file sink output,
//! exact resume, the resume check, gaps from real drops, damage and power cuts, outages and
//! shutdown.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Background, Options, SimGateway, drain_config, run_drain, spawn_drain};
use spillway_bridge::checkpoint::{Checkpoint, ResumeMismatch, Store};
use spillway_bridge::drain::{DrainConfig, DrainError, DrainSummary};
use spillway_bridge::metrics::Metrics;

fn cfg(gw: &SimGateway, dir: &Path) -> DrainConfig {
    let sink = format!("file:{}", dir.join("out").display());
    let mut c = drain_config(gw, &sink, dir);
    c.reply_timeout = Duration::from_secs(2);
    c
}

fn run(c: DrainConfig) -> Result<DrainSummary, DrainError> {
    run_drain(c, &Metrics::default())
}

/// (topic, offset, payload) of every line in the output directory, sorted by offset.
fn read_out(dir: &Path) -> Vec<(String, u64, String)> {
    let mut v = Vec::new();
    for path in common::sink_files::sink_files(&dir.join("out")) {
        let text = std::fs::read_to_string(path).unwrap();
        for line in text.lines() {
            let j: serde_json::Value = serde_json::from_str(line).unwrap();
            if j.get("gap").is_some() {
                // A gap line: no offset, no payload (records readers skip it).
                continue;
            }
            v.push((
                j["topic"].as_str().unwrap().to_string(),
                j["offset"].as_u64().unwrap(),
                j["payload"].as_str().unwrap().to_string(),
            ));
        }
    }
    v.sort_by_key(|x| x.1);
    v
}

/// Complete lines (newline included) in the output directory, for waiting on a drain
/// that is still writing: a line being appended may be read half written.
fn complete_lines(dir: &Path) -> usize {
    common::sink_files::sink_files(&dir.join("out"))
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).unwrap_or_default();
            bytes.iter().filter(|&&b| b == b'\n').count()
        })
        .sum()
}

fn payloads(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .collect()
}

fn publish(gw: &SimGateway, topic: &str, p: &[Vec<u8>]) -> Vec<u64> {
    let refs: Vec<&[u8]> = p.iter().map(|x| x.as_slice()).collect();
    gw.publish(topic, &refs)
}

#[test]
fn once_drains_everything_in_order_and_commits() {
    let gw = SimGateway::start("gw-1", 0x1111);
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "buoy/sst", &payloads("a", 300));
    publish(&gw, "cgm", &payloads("b", 200));
    let s = run(cfg(&gw, dir.path())).unwrap();
    assert_eq!(s.records, 500);
    assert_eq!(s.offset, 500);
    let out = read_out(dir.path());
    assert_eq!(out.len(), 500);
    for (i, (topic, off, payload)) in out.iter().enumerate() {
        assert_eq!(*off, i as u64);
        if i < 300 {
            assert_eq!(topic, "buoy/sst");
            assert_eq!(payload, &format!("a-{i}"));
        } else {
            assert_eq!(topic, "cgm");
            assert_eq!(payload, &format!("b-{}", i - 300));
        }
    }
    assert!(
        dir.path()
            .join("out/gw-1/buoy%2Fsst/00000000000000000000.jsonl.open")
            .exists()
    );
    assert_eq!(gw.committed("bridge"), Some(500));
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!(cp.offset, 500);
    assert_eq!(cp.records, 500);
    assert!(cp.last_crc.is_some());
}

#[test]
fn resume_continues_exactly_where_it_stopped() {
    let gw = SimGateway::start("gw-1", 0x2222);
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads("x", 100));
    assert_eq!(run(cfg(&gw, dir.path())).unwrap().records, 100);
    publish(&gw, "t", &payloads("y", 50));
    let s = run(cfg(&gw, dir.path())).unwrap();
    assert_eq!(s.records, 50);
    let out = read_out(dir.path());
    assert_eq!(out.len(), 150);
    assert!(out.iter().enumerate().all(|(i, r)| r.1 == i as u64));
    // Nothing new: nothing forwarded.
    assert_eq!(run(cfg(&gw, dir.path())).unwrap().records, 0);
}

#[test]
fn a_replaced_gateway_is_refused_unless_accepted() {
    let gw = SimGateway::start("gw-1", 0xAAAA);
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads("old", 20));
    run(cfg(&gw, dir.path())).unwrap();
    gw.replace_log(0xBBBB);
    publish(&gw, "t", &payloads("new", 5));
    let e = run(cfg(&gw, dir.path())).unwrap_err();
    let msg = e.to_string();
    match e {
        DrainError::Resume(ResumeMismatch::LogId {
            stored, gateway, ..
        }) => {
            assert_eq!(stored, "0000000000000000000000000000aaaa");
            assert_eq!(gateway, "0000000000000000000000000000bbbb");
        }
        other => panic!("{other:?}"),
    }
    assert!(msg.contains("aaaa") && msg.contains("bbbb"), "{msg}");
    assert_eq!(read_out(dir.path()).len(), 20);

    let mut c = cfg(&gw, dir.path());
    c.accept_new_log = true;
    let s = run(c).unwrap();
    assert_eq!(s.records, 5);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let resets = store.resets("gw-1", "bridge").unwrap();
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].old_offset, 20);
    assert_eq!(resets[0].new_log_id, "0000000000000000000000000000bbbb");
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!((cp.offset, cp.resets), (5, 1));
}

/// Publishes `a 0` to `a 9` on `gw` (whose id is `gw-1`), drains them, then changes the
/// saved checkpoint of consumer `bridge` with `edit`.
fn drained_then_edited(gw: &SimGateway, dir: &Path, edit: impl FnOnce(&mut Checkpoint)) {
    publish(gw, "t", &payloads("a", 10));
    run(cfg(gw, dir)).unwrap();
    let store = Store::open(&dir.join("state.redb")).unwrap();
    let mut cp = store.load("gw-1", "bridge").unwrap().unwrap();
    edit(&mut cp);
    store.save("gw-1", "bridge", &cp).unwrap();
}

#[test]
fn a_crc_mismatch_is_refused() {
    let gw = SimGateway::start("gw-1", 0xC0C0);
    let dir = tempfile::tempdir().unwrap();
    drained_then_edited(&gw, dir.path(), |cp| {
        cp.last_crc = Some(cp.last_crc.unwrap() ^ 1)
    });
    publish(&gw, "t", &payloads("b", 10));
    match run(cfg(&gw, dir.path())).unwrap_err() {
        DrainError::Resume(ResumeMismatch::Crc { offset, .. }) => assert_eq!(offset, 10),
        other => panic!("{other:?}"),
    }
    assert_eq!(read_out(dir.path()).len(), 10);
}

#[test]
fn a_checkpoint_beyond_the_log_is_refused() {
    let gw = SimGateway::start("gw-1", 0xD0D0);
    let dir = tempfile::tempdir().unwrap();
    drained_then_edited(&gw, dir.path(), |cp| cp.offset = 1000);
    match run(cfg(&gw, dir.path())).unwrap_err() {
        DrainError::Resume(ResumeMismatch::BeyondEnd {
            offset,
            next_offset,
            ..
        }) => assert_eq!((offset, next_offset), (1000, 10)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn gaps_are_recorded_and_skipped() {
    let gw = SimGateway::start_with("gw-1", 0xE0E0, Options::small_ring_dropping_oldest());
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads(FILLER, 100));
    let first = dropped_oldest(&gw, 100);
    let mut c = cfg(&gw, dir.path());
    // Start at 0 even though the gateway's first offset is past it: the gap is met by a
    // fetch.
    c.from = Some(spillway_bridge::drain::StartFrom::Offset(0));
    let s = run(c).unwrap();
    assert_eq!(s.records, 100 - first);
    assert_eq!(s.gaps, 1);
    let out = read_out(dir.path());
    assert_eq!(out.first().unwrap().1, first);
    assert_eq!(out.len() as u64, 100 - first);
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let gaps = store.gaps(0xE0E0, "bridge").unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!((gaps[0].from, gaps[0].to), (0, first));
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!((cp.gaps, cp.lost, cp.offset), (1, first, 100));
}

/// A payload prefix long enough that 100 records overflow the small ring whatever the
/// batch layout saves per record (the compact layout of format version 4 stores short
/// records in a few bytes each).
const FILLER: &str = "reading-with-enough-bytes-to-fill-a-1-KiB-segment";

/// On a small ring under drop-oldest that took `published` records, the oldest segment was
/// dropped unread: returns the log's first offset, now past 0.
fn dropped_oldest(gw: &SimGateway, published: u64) -> u64 {
    let first = gw.first_offset();
    assert!(first > 0 && first < published, "first offset {first}");
    assert_eq!(gw.records_dropped(), first, "the log counted the drop");
    first
}

#[test]
fn from_latest_skips_the_backlog() {
    let gw = SimGateway::start("gw-1", 0xF0F0);
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads("a", 30));
    let mut c = cfg(&gw, dir.path());
    c.from = Some(spillway_bridge::drain::StartFrom::Latest);
    assert_eq!(run(c).unwrap().records, 0);
    publish(&gw, "t", &payloads("b", 5));
    // The checkpoint now wins over --from.
    let mut c = cfg(&gw, dir.path());
    c.from = Some(spillway_bridge::drain::StartFrom::Earliest);
    assert_eq!(run(c).unwrap().records, 5);
    assert_eq!(read_out(dir.path()).first().unwrap().1, 30);
}

#[test]
fn survives_a_gateway_outage_and_stops_cleanly_on_shutdown() {
    let gw = SimGateway::start("gw-1", 0x0707);
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(&gw, dir.path());
    c.once = false;
    let Background {
        handle,
        metrics,
        trigger,
    } = spawn_drain(c);
    publish(&gw, "t", &payloads("a", 200));
    let wait_for = |n: usize| {
        let t = Instant::now();
        while complete_lines(dir.path()) < n {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(200);
    gw.outage(Duration::from_millis(700));
    publish(&gw, "t", &payloads("b", 200));
    wait_for(400);
    trigger.trigger();
    let s = handle.join().unwrap().unwrap();
    assert_eq!(s.records, 400);
    let out = read_out(dir.path());
    assert_eq!(out.len(), 400);
    assert!(out.iter().enumerate().all(|(i, r)| r.1 == i as u64));
    assert!(metrics.retries.get() >= 1, "an outage means retries");
    // The final checkpoint reached the gateway.
    assert_eq!(gw.committed("bridge"), Some(400));
}

/// Offsets the gateway skipped after a crash (`NotPersisted`: the rest of its offset
/// lease) never held a durable record: the drain moves past them without calling them a
/// gap. Before, every power cut counted the skipped lease as lost records in the metrics
/// and in redb, which fired data-loss alerts.
#[test]
fn never_persisted_offsets_are_skipped_not_counted_as_lost() {
    let opts = Options {
        lease_step: 20,
        ..Options::default()
    };
    let gw = SimGateway::start_with("gw-1", 0x5EED, opts);
    let dir = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads("a", 40));
    // Offset 40 takes the lease to 60; the record is in RAM only when the power goes.
    gw.publish_unflushed("t", &[b"lost in RAM"]);
    let report = gw.power_cut();
    assert_eq!(report.not_durable, Some((40, 60)));
    assert_eq!(
        publish(&gw, "t", &payloads("b", 40)),
        (60..100).collect::<Vec<_>>()
    );
    let m = Metrics::default();
    let s = run_drain(cfg(&gw, dir.path()), &m).unwrap();
    assert_eq!((s.records, s.gaps, s.skipped_offsets), (80, 0, 20));
    let offs: Vec<u64> = read_out(dir.path()).iter().map(|r| r.1).collect();
    assert_eq!(offs, (0..40).chain(60..100).collect::<Vec<_>>());
    assert_eq!(m.skipped_offsets.get(), 20);
    assert_eq!((m.gaps.get(), m.lost.get()), (0, 0));
    let text = m.render();
    assert!(
        text.contains("spillway_bridge_skipped_offsets_total 20"),
        "{text}"
    );
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    assert!(
        store.gaps(0x5EED, "bridge").unwrap().is_empty(),
        "not a gap in redb"
    );
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!((cp.gaps, cp.lost, cp.offset), (0, 0, 100));
    assert_eq!(gw.committed("bridge"), Some(100));
}

/// A corrupt range is still a real gap: counted as lost and recorded in redb.
#[test]
fn corrupt_offsets_are_still_a_gap() {
    let gw = SimGateway::start("gw-1", 0xBAD0);
    let dir = tempfile::tempdir().unwrap();
    // Three batches: 0..40, 40..60 and 60..100; a bit of the second one flips for good.
    publish(&gw, "t", &payloads("a", 40));
    publish(&gw, "t", &payloads("b", 20));
    publish(&gw, "t", &payloads("c", 40));
    gw.flip_bit(b"b-10", 2);
    let m = Metrics::default();
    let s = run_drain(cfg(&gw, dir.path()), &m).unwrap();
    assert_eq!((s.records, s.gaps, s.skipped_offsets), (80, 1, 0));
    assert_eq!(
        (m.gaps.get(), m.lost.get(), m.skipped_offsets.get()),
        (1, 20, 0)
    );
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let gaps = store.gaps(0xBAD0, "bridge").unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!(
        (gaps[0].from, gaps[0].to, gaps[0].reason.as_str()),
        (40, 60, "corrupt")
    );
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!((cp.gaps, cp.lost, cp.offset), (1, 20, 100));
}

/// Without a checkpoint in the state file (deleted, or the gateway renamed) and without
/// `--from`, the drain starts at the gateway's committed offset for its consumer, as a
/// Kafka consumer group would; an explicit `--from` still wins. Before, it started at the
/// earliest offset and sent everything again.
#[test]
fn without_a_checkpoint_the_gateways_committed_offset_is_used() {
    let gw = SimGateway::start("gw-1", 0xC0_11);
    let first = tempfile::tempdir().unwrap();
    publish(&gw, "t", &payloads("a", 100));
    assert_eq!(run(cfg(&gw, first.path())).unwrap().records, 100);
    assert_eq!(gw.committed("bridge"), Some(100));
    publish(&gw, "t", &payloads("b", 20));

    // The state file is gone: resume at the gateway's committed offset.
    let lost_state = tempfile::tempdir().unwrap();
    let s = run(cfg(&gw, lost_state.path())).unwrap();
    assert_eq!(s.records, 20);
    let offs: Vec<u64> = read_out(lost_state.path()).iter().map(|r| r.1).collect();
    assert_eq!(offs, (100..120).collect::<Vec<_>>());
    let store = Store::open(&lost_state.path().join("state.redb")).unwrap();
    assert_eq!(store.load("gw-1", "bridge").unwrap().unwrap().offset, 120);

    // An explicit --from wins over the gateway's committed offset.
    let explicit = tempfile::tempdir().unwrap();
    let mut c = cfg(&gw, explicit.path());
    c.from = Some(spillway_bridge::drain::StartFrom::Earliest);
    assert_eq!(run(c).unwrap().records, 120);

    // Another consumer has no committed offset: it starts at the earliest.
    let other = tempfile::tempdir().unwrap();
    let mut c = cfg(&gw, other.path());
    c.consumer = "archive".into();
    assert_eq!(run(c).unwrap().records, 120);
}

/// 100 records in 4 flushes, with one byte of record 35's payload a flaky cell of the
/// simulated flash, wrong on `percent`% of reads: the real log finds the batch's CRC wrong
/// on those reads and the gateway reports the range corrupt.
fn flaky_gateway(log_id: u128, percent: u8) -> SimGateway {
    let gw = SimGateway::start("gw-1", log_id);
    for chunk in 0..4 {
        publish(&gw, "t", &payloads(&format!("c{chunk}"), 25));
    }
    gw.flaky_cell(b"c1-10", 3, percent);
    gw
}

fn fresh_drain(gw: &SimGateway, m: &Metrics) -> DrainSummary {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(gw, dir.path());
    c.from = Some(spillway_bridge::drain::StartFrom::Earliest);
    let s = run_drain(c, m).unwrap();
    let offs: Vec<u64> = read_out(dir.path()).iter().map(|r| r.1).collect();
    assert_eq!(offs.len() as u64, s.records);
    s
}

/// A flash cell that reads wrong on 70% of reads: the gateway's log reads a batch again
/// before it calls it corrupt (`READ_ATTEMPTS`), and the drain fetches a range the gateway
/// did report corrupt again until a read comes back whole. 20 fresh drains in a row lose
/// nothing (`SPILLWAY_FLAKY_DRAINS=N` runs N instead, for a longer campaign).
#[test]
fn a_cell_wrong_on_70_percent_of_reads_is_never_a_gap() {
    let gw = flaky_gateway(0xF1A4, 70);
    let drains: u32 = std::env::var("SPILLWAY_FLAKY_DRAINS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let (mut refetches, mut slowest) = (0, Duration::ZERO);
    for _ in 0..drains {
        let m = Metrics::default();
        let t = Instant::now();
        let s = fresh_drain(&gw, &m);
        slowest = slowest.max(t.elapsed());
        assert_eq!((s.records, s.gaps), (100, 0));
        refetches += m.corrupt_refetches.get();
    }
    let wrong = gw.flaky_reads();
    eprintln!(
        "{drains} fresh drains past a cell wrong on 70% of reads: 0 gaps, {wrong} wrong reads of the cell, {refetches} fetches again in all, slowest drain {slowest:?}"
    );
    assert!(wrong > 0, "the cell was met");
}

/// A cell wrong on every read: its batch becomes a gap after a bounded number of fetches
/// again, within 2 s.
#[test]
fn a_cell_wrong_on_every_read_becomes_a_gap_within_2_s() {
    let gw = flaky_gateway(0xBAD1, 100);
    let m = Metrics::default();
    let t = Instant::now();
    let s = fresh_drain(&gw, &m);
    let took = t.elapsed();
    assert_eq!(s.gaps, 1);
    assert!(s.records < 100 && s.records >= 75, "{}", s.records);
    let n = m.corrupt_refetches.get();
    eprintln!(
        "cell wrong on every read: gap of {} offsets after {n} fetches again; whole drain {took:?}",
        m.lost.get()
    );
    assert!(
        n >= 3 && n <= u64::from(spillway_bridge::drain::CORRUPT_REFETCHES),
        "{n}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Records the consumer never took, dropped before this state file's first run (drop-oldest
/// on a gateway nobody drained yet), are a gap with its reason and count, met by the first
/// run and by no later one; `--from`, or a consumer the gateway did not know, has none.
#[test]
fn records_dropped_before_the_first_drain_are_a_gap() {
    let gw = SimGateway::start_with("gw-1", 0xD0_01, Options::small_ring_dropping_oldest());
    publish(&gw, "t", &payloads(FILLER, 100));
    let first = dropped_oldest(&gw, 100);
    assert_eq!(gw.committed("bridge"), Some(0));

    let dir = tempfile::tempdir().unwrap();
    let m = Metrics::default();
    let s = run_drain(cfg(&gw, dir.path()), &m).unwrap();
    assert_eq!((s.records, s.gaps), (100 - first, 1));
    assert_eq!((m.gaps.get(), m.lost.get()), (1, first));
    let store = Store::open(&dir.path().join("state.redb")).unwrap();
    let gaps = store.gaps(0xD0_01, "bridge").unwrap();
    assert_eq!(gaps.len(), 1);
    assert_eq!(
        (gaps[0].from, gaps[0].to, gaps[0].reason.as_str()),
        (0, first, "dropped")
    );
    let cp = store.load("gw-1", "bridge").unwrap().unwrap();
    assert_eq!((cp.gaps, cp.lost, cp.offset), (1, first, 100));
    drop(store);
    // The next run has nothing more to say about it.
    let s = run(cfg(&gw, dir.path())).unwrap();
    assert_eq!((s.records, s.gaps), (0, 0));

    // An explicit --from: no gap.
    let explicit = tempfile::tempdir().unwrap();
    let mut c = cfg(&gw, explicit.path());
    c.from = Some(spillway_bridge::drain::StartFrom::Earliest);
    c.consumer = "replay".into();
    let s = run(c).unwrap();
    assert_eq!((s.records, s.gaps), (100 - first, 0));

    // A consumer the gateway did not know when the records were dropped: no gap.
    let other = tempfile::tempdir().unwrap();
    let mut c = cfg(&gw, other.path());
    c.consumer = "archive".into();
    let s = run(c).unwrap();
    assert_eq!((s.records, s.gaps), (100 - first, 0));
}

/// A state file held by another drain is refused at start with its path and what to do
/// (exit code 4).
#[test]
fn a_state_file_in_use_is_refused_with_its_path() {
    let gw = SimGateway::start("gw-1", 0x0BE1);
    let dir = tempfile::tempdir().unwrap();
    let _held = Store::open(&dir.path().join("state.redb")).unwrap();
    let e = run(cfg(&gw, dir.path())).unwrap_err();
    assert!(matches!(e, DrainError::StateOpen { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&dir.path().join("state.redb").display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("another drain"), "{msg}");
}

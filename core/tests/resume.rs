//! The first write after an unclean shutdown continues in the head segment behind a resume
//! marker: readers skip the torn bytes as never persisted, and still report damage to
//! durable data before the marker as corruption.

mod common;
use common::{Ram, Shared, nor};

use std::cell::RefCell;

use spillway_core::log::{Config, Log, LostReason, Record};
use spillway_core::storage::{Geometry, SimFlash};

const GEO: Geometry = nor(4096, 4096 * 10);

fn rec(payload: &[u8]) -> Record<'_> {
    Record {
        topic: "t",
        timestamp_us: 1,
        producer: None,
        payload,
    }
}

/// `(offset, payload)` of each record read.
type Records = Vec<(u64, Vec<u8>)>;
/// `(from, to, reason)` of each lost range met.
type Lost = Vec<(u64, u64, LostReason)>;

/// Offsets and payloads read from `0`, and the lost ranges met on the way.
fn read_all(log: &mut Log<'_, Shared<'_>>) -> (Records, Lost) {
    let (mut recs, mut lost) = (Vec::new(), Vec::new());
    let mut out = vec![0u8; 1024];
    let mut at = 0;
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        if let Some(l) = r.lost {
            lost.push((l.from, l.to, l.reason));
        }
        recs.extend(r.records(&out).map(|x| (x.offset, x.payload.to_vec())));
        at = r.next_offset;
    }
    (recs, lost)
}

#[test]
fn torn_bytes_before_a_resume_marker_are_skipped_and_damage_before_it_is_corrupt() {
    let flash = RefCell::new(SimFlash::new_vec(GEO).unwrap());
    Log::format(&mut *flash.borrow_mut(), 1, 2).unwrap();
    let cfg = Config {
        lease_step: 8,
        ..Config::default()
    };
    let mut ram = Ram::new(&GEO, 2, 1024);
    let a = {
        let mem = ram.memory();
        let (mut log, _) = Log::mount(Shared(&flash), cfg, mem, 0).unwrap();
        let a = log.append(0, &rec(b"durable a")).unwrap().offset;
        log.flush(0).unwrap();
        log.append(1, &rec(b"torn b")).unwrap();
        // Its short batch (format version 5) takes 13 bytes: cut inside it.
        flash.borrow_mut().cut_after_bytes(8);
        assert!(log.flush(1).is_err());
        a
    };
    flash.borrow_mut().power_on();
    let mem = ram.memory();
    let (mut log, report) = Log::mount(Shared(&flash), cfg, mem, 2).unwrap();
    assert!(!report.clean && report.torn_tail_bytes > 0, "{report:?}");
    let c = log.append(2, &rec(b"durable c")).unwrap().offset;
    log.flush(2).unwrap();
    assert_eq!(
        log.stats().segments_opened,
        0,
        "the head segment is continued"
    );
    let (recs, lost) = read_all(&mut log);
    assert_eq!(
        recs,
        vec![(a, b"durable a".to_vec()), (c, b"durable c".to_vec())]
    );
    assert_eq!(lost, vec![(a + 1, c, LostReason::Skipped)]);
    drop(log);

    // A clean remount finds the head ending in erased flash.
    let mem = ram.memory();
    let (log, report) = Log::mount(Shared(&flash), cfg, mem, 3).unwrap();
    assert_eq!(report.torn_tail_bytes, 0, "{report:?}");
    log.close(3).unwrap();
    let mem = ram.memory();
    let (log, report) = Log::mount(Shared(&flash), cfg, mem, 4).unwrap();
    assert!(report.clean, "{report:?}");
    drop(log);

    // A bit flip in the durable batch before the marker: its offsets are corrupt, not
    // "never persisted", and the record after the marker still reads.
    let seg0 = 2 * 4096 + 80;
    flash.borrow_mut().flip_bit(seg0 + 40, 3).unwrap();
    let mem = ram.memory();
    let (mut log, _) = Log::mount(Shared(&flash), cfg, mem, 5).unwrap();
    let (recs, lost) = read_all(&mut log);
    assert_eq!(recs, vec![(c, b"durable c".to_vec())]);
    assert_eq!(lost.first(), Some(&(a, c, LostReason::Corrupt)), "{lost:?}");
}

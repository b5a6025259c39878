//! Basic end-to-end behaviour of the log on a simulated flash.

mod common;
use common::{Ram, formatted};

use spillway_core::log::{Config, Log, Memory, Record, SegmentSlot};
use spillway_core::storage::{Geometry, SimFlash};

fn geo(ws: u32) -> Geometry {
    Geometry {
        erase_size: 4096,
        write_size: ws,
        capacity: 4096 * 34,
        erased: 0xFF,
    }
}

#[test]
fn append_flush_remount_read() {
    let g = geo(4);
    let mut flash = formatted(g, 0xABCD, 2);
    let mut ram = Ram::new(&g, 2, 2048);
    let (mut log, rep) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    assert!(rep.clean, "{rep:?}");
    assert_eq!(rep.next_offset, 0);
    for i in 0..1000u64 {
        let payload = format!("reading {i}");
        let a = log
            .append(
                i,
                &Record {
                    topic: "t",
                    timestamp_us: i,
                    producer: None,
                    payload: payload.as_bytes(),
                },
            )
            .unwrap();
        assert_eq!(a.offset, i);
    }
    log.flush(1000).unwrap();
    assert_eq!(log.durable_offset(), 1000);
    let mut out = vec![0u8; 4096];
    let mut at = 0u64;
    while at < 1000 {
        let r = log.read(at, &mut out).unwrap();
        assert!(r.lost.is_none(), "{r:?}");
        for rec in r.records(&out) {
            assert_eq!(rec.offset, at);
            assert_eq!(rec.payload, format!("reading {at}").as_bytes());
            at += 1;
        }
        assert_eq!(at, r.next_offset);
    }
    drop(log);
    // Unclean remount.
    let (mut log, rep) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    assert!(!rep.clean);
    assert!(rep.next_offset >= 1000);
    let mut at = 0u64;
    while at < 1000 {
        let r = log.read(at, &mut out).unwrap();
        assert!(r.lost.is_none(), "{r:?}");
        for rec in r.records(&out) {
            assert_eq!(rec.payload, format!("reading {}", rec.offset).as_bytes());
        }
        at = r.next_offset;
    }
    let n = log.next_offset();
    let a = log
        .append(
            0,
            &Record {
                topic: "t",
                timestamp_us: 0,
                producer: None,
                payload: b"after",
            },
        )
        .unwrap();
    assert_eq!(a.offset, n);
    log.close(0).unwrap();
    let (log, rep) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    assert!(rep.clean, "{rep:?}");
    assert_eq!(log.next_offset(), n + 1);
}

#[test]
fn mounting_with_another_geometry_is_an_error_not_an_empty_log() {
    let g = geo(4);
    let flash = formatted(g, 7, 2);
    let image = flash.bytes().to_vec();
    let other = Geometry {
        erase_size: 2048,
        write_size: 4,
        capacity: g.capacity,
        erased: 0xFF,
    };
    let mut wrong = SimFlash::new_vec(other).unwrap();
    wrong.load_image(&image).unwrap();
    let mut buf = vec![0u8; 2048];
    let mut slots = vec![SegmentSlot::EMPTY; 200];
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let err = Log::mount(&mut wrong, Config::default(), mem, 0).unwrap_err();
    assert!(
        matches!(
            err,
            spillway_core::MountError::GeometryMismatch {
                image_erase_size: 4096,
                erase_size: 2048,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A torn write left at the end of a segment abandoned by an unclean shutdown was never
/// durable: reads report it as skipped, not as corruption (a bridge alerts on the latter).
#[test]
fn torn_tail_of_an_abandoned_segment_reads_as_skipped() {
    use spillway_core::log::LostReason;
    let g = geo(4);
    let mut flash = formatted(g, 0x77, 2);
    let mut ram = Ram::new(&g, 2, 2048);
    let rec = |p: &'static [u8]| Record {
        topic: "t",
        timestamp_us: 1,
        producer: None,
        payload: p,
    };
    // Bytes programmed before the second batch: the mount's journal entry (88), the lease
    // entry of the first append (88), the first batch (a compact batch of version 4: 32 +
    // 12 of body prefix + 10 × 8 = 124). The cut falls 40 bytes into the second batch.
    flash.cut_after_bytes(88 + 88 + 124 + 40);
    {
        let mem = ram.memory();
        let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
        for _ in 0..10 {
            log.append(0, &rec(b"durable")).unwrap();
        }
        log.flush(0).unwrap();
        for _ in 0..10 {
            log.append(0, &rec(b"torn!")).unwrap();
        }
        assert!(log.flush(0).is_err(), "the cut interrupts this flush");
    }
    flash.power_on();
    let mem = ram.memory();
    let (mut log, rep) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    assert!(!rep.clean);
    assert!(rep.torn_tail_bytes > 0, "{rep:?}");
    log.append(0, &rec(b"after")).unwrap();
    log.flush(0).unwrap();
    let mut out = vec![0u8; 4096];
    let r = log.read(10, &mut out).unwrap();
    let lost = r.lost.expect("offsets after the torn write are lost");
    assert_eq!(lost.from, 10);
    assert_eq!(lost.reason, LostReason::Skipped, "{r:?}");
    let r = log.read(lost.to, &mut out).unwrap();
    assert_eq!(r.records(&out).next().unwrap().payload, b"after");
}

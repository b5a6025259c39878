//! Regression tests, each named after the engine bug it guards.
//!
//! They use a flash wrapper whose writes fail on demand: a storage error that is not a
//! power cut (the log object lives on and the caller retries), which is what these bugs
//! need to show.

use std::cell::Cell;

use spillway_core::AppendError;
use spillway_core::log::{
    Config, FullPolicy, Log, Memory, Record, SegmentSlot, SpillPolicy, segments_for,
};
use spillway_core::storage::{Flash, Geometry, SimError, SimFlash};

type Sim = SimFlash<Vec<u8>>;

/// A simulated flash whose writes fail (without changing anything) while `fail` is set,
/// and whose syncs fail while `fail_sync` is set.
struct Flaky<'a> {
    sim: &'a mut Sim,
    fail: &'a Cell<bool>,
    fail_sync: &'a Cell<bool>,
}

impl Flash for Flaky<'_> {
    type Error = SimError;
    fn geometry(&self) -> Geometry {
        self.sim.geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), SimError> {
        self.sim.read(addr, buf)
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), SimError> {
        if self.fail.get() {
            return Err(SimError::OutOfBounds {
                addr,
                len: data.len() as u32,
            });
        }
        self.sim.write(addr, data)
    }
    fn erase(&mut self, block: u32) -> Result<(), SimError> {
        self.sim.erase(block)
    }
    fn sync(&mut self) -> Result<(), SimError> {
        if self.fail_sync.get() {
            return Err(SimError::PowerCut);
        }
        self.sim.sync()
    }
}

fn geometry() -> Geometry {
    Geometry {
        erase_size: 1024,
        write_size: 4,
        capacity: 1024 * (2 + 4 * 2),
        erased: 0xFF,
    }
}

fn record(payload: &[u8]) -> Record<'_> {
    Record {
        topic: "t",
        timestamp_us: 7,
        producer: None,
        payload,
    }
}

/// Bug: under `OnPressure`, `append` put the record into the RAM buffer and only then
/// wrote the buffer out at the high-water mark; when that write failed, `append` returned
/// the error although the record was appended (offset taken, record in RAM and written by
/// the next flush). A producer told "failed" retries and the record is stored twice; a
/// power-cut sweep found such records on flash after remount (phantoms).
#[test]
fn high_water_spill_error_appended_the_record() {
    let g = geometry();
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, 1, 2).unwrap();
    let fail = Cell::new(false);
    let mut buf = vec![0u8; 512];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, 2) as usize];
    let cfg = Config {
        spill: SpillPolicy::OnPressure,
        full: FullPolicy::DropOldest,
        high_water_percent: 50,
        ..Config::default()
    };
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let flaky = Flaky {
        sim: &mut sim,
        fail: &fail,
        fail_sync: &Cell::new(false),
    };
    let (mut log, _) = Log::mount(flaky, cfg, mem, 0).unwrap();
    // The first append writes the offset lease; later ones only fill the buffer.
    log.append(0, &record(b"first")).unwrap();
    fail.set(true);
    let payload = [0x5Au8; 40];
    let mut ok = 1u64;
    let err = loop {
        let (next, buffered) = (log.next_offset(), log.buffered_records());
        match log.append(0, &record(&payload)) {
            Ok(a) => {
                assert_eq!(a.offset, next);
                ok += 1;
                assert!(ok < 100, "the buffer never reached its high-water mark");
            }
            Err(e) => {
                // Nothing may have been appended.
                assert_eq!(log.next_offset(), next, "offset taken by a failed append");
                assert_eq!(log.buffered_records(), buffered, "record kept in RAM");
                break e;
            }
        }
    };
    assert!(matches!(err, AppendError::Flash(_)), "{err:?}");
    fail.set(false);
    log.flush(0).unwrap();
    assert_eq!(log.next_offset(), ok);
    assert_eq!(log.durable_offset(), ok);
}

/// Bug: `append` raised the offset lease in RAM before writing it to the journal and kept
/// the raised value when that write failed. The caller's next appends then handed out
/// offsets no journal entry covered; after a crash the log started again at the old lease
/// and handed the same offsets out a second time, to different records.
#[test]
fn failed_lease_write_kept_the_lease_in_ram() {
    let g = geometry();
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, 1, 2).unwrap();
    let fail = Cell::new(false);
    let mut buf = vec![0u8; 512];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, 2) as usize];
    let cfg = Config {
        lease_step: 4,
        ..Config::default()
    };
    let handed = {
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let flaky = Flaky {
            sim: &mut sim,
            fail: &fail,
            fail_sync: &Cell::new(false),
        };
        let (mut log, _) = Log::mount(flaky, cfg, mem, 0).unwrap();
        // Offsets 0..4 are covered by the first lease.
        for _ in 0..4 {
            log.append(0, &record(b"leased")).unwrap();
        }
        log.flush(0).unwrap();
        // The write of the next lease fails; the append must fail with it.
        fail.set(true);
        assert!(matches!(
            log.append(0, &record(b"x")),
            Err(AppendError::Flash(_))
        ));
        // The storage recovers; appends go on, unflushed, and the power is cut.
        fail.set(false);
        for _ in 0..3 {
            log.append(0, &record(b"not durable")).unwrap();
        }
        log.next_offset()
    };
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (log, rep) = Log::mount(&mut sim, cfg, mem, 0).unwrap();
    assert!(
        log.next_offset() >= handed,
        "offsets {}..{handed} handed out again after a crash ({rep:?})",
        log.next_offset()
    );
}

/// Bug: `flush` with an empty RAM buffer returned at once, leaving
/// `durable_offset() < next_offset()` although its documentation promises equality:
/// after an unclean mount (the offsets of the lease gap never existed) and after a flush
/// whose final sync failed (the batches were written but never synced, and no later flush
/// synced them).
#[test]
fn flush_with_empty_buffer_left_durable_below_next() {
    let g = geometry();
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, 1, 2).unwrap();
    let mut buf = vec![0u8; 512];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, 2) as usize];
    let cfg = Config::default();
    {
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let (mut log, _) = Log::mount(&mut sim, cfg, mem, 0).unwrap();
        log.append(0, &record(b"durable")).unwrap();
        log.flush(0).unwrap();
        log.append(0, &record(b"lost in the crash")).unwrap();
    }
    // Unclean mount: the next offset starts at the lease, past a gap.
    let fail = Cell::new(false);
    let fail_sync = Cell::new(false);
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let flaky = Flaky {
        sim: &mut sim,
        fail: &fail,
        fail_sync: &fail_sync,
    };
    let (mut log, rep) = Log::mount(flaky, cfg, mem, 0).unwrap();
    assert!(rep.not_durable.is_some(), "{rep:?}");
    let next = log.next_offset();
    assert_eq!(log.flush(0).unwrap(), next);
    assert_eq!(log.durable_offset(), next);

    // A flush whose sync fails (after the batch was written into the segment opened by
    // the flush before it), then a flush with nothing left in RAM.
    log.append(0, &record(b"opens a segment")).unwrap();
    log.flush(0).unwrap();
    log.append(0, &record(b"written, not synced")).unwrap();
    fail_sync.set(true);
    assert!(log.flush(0).is_err());
    assert_eq!(log.buffered_records(), 0);
    fail_sync.set(false);
    let next = log.next_offset();
    assert_eq!(log.flush(0).unwrap(), next);
    assert_eq!(log.durable_offset(), next);
}

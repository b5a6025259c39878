//! White-box tests of the log's write paths: invariants that poisoning alone would hide.

use std::vec;
use std::vec::Vec;

use super::*;
use crate::storage::SimFlash;

/// One step of xorshift64 (G. Marsaglia, "Xorshift RNGs", J. Stat. Softw. 8(14), 2003;
/// shifts 13, 7, 17): the unit tests' reproducible noise. Returns the new state.
pub(super) fn xorshift64(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

const G: Geometry = Geometry {
    erase_size: 1024,
    write_size: 4,
    capacity: 1024 * (2 + 4 * 2),
    erased: 0xFF,
};

/// A log's RAM for the unit tests of `log` and its modules: a write buffer and a slot for
/// every segment.
pub(super) struct Mem {
    buf: Vec<u8>,
    slots: Vec<SegmentSlot>,
}

impl Mem {
    /// A write buffer of `buffer` bytes and a slot for every segment of a partition of
    /// `geometry` in segments of `blocks_per_segment` erase blocks.
    pub(super) fn with(geometry: &Geometry, blocks_per_segment: u32, buffer: usize) -> Self {
        Mem {
            buf: vec![0u8; buffer],
            slots: vec![SegmentSlot::EMPTY; segments_for(geometry, blocks_per_segment) as usize],
        }
    }

    /// This file's: 512 bytes of buffer, segments of 2 blocks of `G`.
    fn new() -> Self {
        Mem::with(&G, 2, 512)
    }

    pub(super) fn memory(&mut self) -> Memory<'_> {
        Memory {
            buffer: &mut self.buf,
            segments: &mut self.slots,
        }
    }
}

/// Formats `sim` (segments of 2 blocks) and mounts it. A test makes the next write fail
/// with `log.dev.flash.fail_write_after_bytes(0)`: its first word torn, nothing after it
/// programmed, the power still on.
fn mount_sim<'a>(
    sim: &'a mut SimFlash<Vec<u8>>,
    mem: &'a mut Mem,
) -> Log<'a, &'a mut SimFlash<Vec<u8>>> {
    Log::format(&mut *sim, 9, 2).unwrap();
    Log::mount(sim, Config::default(), mem.memory(), 0)
        .unwrap()
        .0
}

/// A one-byte record of topic `t`.
const REC: Record<'static> = Record {
    topic: "t",
    timestamp_us: 0,
    producer: None,
    payload: b"x",
};

/// The newest journal entry's sequence number found on `sim`, as a mount would.
fn newest_entry(sim: &mut SimFlash<Vec<u8>>) -> Option<u64> {
    let mut dev = Dev {
        flash: sim,
        l: Layout::new(G, 2),
        stats: Stats::default(),
        failed: None,
    };
    let mut entry = super::journal::Entry::empty();
    let (found, _, _, _) = Log::scan_journal(&mut dev, &mut entry, &mut []).unwrap();
    found.then_some(entry.seq)
}

/// The journal switches blocks only after an entry in the other block is written and
/// synced: failed attempts to switch, one after another, never erase the block that holds
/// the newest valid entry. (Poisoning stops a log from trying again; this holds without it.)
#[test]
fn failed_journal_switches_never_erase_the_only_good_entry() {
    let mut sim = SimFlash::new_vec(G).unwrap();
    let mut mem = Mem::new();
    let good = {
        let mut log = mount_sim(&mut sim, &mut mem);
        log.persist(0).unwrap();
        let good = log.jseq;
        let block = log.jblock;
        for _ in 0..3 {
            // The next entry does not fit: it goes to the other block, whose write fails.
            log.jpos = None;
            log.dev.flash.fail_write_after_bytes(0);
            assert!(matches!(log.persist(0), Err(CommitError::Flash(_))));
            assert_eq!(log.jblock, block, "switched to a block without an entry");
            // Try again as an engine without poisoning would.
            log.dev.failed = None;
        }
        log.jpos = None;
        log.persist(0).unwrap();
        assert_eq!(log.jblock, 1 - block, "a written and synced entry switches");
        assert_eq!(log.jseq, good + 1);
        good
    };
    assert_eq!(newest_entry(&mut sim), Some(good + 1));
}

/// A journal write that fails in the current block leaves the words it touched alone:
/// the next entry goes to the other block, and the current one keeps its entries.
#[test]
fn failed_journal_write_in_place_moves_the_next_entry_to_the_other_block() {
    let mut sim = SimFlash::new_vec(G).unwrap();
    let mut mem = Mem::new();
    let mut log = mount_sim(&mut sim, &mut mem);
    let block = log.jblock;
    assert!(log.jpos.is_some());
    log.dev.flash.fail_write_after_bytes(0);
    assert!(matches!(log.persist(0), Err(CommitError::Flash(_))));
    assert_eq!((log.jblock, log.jpos), (block, None));
    assert!(matches!(log.persist(0), Err(CommitError::Poisoned { .. })));
    log.dev.failed = None;
    log.persist(0).unwrap();
    assert_eq!(log.jblock, 1 - block);
}

/// A batch write that fails seals the head segment: the words it may have touched are
/// never programmed again, and the next batch goes to a fresh segment.
#[test]
fn failed_batch_write_seals_the_head_segment() {
    let mut sim = SimFlash::new_vec(G).unwrap();
    let mut mem = Mem::new();
    let mut log = mount_sim(&mut sim, &mut mem);
    log.append(0, &REC).unwrap();
    log.flush(0).unwrap();
    let (head, pos) = (log.head, log.head_pos);
    log.append(0, &REC).unwrap();
    log.dev.flash.fail_write_after_bytes(0);
    assert!(matches!(log.flush(0), Err(FlushError::Flash(_))));
    assert!(!log.head_writable, "the head was left open for writing");
    assert_eq!(log.head_pos, pos);
    log.dev.failed = None;
    log.flush(0).unwrap();
    assert_ne!(
        log.head, head,
        "the next batch went into the sealed segment"
    );
}

/// A buffered record that cannot be written even into an empty segment (it no longer
/// parses here) is reported as what it is, never as a full log: `Full` would tell the
/// producer to wait for consumers, for ever.
#[test]
fn unwritable_buffered_record_is_not_reported_as_full() {
    let mut sim = SimFlash::new_vec(G).unwrap();
    Log::format(&mut sim, 9, 2).unwrap();
    let mut mem = Mem::new();
    let (mut log, _) = Log::mount(&mut sim, Config::default(), mem.memory(), 0).unwrap();
    let at = log.append(0, &REC).unwrap().offset;
    // The record's bytes in RAM stop parsing (a bug or a RAM fault, never a full log).
    let end = log.buf_len;
    log.buf[BATCH_HEADER_LEN..end].fill(0xFF);
    let got = log.flush(0);
    assert!(
        matches!(got, Err(FlushError::Unwritable { offset, .. }) if offset == at),
        "{got:?}"
    );
}

/// `mount_in` and `close_in` (the log built and shut down in the caller's slot, for small
/// stacks) leave the flash as `mount` and `close` do: a clean shutdown with every record,
/// mounted again by value. A failed `mount_in` and a `close_in` leave the slot empty.
#[test]
fn mount_in_and_close_in_a_slot_behave_as_mount_and_close() {
    let mut sim = SimFlash::new_vec(G).unwrap();
    Log::format(&mut sim, 9, 2).unwrap();
    let mut blank = SimFlash::new_vec(G).unwrap();
    // One memory per log: the slot's type holds the borrow of each it is mounted with.
    let [mut m0, mut m1, mut m2, mut m3] = [Mem::new(), Mem::new(), Mem::new(), Mem::new()];
    let mut slot = None;
    let (log, rep) = Log::mount_in(&mut slot, &mut sim, Config::default(), m0.memory(), 0).unwrap();
    assert!(rep.clean && rep.journal_found);
    for i in 0..5 {
        assert_eq!(log.append(i, &REC).unwrap().offset, i);
    }
    let flash = Log::close_in(&mut slot, 1)
        .unwrap()
        .expect("the slot held a log");
    assert!(slot.is_none());
    assert!(Log::close_in(&mut slot, 2).unwrap().is_none());

    let (mut log, rep) = Log::mount(flash, Config::default(), m1.memory(), 3).unwrap();
    assert!(rep.clean, "{rep:?}");
    assert_eq!((rep.first_offset, rep.next_offset), (0, 5));
    let mut out = [0u8; 256];
    assert_eq!(log.read(0, &mut out).unwrap().count, 5);
    let flash = log.close(4).unwrap();

    // A log in the slot is replaced; a mount that fails leaves the slot empty.
    assert!(
        Log::mount_in(&mut slot, flash, Config::default(), m2.memory(), 5)
            .unwrap()
            .1
            .clean
    );
    let err = Log::mount_in(&mut slot, &mut blank, Config::default(), m3.memory(), 6);
    assert!(matches!(err, Err(MountError::NotFormatted)), "{err:?}");
    assert!(slot.is_none());
}

//! Who releases retention, and what the log counts when it reclaims a segment: records
//! reclaimed unread are counted exactly (records, not offsets), under both full policies;
//! a worn journal block at mount is reported as such; corrupt ranges and flash reads are
//! counted for what they are.

mod common;
use common::small::{ERASE, GEOMETRY};
use common::{Hook, Hooked, Ram, Sim};

use std::cell::Cell;

use spillway_core::MountError;
use spillway_core::log::format::{BATCH_MAGIC, SEGMENT_HEADER_LEN};
use spillway_core::log::{BRIDGE_CONSUMER, Config, FullPolicy, Log, LostReason, Record};
use spillway_core::storage::{Flash, SimError};

fn payload_of(off: u64) -> Vec<u8> {
    let len = 8 + (off * 7 % 50) as usize;
    (0..len).map(|i| (off as u8) ^ i as u8).collect()
}

fn record(payload: &[u8]) -> Record<'_> {
    Record {
        topic: "retention",
        timestamp_us: 7,
        producer: None,
        payload,
    }
}

fn config(full: FullPolicy) -> Config {
    Config {
        full,
        ..Config::default()
    }
}

fn formatted() -> Sim {
    common::formatted(GEOMETRY, 0xBEEF, 1)
}

/// The log's RAM: one-block segments, a 512-byte write buffer.
fn ram() -> Ram {
    Ram::new(&GEOMETRY, 1, 512)
}

/// Mounts `sim` on `mem` under `full`.
fn mount<'a>(sim: &'a mut Sim, mem: &'a mut Ram, full: FullPolicy) -> Log<'a, &'a mut Sim> {
    Log::mount(sim, config(full), mem.memory(), 0).unwrap().0
}

/// Appends the record of the log's next offset ([`payload_of`]); returns its offset.
fn append_next<F: Flash>(log: &mut Log<'_, F>) -> u64 {
    let off = log.next_offset();
    log.append(0, &record(&payload_of(off))).unwrap().offset
}

/// Appends and flushes `n` records, one at a time; returns their offsets.
fn append_flushed<F: Flash>(log: &mut Log<'_, F>, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let offset = append_next(log);
            log.flush(0).unwrap();
            offset
        })
        .collect()
}

/// Appends and flushes one record at a time until the log's first offset passes `until`;
/// returns the offsets of every record appended (this call's).
fn append_until_first_passes<F: Flash>(log: &mut Log<'_, F>, until: u64) -> Vec<u64> {
    let mut offsets = Vec::new();
    while log.first_offset() <= until {
        offsets.push(append_next(log));
        log.flush(0).unwrap();
        assert!(offsets.len() < 10_000, "the ring never reclaimed {until}");
    }
    offsets
}

/// Fills the log until offset 39 is reclaimed and checks that the records counted dropped
/// are exactly those reclaimed from `unread_from` on, of `stored` and of the fill; returns
/// the first offset after the fill.
fn fill_and_check_dropped<F: Flash>(
    log: &mut Log<'_, F>,
    mut stored: Vec<u64>,
    unread_from: u64,
) -> u64 {
    stored.extend(append_until_first_passes(log, 39));
    let first = log.first_offset();
    let unread = stored
        .iter()
        .filter(|&&o| (unread_from..first).contains(&o))
        .count() as u64;
    assert_eq!(log.stats().records_dropped, unread);
    first
}

/// With no consumer left, `reject-new` reclaims segments nobody read: each of their records
/// counts as dropped, and the offsets a crash skipped (which hold no record) do not.
#[test]
fn reclaiming_with_no_consumer_counts_the_unread_records_not_the_skipped_offsets() {
    let (mut sim, mut mem) = (formatted(), ram());
    // First run: 30 records, then a crash (no close): the rest of the lease is skipped.
    let mut stored = {
        let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
        append_flushed(&mut log, 30)
    };
    let (mut log, report) =
        Log::mount(&mut sim, config(FullPolicy::RejectNew), mem.memory(), 0).unwrap();
    assert!(!report.clean);
    assert!(
        log.next_offset() > 30,
        "the crash skipped no offsets: {}",
        log.next_offset()
    );
    assert!(log.delete_consumer(BRIDGE_CONSUMER).unwrap());
    assert_eq!(log.consumers().count(), 0);
    let first_run_end = *stored.last().unwrap();
    stored.extend(append_until_first_passes(&mut log, first_run_end));
    let first = log.first_offset();
    let reclaimed = stored.iter().filter(|&&o| o < first).count() as u64;
    assert!(reclaimed > 30, "{reclaimed}");
    assert_eq!(
        log.stats().records_dropped,
        reclaimed,
        "records reclaimed unread (offsets {}..{first}, a skipped lease inside)",
        stored[0]
    );
}

/// Under `drop-oldest`, records every consumer had committed are not counted when their
/// segment goes; only those from the lowest committed offset on are.
#[test]
fn drop_oldest_counts_only_what_a_consumer_had_not_committed() {
    let (mut sim, mut mem) = (formatted(), ram());
    let mut log = mount(&mut sim, &mut mem, FullPolicy::DropOldest);
    let stored = append_flushed(&mut log, 40);
    // `bridge` read the first 25; `other` read 35. The lowest (25) decides.
    log.commit(BRIDGE_CONSUMER, 25).unwrap();
    log.commit("other", 35).unwrap();
    let first = fill_and_check_dropped(&mut log, stored, 25);
    // The consumers' committed offsets are now below the first offset: they lost exactly
    // those records.
    assert!(log.committed(BRIDGE_CONSUMER).unwrap() < first);
}

/// A consumer deleted by force releases retention: what it had committed is not counted
/// when reclaimed, what it had not is.
#[test]
fn deleting_the_last_consumer_counts_only_what_it_had_not_read() {
    let (mut sim, mut mem) = (formatted(), ram());
    let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
    let stored = append_flushed(&mut log, 40);
    log.commit(BRIDGE_CONSUMER, 20).unwrap();
    assert!(log.delete_consumer(BRIDGE_CONSUMER).unwrap());
    fill_and_check_dropped(&mut log, stored, 20);
}

/// `reject-new` with a consumer that read everything reclaims without counting anything.
#[test]
fn reclaiming_what_every_consumer_read_counts_nothing() {
    let (mut sim, mut mem) = (formatted(), ram());
    let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
    for _ in 0..400 {
        append_next(&mut log);
        log.flush(0).unwrap();
        log.commit(BRIDGE_CONSUMER, log.durable_offset()).unwrap();
    }
    assert!(log.first_offset() > 0, "the ring never wrapped");
    assert_eq!(log.stats().records_dropped, 0);
}

/// Erases of the journal's blocks (0 and 1) leave the block as it was: worn-out flash.
/// Counts the erases so refused.
struct WornJournal<'a>(&'a Cell<u32>);

impl Hook for WornJournal<'_> {
    fn before_erase(&mut self, block: u32) -> Result<bool, SimError> {
        if block < 2 {
            self.0.set(self.0.get() + 1);
            return Ok(false);
        }
        Ok(true)
    }
}

/// A mount whose journal write meets a journal block that no longer erases says so, with
/// the block: the partition is a log (its records are intact), not "not formatted".
#[test]
fn worn_journal_block_at_mount_is_reported_with_its_block_not_as_unformatted() {
    let (mut sim, mut mem) = (formatted(), ram());
    {
        let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
        for _ in 0..20 {
            append_next(&mut log);
        }
        log.close(0).unwrap();
    }
    let refused = Cell::new(0);
    let mut mem = ram();
    let got = loop {
        let flash = Hooked::new(&mut sim, WornJournal(&refused));
        match Log::mount(flash, config(FullPolicy::RejectNew), mem.memory(), 0) {
            Ok((mut log, _)) => {
                // Fill the journal until it needs the other block, which does not erase.
                for _ in 0..100 {
                    if log.persist(0).is_err() {
                        break;
                    }
                }
            }
            Err(e) => break e,
        }
        assert!(refused.get() < 1000, "the journal never needed an erase");
    };
    assert!(
        matches!(got, MountError::WornJournal { block } if block < 2),
        "{got:?}"
    );
    assert!(got.to_string().contains("does not erase"), "{got}");
}

/// A corrupt range read again and again (a consumer fetching it again, a second consumer)
/// counts its offsets once in `corrupt_offsets`; every read that meets it counts in
/// `corrupt_batches`. Flash bytes read are counted, matching the storage's own counter.
#[test]
fn corrupt_range_read_again_counts_its_offsets_once_and_reads_are_counted_in_bytes() {
    let (mut sim, mut mem) = (formatted(), ram());
    {
        let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
        for i in 0..30u64 {
            log.append(0, &record(&payload_of(i))).unwrap();
            if i % 5 == 4 {
                log.flush(0).unwrap();
            }
        }
        log.close(0).unwrap();
    }
    // Flip a bit inside the second batch (records 5..10) of the first segment (block 2).
    let magic = BATCH_MAGIC.to_le_bytes();
    let seg = 2 * ERASE as usize;
    let second = (seg + SEGMENT_HEADER_LEN..seg + ERASE as usize)
        .step_by(4)
        .filter(|&p| sim.bytes()[p..p + 4] == magic)
        .nth(1)
        .expect("second batch");
    sim.flip_bit(second as u32 + 40, 3).unwrap();
    sim.reset_counters();
    let mut log = mount(&mut sim, &mut mem, FullPolicy::RejectNew);
    let mut buf = vec![0u8; 600];
    let mut lost = None;
    for _ in 0..3 {
        let r = log.read(5, &mut buf).unwrap();
        let l = r.lost.expect("the flipped batch reads corrupt");
        assert_eq!(l.reason, LostReason::Corrupt);
        lost = Some((l.from, l.to));
    }
    let (from, to) = lost.unwrap();
    assert_eq!((from, to), (5, 10));
    let s = log.stats();
    assert_eq!(s.corrupt_offsets, to - from, "{s:?}");
    assert!(s.corrupt_batches >= 3, "{s:?}");
    let counted = s.flash_bytes_read;
    drop(log);
    assert_eq!(counted, sim.counters().bytes_read);
    assert!(counted > 0);
}

/// Reads of journal block 0 fail (every re-read too).
struct UnreadableJournal;

impl Hook for UnreadableJournal {
    fn before_read(&mut self, addr: u32, len: usize) -> Result<(), SimError> {
        if addr < ERASE {
            return Err(SimError::ReadFailed {
                addr,
                len: len as u32,
            });
        }
        Ok(())
    }
}

/// A journal block that cannot be read at mount is reported with its block and the
/// storage's error, as a storage failure of the journal.
#[test]
fn unreadable_journal_block_at_mount_is_reported_with_its_block() {
    let (mut sim, mut mem) = (formatted(), ram());
    let got = Log::mount(
        Hooked::new(&mut sim, UnreadableJournal),
        config(FullPolicy::RejectNew),
        mem.memory(),
        0,
    )
    .map(|_| ())
    .unwrap_err();
    assert!(
        matches!(
            got,
            MountError::JournalUnreadable {
                block: 0,
                error: SimError::ReadFailed { .. }
            }
        ),
        "{got:?}"
    );
    assert!(got.to_string().contains("journal erase block 0"), "{got}");
}

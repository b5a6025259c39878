//! Unit tests of the commit journal: entry encoding and decoding, hostile entries, and the
//! journal blocks a mount reads.

use std::vec;
use std::vec::Vec;

use super::*;
use crate::error::AppendError;
use crate::log::format::{MAX_NEXT_OFFSET, Record, align_up};
use crate::log::tests::Mem;
use crate::log::{Config, JournalInvalid, Log, RecoveryReport};
use crate::storage::{Flash, Geometry, SimFlash};

const G: Geometry = Geometry {
    erase_size: 4096,
    write_size: 4,
    capacity: 4096 * 8,
    erased: 0xFF,
};

const REC: Record<'static> = Record {
    topic: "t",
    timestamp_us: 1,
    producer: None,
    payload: b"x",
};

/// A log's RAM for a partition of `G` in one-block segments: a 1 KiB write buffer and a
/// slot for every segment.
fn ram() -> Mem {
    Mem::with(&G, 1, 1024)
}

/// Mounts `flash` with the default config and returns its next offset.
fn mount(flash: &mut SimFlash<Vec<u8>>) -> u64 {
    let mut ram = ram();
    let (log, _) = Log::mount(flash, Config::default(), ram.memory(), 0).unwrap();
    log.next_offset()
}

/// A log of `n` records, closed cleanly.
fn log_of(n: u64) -> SimFlash<Vec<u8>> {
    let mut flash = SimFlash::new_vec(G).unwrap();
    Log::format(&mut flash, 5, 1).unwrap();
    let mut ram = ram();
    let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    for i in 0..n {
        assert_eq!(log.append(0, &REC).unwrap().offset, i);
    }
    log.close(0).unwrap();
    flash
}

/// Visits the journal's entries in block order, each as its bytes and the block and byte
/// position it starts at, until an entry that `visit` refuses (returns false) or the end of
/// what reads as an entry.
fn each_entry(flash: &mut SimFlash<Vec<u8>>, mut visit: impl FnMut(&[u8], u32, u32) -> bool) {
    let e = G.erase_size;
    for blk in 0..2u32 {
        let mut pos = 0u32;
        loop {
            let mut head = [0u8; 16];
            flash.read(blk * e + pos, &mut head).unwrap();
            let Some(len) = entry_len(&head, (e - pos) as usize) else {
                break;
            };
            let mut b = vec![0u8; len];
            flash.read(blk * e + pos, &mut b).unwrap();
            if !visit(&b, blk, pos) {
                break;
            }
            pos += align_up(len as u32, G.write_size);
        }
    }
}

/// An entry as the log writes it (entry sequence `seq`, consumer `bridge` at
/// `bridge_offset`, segments of `bps` blocks), padded with the erased value to the write
/// size; and its length before the padding.
fn entry_bytes(
    seq: u64,
    lease: u64,
    durable_next: u64,
    bps: u32,
    bridge_offset: u64,
    producers: &[Snapshot],
) -> (Vec<u8>, usize) {
    let mut out = vec![0u8; MAX_ENTRY_LEN];
    let head = EntryHead {
        seq,
        lease,
        durable_next,
        log_id: 5,
        geometry: (G.erase_size, G.write_size, G.erased, bps),
        clean: false,
    };
    let len = encode(
        &mut out,
        MAX_ENTRY_LEN,
        &head,
        [("bridge", bridge_offset)].into_iter(),
        producers.iter().copied(),
    );
    out.truncate(align_up(len as u32, G.write_size) as usize);
    out[len..].fill(G.erased);
    (out, len)
}

/// The newest journal entry's sequence number, its block, and the position in that block
/// just past it (where a newer entry goes).
fn newest_entry(flash: &mut SimFlash<Vec<u8>>) -> (u64, u32, u32) {
    let mut newest: Option<(u64, u32, u32)> = None;
    each_entry(flash, |b, blk, pos| {
        let entry = decode(b).expect("the real log's entries decode");
        let end = pos + align_up(b.len() as u32, G.write_size);
        if newest.is_none_or(|n| entry.seq > n.0) {
            newest = Some((entry.seq, blk, end));
        }
        true
    });
    newest.expect("a formatted journal has an entry")
}

/// Writes `entry` (encoded by `encode`) after the newest entry of the journal, with the
/// next entry sequence number, as a newer snapshot that a mount prefers.
fn write_newer_entry(
    flash: &mut SimFlash<Vec<u8>>,
    lease: u64,
    durable_next: u64,
    bps: u32,
    consumer_offset: u64,
) {
    write_newer_entry_with(flash, lease, durable_next, bps, consumer_offset, &[]);
}

/// [`write_newer_entry`] with a producer table.
fn write_newer_entry_with(
    flash: &mut SimFlash<Vec<u8>>,
    lease: u64,
    durable_next: u64,
    bps: u32,
    consumer_offset: u64,
    producers: &[Snapshot],
) {
    let (seq, blk, pos) = newest_entry(flash);
    let (out, _) = entry_bytes(
        seq + 1,
        lease,
        durable_next,
        bps,
        consumer_offset,
        producers,
    );
    flash.write(blk * G.erase_size + pos, &out).unwrap();
}

/// Producer sequences cross the wrap from `u32::MAX` to 0, on the real log and across
/// a power cut and a clean restart. The state is written by a journal entry, as a
/// producer that has published for about 50 days at 1,000 records/s leaves it. Before,
/// sequences were compared with a plain `<=`: after the wrap every new record of a
/// producer looked like an old resend and was answered "already stored" unstored.
#[test]
fn producer_sequences_cross_the_wrap_across_restarts() {
    const SESSION: u64 = 9;
    const LEGACY: u64 = 10;
    let mut flash = log_of(3);
    let snapshot = |id, epoch, seq, off| Snapshot {
        id,
        epoch,
        last_seq: seq,
        last_offset: off,
        session_from: 0,
        contiguous_from: seq,
        wrapped: false,
        behind: false,
    };
    write_newer_entry_with(
        &mut flash,
        3,
        3,
        1,
        0,
        &[
            snapshot(SESSION, 4, u32::MAX - 2, 2),
            snapshot(LEGACY, 0, u32::MAX, 1),
        ],
    );
    let rec = |id, seq| Record {
        topic: "t",
        timestamp_us: 1,
        producer: Some(crate::log::Producer { id, seq }),
        payload: b"w",
    };
    let mut ram = ram();
    let mut offsets = Vec::new();
    {
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        assert_eq!(log.producer_session(SESSION), Some((4, u32::MAX - 2)));
        for seq in [u32::MAX - 1, u32::MAX, 0, 1, 2] {
            let a = log.append_in_session(0, &rec(SESSION, seq), 4).unwrap();
            assert!(!a.duplicate, "seq {seq}");
            offsets.push(a.offset);
        }
        let a = log
            .append_in_session(0, &rec(SESSION, u32::MAX), 4)
            .unwrap();
        assert_eq!((a.offset, a.duplicate), (offsets[1], true));
        // The legacy rule (no session) crosses the wrap too.
        let a = log.append(0, &rec(LEGACY, 0)).unwrap();
        assert!(!a.duplicate);
        log.flush(0).unwrap();
        let _ = log.into_flash(); // power cut
    }
    for round in 0..2 {
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        let last = 2 + round;
        assert_eq!(
            log.producer_session(SESSION),
            Some((4, last)),
            "round {round}"
        );
        let a = log.append_in_session(0, &rec(SESSION, last), 4).unwrap();
        assert!(a.duplicate);
        // Stored before the wrap: older than the window, known stored.
        for old in [u32::MAX - 1, u32::MAX - 100] {
            let e = log.append_in_session(0, &rec(SESSION, old), 4).unwrap_err();
            assert!(
                matches!(e, AppendError::SequenceTooOld { .. }),
                "round {round} seq {old}: {e:?}"
            );
        }
        let e = log
            .append_in_session(0, &rec(SESSION, last + 2), 4)
            .unwrap_err();
        assert!(matches!(e, AppendError::OutOfSequence { .. }), "{e:?}");
        assert!(log.append(0, &rec(LEGACY, 0)).unwrap().duplicate);
        if round == 0 {
            let a = log.append_in_session(0, &rec(SESSION, 3), 4).unwrap();
            assert!(!a.duplicate);
            log.close(0).unwrap();
        }
    }
}

/// A journal entry whose lease is `u64::MAX` is refused as damaged: the mount keeps
/// the previous entry's lease, and appends go on from the log's real end (before, the
/// next offset became `u64::MAX` and the next append wrapped it to 0, reusing offsets).
#[test]
fn a_journal_lease_at_the_top_of_the_offset_range_is_refused() {
    for (lease, durable, consumer) in [
        (u64::MAX, 3, 0),
        (MAX_OFFSET, 3, 0),
        (3, u64::MAX, 0),
        (3, 3, u64::MAX),
    ] {
        let mut flash = log_of(3);
        write_newer_entry(&mut flash, lease, durable, 1, consumer);
        let mut ram = ram();
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        assert_eq!(
            log.next_offset(),
            3,
            "lease {lease:#x} durable {durable:#x}"
        );
        assert!(log.committed("bridge").is_none_or(|c| c <= 3));
        for want in 3..6 {
            assert_eq!(log.append(0, &REC).unwrap().offset, want);
        }
        log.close(0).unwrap();
        assert_eq!(mount(&mut flash), 6);
    }
}

/// Found by the `mount_image` fuzz target: a journal entry whose sequence number is
/// `u64::MAX - 1` (CRC fixed) was the newest; the mount's own entry took `u64::MAX` and
/// the first append's lease entry added 1 to it (a panic with overflow checks, an
/// entry sequence of 0 that loses to every older entry without). Such an entry is
/// refused as damaged.
#[test]
fn a_journal_entry_sequence_at_the_top_of_its_range_is_refused() {
    for seq in [u64::MAX - 1, u64::MAX, MAX_SEQ] {
        let mut flash = log_of(3);
        let (out, len) = entry_bytes(seq, 1027, 3, 1, 0, &[]);
        assert!(decode(&out[..len]).is_none(), "seq {seq:#x}");
        // Both journal blocks hold only this entry.
        flash.erase(0).unwrap();
        flash.erase(1).unwrap();
        flash.write(0, &out).unwrap();
        let mut ram = ram();
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        assert_eq!(log.next_offset(), 3);
        for want in 3..1030 {
            assert_eq!(log.append(0, &REC).unwrap().offset, want);
        }
        log.close(0).unwrap();
    }
}

/// A journal entry whose segment size (`blocks_per_segment × erase_size`) does not fit
/// in 32 bits is refused (before, the mount's layout multiplied it unchecked: a panic
/// with overflow checks, a wrapped segment size without).
#[test]
fn a_journal_entry_with_an_overflowing_segment_size_is_refused() {
    for bps in [1 << 20, u32::MAX, 0] {
        let mut flash = log_of(2);
        write_newer_entry(&mut flash, 1026, 2, bps, 0);
        assert_eq!(mount(&mut flash), 2, "bps {bps}");
    }
}

/// A journal entry as [`entries`] lists it: (entry sequence, consumer `bridge`'s offset,
/// byte address, length in bytes).
type EntryAt = (u64, u64, u32, usize);

/// Every valid journal entry.
fn entries(flash: &mut SimFlash<Vec<u8>>) -> Vec<EntryAt> {
    let mut out = Vec::new();
    each_entry(flash, |b, blk, pos| {
        let Some(entry) = decode(b) else {
            return false;
        };
        let bridge = entry
            .consumers
            .iter()
            .find(|c| c.0 == "bridge")
            .map_or(0, |c| c.1);
        out.push((entry.seq, bridge, blk * G.erase_size + pos, b.len()));
        true
    });
    out
}

/// Flips one bit in the middle of the entry at `addr` of `len` bytes, as a worn cell
/// would, after it was written.
fn flip_inside(flash: &mut SimFlash<Vec<u8>>, addr: u32, len: usize) {
    flash.bytes_mut()[addr as usize + len / 2] ^= 0x10;
}

/// Mounts `flash` and returns the report and consumer `bridge`'s committed offset.
fn mount_report(flash: &mut SimFlash<Vec<u8>>) -> (RecoveryReport, u64) {
    let mut ram = ram();
    let (log, report) = Log::mount(flash, Config::default(), ram.memory(), 0).unwrap();
    let bridge = log
        .consumers()
        .find(|(n, _)| *n == "bridge")
        .map_or(0, |(_, o)| o);
    (report, bridge)
}

/// A log of 3 records whose journal then commits `bridge` at 1, 2 and 3, one entry
/// each; and the journal's [`entries`].
fn commits_1_to_3() -> (SimFlash<Vec<u8>>, Vec<EntryAt>) {
    let mut flash = log_of(3);
    for committed in 1..=3 {
        write_newer_entry(&mut flash, 3, 3, 1, committed);
    }
    let all = entries(&mut flash);
    (flash, all)
}

/// A journal entry damaged after it was written, with newer valid entries after it in
/// its block, is skipped and reported: the mount uses the newest valid entry. Before,
/// the block's scan ended at the damaged entry, the mount used the one before it, and
/// consumers' committed offsets went back with nothing reported.
#[test]
fn a_damaged_journal_entry_before_newer_ones_is_skipped_and_reported() {
    let (mut flash, all) = commits_1_to_3();
    let &(_, _, addr, len) = all
        .iter()
        .find(|e| e.1 == 2)
        .expect("the entry committing 2");
    let newest = all.iter().map(|e| e.0).max().unwrap();
    flip_inside(&mut flash, addr, len);

    let (report, bridge) = mount_report(&mut flash);
    assert_eq!(
        bridge, 3,
        "the newest entry, after the damaged one, is used"
    );
    assert_eq!(report.journal_seq, newest);
    assert_eq!(
        report.journal_invalid,
        JournalInvalid {
            damaged: 1,
            torn: 0
        }
    );
}

/// The newest journal entry that does not validate (torn by a power cut, or damaged)
/// is reported as torn, and the mount falls back to the entry before it.
#[test]
fn a_newest_journal_entry_that_does_not_validate_is_reported_as_torn() {
    let (mut flash, all) = commits_1_to_3();
    let &(seq, _, addr, len) = all.iter().max_by_key(|e| e.0).unwrap();
    assert_eq!(all.iter().find(|e| e.0 == seq).unwrap().1, 3);
    flip_inside(&mut flash, addr, len);

    let (report, bridge) = mount_report(&mut flash);
    assert_eq!(bridge, 2, "the entry before the newest");
    assert_eq!(report.journal_seq, seq - 1);
    assert_eq!(
        report.journal_invalid,
        JournalInvalid {
            damaged: 0,
            torn: 1
        }
    );
}

/// A journal whose entries all validate reports nothing.
#[test]
fn a_valid_journal_reports_no_invalid_entries() {
    let mut flash = log_of(3);
    write_newer_entry(&mut flash, 3, 3, 1, 2);
    let (report, bridge) = mount_report(&mut flash);
    assert_eq!(bridge, 2);
    assert_eq!(report.journal_invalid, JournalInvalid::default());
}

/// Mounts `flash` and appends until the log refuses: returns the offsets handed out and
/// the refusal.
fn append_until_refused(
    flash: &mut SimFlash<Vec<u8>>,
) -> (Vec<u64>, AppendError<crate::storage::SimError>) {
    let mut ram = ram();
    let (mut log, _) = Log::mount(&mut *flash, Config::default(), ram.memory(), 0).unwrap();
    let mut handed = Vec::new();
    let refused = loop {
        match log.append(0, &REC) {
            Ok(a) => handed.push(a.offset),
            Err(AppendError::Flash(e)) => panic!("flash error {e:?}"),
            Err(AppendError::OffsetsExhausted { next }) => {
                assert_eq!(next, MAX_NEXT_OFFSET);
                break AppendError::OffsetsExhausted { next };
            }
            Err(e) => panic!("{e}"),
        }
        assert!(handed.len() < 10, "offsets {handed:x?} handed out");
    };
    log.close(0).unwrap();
    (handed, refused)
}

/// Found by a break-it run: a journal entry (valid CRC) whose lease or durable end is just
/// below 2^62 mounted, and the next appends were acknowledged at offsets at and past
/// [`MAX_OFFSET`] (the bridge refused each acknowledgement and resent: one record was
/// stored six times); the lease entry of the first append named an offset past the limit,
/// so the next mount found that entry damaged. The log now hands out offsets up to
/// `MAX_OFFSET - 2`, then refuses appends with `OffsetsExhausted`; every entry it writes
/// decodes, and a remount starts where it stopped.
#[test]
fn a_journal_lease_or_durable_end_near_the_offset_limit_exhausts_offsets_without_passing_it() {
    for (lease, durable, left) in [
        (MAX_OFFSET - 1, 3, 0u64),
        (MAX_OFFSET - 3, 3, 2),
        (3, MAX_OFFSET - 1, 0),
        (3, MAX_OFFSET - 2, 1),
    ] {
        let mut flash = log_of(3);
        write_newer_entry(&mut flash, lease, durable, 1, 0);
        let (handed, _) = append_until_refused(&mut flash);
        let first = MAX_NEXT_OFFSET - left;
        assert_eq!(
            handed,
            (first..MAX_NEXT_OFFSET).collect::<Vec<_>>(),
            "lease {lease:#x} durable {durable:#x}"
        );
        // The entries written decode: the remount starts at the limit, and what was
        // appended reads back.
        let mut ram = ram();
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        assert_eq!(log.next_offset(), MAX_NEXT_OFFSET);
        let mut buf = [0u8; 256];
        if let Some(&o) = handed.first() {
            let r = log.read(o, &mut buf).unwrap();
            assert_eq!((r.first_offset, r.count as usize), (o, handed.len()));
        }
        assert!(matches!(
            log.append(0, &REC),
            Err(AppendError::OffsetsExhausted { .. })
        ));
    }
}

/// The same for a segment header (valid CRC) whose base offset is just below 2^62: the
/// head opens there, and appends stop at the limit.
#[test]
fn a_segment_base_near_the_offset_limit_exhausts_offsets_without_passing_it() {
    for left in [0u64, 2] {
        let mut flash = log_of(3);
        let hdr = segment_header(2, MAX_NEXT_OFFSET - left);
        flash.write(3 * G.erase_size, &hdr.encode()).unwrap();
        let (handed, _) = append_until_refused(&mut flash);
        assert_eq!(
            handed,
            (MAX_NEXT_OFFSET - left..MAX_NEXT_OFFSET).collect::<Vec<_>>()
        );
        assert_eq!(mount(&mut flash), MAX_NEXT_OFFSET);
    }
}

/// A valid header of a segment of [`log_of`]'s log (one block per segment, six segments,
/// log id 5, never erased before) numbered `seq` from offset `base_offset`.
fn segment_header(seq: u64, base_offset: u64) -> crate::log::format::SegmentHeader {
    crate::log::format::SegmentHeader {
        version: crate::log::format::FORMAT_VERSION,
        erase_size: G.erase_size,
        write_size: G.write_size,
        erased: G.erased,
        blocks_per_segment: 1,
        segment_count: 6,
        log_id: 5,
        seq,
        base_offset,
        prev_crc: 0,
        erase_count: 1,
        after_unclean: false,
    }
}

/// Writes an entry numbered `seq` (lease and durable end 3, `bridge` at `bridge`) after the
/// newest entry of the journal.
fn write_entry_numbered(flash: &mut SimFlash<Vec<u8>>, seq: u64, bridge: u64) {
    let (_, blk, pos) = newest_entry(flash);
    let (out, _) = entry_bytes(seq, 3, 3, 1, bridge, &[]);
    flash.write(blk * G.erase_size + pos, &out).unwrap();
}

/// Found by a QA run: with the newest journal entry numbered `2^62 - 2` (valid), the log
/// wrote entries numbered `2^62` and on, which its own mount rejects: after a restart the
/// commits made since were gone and a consumer created since had vanished. The journal
/// never writes an entry numbered at or past the limit: the write fails with
/// `SeqExhausted` (persisting commits, appends and sessions are refused, so no caller is
/// told a commit or record is safe), a journal with no room left mounts read-only, and
/// what was stored and committed stays as it was.
#[test]
fn a_journal_seq_near_the_limit_refuses_writes_and_keeps_commits() {
    use crate::error::{CommitError, SeqSpace};
    let mut flash = log_of(3);
    write_entry_numbered(&mut flash, MAX_SEQ - 2, 1);
    let journal = SeqSpace::Journal;
    for mount_seq in [MAX_SEQ - 2, MAX_SEQ - 1] {
        let mut ram = ram();
        let (mut log, report) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        assert_eq!(report.journal_seq, mount_seq);
        assert_eq!(report.journal_invalid, JournalInvalid::default());
        assert_eq!(log.commit("later", 2).unwrap(), 2, "kept in RAM");
        assert!(matches!(
            log.persist(0),
            Err(CommitError::SeqExhausted { what }) if what == journal
        ));
        assert!(matches!(
            log.append(0, &REC),
            Err(AppendError::SeqExhausted { what }) if what == journal
        ));
        let mut buf = [0u8; 256];
        let r = log.read(0, &mut buf).unwrap();
        assert_eq!(
            (r.first_offset, r.count),
            (0, 3),
            "the records stay readable"
        );
        assert_eq!(log.committed("bridge"), Some(1));
    }
    let (report, bridge) = mount_report(&mut flash);
    assert_eq!(report.journal_seq, MAX_SEQ - 1);
    assert_eq!(report.journal_invalid, JournalInvalid::default());
    assert_eq!(bridge, 1);
}

/// Found by a QA run: with the head segment's header numbered `2^62 - 1` (valid), the log
/// opened segments numbered `2^62` and on, which its own mount rejects: after a restart
/// the durably acknowledged records written there were gone. The log never opens a
/// segment numbered at or past the limit: the flush (and then the append) fails with
/// `SeqExhausted`, the records in RAM stay unacknowledged, and every record acknowledged
/// as durable reads back after a restart.
#[test]
fn a_segment_seq_near_the_limit_refuses_writes_and_keeps_durable_records() {
    use crate::error::{FlushError, SeqSpace};
    let mut flash = log_of(3);
    let hdr = segment_header(MAX_SEQ - 1, 0);
    let at = 2 * G.erase_size as usize;
    flash.bytes_mut()[at..at + hdr.encode().len()].copy_from_slice(&hdr.encode());
    let segment = SeqSpace::Segment;
    let mut ram1 = ram();
    let (mut log, _) = Log::mount(&mut flash, Config::default(), ram1.memory(), 0).unwrap();
    let mut durable = 3u64;
    loop {
        let a = log.append(0, &REC).unwrap();
        match log.flush(0) {
            Ok(_) => durable = a.offset + 1,
            Err(FlushError::SeqExhausted { what }) if what == segment => break,
            Err(e) => panic!("{e}"),
        }
        assert!(durable < 10_000, "the head segment never filled");
    }
    let refused = (0..100).find_map(|_| log.append(0, &REC).err());
    assert!(
        matches!(refused, Some(AppendError::SeqExhausted { what }) if what == segment),
        "{refused:?}"
    );
    drop(log);
    let mut ram2 = ram();
    let (mut log, _) = Log::mount(&mut flash, Config::default(), ram2.memory(), 0).unwrap();
    assert_eq!(log.durable_offset(), durable);
    let mut at = 0u64;
    let mut buf = [0u8; 1024];
    while at < durable {
        let r = log.read(at, &mut buf).unwrap();
        assert_eq!((r.first_offset, r.lost), (at, None));
        at = r.next_offset;
    }
}

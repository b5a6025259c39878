//! The commit journal: consumers' committed offsets, the offset lease and a snapshot of the
//! producer table, written as whole snapshots into two erase blocks used in turn.

use heapless::Vec;

use super::format::{
    JOURNAL_HEADER_LEN, JOURNAL_MAGIC, MAX_CONSUMER_NAME_LEN, MAX_OFFSET, MAX_SEQ, crc32,
    geometry_fits,
};
use super::producers::{MAX_PRODUCERS, Snapshot};

/// Most consumers a log tracks (the `bridge` consumer included).
pub const MAX_CONSUMERS: usize = 8;

/// Bytes of one producer in an entry of layout 1 (format version 3).
pub const PRODUCER_ENTRY_LEN: usize = 40;
/// Bytes of one producer in an entry of layout 0 (format versions 1 and 2).
pub const PRODUCER_ENTRY_LEN_V0: usize = 24;
/// The producer layout this engine writes (entry byte 63): 1, producers with sessions.
pub const PRODUCER_LAYOUT: u8 = 1;

/// Longest journal entry in bytes.
pub const MAX_ENTRY_LEN: usize = JOURNAL_HEADER_LEN
    + MAX_CONSUMERS * (1 + MAX_CONSUMER_NAME_LEN + 8)
    + MAX_PRODUCERS * PRODUCER_ENTRY_LEN;

const FLAG_CLEAN: u8 = 0x01;

const PRODUCER_HAS_LAST: u32 = 0x01;
const PRODUCER_WRAPPED: u32 = 0x02;
const PRODUCER_BEHIND: u32 = 0x04;

/// A named consumer and its committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// Name, 1 to 31 bytes.
    pub name: heapless::String<MAX_CONSUMER_NAME_LEN>,
    /// Committed offset in RAM: every offset below it is done.
    pub committed: u64,
    /// The committed offset as last persisted in the journal.
    pub persisted: u64,
}

/// A decoded journal entry (a whole snapshot).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Entry sequence number; the highest valid one wins.
    pub seq: u64,
    /// No offset below the lease has been or will be handed out without a new entry.
    pub lease: u64,
    /// The durable end when the entry was written.
    pub durable_next: u64,
    /// The log id.
    pub log_id: u128,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
    /// Erase size of the partition the entry was written on, bytes.
    pub erase_size: u32,
    /// Write size of the partition the entry was written on, bytes.
    pub write_size: u32,
    /// The erased value.
    pub erased: u8,
    /// The entry was written by a clean shutdown.
    pub clean: bool,
    /// Consumers and their committed offsets.
    pub consumers: Vec<(heapless::String<MAX_CONSUMER_NAME_LEN>, u64), MAX_CONSUMERS>,
    /// The producer table (layout 0 entries read as legacy producers, epoch 0).
    pub producers: Vec<Snapshot, MAX_PRODUCERS>,
}

/// Encodes a journal entry into `out` (at least [`MAX_ENTRY_LEN`] bytes); returns its
/// length. Producers that would make the entry longer than `max_len` are left out.
#[allow(clippy::too_many_arguments)]
pub fn encode<'c>(
    out: &mut [u8],
    max_len: usize,
    seq: u64,
    lease: u64,
    durable_next: u64,
    log_id: u128,
    geometry: (u32, u32, u8, u32),
    clean: bool,
    consumers: impl Iterator<Item = (&'c str, u64)>,
    producers: impl Iterator<Item = Snapshot>,
) -> usize {
    let mut at = JOURNAL_HEADER_LEN;
    let mut nc = 0u8;
    for (name, off) in consumers {
        let n = name.as_bytes();
        out[at] = n.len() as u8;
        out[at + 1..at + 1 + n.len()].copy_from_slice(n);
        at += 1 + n.len();
        out[at..at + 8].copy_from_slice(&off.to_le_bytes());
        at += 8;
        nc += 1;
    }
    let mut np = 0u8;
    for p in producers {
        if at + PRODUCER_ENTRY_LEN > max_len || np as usize >= MAX_PRODUCERS {
            break;
        }
        let (seq, off) = p.last.unwrap_or((0, 0));
        let flags = if p.last.is_some() {
            PRODUCER_HAS_LAST
        } else {
            0
        } | if p.wrapped { PRODUCER_WRAPPED } else { 0 }
            | if p.behind { PRODUCER_BEHIND } else { 0 };
        out[at..at + 8].copy_from_slice(&p.id.to_le_bytes());
        out[at + 8..at + 12].copy_from_slice(&p.epoch.to_le_bytes());
        out[at + 12..at + 16].copy_from_slice(&seq.to_le_bytes());
        out[at + 16..at + 24].copy_from_slice(&off.to_le_bytes());
        out[at + 24..at + 32].copy_from_slice(&p.session_from.to_le_bytes());
        out[at + 32..at + 36].copy_from_slice(&p.contiguous_from.to_le_bytes());
        out[at + 36..at + 40].copy_from_slice(&flags.to_le_bytes());
        at += PRODUCER_ENTRY_LEN;
        np += 1;
    }
    let len = at as u32;
    out[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out[8..12].copy_from_slice(&(!len).to_le_bytes());
    out[16..24].copy_from_slice(&seq.to_le_bytes());
    out[24..32].copy_from_slice(&lease.to_le_bytes());
    out[32..40].copy_from_slice(&durable_next.to_le_bytes());
    out[40..56].copy_from_slice(&log_id.to_le_bytes());
    let (erase_size, write_size, erased, blocks_per_segment) = geometry;
    out[56..60].copy_from_slice(&blocks_per_segment.to_le_bytes());
    out[64..68].copy_from_slice(&erase_size.to_le_bytes());
    out[68..70].copy_from_slice(&(write_size as u16).to_le_bytes());
    out[70] = erased;
    out[71] = 0;
    out[60] = if clean { FLAG_CLEAN } else { 0 };
    out[61] = nc;
    out[62] = np;
    out[63] = PRODUCER_LAYOUT;
    let crc = crc32(&out[16..at]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    at
}

/// Reads the entry length from a 16-byte prefix: `Some(len)` if the magic and the length
/// check agree and `len` fits in `max_len`.
pub fn entry_len(head: &[u8; 16], max_len: usize) -> Option<usize> {
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let check = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if magic != JOURNAL_MAGIC || check != !len {
        return None;
    }
    let len = len as usize;
    (JOURNAL_HEADER_LEN..=max_len.min(MAX_ENTRY_LEN))
        .contains(&len)
        .then_some(len)
}

/// Decodes a whole entry (`b` is exactly the entry's bytes); `None` if anything is off,
/// numbers included: an unknown producer layout or producer flag, an entry sequence number at
/// or above [`MAX_SEQ`], a lease, durable end, committed offset, producer offset or session
/// start at or above
/// [`MAX_OFFSET`], a zero erase size, write size or segment size, a segment
/// (`blocks_per_segment × erase_size` bytes) past 4 GiB.
pub fn decode(b: &[u8]) -> Option<Entry> {
    if b.len() < JOURNAL_HEADER_LEN {
        return None;
    }
    let crc = u32::from_le_bytes(b[12..16].try_into().ok()?);
    if crc32(&b[16..]) != crc {
        return None;
    }
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let mut e = Entry {
        seq: u64_at(16)?,
        lease: u64_at(24)?,
        durable_next: u64_at(32)?,
        log_id: u128::from_le_bytes(b[40..56].try_into().ok()?),
        blocks_per_segment: u32::from_le_bytes(b[56..60].try_into().ok()?),
        erase_size: u32::from_le_bytes(b[64..68].try_into().ok()?),
        write_size: u16::from_le_bytes(b[68..70].try_into().ok()?) as u32,
        erased: b[70],
        clean: b[60] & FLAG_CLEAN != 0,
        consumers: Vec::new(),
        producers: Vec::new(),
    };
    let (nc, np, layout) = (b[61] as usize, b[62] as usize, b[63]);
    if nc > MAX_CONSUMERS
        || layout > PRODUCER_LAYOUT
        || np > MAX_PRODUCERS
        || e.seq >= MAX_SEQ
        || e.lease >= MAX_OFFSET
        || e.durable_next >= MAX_OFFSET
        || e.erase_size == 0
        || e.write_size == 0
        || e.blocks_per_segment == 0
        || !geometry_fits(e.erase_size, e.blocks_per_segment)
    {
        return None;
    }
    let mut at = JOURNAL_HEADER_LEN;
    for _ in 0..nc {
        let n = *b.get(at)? as usize;
        if n == 0 || n > MAX_CONSUMER_NAME_LEN {
            return None;
        }
        let name = core::str::from_utf8(b.get(at + 1..at + 1 + n)?).ok()?;
        at += 1 + n;
        let off = u64_at(at)?;
        at += 8;
        if off >= MAX_OFFSET {
            return None;
        }
        let mut s = heapless::String::new();
        s.push_str(name).ok()?;
        e.consumers.push((s, off)).ok()?;
    }
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    for _ in 0..np {
        let id = u64_at(at)?;
        let p = if layout == 0 {
            // Format versions 1 and 2: id, last durable sequence, its offset, start of
            // the unbroken run; a producer without a session.
            let (seq, off) = (u32_at(at + 8)?, u64_at(at + 12)?);
            at += PRODUCER_ENTRY_LEN_V0;
            Snapshot {
                id,
                epoch: 0,
                last: Some((seq, off)),
                session_from: 0,
                contiguous_from: u32_at(at - 4)?,
                wrapped: false,
                behind: false,
            }
        } else {
            let flags = u32_at(at + 36)?;
            if flags & !(PRODUCER_HAS_LAST | PRODUCER_WRAPPED | PRODUCER_BEHIND) != 0 {
                return None;
            }
            let (seq, off) = (u32_at(at + 12)?, u64_at(at + 16)?);
            let p = Snapshot {
                id,
                epoch: u32_at(at + 8)?,
                last: (flags & PRODUCER_HAS_LAST != 0).then_some((seq, off)),
                session_from: u64_at(at + 24)?,
                contiguous_from: u32_at(at + 32)?,
                wrapped: flags & PRODUCER_WRAPPED != 0,
                behind: flags & PRODUCER_BEHIND != 0,
            };
            at += PRODUCER_ENTRY_LEN;
            p
        };
        if p.last.is_some_and(|l| l.1 >= MAX_OFFSET) || p.session_from >= MAX_OFFSET {
            return None;
        }
        e.producers.push(p).ok()?;
    }
    (at == b.len()).then_some(e)
}

#[cfg(test)]
mod tests {
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::error::AppendError;
    use crate::log::format::{Record, align_up};
    use crate::log::{Config, Log, Memory, SegmentSlot, segments_for};
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

    /// Mounts `flash` with the default config and room for every segment.
    fn mount(flash: &mut SimFlash<Vec<u8>>, buf: &mut [u8], slots: &mut [SegmentSlot]) -> u64 {
        let mem = Memory {
            buffer: buf,
            segments: slots,
        };
        let (log, _) = Log::mount(flash, Config::default(), mem, 0).unwrap();
        log.next_offset()
    }

    /// A log of `n` records, closed cleanly.
    fn log_of(n: u64) -> SimFlash<Vec<u8>> {
        let mut flash = SimFlash::new_vec(G).unwrap();
        Log::format(&mut flash, 5, 1).unwrap();
        let mut buf = vec![0u8; 1024];
        let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
        for i in 0..n {
            assert_eq!(log.append(0, &REC).unwrap().offset, i);
        }
        log.close(0).unwrap();
        flash
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
        let e = G.erase_size;
        let mut newest: Option<(u64, u32, u32)> = None;
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
                let entry = decode(&b).expect("the real log's entries decode");
                pos += align_up(len as u32, G.write_size);
                if newest.is_none_or(|n| entry.seq > n.0) {
                    newest = Some((entry.seq, blk, pos));
                }
            }
        }
        let (seq, blk, pos) = newest.expect("a formatted journal has an entry");
        let mut out = vec![0u8; MAX_ENTRY_LEN];
        let len = encode(
            &mut out,
            MAX_ENTRY_LEN,
            seq + 1,
            lease,
            durable_next,
            5,
            (G.erase_size, G.write_size, G.erased, bps),
            false,
            [("bridge", consumer_offset)].into_iter(),
            producers.iter().copied(),
        );
        out.truncate(align_up(len as u32, G.write_size) as usize);
        out[len..].fill(G.erased);
        flash.write(blk * e + pos, &out).unwrap();
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
            last: Some((seq, off)),
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
        let mut buf = vec![0u8; 1024];
        let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
        let mut offsets = Vec::new();
        {
            let mem = Memory {
                buffer: &mut buf,
                segments: &mut slots,
            };
            let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
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
            let mem = Memory {
                buffer: &mut buf,
                segments: &mut slots,
            };
            let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
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
            let mut buf = vec![0u8; 1024];
            let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
            let mem = Memory {
                buffer: &mut buf,
                segments: &mut slots,
            };
            let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
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
            let mut buf = vec![0u8; 1024];
            let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
            assert_eq!(mount(&mut flash, &mut buf, &mut slots), 6);
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
            let mut out = vec![0u8; MAX_ENTRY_LEN];
            let len = encode(
                &mut out,
                MAX_ENTRY_LEN,
                seq,
                1027,
                3,
                5,
                (G.erase_size, G.write_size, G.erased, 1),
                false,
                [("bridge", 0)].into_iter(),
                core::iter::empty(),
            );
            assert!(decode(&out[..len]).is_none(), "seq {seq:#x}");
            // Both journal blocks hold only this entry.
            flash.erase(0).unwrap();
            flash.erase(1).unwrap();
            out.truncate(align_up(len as u32, G.write_size) as usize);
            out[len..].fill(G.erased);
            flash.write(0, &out).unwrap();
            let mut buf = vec![0u8; 1024];
            let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
            let mem = Memory {
                buffer: &mut buf,
                segments: &mut slots,
            };
            let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
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
            let mut buf = vec![0u8; 1024];
            let mut slots = vec![SegmentSlot::EMPTY; segments_for(&G, 1) as usize];
            assert_eq!(mount(&mut flash, &mut buf, &mut slots), 2, "bps {bps}");
        }
    }
}

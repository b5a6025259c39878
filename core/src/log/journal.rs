//! The commit journal: consumers' committed offsets, the offset lease and a snapshot of the
//! producer table, written as whole snapshots into two erase blocks used in turn.

use heapless::Vec;

use super::format::{
    JOURNAL_HEADER_LEN, JOURNAL_MAGIC, MAX_CONSUMER_NAME_LEN, MAX_OFFSET, MAX_SEQ, crc32,
    geometry_fits,
};

/// Most consumers a log tracks (the `bridge` consumer included).
pub const MAX_CONSUMERS: usize = 8;
/// Most producers remembered for idempotent publishing.
pub const MAX_PRODUCERS: usize = 32;
/// Sequence numbers remembered per producer in RAM (a resend of one of the last
/// `PRODUCER_WINDOW` records of a producer is answered with its original offset).
pub const PRODUCER_WINDOW: usize = 4;

/// Longest journal entry in bytes.
pub const MAX_ENTRY_LEN: usize =
    JOURNAL_HEADER_LEN + MAX_CONSUMERS * (1 + MAX_CONSUMER_NAME_LEN + 8) + MAX_PRODUCERS * 24;

const FLAG_CLEAN: u8 = 0x01;

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

/// What the log remembers of one producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerState {
    /// Producer id.
    pub id: u64,
    /// The last records' `(sequence, offset)`, oldest first, at most [`PRODUCER_WINDOW`].
    pub window: Vec<(u32, u64), PRODUCER_WINDOW>,
    /// Every sequence from this one up to the last was stored (no sequence skipped since):
    /// a resend at or above it, older than the window, is known to be stored.
    pub contiguous_from: u32,
}

impl ProducerState {
    /// The highest sequence seen.
    pub fn last_seq(&self) -> Option<u32> {
        self.window.last().map(|w| w.0)
    }

    /// A producer whose first remembered record is `(seq, offset)`.
    pub fn new(id: u64, seq: u32, offset: u64) -> Self {
        let mut st = ProducerState {
            id,
            window: Vec::new(),
            contiguous_from: seq,
        };
        let _ = st.window.push((seq, offset));
        st
    }

    /// Records `(seq, offset)` (a sequence above the last), forgetting the oldest when the
    /// window is full. A skipped sequence restarts the contiguous run.
    pub fn push(&mut self, seq: u32, offset: u64) {
        if self.last_seq().is_some_and(|l| seq != l.wrapping_add(1)) {
            self.contiguous_from = seq;
        }
        if self.window.is_full() {
            self.window.remove(0);
        }
        let _ = self.window.push((seq, offset));
    }
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
    /// Producers: `(id, last durable sequence, its offset, start of its contiguous run)`.
    pub producers: Vec<(u64, u32, u64, u32), MAX_PRODUCERS>,
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
    producers: impl Iterator<Item = (u64, u32, u64, u32)>,
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
    for (id, pseq, off, from) in producers {
        if at + 24 > max_len || np as usize >= MAX_PRODUCERS {
            break;
        }
        out[at..at + 8].copy_from_slice(&id.to_le_bytes());
        out[at + 8..at + 12].copy_from_slice(&pseq.to_le_bytes());
        out[at + 12..at + 20].copy_from_slice(&off.to_le_bytes());
        out[at + 20..at + 24].copy_from_slice(&from.to_le_bytes());
        at += 24;
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
    out[63] = 0;
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
/// numbers included: an entry sequence number at or above [`MAX_SEQ`], a lease, durable end, committed offset or producer offset at or above
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
    let (nc, np) = (b[61] as usize, b[62] as usize);
    if nc > MAX_CONSUMERS
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
    for _ in 0..np {
        let id = u64_at(at)?;
        let seq = u32::from_le_bytes(b.get(at + 8..at + 12)?.try_into().ok()?);
        let off = u64_at(at + 12)?;
        let from = u32::from_le_bytes(b.get(at + 20..at + 24)?.try_into().ok()?);
        at += 24;
        if off >= MAX_OFFSET {
            return None;
        }
        e.producers.push((id, seq, off, from)).ok()?;
    }
    (at == b.len()).then_some(e)
}

#[cfg(test)]
mod tests {
    use std::vec;
    use std::vec::Vec;

    use super::*;
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
            core::iter::empty(),
        );
        out.truncate(align_up(len as u32, G.write_size) as usize);
        out[len..].fill(G.erased);
        flash.write(blk * e + pos, &out).unwrap();
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

//! Ring retention: whether the flash has room, opening the next segment of the ring, and
//! reclaiming (or, under `DropOldest`, dropping) the oldest one, counting the records it
//! loses unread.

use super::Log;
use super::config::{FullPolicy, SegmentSlot};
use super::device::Io;
use super::format::{
    BATCH_HEADER_LEN, BatchHeader, FORMAT_VERSION, HeadCheck, JOURNAL_BLOCKS, MAX_SEQ, RESUME_LEN,
    SegmentHeader, align_up,
};
use super::journal::Consumer;
use super::scan::{Next, Prev};
use super::short::{self, SHORT_VERSION};
use crate::error::{FlushError, SeqSpace};
use crate::storage::Flash;

impl<'a, F: Flash> Log<'a, F> {
    /// Whether the flash can take `bytes` of records now (looking at the head segment and
    /// the one after it).
    pub(super) fn flash_has_room(&self, bytes: usize) -> bool {
        let l = self.dev.l;
        let marker = if self.resume.is_some() { RESUME_LEN } else { 0 };
        if let Some(_h) = self.head
            && self.head_writable
            && self.head_pos as usize + marker + align_up(bytes as u32, l.ws()) as usize
                <= l.seg_size as usize
        {
            return true;
        }
        let target = self.head.map_or(0, |h| (h + 1) % l.seg_count);
        if !self.slots[target as usize].valid || Some(target) == self.head {
            return true;
        }
        let end = self.segment_end(target);
        end <= self.min_commit(|c| c.committed)
    }

    pub(super) fn min_commit(&self, f: impl Fn(&Consumer) -> u64) -> u64 {
        self.consumers.iter().map(f).min().unwrap_or(u64::MAX)
    }

    /// One past the last offset segment `seg` can hold: the base of the next valid segment
    /// in ring order, or for the head the start of the RAM buffer.
    pub(super) fn segment_end(&self, seg: u32) -> u64 {
        if Some(seg) == self.head {
            return if self.buf_count > 0 {
                self.buf_base
            } else {
                self.next_offset
            };
        }
        let n = self.dev.l.seg_count;
        for i in 1..n {
            let s = ((seg + i) % n) as usize;
            if self.slots[s].valid {
                return self.slots[s].base;
            }
        }
        self.next_offset
    }

    /// Opens the next segment in the ring for the records starting at the buffer's base,
    /// reclaiming (or, under `DropOldest`, dropping) the oldest segment if the ring is full.
    pub(super) fn roll(&mut self) -> Result<(), FlushError<F::Error>> {
        let l = self.dev.l;
        // A header numbered at or past the limit would not validate at the next mount (the
        // segment's durable records would be gone): refuse before reclaiming anything.
        if self.max_seq + 1 >= MAX_SEQ {
            return Err(FlushError::SeqExhausted {
                what: SeqSpace::Segment,
            });
        }
        let target = self.head.map_or(0, |h| (h + 1) % l.seg_count);
        let slot = self.slots[target as usize];
        let reclaiming = slot.valid && Some(target) != self.head;
        if reclaiming {
            let end = self.segment_end(target);
            if end > self.min_commit(|c| c.persisted) {
                if end <= self.min_commit(|c| c.committed.min(self.durable_end)) {
                    self.persist_journal(false)?;
                }
                if end > self.min_commit(|c| c.persisted) {
                    match self.cfg.full {
                        FullPolicy::RejectNew => return Err(FlushError::Full),
                        FullPolicy::DropOldest => {
                            warn!("ring full: dropping offsets {}..{}", slot.base, end);
                        }
                    }
                }
            }
            // Count what nobody has read: at or after the lowest committed offset, or with
            // no consumer left, the highest committed offset of those deleted.
            let read_below = if self.consumers.is_empty() {
                self.released
            } else {
                self.min_commit(|c| c.committed)
            };
            if end > read_below.max(slot.base) {
                let unread = self.count_records(target, read_below, end)?;
                if unread > 0 {
                    warn!(
                        "reclaiming segment {}: {} records at offsets {}..{} were never read",
                        target,
                        unread,
                        read_below.max(slot.base),
                        end
                    );
                }
                self.dev.stats.records_dropped += unread;
            }
        }
        let base = if self.buf_count > 0 {
            self.buf_base
        } else {
            self.next_offset
        };
        // Invalidate the slot before erasing: a crash from here on leaves it invalid.
        self.slots[target as usize].valid = false;
        if self.damaged.is_some_and(|d| d.seg == target) {
            // The damaged segment is reused: its offsets are gone like dropped ones.
            self.damaged = None;
        }
        if self.cursor.is_some_and(|c| c.seg == target) {
            self.cursor = None;
        }
        if self.last_batch.is_some_and(|c| c.seg == target) {
            self.last_batch = None;
        }
        if self.read_start.is_some_and(|c| c.seg == target) {
            self.read_start = None;
        }
        if self.index_seg.is_some_and(|s| s.0 == target) {
            self.index_seg = None;
        }
        if reclaiming && self.tail == Some(target) {
            self.tail = self.next_valid_after(target);
        }
        self.dev
            .erase_verified(JOURNAL_BLOCKS + target * l.bps, l.bps)?;
        let erase_count = slot.erase_count.saturating_add(1);
        let seq = self.max_seq + 1;
        let hdr = SegmentHeader {
            version: FORMAT_VERSION,
            erase_size: l.geo.erase_size,
            write_size: l.geo.write_size,
            erased: l.geo.erased,
            blocks_per_segment: l.bps,
            segment_count: l.seg_count,
            log_id: self.log_id,
            seq,
            base_offset: base,
            prev_crc: self.buf_prev_crc,
            erase_count,
            after_unclean: self.unclean_pending,
        };
        self.dev
            .write_padded(l.seg_addr(target), &hdr.encode())
            .map_err(FlushError::Flash)?;
        self.max_seq = seq;
        self.slots[target as usize] = SegmentSlot {
            seq,
            base,
            erase_count,
            valid: true,
            after_unclean: self.unclean_pending,
            version: FORMAT_VERSION,
        };
        self.unclean_pending = false;
        self.resume = None;
        self.short_link = None;
        self.head = Some(target);
        self.head_pos = l.data_start;
        self.head_writable = true;
        if self.tail.is_none() {
            self.tail = Some(target);
        }
        self.dev.stats.segments_opened += 1;
        debug!("opened segment {} (seq {}, base {})", target, seq, base);
        // A fresh snapshot bounds the producer rebuild at the next mount to this segment.
        self.persist_journal(false)?;
        Ok(())
    }

    /// Records of segment `seg` (not the head) whose offsets are in `from..to`, counted
    /// from the batch headers of its data: a header whose magic and length check agree,
    /// whose base offset continues the segment and whose records end by `to` is taken as
    /// it is (one 32-byte read per batch, no CRC over the data); anything else (torn bytes,
    /// a resume marker, damage) goes through the full check of
    /// [`Dev::next_batch`](super::device::Dev::next_batch), so a corrupt batch's records,
    /// lost already, are not counted. A short batch tag right after a batch a short batch
    /// can follow is taken the same way: one record at the next offset, skipped by the
    /// length its tag and length bytes give.
    fn count_records(&mut self, seg: u32, from: u64, to: u64) -> Result<u64, Io<F::Error>> {
        let l = self.dev.l;
        let mut pos = l.data_start;
        let mut expected = self.slots[seg as usize].base;
        let mut n = 0u64;
        let version = self.slots[seg as usize].version;
        let mut prev = Prev::None;
        // Whether a short batch may follow what was taken last.
        let mut chain = false;
        while expected < to && pos < l.seg_size {
            let mut hb = [0u8; BATCH_HEADER_LEN];
            let got = (l.seg_size - pos).min(BATCH_HEADER_LEN as u32) as usize;
            self.dev
                .read(l.seg_addr(seg) + pos, &mut hb[..got])
                .map_err(Io::Flash)?;
            if chain && got >= 2 && short::is_tag(hb[0], l.geo.erased) {
                n += u64::from(expected >= from);
                pos = pos.saturating_add(align_up(short::total_len(hb[0], hb[1]), l.ws()));
                expected += 1;
                // Not checked: a batch that needs the full check starts without a link.
                prev = Prev::None;
                continue;
            }
            let quick = if got == BATCH_HEADER_LEN {
                match BatchHeader::check(&hb, l.geo.erased, l.seg_size - pos) {
                    // Erased may still be followed by a resume marker: the full search.
                    HeadCheck::Erased | HeadCheck::Invalid => None,
                    HeadCheck::Plausible => Some(BatchHeader::decode(&hb))
                        .filter(|h| h.base_offset >= expected && h.end_offset() <= to),
                }
            } else {
                None
            };
            let (p, h, short) = match quick {
                Some(h) => (pos, h, None),
                None => match self
                    .dev
                    .next_batch(seg, pos, expected, prev)
                    .map_err(Io::Flash)?
                {
                    Next::End { .. } => break,
                    Next::Batch {
                        pos: p, h, short, ..
                    } => (p, h, short),
                },
            };
            prev = Prev::after(version, p, &h, short);
            chain = short.is_some() || (version >= SHORT_VERSION && h.count == 1);
            n += h
                .end_offset()
                .min(to)
                .saturating_sub(h.base_offset.max(from));
            pos = p.saturating_add(align_up(h.len, l.ws()));
            expected = h.end_offset();
        }
        Ok(n)
    }

    /// The next valid segment after `seg` in ring order, if any.
    pub(super) fn next_valid_after(&self, seg: u32) -> Option<u32> {
        let n = self.dev.l.seg_count;
        (1..n)
            .map(|i| (seg + i) % n)
            .find(|&s| self.slots[s as usize].valid)
    }
}

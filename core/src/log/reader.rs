//! Reading records by offset: from RAM or flash (a binary search over the segments, a
//! sparse batch index and the sequential reader's cursor inside one), batches larger than
//! the caller's buffer, the ranges that cannot be read, and a poisoned log's reads.

use super::Log;
use super::compact::COMPACT_VERSION;
use super::compact_io::CompactRead;
use super::device::{CHUNK, READ_ATTEMPTS};
use super::format;
use super::format::{BATCH_HEADER_LEN, BatchHeader, align_up, parse_record_fields};
use super::outcome::{LostRange, LostReason, ReadOutcome};
use super::scan::{Next, Prev};
use crate::error::ReadError;
use crate::storage::Flash;

/// Entries of the sparse batch index kept for the last segment scanned.
pub(super) const INDEX_ENTRIES: usize = 16;

/// Where a sequential reader left off in a segment.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor {
    pub(super) seg: u32,
    pub(super) seq: u64,
    pub(super) pos: u32,
    pub(super) expected: u64,
    /// What lies before `pos` (for a short batch there).
    pub(super) prev: Prev,
}

/// Whether `b` holds exactly `count` well-formed record encodings, the first at `first`.
pub(super) fn parses_exactly(b: &[u8], first: u64, count: u32) -> bool {
    let mut at = 0usize;
    for i in 0..u64::from(count) {
        match parse_record_fields(&b[at..], first + i) {
            Some((_, n)) => at += n,
            None => return false,
        }
    }
    at == b.len()
}

/// An outcome with no records yet at `from` (the start of a read, or the end of the log),
/// `prev_crc` the record CRC of the record before `from` if known (else 0).
fn empty(from: u64, prev_crc: u32) -> ReadOutcome {
    ReadOutcome {
        first_offset: from,
        count: 0,
        len: 0,
        prev_crc,
        next_offset: from,
        lost: None,
    }
}

/// An outcome that reports `from..to` as lost.
pub(super) fn lost(from: u64, to: u64, reason: LostReason) -> ReadOutcome {
    ReadOutcome {
        first_offset: from,
        count: 0,
        len: 0,
        prev_crc: 0,
        next_offset: to,
        lost: Some(LostRange { from, to, reason }),
    }
}

impl<'a, F: Flash> Log<'a, F> {
    /// Reads records from offset `from` into `buf`: as many whole records as fit, at least
    /// one (RAM first, then flash; a binary search over the segments, then a sparse index
    /// and the sequential reader's cursor inside the segment). Every record returned comes
    /// from a batch whose CRC was checked.
    ///
    /// `from == next_offset()` returns no records. If `from` falls in a range that cannot
    /// be read, the outcome's `lost` names the exact range and `next_offset` is past it.
    ///
    /// Errors: [`ReadError::OffsetOutOfRange`] above the next offset,
    /// [`ReadError::Dropped`] below the first retained offset,
    /// [`ReadError::BufferTooSmall`] when the first record does not fit, storage errors.
    pub fn read(&mut self, from: u64, buf: &mut [u8]) -> Result<ReadOutcome, ReadError<F::Error>> {
        let out = if self.dev.failed.is_some() {
            self.read_durable(from, buf)?
        } else {
            self.read_any(from, buf)?
        };
        let out = self.damaged_not_skipped(out);
        if let Some(l) = out.lost
            && l.reason == LostReason::Corrupt
        {
            self.count_corrupt(l.from, l.to);
        }
        Ok(out)
    }

    /// A range read as skipped (never persisted) that overlaps the durable offsets the
    /// mount found damaged at the head's end is cut there: the damaged part is corrupt.
    fn damaged_not_skipped(&self, out: ReadOutcome) -> ReadOutcome {
        let (Some((a, b)), Some(l)) = (self.damaged_at_head_end, out.lost) else {
            return out;
        };
        if l.reason != LostReason::Skipped || l.to <= a || l.from >= b {
            return out;
        }
        if l.from < a {
            return lost(l.from, a, LostReason::Skipped);
        }
        lost(l.from, l.to.min(b), LostReason::Corrupt)
    }

    /// Adds the offsets of the corrupt range `from..to` not counted yet to
    /// [`Stats::corrupt_offsets`](super::Stats::corrupt_offsets) (a range read again, or
    /// overlapping one counted, adds only what is new).
    pub(super) fn count_corrupt(&mut self, from: u64, to: u64) {
        // The parts of `from..to` not covered by a remembered range: a range is cut by each
        // remembered one into at most two pieces, so walk it as a sorted sweep.
        let mut new = 0u64;
        let mut at = from;
        while at < to {
            // The remembered range covering `at`, if any, moves `at` past it.
            if let Some(&(_, e)) = self.corrupt_seen.iter().find(|r| r.0 <= at && at < r.1) {
                at = e;
                continue;
            }
            // Otherwise count up to the next remembered range's start (or `to`).
            let next = self
                .corrupt_seen
                .iter()
                .filter(|r| r.0 > at)
                .map(|r| r.0)
                .min()
                .unwrap_or(to)
                .min(to);
            new += next - at;
            at = next;
        }
        if new == 0 {
            return;
        }
        self.dev.stats.corrupt_offsets += new;
        if self.corrupt_seen.is_full() {
            self.corrupt_seen.remove(0);
        }
        let _ = self.corrupt_seen.push((from, to));
    }

    /// A poisoned log's read: only offsets below the durable offset are served (what is
    /// above may never have reached flash); at or past it a read returns no records.
    fn read_durable(
        &mut self,
        from: u64,
        buf: &mut [u8],
    ) -> Result<ReadOutcome, ReadError<F::Error>> {
        let end = self.durable_end;
        if from >= end && from <= self.next_offset {
            let prev_crc = if from == self.next_offset {
                self.newest_crc()
            } else {
                0
            };
            return Ok(empty(from, prev_crc));
        }
        let mut out = self.read_any(from, buf)?;
        if out.next_offset <= end {
            return Ok(out);
        }
        if let Some(lost) = out.lost.as_mut() {
            lost.to = lost.to.min(end);
            out.next_offset = lost.to;
            return Ok(out);
        }
        // Keep the records below `end` (whole batches are durable or not, so this cuts
        // only when the read went on into a batch written after the last good sync).
        let (mut at, mut count) = (0usize, 0u32);
        while count < out.count && out.first_offset + u64::from(count) < end {
            let Some((_, len)) =
                parse_record_fields(&buf[at..out.len], out.first_offset + u64::from(count))
            else {
                break;
            };
            at += len;
            count += 1;
        }
        out.count = count;
        out.len = at;
        out.next_offset = out.first_offset + u64::from(count);
        Ok(out)
    }

    fn read_any(&mut self, from: u64, buf: &mut [u8]) -> Result<ReadOutcome, ReadError<F::Error>> {
        if from > self.next_offset {
            return Err(ReadError::OffsetOutOfRange {
                offset: from,
                next: self.next_offset,
            });
        }
        if from == self.next_offset {
            return Ok(empty(from, self.newest_crc()));
        }
        let first = self.first_offset();
        if from < first {
            return Err(ReadError::Dropped {
                offset: from,
                first_available: first,
            });
        }
        if let Some((_, to)) = self.damaged_before_tail()
            && from < to
        {
            return Ok(lost(from, to, LostReason::Corrupt));
        }
        if self.buf_count > 0 && from >= self.buf_base {
            return self.read_ram(from, buf);
        }
        if from >= self.flash_end {
            let to = if self.buf_count > 0 {
                self.buf_base
            } else {
                self.next_offset
            };
            return Ok(lost(from, to, LostReason::Skipped));
        }
        self.read_flash(from, buf)
    }

    fn read_ram(&mut self, from: u64, buf: &mut [u8]) -> Result<ReadOutcome, ReadError<F::Error>> {
        let skip = (from - self.buf_base) as u32;
        let (_, skip_bytes, prev_crc) = self.buffered_fit(skip, usize::MAX);
        let start = BATCH_HEADER_LEN + skip_bytes;
        let mut at = start;
        let mut n = 0u32;
        while at < self.buf_len {
            let Some((_, len)) = parse_record_fields(&self.buf[at..self.buf_len], from + n as u64)
            else {
                break;
            };
            if at - start + len > buf.len() {
                if n == 0 {
                    return Err(ReadError::BufferTooSmall { needed: len });
                }
                break;
            }
            at += len;
            n += 1;
        }
        buf[..at - start].copy_from_slice(&self.buf[start..at]);
        Ok(ReadOutcome {
            first_offset: from,
            count: n,
            len: at - start,
            prev_crc,
            next_offset: from + n as u64,
            lost: None,
        })
    }

    /// The valid segment with the largest base offset ≤ `offset` (binary search over the
    /// ring from the tail; invalid slots count as their nearest valid left neighbour).
    fn find_segment(&self, offset: u64) -> Option<u32> {
        let n = self.dev.l.seg_count;
        let tail = self.tail?;
        let head = self.head?;
        let span = (head + n - tail) % n + 1;
        let phys = |i: u32| (tail + i) % n;
        let (mut lo, mut hi) = (0u32, span);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let mut v = mid;
            while v > lo && !self.slots[phys(v) as usize].valid {
                v -= 1;
            }
            let slot = self.slots[phys(v) as usize];
            if !slot.valid {
                lo = mid + 1;
                continue;
            }
            if slot.base <= offset {
                found = Some(phys(v));
                lo = mid + 1;
            } else {
                hi = v;
            }
        }
        found
    }

    pub(super) fn read_flash(
        &mut self,
        from: u64,
        buf: &mut [u8],
    ) -> Result<ReadOutcome, ReadError<F::Error>> {
        let l = self.dev.l;
        let Some(seg) = self.find_segment(from) else {
            let first = self.first_offset();
            return Err(ReadError::Dropped {
                offset: from,
                first_available: first,
            });
        };
        let slot = self.slots[seg as usize];
        let compact = slot.version >= COMPACT_VERSION;
        let seg_end = self.segment_end(seg);
        // Where to start scanning: the cursor, the last batch read through, the first
        // batch of the last read, the sparse index, or the segment start.
        let (mut pos, mut expected) = (l.data_start, slot.base);
        // The index holds full batches only: a walk from one needs nothing before it.
        let mut prev = Prev::None;
        if self.index_seg == Some((seg, slot.seq)) {
            for &(p, e) in self.index.iter() {
                if e <= from && e >= expected {
                    (pos, expected) = (p, e);
                }
            }
        } else {
            self.index_seg = Some((seg, slot.seq));
            self.index.clear();
        }
        // The cursor, the start of the last batch read through or the last read's first
        // batch (each behind the one after it, so tried first: the nearest one at or
        // before `from` wins).
        for c in [self.read_start, self.last_batch, self.cursor]
            .into_iter()
            .flatten()
        {
            if c.seg == seg && c.seq == slot.seq && c.expected <= from && c.expected >= expected {
                (pos, expected, prev) = (c.pos, c.expected, c.prev);
            }
        }
        let mut corrupt_before = false;
        let mut out = empty(from, 0);
        // A compact batch taken on its header alone that then did not check: found again
        // the slow way, which validates (and re-reads) it before it is believed bad.
        let mut unchecked_failed_at = None;
        loop {
            // A compressed batch decoded into the scratch by an earlier read was validated
            // then: a read that goes on inside it does not read it again.
            #[cfg(feature = "compression")]
            let held = self.scratch.holds.and_then(|held| {
                (held.addr == l.seg_addr(seg) + pos && held.h.base_offset >= expected)
                    .then_some(held.h)
            });
            #[cfg(not(feature = "compression"))]
            let held = None;
            // Fast path: the batch at `pos` holds the next wanted offset and fits in the
            // rest of `buf`: it is read once, straight into `buf`, and checked there. A
            // compact batch is taken on a plausible header: decoding it checks its CRC.
            let mut unchecked = false;
            let fast = if held.is_some() {
                held
            } else if compact {
                let h = if unchecked_failed_at == Some(pos) {
                    None
                } else {
                    self.dev
                        .wanted_header(seg, pos, expected, out.next_offset)
                        .map_err(ReadError::Flash)?
                        .map(|(_, h)| h)
                };
                unchecked = h.is_some();
                h
            } else {
                self.dev
                    .read_wanted_batch(seg, pos, expected, out.next_offset, &mut buf[out.len..])
                    .map_err(ReadError::Flash)?
            };
            // A short batch right after the record just walked (its link known): read and
            // checked once, its record copied into `buf` in the same pass. If it does not
            // check, the slow way below reads it again (with re-reads) before it is
            // believed bad.
            let mut short_read = None;
            if fast.is_none()
                && let Prev::Link(link) = prev
                && let Some(s) = self
                    .dev
                    .short_at(
                        l.seg_addr(seg) + pos,
                        l.seg_size.saturating_sub(pos),
                        &link,
                        &mut buf[out.len..],
                    )
                    .map_err(ReadError::Flash)?
                && s.h.base_offset >= expected
            {
                short_read = Some((link, s));
            }
            let next = match (fast, short_read) {
                (Some(h), _) => Next::Batch {
                    pos,
                    h,
                    after_corruption: false,
                    short: None,
                },
                (None, Some((link, s))) => Next::Batch {
                    pos,
                    h: s.h,
                    after_corruption: false,
                    short: Some((link, s.out)),
                },
                (None, None) => self
                    .dev
                    .next_batch(seg, pos, expected, prev)
                    .map_err(ReadError::Flash)?,
            };
            let batch = match next {
                Next::End { corrupt, .. } => {
                    if out.count > 0 {
                        return Ok(out);
                    }
                    if corrupt {
                        self.dev.stats.corrupt_batches += 1;
                    }
                    // A segment abandoned by an unclean shutdown may end in a torn write:
                    // what follows its last valid batch was never durable.
                    let abandoned = Some(seg) != self.head
                        && self
                            .next_valid_after(seg)
                            .is_some_and(|n| self.slots[n as usize].after_unclean);
                    // Between the tail and the head every segment holds records: one whose
                    // header does not validate is damage, and its offsets are corrupt.
                    let n = self.dev.l.seg_count;
                    let damaged_next =
                        Some(seg) != self.head && !self.slots[((seg + 1) % n) as usize].valid;
                    let reason = if corrupt_before || damaged_next || (corrupt && !abandoned) {
                        LostReason::Corrupt
                    } else {
                        LostReason::Skipped
                    };
                    let to = seg_end.max(from + 1);
                    return Ok(lost(from, to, reason));
                }
                Next::Batch {
                    pos: p,
                    h,
                    after_corruption,
                    short,
                } => {
                    if after_corruption {
                        self.dev.stats.corrupt_batches += 1;
                        prev = Prev::None;
                    }
                    corrupt_before = after_corruption;
                    (p, h, short)
                }
            };
            let (p, h, short) = batch;
            let before = prev;
            prev = Prev::after(slot.version, p, &h, short);
            let after = p + align_up(h.len, l.ws());
            if h.end_offset() <= from {
                if short.is_none() {
                    self.note_index(p, h.base_offset);
                }
                pos = after;
                expected = h.end_offset();
                continue;
            }
            if h.base_offset > from.max(out.next_offset)
                || (out.count > 0 && h.base_offset != out.next_offset)
            {
                if out.count > 0 {
                    return Ok(out);
                }
                // `from` sits in a gap before this batch. The next read starts at this
                // batch, without validating what lies before it again.
                self.cursor = Some(Cursor {
                    seg,
                    seq: slot.seq,
                    pos: p,
                    expected: h.base_offset,
                    prev: before,
                });
                let reason = if corrupt_before {
                    LostReason::Corrupt
                } else {
                    LostReason::Skipped
                };
                return Ok(lost(from, h.base_offset, reason));
            }
            // This batch holds `out.next_offset`: copy its records from there.
            let want = out.next_offset;
            // The batch read again, the buffer full before its end: the next read starts
            // at this batch.
            let stop_here = Cursor {
                seg,
                seq: slot.seq,
                pos: p,
                expected: h.base_offset,
                prev: before,
            };
            // Each kind of batch copies its records at or after `want` into `buf`:
            // how many, their bytes, and the record CRC before the first.
            let (count, len, prev_crc) = if let Some((link, _)) = short {
                let addr = l.seg_addr(seg) + p;
                let room = &mut buf[out.len..];
                // Read already by the fast path above, into the same place of `buf`.
                let mut got = short_read.map(|(_, s)| s);
                let attempts = if got.is_some() { 0 } else { READ_ATTEMPTS };
                for _ in 0..attempts {
                    got = self
                        .dev
                        .short_at(addr, l.seg_size - p, &link, room)
                        .map_err(ReadError::Flash)?;
                    if got.is_some() {
                        break;
                    }
                }
                let Some(s) = got else {
                    // Changed since it was validated: corrupt.
                    if out.count > 0 {
                        return Ok(out);
                    }
                    self.dev.stats.corrupt_batches += 1;
                    return Ok(lost(from, h.end_offset(), LostReason::Corrupt));
                };
                if !s.copied {
                    if out.count == 0 {
                        return Err(ReadError::BufferTooSmall {
                            needed: s.canonical_len,
                        });
                    }
                    self.cursor = Some(stop_here);
                    return Ok(out);
                }
                self.dev.stats.short_batches_read += 1;
                (1, s.canonical_len, h.prev_crc)
            } else if compact {
                let addr = l.seg_addr(seg) + p;
                let room = &mut buf[out.len..];
                // One read of a batch taken on its header alone, as the canonical fast
                // path: if it does not check, the slow way validates it with re-reads.
                let attempts = if unchecked { 1 } else { READ_ATTEMPTS };
                let got = self
                    .dev
                    .read_compact(addr, &h, &mut self.scratch, want, room, attempts)
                    .map_err(ReadError::Flash)?;
                match got {
                    CompactRead::Records {
                        count,
                        len,
                        prev_crc,
                    } if count > 0 => (count, len, prev_crc),
                    // Not checked yet (a compressed body is sized before its CRC is
                    // checked): the slow way validates the batch first.
                    CompactRead::Corrupt | CompactRead::ScratchTooSmall { .. } if unchecked => {
                        unchecked_failed_at = Some(p);
                        continue;
                    }
                    CompactRead::TooSmall { needed } if out.count == 0 => {
                        return Err(ReadError::BufferTooSmall { needed });
                    }
                    CompactRead::ScratchTooSmall { needed } if out.count == 0 => {
                        return Err(ReadError::ScratchTooSmall {
                            needed,
                            len: self.scratch.buf.len(),
                        });
                    }
                    CompactRead::Corrupt if out.count == 0 => {
                        self.dev.stats.corrupt_batches += 1;
                        return Ok(lost(from, h.end_offset(), LostReason::Corrupt));
                    }
                    _ => return Ok(out),
                }
            } else {
                let body_len = (h.len as usize) - BATCH_HEADER_LEN;
                let room = buf.len() - out.len;
                if body_len > room {
                    if out.count > 0 {
                        return Ok(out);
                    }
                    // The batch is larger than the buffer: copy record by record.
                    return self.read_large_batch(seg, p, &h, want, buf);
                }
                let body_addr = l.seg_addr(seg) + p + BATCH_HEADER_LEN as u32;
                let dst = &mut buf[out.len..out.len + body_len];
                let mut crc_ok = fast.is_some();
                for _ in 0..if crc_ok { 0 } else { READ_ATTEMPTS } {
                    self.dev.read(body_addr, dst).map_err(ReadError::Flash)?;
                    let mut crc = crate::crc::Hasher::new();
                    crc.update(&BatchHeader::encode(&h)[16..]);
                    crc.update(dst);
                    if crc.finalize() == h.crc {
                        crc_ok = true;
                        break;
                    }
                }
                let skip = want - h.base_offset;
                let walked = if crc_ok {
                    format::walk_records(dst, h.base_offset, h.count, skip, h.prev_crc)
                } else {
                    None
                };
                let Some((skip_len, prev_crc)) = walked else {
                    // Changed since it was validated: treat as corrupt at the next read.
                    if out.count > 0 {
                        return Ok(out);
                    }
                    self.dev.stats.corrupt_batches += 1;
                    return Ok(lost(from, h.end_offset(), LostReason::Corrupt));
                };
                dst.copy_within(skip_len.., 0);
                (h.count - skip as u32, body_len - skip_len, prev_crc)
            };
            if out.count == 0 {
                out.prev_crc = prev_crc;
                self.read_start = Some(stop_here);
            }
            out.len += len;
            out.count += count;
            out.next_offset = want + u64::from(count);
            // The index holds full batches only: a short batch needs the record before it.
            if short.is_none() {
                self.note_index(p, h.base_offset);
            }
            if out.next_offset < h.end_offset() {
                // The buffer is full: the next read starts at this batch again.
                self.cursor = Some(stop_here);
                return Ok(out);
            }
            self.cursor = Some(Cursor {
                seg,
                seq: slot.seq,
                pos: after,
                expected: h.end_offset(),
                prev,
            });
            self.last_batch = Some(stop_here);
            pos = after;
            expected = h.end_offset();
            if out.next_offset >= seg_end || out.next_offset >= self.flash_end {
                return Ok(out);
            }
        }
    }

    fn note_index(&mut self, pos: u32, base: u64) {
        let spacing = self.dev.l.seg_size / INDEX_ENTRIES as u32;
        let far_enough = self
            .index
            .last()
            .is_none_or(|&(p, b)| pos >= p + spacing && base > b);
        if far_enough && !self.index.is_full() {
            let _ = self.index.push((pos, base));
        }
    }

    /// Reads records of one already validated batch that does not fit in `buf` whole. The
    /// records are copied record by record, twice, going by lengths read from flash; the
    /// two copies must agree, and a third pass over the whole batch checks its CRC and
    /// that the bytes copied (and the record before them, for `prev_crc`) read the same
    /// in it. A read that disagrees is done again, up to [`READ_ATTEMPTS`] times, then the
    /// batch is reported corrupt. (A cell that reads wrong the same way in both copies,
    /// inside a record length, can still misplace the copy: the remaining risk of this
    /// path, which only batches larger than the caller's buffer take.)
    fn read_large_batch(
        &mut self,
        seg: u32,
        pos: u32,
        h: &BatchHeader,
        from: u64,
        buf: &mut [u8],
    ) -> Result<ReadOutcome, ReadError<F::Error>> {
        let l = self.dev.l;
        let body = l.seg_addr(seg) + pos + BATCH_HEADER_LEN as u32;
        let body_len = h.len - BATCH_HEADER_LEN as u32;
        for _ in 0..READ_ATTEMPTS {
            // Two copy passes must agree on the record lengths they went by and on the
            // bytes copied: a length read wrong once would otherwise place the copy on
            // other records' bytes, consistently with the check below.
            // A record too large for `buf` is believed when both passes say so.
            let first = match self.read_large_batch_once(body, h, from, buf) {
                Err(ReadError::BufferTooSmall { needed }) => Err(needed),
                other => Ok(other?),
            };
            let first_crc = match &first {
                Ok(f) => format::crc32(&buf[..f.0.len.min(buf.len())]),
                Err(_) => 0,
            };
            let second = match self.read_large_batch_once(body, h, from, buf) {
                Err(ReadError::BufferTooSmall { needed }) => Err(needed),
                other => Ok(other?),
            };
            let (first, (out, prev_at, copy_at)) = match (first, second) {
                (Ok(f), Ok(s)) => (f, s),
                (Err(a), Err(b)) if a == b => {
                    return Err(ReadError::BufferTooSmall { needed: a });
                }
                _ => continue,
            };
            if out.count == 0
                || first != (out, prev_at, copy_at)
                || first_crc != format::crc32(&buf[..out.len])
            {
                continue;
            }
            let mut full = crate::crc::Hasher::new();
            full.update(&BatchHeader::encode(h)[16..]);
            let mut prev = crate::crc::Hasher::new();
            prev.update(&from.wrapping_sub(1).to_le_bytes());
            let mut copy = crate::crc::Hasher::new();
            let prev_range = prev_at.map_or((0, 0), |(a, n)| (a, a + n));
            let copy_range = (copy_at, copy_at + out.len as u32);
            let mut chunk = [0u8; CHUNK];
            let mut at = 0u32;
            while at < body_len {
                let n = (body_len - at).min(CHUNK as u32);
                let a = body + at;
                self.dev
                    .read(a, &mut chunk[..n as usize])
                    .map_err(ReadError::Flash)?;
                full.update(&chunk[..n as usize]);
                for (r, hasher) in [(prev_range, &mut prev), (copy_range, &mut copy)] {
                    let (lo, hi) = (r.0.max(a), r.1.min(a + n));
                    if lo < hi {
                        hasher.update(&chunk[(lo - a) as usize..(hi - a) as usize]);
                    }
                }
                at += n;
            }
            let prev_ok = prev_at.is_none() || prev.finalize() == out.prev_crc;
            // The lengths the copy went by were read once: the bytes copied must parse as
            // exactly the records counted, right after the record before them.
            let bounds_ok = prev_at.is_none_or(|(a, n)| a + n == copy_at)
                && parses_exactly(&buf[..out.len], from, out.count);
            if full.finalize() == h.crc
                && prev_ok
                && bounds_ok
                && copy.finalize() == format::crc32(&buf[..out.len])
            {
                return Ok(out);
            }
        }
        self.dev.stats.corrupt_batches += 1;
        Ok(lost(from, h.end_offset(), LostReason::Corrupt))
    }

    /// One copy pass of [`Log::read_large_batch`] over the body at flash address `body` of
    /// the batch `h`: the outcome, the address and length of the record before `from` if
    /// it is in this batch, and the address of the first record copied.
    #[allow(clippy::type_complexity)]
    fn read_large_batch_once(
        &mut self,
        body: u32,
        h: &BatchHeader,
        from: u64,
        buf: &mut [u8],
    ) -> Result<(ReadOutcome, Option<(u32, u32)>, u32), ReadError<F::Error>> {
        let mut prev_at = None;
        let mut copy_at = 0u32;
        let end = body - BATCH_HEADER_LEN as u32 + h.len;
        let mut at = body;
        let mut prev = h.prev_crc;
        let mut out = empty(from, 0);
        for i in 0..h.count as u64 {
            let off = h.base_offset + i;
            let Some(len) = self
                .dev
                .record_len_at(at, end - at)
                .map_err(ReadError::Flash)?
            else {
                break;
            };
            if off < from {
                let mut hasher = crate::crc::Hasher::new();
                hasher.update(&off.to_le_bytes());
                self.dev
                    .crc_of(&mut hasher, at, len)
                    .map_err(ReadError::Flash)?;
                prev = hasher.finalize();
                prev_at = Some((at, len));
            } else {
                if out.count == 0 {
                    copy_at = at;
                }
                let len_us = len as usize;
                if out.len + len_us > buf.len() {
                    if out.count == 0 {
                        return Err(ReadError::BufferTooSmall { needed: len_us });
                    }
                    break;
                }
                self.dev
                    .read(at, &mut buf[out.len..out.len + len_us])
                    .map_err(ReadError::Flash)?;
                if out.count == 0 {
                    out.prev_crc = prev;
                }
                out.len += len_us;
                out.count += 1;
                out.next_offset = off + 1;
            }
            at += len;
        }
        if out.count == 0 {
            out.next_offset = h.end_offset();
            out.lost = Some(LostRange {
                from,
                to: h.end_offset(),
                reason: LostReason::Corrupt,
            });
        }
        Ok((out, prev_at, copy_at))
    }
}

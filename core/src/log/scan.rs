//! Finding data in a segment: validating batch headers and CRCs, segment headers and
//! resume markers (each re-read before it is believed bad), and scanning past torn or
//! corrupt bytes to the next valid batch.

use super::device::{CHUNK, Dev, READ_ATTEMPTS};
use super::format;
use super::format::{
    BATCH_HEADER_LEN, BatchHeader, HeadCheck, RESUME_LEN, ResumeMarker, SEGMENT_HEADER_LEN,
    SegmentHeader,
};
use crate::storage::Flash;

/// Outcome of looking for the next batch in a segment.
pub(super) enum Next {
    /// A valid batch at `pos`; `after_corruption` when bytes before it failed to validate.
    Batch {
        pos: u32,
        h: BatchHeader,
        after_corruption: bool,
    },
    /// No further batch; `corrupt` when non-erased bytes that do not validate were met.
    End { pos: u32, corrupt: bool },
}

/// What [`Dev::rescan`] found.
pub(super) enum Found {
    /// A valid batch at this position.
    Batch(u32, BatchHeader),
    /// A resume marker for the position scanned from, at this position.
    Resume(u32),
    /// Neither.
    Nothing,
}

impl<F: Flash> Dev<F> {
    /// Reads and fully validates the batch at `pos` of segment `seg` (header, bounds and
    /// CRC). A batch that fails is read again, header and body, up to [`READ_ATTEMPTS`]
    /// reads in all; a header that reads erased is the end of the data at once. Returns
    /// the header if valid.
    fn check_batch(
        &mut self,
        seg: u32,
        pos: u32,
    ) -> Result<Result<BatchHeader, HeadCheck>, F::Error> {
        let l = self.l;
        if pos + BATCH_HEADER_LEN as u32 > l.seg_size {
            return Ok(Err(HeadCheck::Erased));
        }
        let addr = l.seg_addr(seg) + pos;
        let mut hb = [0u8; BATCH_HEADER_LEN];
        for _ in 0..READ_ATTEMPTS {
            self.read(addr, &mut hb)?;
            match BatchHeader::check(&hb, l.geo.erased, l.seg_size - pos) {
                HeadCheck::Plausible => {}
                // Blank: the end of the data (a read that went wrong once and blank the
                // next time was a blank header read wrong).
                HeadCheck::Erased => return Ok(Err(HeadCheck::Erased)),
                HeadCheck::Invalid => continue,
            }
            let h = BatchHeader::decode(&hb);
            let mut crc = crate::crc::Hasher::new();
            crc.update(&hb[16..]);
            self.crc_of(
                &mut crc,
                addr + BATCH_HEADER_LEN as u32,
                h.len - BATCH_HEADER_LEN as u32,
            )?;
            if crc.finalize() == h.crc {
                return Ok(Ok(h));
            }
        }
        Ok(Err(HeadCheck::Invalid))
    }

    /// Reads the segment header at `addr`; one that does not validate is read again, up to
    /// [`READ_ATTEMPTS`] reads in all, unless it reads blank (an unused segment).
    pub(super) fn read_segment_header(
        &mut self,
        addr: u32,
    ) -> Result<Option<SegmentHeader>, F::Error> {
        self.read_decoded::<_, SEGMENT_HEADER_LEN>(addr, true, |b| SegmentHeader::decode(b))
    }

    /// Reads the `N` bytes at `addr` until `decode` takes them, [`READ_ATTEMPTS`] reads in
    /// all; `None` if it never does, or at once on an erased read if `blank_is_final`.
    fn read_decoded<T, const N: usize>(
        &mut self,
        addr: u32,
        blank_is_final: bool,
        decode: impl Fn(&[u8; N]) -> Option<T>,
    ) -> Result<Option<T>, F::Error> {
        let mut b = [0u8; N];
        for _ in 0..READ_ATTEMPTS {
            self.read(addr, &mut b)?;
            if blank_is_final && b.iter().all(|&x| x == self.l.geo.erased) {
                return Ok(None);
            }
            if let Some(t) = decode(&b) {
                return Ok(Some(t));
            }
        }
        Ok(None)
    }

    /// Finds the next valid batch at or after `pos` whose base offset is at least
    /// `expected`, rescanning aligned positions after a batch that fails to validate.
    ///
    /// A resume marker ([`ResumeMarker`]) found after the data ends at `pos` (erased or
    /// not valid) whose `torn_from` is `pos` and whose `expected` is `expected` says that
    /// the bytes between are a torn write left by a power cut: the search goes on right
    /// after the marker, without counting them as corruption.
    pub(super) fn next_batch(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
    ) -> Result<Next, F::Error> {
        let mut pos = pos;
        loop {
            let erased = match self.check_batch(seg, pos)? {
                Ok(h) if h.base_offset >= expected => {
                    return Ok(Next::Batch {
                        pos,
                        h,
                        after_corruption: false,
                    });
                }
                Err(HeadCheck::Erased) => true,
                _ => false,
            };
            // Look for a batch magic (only after non-erased bytes that do not validate)
            // or a resume marker at later aligned positions.
            match self.rescan(seg, pos, expected, !erased)? {
                Found::Batch(p, h) => {
                    return Ok(Next::Batch {
                        pos: p,
                        h,
                        after_corruption: true,
                    });
                }
                Found::Resume(p) => pos = p + RESUME_LEN as u32,
                Found::Nothing => {
                    return Ok(Next::End {
                        pos,
                        corrupt: !erased,
                    });
                }
            }
        }
    }

    /// Scans the aligned positions after `pos` for the first valid batch with a base offset
    /// at least `expected` (when `batches`) or resume marker for (`pos`, `expected`).
    ///
    /// A scan that finds nothing is done once more before it is believed: the magic of the
    /// marker or batch that goes on (and every durable record after it) may have read wrong
    /// on one read only (a transient bit flip), and finding nothing turns them into bytes
    /// never written.
    fn rescan(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        batches: bool,
    ) -> Result<Found, F::Error> {
        let l = self.l;
        let ws = l.ws();
        let magic = format::BATCH_MAGIC.to_le_bytes();
        let resume = format::RESUME_MAGIC.to_le_bytes();
        let mut chunk = [0u8; CHUNK];
        // Two passes before finding nothing is believed (see above).
        for _ in 0..2 {
            let mut p = pos + ws;
            while p + (RESUME_LEN.min(BATCH_HEADER_LEN) as u32) <= l.seg_size {
                let n = (l.seg_size - p).min(CHUNK as u32) as usize;
                self.read(l.seg_addr(seg) + p, &mut chunk[..n])?;
                let mut q = 0usize;
                while q + 4 <= n {
                    let cand = p + q as u32;
                    if batches && chunk[q..q + 4] == magic {
                        if let Ok(h) = self.check_batch(seg, cand)?
                            && h.base_offset >= expected
                        {
                            return Ok(Found::Batch(cand, h));
                        }
                    } else if chunk[q..q + 4] == resume
                        && cand + RESUME_LEN as u32 <= l.seg_size
                        && self
                            .read_resume_marker(l.seg_addr(seg) + cand)?
                            .is_some_and(|m| m.torn_from == pos && m.expected == expected)
                    {
                        return Ok(Found::Resume(cand));
                    }
                    q += ws as usize;
                }
                let advance = ((n.saturating_sub(3)) as u32 / ws) * ws;
                p += advance.max(ws);
            }
        }
        Ok(Found::Nothing)
    }

    /// Reads the resume marker whose magic was seen at `addr`, [`READ_ATTEMPTS`] reads in
    /// all until it decodes: one bad read (a transient bit flip) must not turn the torn
    /// write it bounds, and every durable record after it, into bytes never written.
    fn read_resume_marker(&mut self, addr: u32) -> Result<Option<ResumeMarker>, F::Error> {
        self.read_decoded(addr, false, ResumeMarker::decode)
    }

    /// Reads the batch at `pos` straight into `dst` if its header is plausible, it holds
    /// offset `want` (from its base, at or after `expected`) and its body fits in `dst`;
    /// returns its header if the CRC then checks. `None` means: take the slow path.
    pub(super) fn read_wanted_batch(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        want: u64,
        dst: &mut [u8],
    ) -> Result<Option<BatchHeader>, F::Error> {
        let l = self.l;
        if pos + BATCH_HEADER_LEN as u32 > l.seg_size {
            return Ok(None);
        }
        let mut hb = [0u8; BATCH_HEADER_LEN];
        self.read(l.seg_addr(seg) + pos, &mut hb)?;
        if BatchHeader::check(&hb, l.geo.erased, l.seg_size - pos) != HeadCheck::Plausible {
            return Ok(None);
        }
        let h = BatchHeader::decode(&hb);
        let body_len = h.len as usize - BATCH_HEADER_LEN;
        if h.base_offset < expected
            || h.base_offset > want
            || h.end_offset() <= want
            || body_len > dst.len()
        {
            return Ok(None);
        }
        let body = &mut dst[..body_len];
        self.read(l.seg_addr(seg) + pos + BATCH_HEADER_LEN as u32, body)?;
        let mut crc = crate::crc::Hasher::new();
        crc.update(&hb[16..]);
        crc.update(body);
        Ok((crc.finalize() == h.crc).then_some(h))
    }

    /// Length in bytes of the record encoded at `addr` (at most `limit` bytes), read with
    /// three small reads; `None` if malformed.
    pub(super) fn record_len_at(&mut self, addr: u32, limit: u32) -> Result<Option<u32>, F::Error> {
        let mut t = [0u8; 1];
        self.read(addr, &mut t)?;
        let tlen = t[0] as u32;
        let flags_at = 1 + tlen + 8;
        if tlen == 0 || flags_at + 1 > limit {
            return Ok(None);
        }
        self.read(addr + flags_at, &mut t)?;
        let plen_at = match t[0] {
            0 => flags_at + 1,
            1 => flags_at + 1 + format::PRODUCER_LEN as u32,
            _ => return Ok(None),
        };
        if plen_at + 4 > limit {
            return Ok(None);
        }
        let mut p = [0u8; 4];
        self.read(addr + plen_at, &mut p)?;
        let total = (plen_at + 4).checked_add(u32::from_le_bytes(p));
        Ok(total.filter(|&t| t <= limit))
    }
}

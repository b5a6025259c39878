//! Finding data in a segment: validating batch headers and CRCs, segment headers and
//! resume markers (each re-read before it is believed bad), and scanning past torn or
//! corrupt bytes to the next valid batch.

use super::device::{CHUNK, Dev, READ_ATTEMPTS};
use super::format;
use super::format::{
    BATCH_HEADER_LEN, BatchHeader, HeadCheck, RESUME_LEN, ResumeMarker, SEGMENT_HEADER_LEN,
    SegmentHeader,
};
use super::short::{self, Link, SHORT_MAX_HEAD, SHORT_VERSION, TopicBuf};
use crate::storage::Flash;

/// What lies just before a batch position of a segment, for a short batch there
/// ([`short`](super::short)): a short batch continues the record before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prev {
    /// Nothing a short batch can continue: the start of the segment, a resume marker, a
    /// batch of several records, a segment of a version before 5.
    None,
    /// A valid full batch of one record at this position, in a version 5 segment: it
    /// links a short batch after it if its body is not compressed.
    Anchor(u32, BatchHeader),
    /// The record before, known (a short batch, or an anchor already decoded).
    Link(Link),
}

impl Prev {
    /// What follows the valid batch `h` at `pos` of a segment of `version` (`short`: its
    /// link in and out, if it is a short batch).
    pub(super) fn after(
        version: u16,
        pos: u32,
        h: &BatchHeader,
        short: Option<(Link, Link)>,
    ) -> Prev {
        match short {
            Some((_, out)) => Prev::Link(out),
            None if version >= SHORT_VERSION && h.count == 1 => Prev::Anchor(pos, *h),
            None => Prev::None,
        }
    }
}

/// A short batch read and checked by [`Dev::short_at`].
#[derive(Debug, Clone, Copy)]
pub(super) struct ShortAt {
    /// The batch as a header would describe it (`len` its stored length, `count` 1).
    pub(super) h: BatchHeader,
    /// The link it gives a short batch after it.
    pub(super) out: Link,
    /// Length of its record's canonical encoding.
    pub(super) canonical_len: usize,
    /// Whether the canonical encoding was copied into the destination given.
    pub(super) copied: bool,
}

/// Outcome of looking for the next batch in a segment.
pub(super) enum Next {
    /// A valid batch at `pos`; `after_corruption` when bytes before it failed to validate;
    /// `short`: the links in and out of a short batch.
    Batch {
        pos: u32,
        h: BatchHeader,
        after_corruption: bool,
        short: Option<(Link, Link)>,
    },
    /// No further batch; `corrupt` when non-erased bytes that do not validate were met;
    /// `linked` when a short batch could have continued the data at `pos`.
    End {
        pos: u32,
        corrupt: bool,
        linked: bool,
    },
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
    /// CRC), a short batch if its first byte is a short batch tag and `prev` links one. A
    /// batch that fails is read again, header and body, up to [`READ_ATTEMPTS`] reads in
    /// all; a header that reads erased is the end of the data at once. Returns the header
    /// if valid (with the links in and out of a short batch). An anchor in `prev` is
    /// decoded into its link the first time a short batch needs it.
    #[allow(clippy::type_complexity)]
    fn check_batch(
        &mut self,
        seg: u32,
        pos: u32,
        prev: &mut Prev,
    ) -> Result<Result<(BatchHeader, Option<(Link, Link)>), HeadCheck>, F::Error> {
        let l = self.l;
        if pos >= l.seg_size {
            return Ok(Err(HeadCheck::Erased));
        }
        let avail = l.seg_size - pos;
        let addr = l.seg_addr(seg) + pos;
        let mut hb = [0u8; BATCH_HEADER_LEN];
        let n = (avail as usize).min(BATCH_HEADER_LEN);
        for _ in 0..READ_ATTEMPTS {
            self.read(addr, &mut hb[..n])?;
            if short::is_tag(hb[0], l.geo.erased) {
                if let Some(link) = self.resolve(seg, prev)?
                    && let Some(s) = self.short_at(addr, avail, &link, &mut [])?
                {
                    return Ok(Ok((s.h, Some((link, s.out)))));
                }
                continue;
            }
            if n < BATCH_HEADER_LEN {
                return Ok(Err(HeadCheck::Erased));
            }
            match BatchHeader::check(&hb, l.geo.erased, avail) {
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
                return Ok(Ok((h, None)));
            }
        }
        Ok(Err(HeadCheck::Invalid))
    }

    /// The link `prev` gives a short batch: an anchor's is decoded from its body (its one
    /// record, which must be plain and on the batch topic) and kept in `prev`.
    fn resolve(&mut self, seg: u32, prev: &mut Prev) -> Result<Option<Link>, F::Error> {
        match *prev {
            Prev::None => Ok(None),
            Prev::Link(link) => Ok(Some(link)),
            Prev::Anchor(pos, h) => {
                // Kept on failure: a read that went wrong is tried again with the batch.
                let link = self.anchor_link(self.l.seg_addr(seg) + pos, &h)?;
                if let Some(link) = link {
                    *prev = Prev::Link(link);
                }
                Ok(link)
            }
        }
    }

    /// The link after the valid one-record batch `h` at flash address `addr`: `None` if
    /// its body is compressed, its record has its own topic, or it does not read valid.
    fn anchor_link(&mut self, addr: u32, h: &BatchHeader) -> Result<Option<Link>, F::Error> {
        let body = addr + BATCH_HEADER_LEN as u32;
        let mut flags = [0u8; 1];
        self.read(body, &mut flags)?;
        if flags[0] & super::compact::BODY_LZ4_BIT != 0 || h.count != 1 {
            return Ok(None);
        }
        let mut got = None;
        if !self.walk_plain(addr, h, |_, head, topic, crc| {
            got = Some((
                head.timestamp_us,
                head.own_topic(),
                topic.len() as u8,
                super::format::crc32(topic),
                crc,
            ));
        })? {
            return Ok(None);
        }
        let Some((ts, false, topic_len, topic_crc, crc)) = got else {
            return Ok(None);
        };
        Ok(Some(Link {
            next: h.base_offset + 1,
            prev_crc: crc,
            ts,
            topic_addr: body + super::compact::BODY_PREFIX_LEN as u32,
            topic_len,
            topic_crc,
        }))
    }

    /// Reads the short batch at flash address `addr` (`avail` bytes to the end of its
    /// segment) and checks it against `link` (one read of each byte); copies its record's
    /// canonical encoding into `dst` if it fits there. `None` if it does not check.
    ///
    /// The fields before the payload are read into a buffer of [`SHORT_MAX_HEAD`] bytes,
    /// and the payload goes through it in pieces: each piece read once feeds the batch CRC,
    /// the record CRC and the copy alike. Not inlined: that buffer and the topic's are on
    /// the stack only while it runs.
    #[inline(never)]
    pub(super) fn short_at(
        &mut self,
        addr: u32,
        avail: u32,
        link: &Link,
        dst: &mut [u8],
    ) -> Result<Option<ShortAt>, F::Error> {
        let mut b = [0u8; SHORT_MAX_HEAD];
        if avail < 2 {
            return Ok(None);
        }
        self.read(addr, &mut b[..2])?;
        let total = short::total_len(b[0], b[1]);
        if total > avail {
            return Ok(None);
        }
        let head_len = (total as usize).min(SHORT_MAX_HEAD);
        self.read(addr, &mut b[..head_len])?;
        let Some(d) = short::decode_head(&b[..head_len], total as usize, link) else {
            return Ok(None);
        };
        let mut tb: TopicBuf = [0; super::format::MAX_TOPIC_LEN];
        let (topic_addr, topic_len, topic_crc) = match d.own_topic {
            Some((at, n)) => {
                let t = &mut tb[..n as usize];
                t.copy_from_slice(&b[at..at + n as usize]);
                (addr + at as u32, n, super::format::crc32(t))
            }
            None => {
                let n = link.topic_len as usize;
                if n == 0 {
                    return Ok(None);
                }
                self.read(link.topic_addr, &mut tb[..n])?;
                // The CRC of the topic as read: the link's, or the read is not believed.
                if super::format::crc32(&tb[..n]) != link.topic_crc {
                    return Ok(None);
                }
                (link.topic_addr, link.topic_len, link.topic_crc)
            }
        };
        let topic = &tb[..topic_len as usize];
        if core::str::from_utf8(topic).is_err() {
            return Ok(None);
        }
        let stored = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let payload_len = total as usize - d.payload_at;
        let canonical_len = short::canonical_len(&d, topic.len(), payload_len);
        let copy = dst.len() >= canonical_len;
        let mut batch = short::crc_start(link.next, link.prev_crc, [b[0], b[1]]);
        batch.update(&b[short::SHORT_HEAD_LEN..d.payload_at]);
        // The record CRC and canonical encoding (`short::record_crc`, `short::canonical`):
        // the head pieces, then the payload. A record copied is hashed once whole from
        // where it was copied to (one hasher update instead of one per piece).
        let mut rec = crate::crc::Hasher::new();
        rec.update(&link.next.to_le_bytes());
        let mut at = 0usize;
        super::format::record_head_pieces(topic, d.ts, d.producer, payload_len as u32, &mut |p| {
            if copy {
                dst[at..at + p.len()].copy_from_slice(p);
            } else {
                rec.update(p);
            }
            at += p.len();
        });
        let (mut from, mut end, mut pos) = (d.payload_at, head_len, head_len as u32);
        loop {
            let piece = &b[from..end];
            batch.update(piece);
            if copy {
                dst[at..at + piece.len()].copy_from_slice(piece);
            } else {
                rec.update(piece);
            }
            at += piece.len();
            if pos >= total {
                break;
            }
            let n = ((total - pos) as usize).min(SHORT_MAX_HEAD);
            self.read(addr + pos, &mut b[..n])?;
            (from, end, pos) = (0, n, pos + n as u32);
        }
        if batch.finalize() != stored {
            return Ok(None);
        }
        if copy {
            rec.update(&dst[..at]);
        }
        Ok(Some(ShortAt {
            h: BatchHeader {
                len: total,
                crc: stored,
                base_offset: link.next,
                count: 1,
                prev_crc: link.prev_crc,
            },
            out: Link {
                next: link.next + 1,
                prev_crc: rec.finalize(),
                ts: d.ts,
                topic_addr,
                topic_len,
                topic_crc,
            },
            canonical_len,
            copied: copy,
        }))
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
    ///
    /// `prev` is what lies before `pos` (a short batch there needs it).
    pub(super) fn next_batch(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        prev: Prev,
    ) -> Result<Next, F::Error> {
        let mut pos = pos;
        let mut prev = prev;
        loop {
            let erased = match self.check_batch(seg, pos, &mut prev)? {
                Ok((h, short)) if h.base_offset >= expected => {
                    return Ok(Next::Batch {
                        pos,
                        h,
                        after_corruption: false,
                        short,
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
                        short: None,
                    });
                }
                Found::Resume(p) => {
                    pos = p + RESUME_LEN as u32;
                    prev = Prev::None;
                }
                Found::Nothing => {
                    return Ok(Next::End {
                        pos,
                        corrupt: !erased,
                        linked: prev != Prev::None,
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
                        if let Ok((h, _)) = self.check_batch(seg, cand, &mut Prev::None)?
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

    /// The header of the batch at `pos` of segment `seg` (its bytes and decoded) if it is
    /// plausible and the batch holds offset `want` (its base at or after `expected`), its
    /// CRC not checked. A sequential read's fast path: a compact batch is then decoded with
    /// [`Dev::read_compact`], which checks the CRC over the bytes it copies; a canonical one
    /// is read by [`Dev::read_wanted_batch`]. `None` means: find the batch the slow way
    /// (`next_batch`).
    pub(super) fn wanted_header(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        want: u64,
    ) -> Result<Option<([u8; BATCH_HEADER_LEN], BatchHeader)>, F::Error> {
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
        Ok(
            (h.base_offset >= expected && h.base_offset <= want && want < h.end_offset())
                .then_some((hb, h)),
        )
    }

    /// Reads the batch at `pos` straight into `dst` if [`Dev::wanted_header`] takes it and
    /// its body fits in `dst`; returns its header if the CRC then checks. `None` means:
    /// take the slow path.
    pub(super) fn read_wanted_batch(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        want: u64,
        dst: &mut [u8],
    ) -> Result<Option<BatchHeader>, F::Error> {
        let Some((hb, h)) = self.wanted_header(seg, pos, expected, want)? else {
            return Ok(None);
        };
        let body_len = h.len as usize - BATCH_HEADER_LEN;
        let Some(body) = dst.get_mut(..body_len) else {
            return Ok(None);
        };
        self.read(self.l.seg_addr(seg) + pos + BATCH_HEADER_LEN as u32, body)?;
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

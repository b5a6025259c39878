//! Damage a mount measures at the two ends of the log: how far the bytes a cut write may
//! have programmed reach at the end of the head segment (a torn batch, a torn resume marker,
//! a resume marker an earlier boot placed after them), and a damaged segment just before the
//! tail whose records are reported lost rather than dropped; and whether unreadable bytes at
//! the head's end held records that were durable (lost to damage, not to a crash).

use super::Log;
use super::config::FullPolicy;
use super::device::CHUNK;
use super::format;
use super::format::{BATCH_HEADER_LEN, BatchHeader, HeadCheck, RESUME_LEN, align_up};
use super::recovery::JournalFacts;
use super::scan::{Next, Prev};
use super::short;
use crate::error::MountError;
use crate::storage::Flash;

/// A segment just before the tail whose header does not validate although it held records
/// (see [`Log::find_damage_before_tail`]): its records, `from` up to the tail's base
/// offset, are lost to damage.
#[derive(Debug, Clone, Copy)]
pub(super) struct DamagedBeforeTail {
    /// The tail segment when the damage was found (the range ends at its base).
    pub(super) tail: u32,
    /// The damaged segment.
    pub(super) seg: u32,
    /// The first offset lost (see [`Log::find_damage_before_tail`]).
    pub(super) from: u64,
}

impl<F: Flash> Log<'_, F> {
    /// Where the words a cut write may have programmed end, from `from` (the end of the
    /// valid data) in segment `seg` whose last non-erased byte ends at `used_end`: a word
    /// programmed with erased-valued data reads erased, so the extent of each torn
    /// structure is taken from its header when the length pair survived (a batch), as 32
    /// bytes from its magic for a resume marker (whole or torn), else as 32 bytes (a batch
    /// header cut before its length check). After such a cut header, a resume marker an
    /// earlier boot placed after it (and a later cut tore) is looked for by its magic at
    /// the `W`-aligned positions up to `used_end`, and the walk goes on after it.
    /// Returns a write-size-aligned position at or after `used_end`, at most the segment
    /// size.
    #[inline(never)]
    pub(super) fn torn_extent(
        &mut self,
        seg: u32,
        from: u32,
        used_end: u32,
    ) -> Result<u32, F::Error> {
        let l = self.dev.l;
        let resume = format::RESUME_MAGIC.to_le_bytes();
        let mut at = from;
        while at < used_end && at + 2 <= l.seg_size {
            let mut hb = [0u8; BATCH_HEADER_LEN];
            let n = ((l.seg_size - at) as usize).min(BATCH_HEADER_LEN);
            self.dev.read(l.seg_addr(seg) + at, &mut hb[..n])?;
            if short::is_tag(hb[0], l.geo.erased) {
                // A short batch (version 5), by its tag and length bytes: cut in its first
                // word (tag or length torn), the write programmed nothing after that word.
                at += align_up(short::total_len(hb[0], hb[1]), l.ws());
                continue;
            }
            if n < BATCH_HEADER_LEN {
                break;
            }
            if BatchHeader::check(&hb, l.geo.erased, l.seg_size - at) == HeadCheck::Plausible {
                at += align_up(BatchHeader::decode(&hb).len, l.ws());
                continue;
            }
            if hb[..4] == resume {
                at += align_up(RESUME_LEN as u32, l.ws());
                continue;
            }
            // Cut inside its first 32 bytes (in address order nothing after them was
            // written by the same write); bytes a cut out of order programmed read
            // non-erased, and `used_end` covers them. A later boot may have put a resume
            // marker after them that a later cut tore: its bytes after the last one that
            // reads non-erased may be programmed too (its `len_check` holds erased-valued
            // bytes), so it is measured from its magic.
            let next = at + align_up(BATCH_HEADER_LEN.max(RESUME_LEN) as u32, l.ws());
            match self.find_resume_magic(seg, next, used_end)? {
                Some(p) if p + RESUME_LEN as u32 > l.seg_size => {
                    at = l.seg_size;
                    break;
                }
                Some(p) => at = p,
                None => {
                    at = next;
                    break;
                }
            }
        }
        Ok(align_up(at.max(used_end), l.ws()).min(l.seg_size))
    }

    /// How many short batches follow one another from `pos` of segment `seg`, going by
    /// their tag and length bytes only (none validates without the link the data before
    /// lost).
    fn short_chain(&mut self, seg: u32, pos: u32) -> Result<u64, F::Error> {
        let l = self.dev.l;
        let (mut at, mut n) = (pos, 0u64);
        while at + 2 <= l.seg_size {
            let mut b = [0u8; 2];
            self.dev.read(l.seg_addr(seg) + at, &mut b)?;
            if !short::is_tag(b[0], l.geo.erased) {
                break;
            }
            n += 1;
            at += align_up(short::total_len(b[0], b[1]), l.ws());
        }
        Ok(n)
    }

    /// The first `W`-aligned position in `from..to` of segment `seg` holding the resume
    /// marker magic, read in chunks of [`CHUNK`] bytes.
    fn find_resume_magic(&mut self, seg: u32, from: u32, to: u32) -> Result<Option<u32>, F::Error> {
        let l = self.dev.l;
        let ws = l.ws();
        let magic = format::RESUME_MAGIC.to_le_bytes();
        let to = to.min(l.seg_size);
        let mut chunk = [0u8; CHUNK];
        let mut p = align_up(from, ws);
        while p + 4 <= l.seg_size && p < to {
            let n = (l.seg_size - p).min(CHUNK as u32) as usize;
            self.dev.read(l.seg_addr(seg) + p, &mut chunk[..n])?;
            let mut q = 0usize;
            while q + 4 <= n && p + (q as u32) < to {
                if chunk[q..q + 4] == magic {
                    return Ok(Some(p + q as u32));
                }
                q += ws as usize;
            }
            let advance = ((n.saturating_sub(3)) as u32 / ws) * ws;
            p += advance.max(ws);
        }
        Ok(None)
    }

    /// Looks at the segment just before the tail in ring order: if it does not hold a valid
    /// header although records were written before the tail's (the tail's `seq` is above
    /// 1), and it was not reclaimed legitimately, it was damaged, and its offsets are
    /// reported corrupt rather than dropped. Segments are opened in ring order, each with
    /// the next `seq`, and only the one after the head is ever reclaimed (erased, then
    /// given a header): a segment just before the tail that is not the next one to open
    /// lost its header to damage. When it is the next one to open, an erase for reopening
    /// it may have been under way, unless the journal says the last shutdown was `clean`
    /// (a clean entry is written only by a close, never while a segment is being opened):
    /// a reclaim was legitimate under `DropOldest` (the policy this mount runs with), with
    /// no consumer, or when every consumer of the journal had committed past the tail's
    /// base; under `RejectNew` a consumer committed below it says the reclaim never began
    /// (it persists the commits it relies on first). After a clean shutdown, under either
    /// policy, a consumer committed below the tail's base says the segment was damaged.
    ///
    /// The range reported ends at the tail's base and starts at the first of: 0 when no
    /// segment was ever reused (the highest `seq` is at most the segment count: nothing was
    /// reclaimed, so every offset below the tail's was stored), the base of a valid batch
    /// found in the segment, and the lowest committed offset of the journal's consumers
    /// (what a consumer had not read yet). Costs one read when the segment is blank.
    pub(super) fn find_damage_before_tail(&mut self, clean: bool) -> Result<(), F::Error> {
        let n = self.dev.l.seg_count;
        let (Some(t), Some(h)) = (self.tail, self.head) else {
            return Ok(());
        };
        let p = (t + n - 1) % n;
        let tail = self.slots[t as usize];
        if self.slots[p as usize].valid || tail.seq <= 1 {
            return Ok(());
        }
        let tail_base = tail.base;
        let unread_from = self.consumers.iter().map(|c| c.committed).min();
        let from = if p == (h + 1) % n {
            let reclaim_possible = !clean && self.cfg.full == FullPolicy::DropOldest;
            match unread_from {
                Some(c) if !reclaim_possible && c < tail_base => c,
                _ => return Ok(()),
            }
        } else {
            let mut from = if self.max_seq <= u64::from(n) {
                0
            } else {
                unread_from.unwrap_or(tail_base)
            };
            let start = self.dev.l.data_start;
            if let Next::Batch { h: bh, .. } = self.dev.next_batch(p, start, 0, Prev::None)?
                && bh.base_offset < tail_base
                && bh.end_offset() <= tail_base
            {
                from = from.min(bh.base_offset);
            }
            from
        };
        if from >= tail_base {
            return Ok(());
        }
        warn!(
            "segment {} is damaged: offsets {}..{} lost",
            p, from, tail_base
        );
        self.damaged = Some(DamagedBeforeTail {
            tail: t,
            seg: p,
            from,
        });
        Ok(())
    }

    /// The damaged range before the tail, `from..tail base`, while the tail is unchanged.
    pub(super) fn damaged_before_tail(&self) -> Option<(u64, u64)> {
        let d = self.damaged?;
        (self.tail == Some(d.tail)).then(|| (d.from, self.slots[d.tail as usize].base))
    }

    /// Whether the segment just before the tail is a reclaim an earlier boot left
    /// unfinished that a clean journal entry would turn into damage at the next mount: it
    /// is the next one to open (the one after the head), holds no valid header, the
    /// tail's `seq` is above 1, this log did not find it damaged, and a consumer is
    /// committed below the tail's base. This log took it for an interrupted reclaim (the
    /// mount's rule after an unclean shutdown under `DropOldest`, or no consumer below the
    /// tail's base then) and its offsets for reclaimed; after a clean shutdown the mount
    /// rule counts them corrupt ([`Log::find_damage_before_tail`]). A close finishes the
    /// reclaim first ([`Log::roll`] into that segment), so the clean flag's premise (no
    /// reclaim under way) holds. False when no further segment `seq` is left.
    pub(super) fn reclaim_left_unfinished(&self) -> bool {
        let n = self.dev.l.seg_count;
        let (Some(t), Some(h)) = (self.tail, self.head) else {
            return false;
        };
        let p = (t + n - 1) % n;
        let tail = self.slots[t as usize];
        p == (h + 1) % n
            && !self.slots[p as usize].valid
            && tail.seq > 1
            && self.max_seq + 1 < format::MAX_SEQ
            && self.damaged.is_none_or(|d| d.seg != p)
            && self.min_commit(|c| c.committed) < tail.base
    }
}

impl<F: Flash> Log<'_, F> {
    /// Whether the head segment `seg`, whose valid data ends at `pos` (`expected` the
    /// offset after it) in non-erased bytes that hold no valid batch (`corrupt`) or in
    /// erased flash, lost durable records there: the range of offsets lost if so (it ends
    /// at the journal's `durable_next`, or past it for a chain of short batches, see
    /// below). A batch is durable once the journal's
    /// `durable_next` covers it (it is written after the batch's sync), so one failing its
    /// CRC below that was damaged, never torn by a power cut.
    ///
    /// After a clean shutdown nothing was written after the journal entry, so non-erased
    /// bytes there that hold no valid batch were damaged: every offset from `expected` to
    /// `durable_next` is lost, whatever a damaged batch header says (its base offset is not
    /// trusted). When the data ends in erased flash, the gap up to `durable_next` may hold
    /// no records (offsets a crash skipped, settled by the close; records consumed from
    /// RAM): only a batch found in the invalid segment after the head (whose header was
    /// damaged, so an older segment was taken for the head) proves records lost, from its
    /// base offset.
    ///
    /// After an unclean shutdown only non-erased bytes count: their header, if plausible,
    /// gives their base offset (offsets between `expected` and it were consumed from RAM,
    /// never written); a torn write holds offsets at or above `durable_next`. A short batch
    /// there (`linked`: one could continue the data) holds `expected`; each short batch is
    /// the last batch of its write, synced before the next one, so every short batch of the
    /// chain that follows (by length bytes) but the last was durable too, whatever
    /// `durable_next` says.
    pub(super) fn durable_but_damaged(
        &mut self,
        seg: u32,
        pos: u32,
        expected: u64,
        corrupt: bool,
        linked: bool,
        facts: Option<JournalFacts>,
    ) -> Result<Option<(u64, u64)>, MountError<F::Error>> {
        let l = self.dev.l;
        if let Some(f) = facts
            && !f.clean
            && corrupt
            && linked
            && pos < l.seg_size
        {
            let mut b = [0u8; 1];
            self.dev
                .read(l.seg_addr(seg) + pos, &mut b)
                .map_err(MountError::Flash)?;
            if short::is_tag(b[0], l.geo.erased) {
                // A short batch there holds `expected` (it continues the record before it).
                // A short batch is the last batch of its write, synced before the next
                // one is written: every short batch of the chain but the last was durable
                // (the last may be a write cut by the power loss), and so is everything
                // below `durable_next`.
                let n = self.short_chain(seg, pos).map_err(MountError::Flash)?;
                let to = f.durable_next.max(expected + n.saturating_sub(1));
                return Ok((to > expected).then_some((expected, to)));
            }
        }
        let Some(f) = facts.filter(|f| f.durable_next > expected) else {
            return Ok(None);
        };
        if f.clean {
            if corrupt {
                return Ok(Some((expected, f.durable_next)));
            }
            // Erased flash after the data: offsets a crash skipped (settled into
            // `durable_next` by a later close) or records consumed from RAM leave the same
            // gap, so only a batch of those offsets in the segment after the head, whose
            // header did not validate, proves damage (a reused segment's old batches hold
            // offsets below the head's).
            let next = (seg + 1) % l.seg_count;
            if self.slots[next as usize].valid {
                return Ok(None);
            }
            return match self
                .dev
                .next_batch(next, l.data_start, expected, Prev::None)
                .map_err(MountError::Flash)?
            {
                Next::Batch { h, .. } if h.base_offset < f.durable_next => {
                    Ok(Some((h.base_offset, f.durable_next)))
                }
                _ => Ok(None),
            };
        }
        if !corrupt {
            return Ok(None);
        }
        let mut hb = [0u8; BATCH_HEADER_LEN];
        if pos + BATCH_HEADER_LEN as u32 <= l.seg_size {
            self.dev
                .read(l.seg_addr(seg) + pos, &mut hb)
                .map_err(MountError::Flash)?;
            if BatchHeader::check(&hb, l.geo.erased, l.seg_size - pos) == HeadCheck::Plausible {
                let base = BatchHeader::decode(&hb).base_offset;
                return Ok((base < f.durable_next).then_some((base.max(expected), f.durable_next)));
            }
        }
        Ok(None)
    }
}

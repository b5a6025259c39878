//! Appending and writing: records into the RAM buffer (the pending batch), the spill
//! policies, batches written to the head segment (group commit), flush, tick and the clean
//! shutdown.

use super::Log;
use super::compact::{self, COMPACT_VERSION};
#[cfg(feature = "compression")]
use super::config::{AUTO_MIN_BODY, Compression};
use super::config::{FullPolicy, SpillPolicy};
use super::format::{
    BATCH_HEADER_LEN, BatchHeader, MAX_NEXT_OFFSET, MAX_TOPIC_LEN, RESUME_LEN, Record, align_up,
    parse_record_fields, record_crc,
};
use super::outcome::Appended;
use super::short::{self, SHORT_MAX_BODY, SHORT_MAX_LEN, SHORT_VERSION, WriterLink};
use crate::error::{AppendError, FlushError};
use crate::storage::Flash;

impl<'a, F: Flash> Log<'a, F> {
    /// Appends a record into the RAM buffer and returns its offset. The record is durable
    /// once [`Log::durable_offset`] passes its offset ([`Log::flush`] forces that).
    ///
    /// With a [`Producer`], a resend of one of the producer's last [`PRODUCER_WINDOW`]
    /// sequences returns the original offset with `duplicate: true` and stores nothing.
    ///
    /// May write to flash: when the buffer is full, when the offset lease runs out (a
    /// journal write every [`Config::lease_step`] offsets) and under `OnPressure` at the
    /// high-water mark. Cancel-safety: a failure leaves the log consistent; the record is
    /// not appended.
    ///
    /// Errors: [`AppendError::BadTopic`], [`AppendError::TooLarge`] (see
    /// [`Log::max_record_len`]), [`AppendError::Full`] under `RejectNew`,
    /// [`AppendError::SequenceTooOld`], [`AppendError::OffsetsExhausted`] when the next
    /// offset is [`MAX_NEXT_OFFSET`], [`AppendError::Poisoned`] once a flash write, erase
    /// or sync has failed (see [`Log::poisoned`]), storage errors (the first failure).
    ///
    /// [`Producer`]: super::Producer
    /// [`PRODUCER_WINDOW`]: super::PRODUCER_WINDOW
    /// [`Config::lease_step`]: super::Config::lease_step
    pub fn append(
        &mut self,
        now_us: u64,
        rec: &Record<'_>,
    ) -> Result<Appended, AppendError<F::Error>> {
        self.append_in_session(now_us, rec, 0)
    }

    /// Appends a record of a producer session opened with [`Log::open_session`]: like
    /// [`Log::append`], with the session rules (see [`producers`]). `epoch` is the session's;
    /// 0 means no session (the legacy rule of [`Log::append`]). A record without a producer
    /// ignores `epoch`.
    ///
    /// The record is appended only if its sequence is the session's last stored + 1; a
    /// resend of a stored sequence returns its offset with `duplicate: true` (from the
    /// window of the last [`PRODUCER_WINDOW`] records), or [`AppendError::SequenceTooOld`]
    /// when it is older than the window (stored, offset unknown). Errors beyond those of
    /// [`Log::append`]: [`AppendError::OutOfSequence`] (resend in order),
    /// [`AppendError::Fenced`] (an older epoch, or none, while a newer session owns the id),
    /// [`AppendError::UnknownSession`] (an epoch the log did not hand out for this id).
    ///
    /// [`producers`]: super::producers
    /// [`PRODUCER_WINDOW`]: super::PRODUCER_WINDOW
    pub fn append_in_session(
        &mut self,
        now_us: u64,
        rec: &Record<'_>,
        epoch: u32,
    ) -> Result<Appended, AppendError<F::Error>> {
        self.now_us = now_us;
        if let Some(op) = self.dev.failed {
            return Err(AppendError::Poisoned { op });
        }
        let tlen = rec.topic.len();
        if tlen == 0 || tlen > MAX_TOPIC_LEN {
            return Err(AppendError::BadTopic { len: tlen });
        }
        let len = rec.encoded_len();
        if len > self.max_record_len() {
            return Err(AppendError::TooLarge {
                len,
                max: self.max_record_len(),
            });
        }
        if let Some(p) = rec.producer
            && let Some(done) = self.check_producer(p, epoch)?
        {
            return Ok(done);
        }
        // No offset at or past the format's limit is ever handed out (and no end stored
        // past it): a crafted image can start the log near it, never past it.
        if self.next_offset >= MAX_NEXT_OFFSET {
            return Err(AppendError::OffsetsExhausted {
                next: self.next_offset,
            });
        }
        // `OnPressure` writes the buffer out before this record would take it past the
        // high-water mark, not after appending it: a failed write must leave the record
        // unappended (the error tells the producer to retry).
        let past_high_water = self.cfg.spill == SpillPolicy::OnPressure
            && (self.buf_len + len - BATCH_HEADER_LEN) * 100
                > (self.buf_cap - BATCH_HEADER_LEN) * self.cfg.high_water_percent as usize;
        if self.buf_len + len > self.buf_cap || past_high_water {
            self.spill()?;
        }
        if self.cfg.full == FullPolicy::RejectNew && !self.flash_has_room(self.buf_len + len) {
            return Err(AppendError::Full);
        }
        if self.next_offset >= self.lease {
            // Raise the lease in RAM only for the write: if the write fails, the next
            // append must try again rather than hand out offsets no journal entry covers.
            let old = self.lease;
            // Capped at the format's limit: a lease past it would not decode at the next
            // mount (the entry would read as damaged).
            self.lease = self
                .next_offset
                .saturating_add(self.cfg.lease_step.max(1))
                .min(MAX_NEXT_OFFSET);
            if let Err(e) = self.persist_journal(false) {
                self.lease = old;
                return Err(e.into());
            }
        }
        let offset = self.next_offset;
        let start = self.buf_len;
        rec.encode_into(&mut self.buf[start..start + len]);
        if self.buf_count == 0 {
            self.buf_base = offset;
            self.buf_prev_crc = self.newest_crc();
            self.buf_first_us = now_us;
        }
        // The record CRC is computed when it is needed (`newest_crc`), not here: most
        // buffered records end no batch, and a flush needs the CRC of a batch's last one.
        self.newest_crc_from = Some(start);
        self.buf_len += len;
        self.buf_count += 1;
        self.next_offset += 1;
        self.dev.stats.records_appended += 1;
        self.dev.stats.payload_bytes_appended += rec.payload.len() as u64;
        if let Some(p) = rec.producer {
            self.note_producer(p.id, p.seq, offset);
        }
        Ok(Appended {
            offset,
            duplicate: false,
        })
    }

    /// Writes the RAM buffer to flash as one batch (or more, when it crosses a segment)
    /// and syncs: afterwards [`Log::durable_offset`] equals [`Log::next_offset`]. This is
    /// the group commit: every record appended before it becomes durable with one write.
    ///
    /// Cancel-safety: an interruption is a power cut; what was synced stays durable.
    /// Errors: [`FlushError::Full`] under `RejectNew` when no segment can be reused (the
    /// records stay in RAM), [`FlushError::Poisoned`] once a flash write, erase or sync has
    /// failed, storage errors (the first failure, which poisons the log: the durable
    /// offset stays where the last successful sync left it).
    pub fn flush(&mut self, now_us: u64) -> Result<u64, FlushError<F::Error>> {
        self.now_us = now_us;
        self.check_poisoned()?;
        self.spill()?;
        Ok(self.durable_end)
    }

    /// Housekeeping driven by the caller's clock: writes the buffer when its oldest record
    /// has waited `linger_us`, persists commits older than `commit_interval_us`.
    /// Returns the time (µs) of the next deadline, for the caller's timer.
    ///
    /// Errors: as [`Log::flush`] ([`FlushError::Poisoned`] on every call once poisoned).
    pub fn tick(&mut self, now_us: u64) -> Result<u64, FlushError<F::Error>> {
        self.now_us = now_us;
        self.check_poisoned()?;
        if self.buf_count > 0 && now_us.saturating_sub(self.buf_first_us) >= self.cfg.linger_us {
            self.spill()?;
        }
        if self.dirty && now_us.saturating_sub(self.last_persist_us) >= self.cfg.commit_interval_us
        {
            self.persist_journal(false)?;
        }
        let mut next = u64::MAX;
        if self.buf_count > 0 {
            next = next.min(self.buf_first_us.saturating_add(self.cfg.linger_us));
        }
        if self.dirty {
            next = next.min(
                self.last_persist_us
                    .saturating_add(self.cfg.commit_interval_us),
            );
        }
        Ok(next)
    }

    /// Clean shutdown: writes the buffer, persists commits with the lease at the next
    /// offset (so no offsets are skipped) and marks the shutdown clean. Gives the storage
    /// back. If an earlier boot left a reclaim unfinished (the segment after the head erased
    /// or torn, just before the oldest one, with a consumer committed below the oldest
    /// one's base), the close finishes it first: it erases that segment and opens it
    /// empty (`FORMAT.md` section 7, step 2).
    ///
    /// Errors: as [`Log::flush`]. A poisoned log cannot shut down cleanly: it fails with
    /// [`FlushError::Poisoned`] without writing (use [`Log::into_flash`] to get the storage
    /// back for a remount).
    pub fn close(mut self, now_us: u64) -> Result<F, FlushError<F::Error>> {
        self.shut_down(now_us)?;
        Ok(self.dev.flash)
    }

    /// [`Log::close`] of the log in `slot` (as [`Log::mount_in`] fills it), in place: the
    /// shutdown runs on the log where it is, and only the storage is moved out. Returns
    /// `Ok(None)` for an empty slot; the slot is empty afterwards, also after an error
    /// (the storage is dropped with the log, as [`Log::close`] drops it).
    ///
    /// Errors: as [`Log::close`].
    pub fn close_in(
        slot: &mut Option<Self>,
        now_us: u64,
    ) -> Result<Option<F>, FlushError<F::Error>> {
        let Some(log) = slot.as_mut() else {
            return Ok(None);
        };
        if let Err(e) = log.shut_down(now_us) {
            *slot = None;
            return Err(e);
        }
        Ok(slot.take().map(Log::into_flash))
    }

    /// The writes of a clean shutdown ([`Log::close`]).
    fn shut_down(&mut self, now_us: u64) -> Result<(), FlushError<F::Error>> {
        self.now_us = now_us;
        self.check_poisoned()?;
        self.spill()?;
        // A reclaim an earlier boot left unfinished (the segment after the head erased or
        // torn, just before the tail) is finished: the clean entry says no reclaim was
        // under way, and the next mount would take that segment for damage and a record
        // this log counted as dropped for a corrupt one (a mount after an unclean
        // shutdown takes it for the reclaim). The segment is opened empty; torn bytes at
        // the old head's end are then covered by its header's `after_unclean` flag.
        if self.reclaim_left_unfinished() {
            self.roll()?;
        }
        // A torn write left in the head is closed off, so the next mount finds the head
        // ending in erased flash (a clean shutdown).
        if self.resume.is_some() {
            self.write_resume_marker()?;
            self.dev.sync().map_err(FlushError::Flash)?;
        }
        self.lease = self.next_offset;
        self.persist_journal(true)?;
        Ok(())
    }

    /// [`FlushError::Poisoned`] if a flash write, erase or sync failed since mount.
    fn check_poisoned(&self) -> Result<(), FlushError<F::Error>> {
        match self.dev.failed {
            Some(op) => Err(FlushError::Poisoned { op }),
            None => Ok(()),
        }
    }

    /// Writes out what the spill policy says must reach flash now: everything in the
    /// buffer, after (`OnPressure`) discarding what every consumer has committed.
    fn spill(&mut self) -> Result<(), FlushError<F::Error>> {
        if self.cfg.spill == SpillPolicy::OnPressure {
            self.discard_committed()?;
        }
        self.write_buffer()
    }

    /// `OnPressure`: drops the buffered records every consumer has committed, after
    /// persisting the commits that allow it.
    fn discard_committed(&mut self) -> Result<(), FlushError<F::Error>> {
        if self.buf_count == 0 || self.consumers.is_empty() {
            return Ok(());
        }
        let m = self.min_commit(|c| c.committed).min(self.next_offset);
        if m <= self.buf_base {
            return Ok(());
        }
        let k = m - self.buf_base;
        let old = self.durable_end;
        self.durable_end = m;
        if let Err(e) = self.persist_journal(false) {
            self.durable_end = old;
            return Err(e.into());
        }
        let (n, bytes, crc) = self.buffered_fit(k as u32, usize::MAX);
        self.drop_buffered(n, bytes, crc);
        self.dev.stats.records_discarded += k;
        trace!("discarded {} committed records from RAM", k);
        Ok(())
    }

    /// How many of the first `k` buffered records fit in `max_bytes`: `(count, bytes,
    /// CRC of the last one counted)`.
    pub(super) fn buffered_fit(&self, k: u32, max_bytes: usize) -> (u32, usize, u32) {
        let mut at = BATCH_HEADER_LEN;
        let mut last = None;
        let mut n = 0u32;
        while n < k.min(self.buf_count) {
            let Some((_, len)) =
                parse_record_fields(&self.buf[at..self.buf_len], self.buf_base + n as u64)
            else {
                break;
            };
            if at - BATCH_HEADER_LEN + len > max_bytes {
                break;
            }
            last = Some(at..at + len);
            at += len;
            n += 1;
        }
        // Only the last counted record's CRC is needed (the newest one's may be kept).
        let crc = match last {
            Some(_) if n == self.buf_count => self.newest_crc(),
            Some(r) => record_crc(self.buf_base + n as u64 - 1, &self.buf[r]),
            None => self.buf_prev_crc,
        };
        (n, at - BATCH_HEADER_LEN, crc)
    }

    /// [`Log::buffered_fit`] of the records `plan` chose, from what the plan's walk already
    /// found: their count and bytes, and the last one's CRC.
    fn planned_fit(&self, plan: &compact::Plan) -> (u32, usize, u32) {
        let (k, len) = (plan.count, plan.canonical_len);
        let crc = if k == 0 {
            self.buf_prev_crc
        } else if k == self.buf_count {
            self.newest_crc()
        } else {
            let last = BATCH_HEADER_LEN + plan.last_start..BATCH_HEADER_LEN + len;
            record_crc(self.buf_base + u64::from(k) - 1, &self.buf[last])
        };
        (k, len, crc)
    }

    fn drop_buffered(&mut self, k: u32, bytes: usize, last_crc: u32) {
        let from = BATCH_HEADER_LEN + bytes;
        if let Some(at) = self.newest_crc_from {
            // Every buffered record dropped: `last_crc` is the newest one's CRC. Else the
            // newest record moves to the front with the others.
            self.newest_crc_from = (k < self.buf_count).then(|| at - bytes);
            if k >= self.buf_count {
                self.last_crc = last_crc;
            }
        }
        self.buf.copy_within(from..self.buf_len, BATCH_HEADER_LEN);
        self.buf_len -= bytes;
        self.buf_count -= k;
        self.buf_base += k as u64;
        self.buf_prev_crc = last_crc;
    }

    /// Writes every buffered record to flash, rolling to new segments as needed, then syncs.
    fn write_buffer(&mut self) -> Result<(), FlushError<F::Error>> {
        if self.buf_count == 0 {
            // Every offset below the next one is on flash, discarded, or was skipped at
            // mount (never existed). Batches written but not synced are left only by a
            // failed write or sync, which poisons the log: a sync now would prove nothing
            // about them (the storage may have dropped them), so callers stop before this.
            if self.durable_end < self.next_offset {
                if self.flash_end > self.durable_end {
                    self.dev.sync().map_err(FlushError::Flash)?;
                }
                self.durable_end = self.next_offset;
            }
            return Ok(());
        }
        let l = self.dev.l;
        while self.buf_count > 0 {
            if self.head.is_none() || !self.head_writable {
                self.roll()?;
            }
            let head = self.head.unwrap_or(0);
            let marker = if self.resume.is_some() { RESUME_LEN } else { 0 };
            let space = (l.seg_size - self.head_pos) & !(l.ws() - 1);
            let max_body = (space as usize).saturating_sub(BATCH_HEADER_LEN + marker);
            let version = self.slots[head as usize].version;
            if version >= SHORT_VERSION && self.write_short(head, space)? {
                continue;
            }
            // A batch in the compact layout (the segment's version has it) or the canonical.
            // Where no compression is tried, the walk also computes the batch CRC when it
            // can (a batch of every buffered record, plain fixed-length body).
            let (plan, body_crc) = if version < COMPACT_VERSION {
                (None, None)
            } else if self.may_compress() {
                let canonical = &self.buf[BATCH_HEADER_LEN..self.buf_len];
                let p = compact::plan(canonical, self.buf_base, self.buf_count, max_body);
                (Some(p), None)
            } else {
                let whole = BatchHeader {
                    len: 0,
                    crc: 0,
                    base_offset: self.buf_base,
                    count: self.buf_count,
                    prev_crc: self.buf_prev_crc,
                };
                let canonical = &self.buf[BATCH_HEADER_LEN..self.buf_len];
                let head = &whole.encode()[16..];
                let (p, crc) = compact::plan_with_crc(canonical, self.buf_count, max_body, head);
                (Some(p), crc)
            };
            let (k, body, crc) = match &plan {
                Some(plan) => self.planned_fit(plan),
                None => self.buffered_fit(self.buf_count, max_body),
            };
            if k == 0 {
                if self.head_pos == l.data_start {
                    // Cannot happen: a buffered record never exceeds an empty segment
                    // (unless it no longer parses).
                    return Err(FlushError::Unwritable {
                        offset: self.buf_base,
                        room: max_body,
                    });
                }
                self.head_writable = false;
                continue;
            }
            let mut hdr = BatchHeader {
                len: 0,
                crc: 0,
                base_offset: self.buf_base,
                count: k,
                prev_crc: self.buf_prev_crc,
            };
            let len = BATCH_HEADER_LEN + body;
            if plan.is_none() {
                hdr.len = len as u32;
                let mut h = crate::crc::Hasher::new();
                h.update(&hdr.encode()[16..]);
                h.update(&self.buf[BATCH_HEADER_LEN..len]);
                hdr.crc = h.finalize();
                self.buf[..BATCH_HEADER_LEN].copy_from_slice(&hdr.encode());
            }
            // One plain record (a compact body not compressed) links a short batch after it
            // (taken now: compressing reuses the buffer).
            match parse_record_fields(&self.buf[BATCH_HEADER_LEN..], self.buf_base) {
                Some((r, _)) if k == 1 && version >= SHORT_VERSION => WriterLink::set(
                    &mut self.short_link,
                    self.buf_base + 1,
                    r.timestamp_us,
                    r.topic.as_bytes(),
                ),
                _ => self.short_link = None,
            }
            let compressed = self.dev.stats.batches_compressed;
            self.write_resume_marker()?;
            let addr = l.seg_addr(head) + self.head_pos;
            let written = match &plan {
                Some(plan) => {
                    let whole = k == self.buf_count;
                    self.write_compact_batch(addr, &mut hdr, plan, body, whole, body_crc)
                }
                None => self.dev.write_padded(addr, &self.buf[..len]),
            };
            if let Err(e) = written {
                // The words from `addr` may be partly programmed: seal the head so that
                // they are never programmed again; the log is poisoned from here on.
                self.head_writable = false;
                return Err(FlushError::Flash(e));
            }
            if self.dev.stats.batches_compressed != compressed {
                self.short_link = None;
            }
            self.head_pos += align_up(hdr.len, l.ws());
            // The head holds data written since the mount: it was not abandoned.
            self.unclean_pending = false;
            self.dev.stats.batches_written += 1;
            self.flash_end = self.buf_base + k as u64;
            self.flash_last_crc = crc;
            self.drop_buffered(k, body, crc);
        }
        self.dev.sync().map_err(FlushError::Flash)?;
        self.durable_end = self.durable_end.max(self.flash_end);
        Ok(())
    }

    /// Writes the one buffered record as a short batch (`FORMAT.md` section 3.5) at the
    /// head position of `head` (`space` bytes left there), if it continues the last record
    /// written there ([`Log::short_link`]: the next offset, no resume marker pending),
    /// its body fits in [`SHORT_MAX_BODY`] bytes and its tag is not the erased value.
    /// `false`: write it as a full batch.
    ///
    /// Not inlined: its encoding buffer ([`SHORT_MAX_LEN`] bytes) is on the stack only
    /// while it runs, not in the frame of a flush that goes on to roll the segment and
    /// write the journal.
    #[inline(never)]
    fn write_short(&mut self, head: u32, space: u32) -> Result<bool, FlushError<F::Error>> {
        let l = self.dev.l;
        let Some(link) = self.short_link.as_ref() else {
            return Ok(false);
        };
        if self.buf_count != 1 || link.next != self.buf_base || self.resume.is_some() {
            return Ok(false);
        }
        let canonical = &self.buf[BATCH_HEADER_LEN..self.buf_len];
        let Some((r, len)) = parse_record_fields(canonical, self.buf_base) else {
            return Ok(false);
        };
        if r.payload.len() >= SHORT_MAX_BODY {
            return Ok(false);
        }
        let mut out = [0u8; SHORT_MAX_LEN];
        let Some(n) = short::encode(
            self.buf_base,
            self.buf_prev_crc,
            link.ts,
            &link.topic[..link.topic_len as usize],
            r.topic.as_bytes(),
            r.timestamp_us,
            r.producer,
            r.payload,
            &mut out,
        ) else {
            return Ok(false);
        };
        let padded = align_up(n as u32, l.ws());
        if out[0] == l.geo.erased || padded > space {
            return Ok(false);
        }
        // Whatever happens to the write (a failure poisons the log), the link moves on.
        WriterLink::set(
            &mut self.short_link,
            self.buf_base + 1,
            r.timestamp_us,
            r.topic.as_bytes(),
        );
        let addr = l.seg_addr(head) + self.head_pos;
        if let Err(e) = self.dev.write_padded(addr, &out[..n]) {
            // As after a failed batch write: the head is sealed, the log poisoned.
            self.head_writable = false;
            return Err(FlushError::Flash(e));
        }
        self.head_pos += padded;
        self.unclean_pending = false;
        self.dev.stats.batches_written += 1;
        self.dev.stats.short_batches_written += 1;
        self.flash_end = self.buf_base + 1;
        let crc = self.newest_crc();
        self.flash_last_crc = crc;
        self.drop_buffered(1, len, crc);
        Ok(true)
    }

    /// Writes the records `plan` chose from the front of the RAM buffer (`canon_len`
    /// bytes of canonical encodings; `whole`: they are every buffered record) as one
    /// compact batch at `addr`, compressed when [`Config::compression`] tries it and it
    /// comes out smaller (`FORMAT.md` section 4.4).
    ///
    /// Compressing takes the compact body into the scratch, moves it to the front of the
    /// RAM buffer (where the canonical encodings it was made from were, and with `whole`
    /// the rest of the buffer) and compresses it from there into the scratch. The
    /// canonical encodings of the batch are then gone from RAM: after a failed write the
    /// log is poisoned and never reads RAM again.
    ///
    /// [`Config::compression`]: super::Config::compression
    fn write_compact_batch(
        &mut self,
        addr: u32,
        hdr: &mut BatchHeader,
        plan: &compact::Plan,
        canon_len: usize,
        whole: bool,
        crc: Option<u32>,
    ) -> Result<(), F::Error> {
        let canonical = BATCH_HEADER_LEN..BATCH_HEADER_LEN + canon_len;
        #[cfg(feature = "compression")]
        {
            use super::lz4;
            let raw = plan.body_len;
            let region = if whole { self.buf.len() } else { canonical.end };
            if raw <= region && lz4::scratch_len(raw) <= self.scratch.buf.len() && self.lz4_try(raw)
            {
                self.scratch.holds = None;
                let scratch = &mut *self.scratch.buf;
                let mut at = 0usize;
                let _ =
                    compact::encode::<()>(&self.buf[canonical], hdr.base_offset, plan, &mut |b| {
                        scratch[at..at + b.len()].copy_from_slice(b);
                        at += b.len();
                        Ok(())
                    });
                self.buf[..raw].copy_from_slice(&scratch[..raw]);
                let mut prefix = [0u8; 11];
                prefix[0] = lz4::BODY_LZ4;
                let mut v = [0u8; 10];
                let vn = compact::put_varint(raw as u64, &mut v);
                prefix[1..1 + vn].copy_from_slice(&v[..vn]);
                let pn = 1 + vn;
                let stored = lz4::compress(&self.buf[..raw], scratch).filter(|&c| {
                    let s = pn + c;
                    s < raw
                        && s as u64 >= compact::min_body_len(1)
                        && compact::count_fits(hdr.count, s as u64)
                });
                self.lz4_outcome(stored.is_some());
                return match stored {
                    Some(c) => {
                        self.dev
                            .write_body(addr, hdr, &[&prefix[..pn], &self.scratch.buf[..c]])?;
                        self.dev.stats.batches_compressed += 1;
                        self.dev.stats.compressed_bytes_saved += (raw - pn - c) as u64;
                        Ok(())
                    }
                    None => self.dev.write_body(addr, hdr, &[&self.buf[..raw]]),
                };
            }
        }
        let _ = whole;
        self.dev
            .write_compact(addr, hdr, &self.buf[canonical], plan, crc)
    }

    /// Whether a batch written now may be compressed (a compression mode other than
    /// `None` and a scratch to compress into): [`compact::plan_with_crc`]'s CRC would go
    /// unused.
    fn may_compress(&self) -> bool {
        #[cfg(feature = "compression")]
        {
            self.cfg.compression != Compression::None && !self.scratch.buf.is_empty()
        }
        #[cfg(not(feature = "compression"))]
        false
    }

    /// Whether to try compressing a compact body of `raw` bytes now
    /// ([`Config::compression`](super::Config::compression)).
    #[cfg(feature = "compression")]
    fn lz4_try(&mut self, raw: usize) -> bool {
        match self.cfg.compression {
            Compression::None => false,
            Compression::Lz4 => true,
            Compression::Auto if raw < AUTO_MIN_BODY => false,
            Compression::Auto if self.lz4_skip > 0 => {
                self.lz4_skip -= 1;
                false
            }
            Compression::Auto => true,
        }
    }

    /// [`Compression::Auto`]'s back-off after a batch that was tried: `smaller` if it was
    /// stored compressed.
    #[cfg(feature = "compression")]
    fn lz4_outcome(&mut self, smaller: bool) {
        if smaller {
            self.lz4_backoff = 0;
        } else {
            self.lz4_backoff = (self.lz4_backoff.saturating_mul(2)).clamp(1, 64);
            self.lz4_skip = self.lz4_backoff;
        }
    }

    /// Writes the pending resume marker (if any) at the head position, after the torn bytes
    /// an unclean shutdown left in the head segment.
    fn write_resume_marker(&mut self) -> Result<(), FlushError<F::Error>> {
        let Some(m) = self.resume else {
            return Ok(());
        };
        let (Some(head), true) = (self.head, self.head_writable) else {
            return Ok(());
        };
        let l = self.dev.l;
        // Whatever happens to this write, these words are never programmed again.
        self.resume = None;
        let at = self.head_pos;
        self.head_pos += RESUME_LEN as u32;
        if let Err(e) = self.dev.write_padded(l.seg_addr(head) + at, &m.encode()) {
            // As after a failed batch write: the head is sealed, the log poisoned.
            self.head_writable = false;
            return Err(FlushError::Flash(e));
        }
        self.unclean_pending = false;
        debug!(
            "resumed segment {} at {} after {} torn bytes from {}",
            head, at, m.torn_bytes, m.torn_from
        );
        Ok(())
    }
}

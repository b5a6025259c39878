//! Mounting a partition (formatting one is `init`): the journal, one header per segment, the scan
//! of the head segment, torn tails and where the next write may go, and the producer table
//! rebuilt from the records the journal does not cover. How far a torn write reaches and
//! damage just before the tail are measured in `damage`.

use heapless::Vec;

use super::Log;
use super::compact::COMPACT_VERSION;
use super::compact_io::Walked;
use super::config::{Config, MIN_BUFFER, MIN_ERASE_SIZE, Memory, SegmentSlot};
use super::consumers::BRIDGE_CONSUMER;
use super::device::{Dev, Io};
use super::format::{
    BATCH_HEADER_LEN, BatchHeader, JOURNAL_BLOCKS, RESUME_LEN, ResumeMarker, SEGMENT_HEADER_LEN,
    SegmentHeader, align_up,
};
use super::journal;
use super::journal::Consumer;
use super::layout::Layout;
use super::outcome::{JournalInvalid, LostRange, LostReason, RecoveryReport, Stats};
use super::producers;
use super::producers::ProducerState;
use super::scan::{Next, Prev};
use crate::error::{MountError, ReadError};
use crate::storage::{Flash, Geometry};

/// What the mount's first phases ([`Log::open`]) found, to build the log from.
struct Opened<F: Flash> {
    dev: Dev<F>,
    log_id: u128,
    max_seq: u64,
    head: Option<u32>,
    tail: Option<u32>,
    jblock: u32,
    jpos: Option<u32>,
    jseq: u64,
}

/// What the mount's first phases found, for the recovery report.
#[derive(Clone, Copy)]
struct Found {
    /// A valid journal entry.
    journal: bool,
    /// Journal entries that did not validate.
    journal_invalid: JournalInvalid,
    /// Segments with a valid header.
    segments_valid: u32,
}

/// The position and header of the head segment's last valid batch, if any.
type LastBatch = Option<(u32, BatchHeader)>;

/// What the mount's last phases ([`Log::finish_mount`]) need from the recovery.
struct Rest {
    /// The producer table is rebuilt from the records at or above this offset.
    rebuild_from: u64,
    /// The head segment and its last valid batch (position and header), if there is a
    /// head: the CRC chain goes on from its last record.
    /// The head segment, its last valid batch, and that batch's record CRC when it is a
    /// short batch (known from its check).
    head_end: Option<(u32, LastBatch, Option<u32>)>,
}

/// What the recovery needs of the journal entry once its consumers and producers are in
/// the log ([`Log::load_journal`]): a few numbers, so that the entry (1.7 KiB on a
/// microcontroller) is off the stack before the recovery's scan of the head segment.
#[derive(Clone, Copy)]
pub(super) struct JournalFacts {
    /// No offset below the lease has been handed out without a newer entry.
    pub(super) lease: u64,
    /// The durable end when the entry was written.
    pub(super) durable_next: u64,
    /// The entry was written by a clean shutdown.
    pub(super) clean: bool,
    /// Where the producer table's rebuild starts ([`producers::rebuild_from`]).
    rebuild_from: u64,
}

/// The geometry recorded in the image must be the storage's: an error otherwise, never a
/// reinterpretation.
pub(super) fn same_geometry<E: core::fmt::Debug>(
    geo: &Geometry,
    erase_size: u32,
    write_size: u32,
    erased: u8,
) -> Result<(), MountError<E>> {
    if erase_size != geo.erase_size || write_size != geo.write_size || erased != geo.erased {
        return Err(MountError::GeometryMismatch {
            image_erase_size: erase_size,
            image_write_size: write_size,
            erase_size: geo.erase_size,
            write_size: geo.write_size,
        });
    }
    Ok(())
}

impl<'a, F: Flash> Log<'a, F> {
    /// Mounts a formatted partition and recovers its state. Recovery never fails on bad
    /// data: torn writes, corrupt batches and interrupted erases are reported in the
    /// [`RecoveryReport`], never returned as errors and never handed out as records.
    ///
    /// `now_us` is the caller's monotonic clock (µs). Errors: storage errors, an unusable
    /// or mismatching geometry, an unformatted partition, a too small [`Memory`],
    /// [`MountError::ScratchTooSmall`] when the records the mount must read (the head's last
    /// batch, the producers' newest records) are in a compressed batch that the scratch
    /// cannot hold (see [`Log::mount_with_scratch`]).
    ///
    /// The log is returned by value (over 5 KiB on a microcontroller, with its producer
    /// table): where stack is short, [`Log::mount_in`] builds it in the caller's slot.
    pub fn mount(
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        now_us: u64,
    ) -> Result<(Self, RecoveryReport), MountError<F::Error>> {
        Self::mount_with_scratch(flash, cfg, mem, &mut [], now_us)
    }

    /// [`Log::mount`] with a scratch buffer for compressed batches (`FORMAT.md` section
    /// 4.4): the log writes batches compressed as [`Config::compression`] says, and reads
    /// compressed batches by decoding each into the scratch once (never onto the heap).
    /// Give it `scratch_len(mem.buffer.len())` bytes (feature `compression`): a smaller
    /// scratch compresses only the batches whose worst case fits, and a compressed batch
    /// whose body decodes to more than it holds cannot be read
    /// ([`ReadError::ScratchTooSmall`]).
    ///
    /// Without the crate feature `compression` the scratch is not used: every batch is
    /// written uncompressed, and a compressed batch reads as corrupt.
    ///
    /// Errors: as [`Log::mount`].
    pub fn mount_with_scratch(
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        scratch: &'a mut [u8],
        now_us: u64,
    ) -> Result<(Self, RecoveryReport), MountError<F::Error>> {
        let mut slot = None;
        let report = Self::mount_in_with_scratch(&mut slot, flash, cfg, mem, scratch, now_us)?.1;
        // `mount_in_with_scratch` returned Ok: the slot holds the log.
        slot.map(|log| (log, report))
            .ok_or(MountError::NotFormatted)
    }

    /// [`Log::mount`] into `slot`, in place: the log is built where it stays, and the
    /// mount's phases run one after the other in frames of their own, so the mount's stack
    /// use is about one journal entry (2.3 KiB on a microcontroller) and one segment
    /// header's scan beside the slot, never a second copy of the log. A log already in
    /// the slot is dropped first. On an error the slot is left empty (the flash is dropped
    /// with the log, as [`Log::mount`] drops it).
    ///
    /// Errors: those of [`Log::mount`].
    ///
    /// Not inlined: the journal entry is on the stack only while the mount runs.
    #[inline(never)]
    pub fn mount_in<'s>(
        slot: &'s mut Option<Self>,
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        now_us: u64,
    ) -> Result<(&'s mut Self, RecoveryReport), MountError<F::Error>> {
        Self::mount_in_with_scratch(slot, flash, cfg, mem, &mut [], now_us)
    }

    /// [`Log::mount_in`] with a scratch buffer for compressed batches (see
    /// [`Log::mount_with_scratch`]).
    ///
    /// Errors: those of [`Log::mount`].
    #[inline(never)]
    pub fn mount_in_with_scratch<'s>(
        slot: &'s mut Option<Self>,
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        scratch: &'a mut [u8],
        now_us: u64,
    ) -> Result<(&'s mut Self, RecoveryReport), MountError<F::Error>> {
        *slot = None;
        let started = Self::mount_start(slot, flash, cfg, mem, scratch, now_us);
        let finished = match (started, slot.as_mut()) {
            (Ok((found, facts)), Some(log)) => log
                .recover(found, facts)
                .and_then(|(report, rest)| log.finish_mount(report, rest)),
            (Err(e), _) => Err(e),
            // Never: `mount_start` put the log in the slot when it returned Ok.
            (Ok(_), None) => Err(MountError::NotFormatted),
        };
        match finished {
            Err(e) => {
                *slot = None;
                Err(e)
            }
            // Never `None`: the log is in the slot.
            Ok(report) => slot
                .as_mut()
                .map(|log| (log, report))
                .ok_or(MountError::NotFormatted),
        }
    }

    /// The mount's first phases: [`Log::open`], the log built in `slot`
    /// ([`Log::assemble`]) and the journal entry's consumers and producers put in it
    /// ([`Log::load_journal`]). Holds the journal entry, which is off the stack once it
    /// returns: the recovery's scan of the head segment and the later phases run without it.
    /// Returns what the first phases found and, if there is a journal entry, what
    /// [`Log::recover`] needs of it.
    #[inline(never)]
    fn mount_start(
        slot: &mut Option<Self>,
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        scratch: &'a mut [u8],
        now_us: u64,
    ) -> Result<(Found, Option<JournalFacts>), MountError<F::Error>> {
        let mut entry = journal::Entry::empty();
        let (opened, found) = Self::open(flash, mem.buffer, mem.segments, &mut entry)?;
        let log = slot.insert(Self::assemble(opened, cfg, mem, scratch, now_us));
        Ok((found, found.journal.then(|| log.load_journal(&entry))))
    }

    /// Puts the journal `entry`'s consumers (their committed offsets as written: the
    /// recovery lowers them to the durable end it finds) and producers in the log, which
    /// holds none yet; returns what the recovery needs of the entry besides.
    fn load_journal(&mut self, entry: &journal::Entry) -> JournalFacts {
        for (name, off) in &entry.consumers {
            let _ = self.consumers.push(Consumer {
                name: name.clone(),
                committed: *off,
                persisted: *off,
            });
        }
        for p in &entry.producers {
            let _ = self.producers.push(ProducerState::from_snapshot(p));
        }
        JournalFacts {
            lease: entry.lease,
            durable_next: entry.durable_next,
            clean: entry.clean,
            rebuild_from: producers::rebuild_from(entry.durable_next, &entry.producers),
        }
    }

    /// The mount's last phases: the CRC of the head's last record (the chain the next
    /// batch continues), the producer table rebuilt from the records at or above
    /// [`Rest::rebuild_from`], and the journal entry that marks the log as running.
    #[inline(never)]
    fn finish_mount(
        &mut self,
        mut report: RecoveryReport,
        rest: Rest,
    ) -> Result<RecoveryReport, MountError<F::Error>> {
        if let Some((seg, last, short_crc)) = rest.head_end {
            // CRC of the last record of the segment's last batch, or the header's prev CRC.
            self.flash_last_crc = match last {
                Some(_) if short_crc.is_some() => Ok(short_crc.unwrap_or(0)),
                Some((pos, h)) => self.last_record_crc(seg, pos, &h),
                None => {
                    let addr = self.dev.l.seg_addr(seg);
                    (self.dev.read_segment_header(addr)).map(|h| h.map_or(0, |h| h.prev_crc))
                }
            }
            .map_err(MountError::Flash)?;
        }
        self.last_crc = self.flash_last_crc;
        self.buf_prev_crc = self.last_crc;
        self.rebuild_producers(rest.rebuild_from)
            .map_err(MountError::Flash)?;
        // The corrupt offsets the mount found count at once (reads add only new ones).
        if let Some((from, to)) = self.damaged_before_tail() {
            self.count_corrupt(from, to);
        }
        if let Some(l) = report.head_lost {
            self.count_corrupt(l.from, l.to);
        }
        if let Some(needed) = self.needs_scratch {
            return Err(MountError::ScratchTooSmall {
                needed,
                len: self.scratch.buf.len(),
            });
        }

        // 6. Mark the log as running (clears the clean flag) with the lease in place. A
        // journal whose seq leaves no room for another entry (a crafted or damaged image)
        // mounts read-only: every write needs an entry first (an append its lease, a
        // commit, a segment), so each fails with `SeqExhausted` and nothing acknowledged
        // or committed is put at risk; the records stay readable.
        match self.persist_journal(false) {
            Ok(()) => {}
            Err(Io::Flash(e)) => return Err(MountError::Flash(e)),
            Err(Io::BadBlock(block)) => return Err(MountError::WornJournal { block }),
            Err(Io::SeqExhausted(_)) => warn!(
                "journal entry seq {} is the last the format allows: the log is read-only; drain it and format again",
                self.jseq
            ),
        }
        report.first_offset = self.first_offset();
        report.next_offset = self.next_offset;
        report.flash_reads = self.dev.stats.flash_reads;
        info!(
            "mounted log {:032x}: offsets {}..{}, clean {}, torn {} B",
            self.log_id,
            report.first_offset,
            report.next_offset,
            report.clean,
            report.torn_tail_bytes
        );
        Ok(report)
    }

    /// The mount's first phases: checks the geometry and the RAM buffer's size, reads the
    /// journal (through `buffer`, see [`Log::scan_journal`]; its newest entry into
    /// `entry`), finds the log id and segment size, and reads one
    /// header per segment into `segments`.
    #[inline(never)]
    fn open(
        flash: F,
        buffer: &mut [u8],
        segments: &mut [SegmentSlot],
        entry: &mut journal::Entry,
    ) -> Result<(Opened<F>, Found), MountError<F::Error>> {
        let geo = flash.geometry();
        if !geo.is_valid() || geo.erase_size < MIN_ERASE_SIZE {
            return Err(MountError::Geometry);
        }
        if buffer.len() < MIN_BUFFER {
            return Err(MountError::BufferTooSmall {
                len: buffer.len(),
                min: MIN_BUFFER,
            });
        }
        let mut dev = Dev {
            flash,
            l: Layout::new(geo, 1),
            stats: Stats::default(),
            failed: None,
        };

        // 1. The journal.
        let (journal_found, jblock, jpos, jinvalid) =
            Self::scan_journal(&mut dev, entry, buffer)
                .map_err(|(block, error)| MountError::JournalUnreadable { block, error })?;

        // 2. Geometry and log id: from the journal, else from the first valid segment
        // header found at an erase block start where a segment of its own geometry begins
        // (no single damaged header decides whether the partition is a log).
        let (log_id, bps) = if journal_found {
            same_geometry(&geo, entry.erase_size, entry.write_size, entry.erased)?;
            (entry.log_id, entry.blocks_per_segment)
        } else {
            let mut found = None;
            for blk in JOURNAL_BLOCKS..geo.blocks() {
                let mut hb = [0u8; SEGMENT_HEADER_LEN];
                dev.read(blk * geo.erase_size, &mut hb)
                    .map_err(MountError::Flash)?;
                if let Some(h) = SegmentHeader::decode(&hb)
                    && h.blocks_per_segment > 0
                    && h.erase_size == geo.erase_size
                    && (blk - JOURNAL_BLOCKS).is_multiple_of(h.blocks_per_segment)
                {
                    found = Some((h.log_id, h.blocks_per_segment));
                    break;
                }
            }
            found.ok_or(MountError::NotFormatted)?
        };
        let l = Layout::new(geo, bps);
        if bps == 0 || l.seg_count < 2 {
            return Err(MountError::NotFormatted);
        }
        dev.l = l;
        if segments.len() < l.seg_count as usize {
            return Err(MountError::SegmentTable {
                segments: l.seg_count,
                slots: segments.len(),
            });
        }

        // 3. One header per segment.
        let mut valid = 0u32;
        let mut head: Option<u32> = None;
        let mut tail: Option<u32> = None;
        let mut max_seq = 0u64;
        for s in 0..l.seg_count {
            let h = dev
                .read_segment_header(l.seg_addr(s))
                .map_err(MountError::Flash)?;
            let slot = &mut segments[s as usize];
            *slot = SegmentSlot::EMPTY;
            let Some(h) = h else {
                continue;
            };
            if h.log_id != log_id {
                continue;
            }
            same_geometry(&geo, h.erase_size, h.write_size, h.erased)?;
            if h.blocks_per_segment != bps || h.segment_count != l.seg_count {
                continue;
            }
            *slot = SegmentSlot {
                seq: h.seq,
                base: h.base_offset,
                erase_count: h.erase_count,
                valid: true,
                after_unclean: h.after_unclean,
                version: h.version,
            };
            valid += 1;
            max_seq = max_seq.max(h.seq);
            if head.is_none_or(|x| segments[x as usize].seq < h.seq) {
                head = Some(s);
            }
            if tail.is_none_or(|x| segments[x as usize].seq > h.seq) {
                tail = Some(s);
            }
        }
        if !journal_found && valid == 0 {
            return Err(MountError::NotFormatted);
        }
        // Valid segments must have increasing bases in ring order; a header that breaks
        // that (possible only on a damaged image) is ignored.
        if let (Some(t), Some(_)) = (tail, head) {
            let mut last_base = 0u64;
            for i in 0..l.seg_count {
                let s = ((t + i) % l.seg_count) as usize;
                if segments[s].valid {
                    if segments[s].base < last_base {
                        segments[s].valid = false;
                        valid -= 1;
                    } else {
                        last_base = segments[s].base;
                    }
                }
            }
            head = (0..l.seg_count)
                .filter(|&s| segments[s as usize].valid)
                .max_by_key(|&s| segments[s as usize].seq);
        }
        Ok((
            Opened {
                dev,
                log_id,
                max_seq,
                head,
                tail,
                jblock,
                jpos,
                jseq: if journal_found { entry.seq } else { 0 },
            },
            Found {
                journal: journal_found,
                journal_invalid: jinvalid,
                segments_valid: valid,
            },
        ))
    }

    /// The log as [`Log::open`] found it, before recovery: built where it is stored
    /// (inlined into [`Log::mount_in`]'s `Option::insert`).
    #[inline(always)]
    fn assemble(
        o: Opened<F>,
        cfg: Config,
        mem: Memory<'a>,
        scratch: &'a mut [u8],
        now_us: u64,
    ) -> Self {
        Log {
            dev: o.dev,
            cfg,
            log_id: o.log_id,
            slots: mem.segments,
            max_seq: o.max_seq,
            head: o.head,
            head_pos: 0,
            head_writable: false,
            unclean_pending: false,
            resume: None,
            tail: o.tail,
            next_offset: 0,
            flash_end: 0,
            durable_end: 0,
            flash_last_crc: 0,
            last_crc: 0,
            newest_crc_from: None,
            lease: 0,
            buf_cap: 0,
            buf: mem.buffer,
            buf_len: BATCH_HEADER_LEN,
            buf_count: 0,
            buf_base: 0,
            buf_prev_crc: 0,
            buf_first_us: now_us,
            needs_scratch: None,
            scratch: super::lz4::Scratch {
                buf: scratch,
                #[cfg(feature = "compression")]
                holds: None,
            },
            #[cfg(feature = "compression")]
            lz4_skip: 0,
            #[cfg(feature = "compression")]
            lz4_backoff: 0,
            consumers: Vec::new(),
            released: 0,
            corrupt_seen: Vec::new(),
            producers: Vec::new(),
            dirty: false,
            last_persist_us: now_us,
            now_us,
            jblock: o.jblock,
            jpos: o.jpos,
            jseq: o.jseq,
            damaged: None,
            damaged_at_head_end: None,
            short_link: None,
            cursor: None,
            last_batch: None,
            read_start: None,
            index_seg: None,
            index: Vec::new(),
        }
    }

    /// The mount's recovery, on the log [`Log::mount_start`] made: the damage before the
    /// tail, the scan of the head segment, offsets and consumers (those of the journal
    /// entry, `facts` its numbers, if [`Found::journal`]). Returns the report so far and
    /// what [`Log::finish_mount`] needs.
    #[inline(never)]
    fn recover(
        &mut self,
        found: Found,
        facts: Option<JournalFacts>,
    ) -> Result<(RecoveryReport, Rest), MountError<F::Error>> {
        let log = self;
        let l = log.dev.l;
        let head = log.head;
        let seg_data = (l.seg_size - l.data_start) & !(l.ws() - 1);
        log.buf_cap = log.buf.len().min(seg_data as usize);
        let clean = facts.is_some_and(|f| f.clean);
        log.find_damage_before_tail(clean)
            .map_err(MountError::Flash)?;

        // 4. Scan the head segment.
        let mut report = RecoveryReport {
            segments: l.seg_count,
            segments_valid: found.segments_valid,
            head_records: 0,
            torn_tail_bytes: 0,
            clean: false,
            journal_found: found.journal,
            journal_seq: log.jseq,
            journal_invalid: found.journal_invalid,
            journal_clean: false,
            not_durable: None,
            head_lost: None,
            first_offset: 0,
            next_offset: 0,
            flash_reads: 0,
        };
        let mut head_clean = false;
        // Torn bytes after the head's data: (end of the data, end of the bytes that do not
        // read erased, how many do not).
        let mut torn_at: Option<(u32, u32, u32)> = None;
        let mut head_end = None;
        let mut head_last_crc = None;
        if let Some(h) = head {
            let slot = log.slots[h as usize];
            let mut pos = l.data_start;
            let mut expected = slot.base;
            let mut last_batch: Option<(u32, BatchHeader)> = None;
            let mut prev = Prev::None;
            loop {
                match log
                    .dev
                    .next_batch(h, pos, expected, prev)
                    .map_err(MountError::Flash)?
                {
                    Next::Batch {
                        pos: p,
                        h: bh,
                        after_corruption,
                        short,
                    } => {
                        prev = Prev::after(slot.version, p, &bh, short);
                        // A short batch's record CRC is known from its check.
                        head_last_crc = short.map(|(_, out)| out.prev_crc);
                        if after_corruption && report.head_lost.is_none() {
                            report.head_lost = Some(LostRange {
                                from: expected,
                                to: bh.base_offset,
                                reason: LostReason::Corrupt,
                            });
                        }
                        report.head_records += bh.count as u64;
                        expected = bh.end_offset();
                        last_batch = Some((p, bh));
                        pos = p + align_up(bh.len, l.ws());
                    }
                    Next::End {
                        pos: p,
                        corrupt,
                        linked,
                    } => {
                        // Count the non-erased bytes after the last valid batch and find
                        // where they end (a byte that read non-erased once counts for
                        // where the next write may go; the report counts bytes that read
                        // non-erased twice).
                        let tail = log
                            .dev
                            .count_non_erased(l.seg_addr(h) + p, l.seg_size - p)
                            .map_err(MountError::Flash)?;
                        let (torn, any) = (tail.both, tail.any);
                        let used_end = p + tail.used_end;
                        if report.head_lost.is_none()
                            && let Some((from, to)) =
                                log.durable_but_damaged(h, p, expected, corrupt, linked, facts)?
                        {
                            // Durable records, not a torn write: lost to damage.
                            warn!(
                                "head segment {}: offsets {}..{} below the durable end cannot be read: lost to damage",
                                h, from, to
                            );
                            log.damaged_at_head_end = Some((from, to));
                            report.head_lost = Some(LostRange {
                                from,
                                to,
                                reason: LostReason::Corrupt,
                            });
                        }
                        report.torn_tail_bytes = torn;
                        head_clean = !corrupt && any == 0 && report.head_lost.is_none();
                        pos = p;
                        if any > 0 {
                            torn_at = Some((p, used_end, any));
                        }
                        break;
                    }
                }
            }
            log.head_pos = pos;
            log.flash_end = expected;
            head_end = Some((h, last_batch, head_last_crc));
        }

        // 5. Offsets, consumers, producers.
        let (jlease, jdurable, jclean) = match facts {
            Some(f) => (f.lease, f.durable_next, f.clean),
            None => (0, 0, false),
        };
        // A clean shutdown leaves a head that ends in erased flash. (The journal's durable
        // end may be past the head's data: records consumed from RAM and never written.)
        report.clean = jclean && head_clean && jdurable >= log.flash_end && head.is_some();
        report.journal_clean = jclean;
        // Records lost to damage at the head's end were durable (a chain of short batches
        // can show more of them than the journal's `durable_next`).
        let damaged_to = log.damaged_at_head_end.map_or(0, |d| d.1);
        log.durable_end = log.flash_end.max(jdurable).max(damaged_to);
        log.next_offset = log.durable_end.max(jlease);
        if log.next_offset > log.durable_end {
            report.not_durable = Some((log.durable_end, log.next_offset));
        }
        log.lease = log.next_offset;
        log.head_writable = report.clean;
        log.unclean_pending = !report.clean;
        if !report.clean
            && let Some(h) = head
        {
            // After an unclean shutdown the head is appended to again, never over a torn
            // word: with no torn bytes the next batch follows the data (readers see the
            // offsets it skips as a gap before it), else it goes after the torn bytes,
            // behind a resume marker (format version 2 segments only; a version 1 head is
            // abandoned for a fresh segment as before).
            match torn_at {
                None => log.head_writable = true,
                Some((from, used_end, torn)) => {
                    let at = log
                        .torn_extent(h, from, used_end)
                        .map_err(MountError::Flash)?;
                    if log.slots[h as usize].version >= 2
                        && at as u64 + RESUME_LEN as u64 <= l.seg_size as u64
                    {
                        log.head_pos = at;
                        log.head_writable = true;
                        log.resume = Some(ResumeMarker {
                            expected: log.flash_end,
                            torn_from: from,
                            torn_bytes: torn,
                        });
                    }
                }
            }
        }
        if log.damaged_at_head_end.is_some() {
            // The head ends in damaged durable records, not a torn write: the next batch
            // opens a new segment whose header does not say "after an unclean shutdown",
            // so reads keep naming those records corrupt after later mounts (behind a
            // resume marker they would read as never persisted).
            log.head_writable = false;
            log.resume = None;
            log.unclean_pending = false;
        }
        log.buf_base = log.next_offset;
        match facts {
            Some(_) => {
                for c in log.consumers.iter_mut() {
                    let committed = c.committed.min(log.durable_end);
                    (c.committed, c.persisted) = (committed, committed);
                }
            }
            None => {
                let first = log.first_offset();
                let mut name = heapless::String::new();
                let _ = name.push_str(BRIDGE_CONSUMER);
                let _ = log.consumers.push(Consumer {
                    name,
                    committed: first,
                    persisted: first,
                });
            }
        }
        // No consumer is known to have read anything retained.
        log.released = log.first_offset();
        let rebuild_from = facts.map_or(jdurable, |f| f.rebuild_from);
        Ok((
            report,
            Rest {
                rebuild_from,
                head_end,
            },
        ))
    }

    /// Record CRC of the last record of the (valid) batch at `pos` of `seg`.
    #[inline(never)]
    fn last_record_crc(&mut self, seg: u32, pos: u32, h: &BatchHeader) -> Result<u32, F::Error> {
        let l = self.dev.l;
        if self.slots[seg as usize].version >= COMPACT_VERSION {
            let mut crc = h.prev_crc;
            let walked =
                self.dev
                    .walk_compact(l.seg_addr(seg) + pos, h, &mut self.scratch, |_, _, c| {
                        crc = c
                    })?;
            if let Walked::ScratchTooSmall { needed } = walked {
                self.needs_scratch = Some(needed);
            }
            return Ok(crc);
        }
        let mut at = l.seg_addr(seg) + pos + BATCH_HEADER_LEN as u32;
        let end = l.seg_addr(seg) + pos + h.len;
        let mut crc = h.prev_crc;
        for i in 0..h.count as u64 {
            let Some(len) = self.dev.record_len_at(at, end - at)? else {
                break;
            };
            let mut hasher = crate::crc::Hasher::new();
            hasher.update(&(h.base_offset + i).to_le_bytes());
            self.dev.crc_of(&mut hasher, at, len)?;
            crc = hasher.finalize();
            at += len;
        }
        Ok(crc)
    }

    /// Rebuilds the producer table from the records at or above `from` (the journal's
    /// snapshot covers those below), using the empty RAM buffer as scratch.
    #[inline(never)]
    fn rebuild_producers(&mut self, from: u64) -> Result<(), F::Error> {
        let mut at = from.max(self.first_offset());
        while at < self.flash_end {
            let buf = core::mem::take(&mut self.buf);
            let r = self.read_flash(at, buf);
            self.buf = buf;
            let out = match r {
                Ok(o) => o,
                Err(ReadError::Flash(e)) => return Err(e),
                Err(ReadError::ScratchTooSmall { needed, .. }) => {
                    self.needs_scratch = Some(needed);
                    break;
                }
                Err(_) => break,
            };
            if out.next_offset <= at {
                break;
            }
            let buf = core::mem::take(&mut self.buf);
            for r in out.records(buf) {
                if let Some(p) = r.producer {
                    self.note_producer(p.id, p.seq, r.offset);
                }
            }
            self.buf = buf;
            at = out.next_offset;
        }
        Ok(())
    }
}

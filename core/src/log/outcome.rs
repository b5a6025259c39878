//! What the log's operations report: read outcomes and the ranges of offsets that cannot be
//! read, append and session results, what a mount found, and the counters since mount.

use super::format::RecordIter;

/// Why offsets cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LostReason {
    /// A batch failed its CRC or length check (bit flips, a damaged segment).
    Corrupt,
    /// The offsets were never stored: handed out from RAM but not durable at a crash, or
    /// consumed by every consumer while in RAM and never spilled (`OnPressure`).
    Skipped,
}

/// A range of offsets that cannot be read, `from..to` (end exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LostRange {
    /// First lost offset.
    pub from: u64,
    /// One past the last lost offset.
    pub to: u64,
    /// Why.
    pub reason: LostReason,
}

/// Result of [`Log::read`](super::Log::read): `count` records with consecutive offsets from
/// `first_offset`, their encodings back to back in the first `len` bytes of the caller's
/// buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Offset of the first record returned (the `from` asked for, unless `lost` is set).
    pub first_offset: u64,
    /// Records returned (0 when at the end of the log or when `lost` is set).
    pub count: u32,
    /// Bytes of the caller's buffer filled.
    pub len: usize,
    /// Record CRC of the last record before `first_offset` (0 if none).
    pub prev_crc: u32,
    /// Where the next read should start.
    pub next_offset: u64,
    /// Set when `from` falls in a range that cannot be read; then `count` is 0 and
    /// `next_offset` is `lost.to`.
    pub lost: Option<LostRange>,
}

impl ReadOutcome {
    /// Iterates the records this read put into `buf`.
    pub fn records<'b>(&self, buf: &'b [u8]) -> RecordIter<'b> {
        RecordIter::new(
            &buf[..self.len.min(buf.len())],
            self.first_offset,
            self.count,
        )
    }
}

/// Result of [`Log::append`](super::Log::append).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The record's offset.
    pub offset: u64,
    /// The record was a resend of an idempotent producer's record and was not stored
    /// again; `offset` is the original one.
    pub duplicate: bool,
}

/// A producer session, from [`Log::open_session`](super::Log::open_session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Session {
    /// Producer id.
    pub producer: u64,
    /// The session's epoch (1 for an id's first session).
    pub epoch: u32,
    /// The last sequence stored in this session (durably, for a resumed one); 0 if none.
    /// The producer's next record takes `last_seq + 1` (wrapping).
    pub last_seq: u32,
    /// The id's current session was resumed (false: a new session was opened).
    pub resumed: bool,
}

/// Journal entries that did not validate at mount, by what they can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct JournalInvalid {
    /// Entries that did not validate with a valid entry after them in the same erase
    /// block: damaged after they were written (a bit flip, a worn cell), never by a power
    /// cut. The mount skipped them.
    pub damaged: u32,
    /// Erase blocks whose last entry did not validate: a write torn by a power cut, or
    /// damage to that entry; the mount cannot tell which. When it was the newest entry,
    /// committed offsets, the offset lease and the producer table come from the entry
    /// before it: consumers re-read from their older committed offsets (nothing is lost).
    pub torn: u32,
}

/// What [`Log::mount`](super::Log::mount) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RecoveryReport {
    /// Segments in the ring (one header read each).
    pub segments: u32,
    /// Segments with a valid header of this log.
    pub segments_valid: u32,
    /// Records found in the head segment.
    pub head_records: u64,
    /// Non-erased bytes after the last valid batch of the head segment (a torn write).
    pub torn_tail_bytes: u32,
    /// The last shutdown was clean (and the head may be appended to).
    pub clean: bool,
    /// The journal recorded a clean shutdown. If `clean` is false all the same, the head
    /// segment changed after that shutdown (a bit flip or a damaged write, not a power cut):
    /// records that were durable may be missing.
    pub journal_clean: bool,
    /// A valid journal entry was found.
    pub journal_found: bool,
    /// Sequence number of the journal entry the mount used (0 without one).
    pub journal_seq: u64,
    /// Journal entries that did not validate.
    pub journal_invalid: JournalInvalid,
    /// Offsets handed out before the crash but not durable: `from..to`, never reused.
    pub not_durable: Option<(u64, u64)>,
    /// Corrupt range found inside the head segment.
    pub head_lost: Option<LostRange>,
    /// First retained offset after mount.
    pub first_offset: u64,
    /// Next offset after mount.
    pub next_offset: u64,
    /// Flash read operations done by the mount.
    pub flash_reads: u64,
}

/// Counters since mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stats {
    /// Records appended (duplicates not counted).
    pub records_appended: u64,
    /// Payload bytes appended.
    pub payload_bytes_appended: u64,
    /// Resends recognised as duplicates.
    pub duplicates: u64,
    /// Batches written to flash.
    pub batches_written: u64,
    /// Flushes that ended with a sync.
    pub syncs: u64,
    /// Bytes programmed into flash (padding, headers and journal included).
    pub flash_bytes_programmed: u64,
    /// Erase-block erases.
    pub erases: u64,
    /// Flash read operations.
    pub flash_reads: u64,
    /// Bytes read from flash (every read operation counted, re-reads included).
    pub flash_bytes_read: u64,
    /// Journal entries written.
    pub journal_writes: u64,
    /// Segments opened.
    pub segments_opened: u64,
    /// Records reclaimed unread: erased with their segment (under `DropOldest`, or under
    /// either policy when no consumer is left) at or after the lowest committed offset of
    /// the consumers, or with no consumer, at or after the highest committed offset of the
    /// consumers deleted since the mount (the first retained offset after a mount without
    /// consumers: the log cannot prove that anyone read them). Records in corrupt batches
    /// are not counted again here; skipped offsets hold no record and are never counted.
    pub records_dropped: u64,
    /// Records consumed from RAM and never written (`OnPressure`).
    pub records_discarded: u64,
    /// Reads that met a corrupt batch (a range read again is counted again; see
    /// `corrupt_offsets` for what was lost).
    pub corrupt_batches: u64,
    /// Offsets reported corrupt by reads, each counted once however often it is read (the
    /// last [`CORRUPT_RANGES_REMEMBERED`] ranges reported are remembered for that).
    pub corrupt_offsets: u64,
    /// Batches written compressed (`FORMAT.md` section 4.4).
    pub batches_compressed: u64,
    /// Bytes the compressed batches saved: their compact bodies' lengths minus what was
    /// stored (before padding to the write size).
    pub compressed_bytes_saved: u64,
    /// Compressed batches reads handed out from their first record on (a read that starts
    /// inside a batch does not count it again: one pass over the log counts each once).
    pub compressed_batches_read: u64,
    /// Bytes those batches saved (as `compressed_bytes_saved`).
    pub compressed_bytes_read_saved: u64,
    /// Short batches written (one record flushed alone, `FORMAT.md` section 3.5).
    pub short_batches_written: u64,
    /// Short batches reads handed out (each read of one counts).
    pub short_batches_read: u64,
}

/// Corrupt ranges the log remembers so that reading one again (a consumer fetching it
/// again, a second consumer) does not count its offsets twice in [`Stats::corrupt_offsets`].
pub const CORRUPT_RANGES_REMEMBERED: usize = 8;

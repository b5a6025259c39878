//! The power-cut-safe segmented log.
//!
//! ## Layout
//! A partition of `B` erase blocks of `E` bytes holds:
//! - blocks 0 and 1: the commit journal (consumers' committed offsets, the offset lease and
//!   a producer snapshot), written as whole snapshots, the two blocks used in turn;
//! - blocks 2.. : `N = (B - 2) / blocks_per_segment` segments forming a ring, each starting
//!   with a segment header (geometry, log id, sequence number, base offset, CRC of the
//!   record before the base offset, erase count) followed by batches of records, each batch
//!   with its own CRC-32 and padded to the write size.
//!
//! `FORMAT.md` has the byte tables.
//!
//! ## Writing
//! [`Log::append`] encodes a record into the RAM buffer, which already has the layout of a
//! batch; the buffer is written as one batch (group commit) when it is full, when its oldest
//! record has waited longer than the linger time ([`Log::tick`]), on [`Log::flush`] (a
//! durable request) and on [`Log::close`]. A segment is only ever written front to back,
//! each word once; a new segment is erased and verified blank before its header is written.
//!
//! ## Recovery
//! [`Log::mount`] reads the journal, one header per segment, and scans the head segment
//! batch by batch, so its cost grows with the number of segments plus one segment's bytes,
//! not with the amount of data. After an unclean shutdown the head is appended to again,
//! never over a torn write: the next batch follows the data, or, when the head ends in
//! torn bytes, a 32-byte resume marker placed right after them (format version 2) and the
//! batch after it. An unclean boot costs the torn bytes plus the marker, never a segment.
//! Offsets are never reused: the journal holds an offset lease ahead of the next offset, and
//! after a crash the next offset starts at the lease (at most [`Config::lease_step`]
//! offsets skipped per crash, read back as never persisted).
//!
//! ## Guarantees
//! Every offset below [`Log::durable_offset`] survives a power cut, as long as the flash
//! keeps its bits. A corrupt batch deeper in the log (a bit flip) costs only its own
//! records: reads report the exact lost range and go on after it.

//! ## Storage errors
//! A failed write, erase or sync is final: the log cannot know what the storage kept (a
//! write may have programmed part of its words; a failed sync may have lost every write
//! since the last good one, while a cache still shows them). The first failure is returned
//! as the storage error and poisons the log ([`Log::poisoned`]): the durable offset stays
//! where the last successful sync left it, nothing more is written, and every writing call
//! fails with a `Poisoned` error until the storage is mounted again. The mount then decides
//! from what the flash holds; the words a failed write touched are never programmed again
//! in place (the head segment is sealed), and the journal keeps its newest valid entry
//! until an entry in its other block is written and synced.

pub mod format;
mod journal;
pub mod producers;
#[cfg(test)]
mod tests;

use heapless::Vec;

use crate::error::{
    AppendError, CommitError, FlushError, FormatError, MountError, ReadError, SessionError,
    StorageOp,
};
use crate::storage::{Flash, Geometry};
use format::{
    BATCH_HEADER_LEN, BatchHeader, FORMAT_VERSION, HeadCheck, JOURNAL_BLOCKS,
    MAX_CONSUMER_NAME_LEN, MAX_TOPIC_LEN, RESUME_LEN, ResumeMarker, SEGMENT_HEADER_LEN,
    SegmentHeader, align_up, parse_record_fields,
};
pub use format::{Producer, Record, RecordIter, RecordRef, record_crc};
use journal::Consumer;
pub use journal::MAX_CONSUMERS;
pub use producers::{MAX_PRODUCERS, PRODUCER_WINDOW, seq_before};
use producers::{ProducerState, Verdict};

/// What a journal entry says of the log it belongs to (see [`journal_geometry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalGeometry {
    /// Entry sequence number (higher is newer).
    pub seq: u64,
    /// The log id.
    pub log_id: u128,
    /// Erase block size of the partition, bytes.
    pub erase_size: u32,
    /// Write granularity of the partition, bytes.
    pub write_size: u32,
    /// The erased value.
    pub erased: u8,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
}

/// Longest journal entry in bytes: read this many bytes (or up to the end of the
/// partition) from the start of a journal block for [`journal_geometry`].
pub const MAX_JOURNAL_ENTRY_LEN: usize = journal::MAX_ENTRY_LEN;

/// Decodes the journal entry at the start of `bytes` (the first bytes of a journal block:
/// block 0 starts the partition, block 1 follows at one erase size) and returns the log's
/// geometry, for tools that open an image without knowing its erase size. `None` unless
/// the magic, length check and CRC all hold.
pub fn journal_geometry(bytes: &[u8]) -> Option<JournalGeometry> {
    let head: &[u8; 16] = bytes.get(..16)?.try_into().ok()?;
    let len = journal::entry_len(head, bytes.len())?;
    let e = journal::decode(bytes.get(..len)?)?;
    Some(JournalGeometry {
        seq: e.seq,
        log_id: e.log_id,
        erase_size: e.erase_size,
        write_size: e.write_size,
        erased: e.erased,
        blocks_per_segment: e.blocks_per_segment,
    })
}

/// Name of the consumer registered at format time.
pub const BRIDGE_CONSUMER: &str = "bridge";

/// Smallest erase block the log accepts, bytes (a journal entry must fit in one).
pub const MIN_ERASE_SIZE: u32 = 1024;

/// Smallest RAM buffer, bytes.
pub const MIN_BUFFER: usize = 256;

/// Erase attempts before an erase block is declared bad.
const ERASE_ATTEMPTS: u32 = 3;

/// Reads of one piece of flash before the log gives up on it: a read that returns an error
/// is retried until it has failed this many times (then the error is returned), and a
/// batch, segment header or journal entry that does not validate is read again until it
/// has failed this many times (then it is declared corrupt). A cell that reads wrong on
/// some reads only (a weak bit, a marginal supply) so costs a re-read, not a permanent gap;
/// a batch wrong on every read is reported corrupt after `READ_ATTEMPTS - 1` re-reads.
/// Blank (erased) regions are never re-read.
pub const READ_ATTEMPTS: u32 = 16;

/// Bytes read at a time when scanning flash.
const CHUNK: usize = 256;

/// Entries of the sparse batch index kept for the last segment scanned.
const INDEX_ENTRIES: usize = 16;

/// What to write to flash and when (TimeTunnel's spill policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SpillPolicy {
    /// Every record reaches flash.
    Always,
    /// Records that every consumer has committed while they are still in RAM are dropped
    /// unwritten; the rest is written when a record would take the buffer past its
    /// high-water mark (before that record is added), when the linger time runs out, or on
    /// a durable request.
    OnPressure,
}

/// What happens when the ring is full of records some consumer still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FullPolicy {
    /// Appends fail with a "full" error (backpressure); nothing is lost.
    RejectNew,
    /// The oldest segment is erased even if a consumer has not read it; the dropped
    /// records are counted and reads of them say which offsets are gone.
    DropOldest,
}

/// Run-time settings of a mounted log. Times are in µs of the caller's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// Spill policy.
    pub spill: SpillPolicy,
    /// Full-storage policy.
    pub full: FullPolicy,
    /// Longest time a record waits in RAM before [`Log::tick`] writes it, µs.
    pub linger_us: u64,
    /// `OnPressure`: buffer fill, in percent, above which records are written.
    pub high_water_percent: u8,
    /// Longest time a commit waits in RAM before [`Log::tick`] persists it, µs.
    pub commit_interval_us: u64,
    /// Offsets reserved by one journal write of the offset lease. A crash skips at most
    /// this many offsets (handed out or not, they are never reused and read back as never
    /// persisted), so offsets count positions, not records.
    pub lease_step: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            spill: SpillPolicy::Always,
            full: FullPolicy::RejectNew,
            linger_us: 100_000,
            high_water_percent: 75,
            commit_interval_us: 1_000_000,
            lease_step: 1024,
        }
    }
}

/// What the log knows of one physical segment (one slot per segment, caller-provided).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentSlot {
    seq: u64,
    base: u64,
    erase_count: u32,
    valid: bool,
    after_unclean: bool,
    /// Format version of the segment's header.
    version: u16,
}

impl SegmentSlot {
    /// An unused slot, to fill the caller's array with.
    pub const EMPTY: SegmentSlot = SegmentSlot {
        seq: 0,
        base: 0,
        erase_count: 0,
        valid: false,
        after_unclean: false,
        version: 0,
    };
}

/// Memory the log works in, provided by the caller (no allocation inside).
#[derive(Debug)]
pub struct Memory<'a> {
    /// The RAM buffer: the pending batch (at least [`MIN_BUFFER`] bytes). Its size bounds
    /// the largest batch and therefore the largest record.
    pub buffer: &'a mut [u8],
    /// One slot per segment of the partition ([`segments_for`] tells how many).
    pub segments: &'a mut [SegmentSlot],
}

/// Number of segments a partition of `geometry` holds with `blocks_per_segment`.
pub fn segments_for(geometry: &Geometry, blocks_per_segment: u32) -> u32 {
    if blocks_per_segment == 0 {
        return 0;
    }
    geometry.blocks().saturating_sub(JOURNAL_BLOCKS) / blocks_per_segment
}

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

/// Result of [`Log::read`]: `count` records with consecutive offsets from `first_offset`,
/// their encodings back to back in the first `len` bytes of the caller's buffer.
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

/// Result of [`Log::append`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The record's offset.
    pub offset: u64,
    /// The record was a resend of an idempotent producer's record and was not stored
    /// again; `offset` is the original one.
    pub duplicate: bool,
}

/// A producer session, from [`Log::open_session`].
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

/// What [`Log::mount`] found.
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
}

/// Corrupt ranges the log remembers so that reading one again (a consumer fetching it
/// again, a second consumer) does not count its offsets twice in [`Stats::corrupt_offsets`].
pub const CORRUPT_RANGES_REMEMBERED: usize = 8;

/// Internal error of a flash operation that can also meet a bad block.
enum Io<E> {
    Flash(E),
    BadBlock(u32),
}

impl<E: core::fmt::Debug> From<Io<E>> for FlushError<E> {
    fn from(e: Io<E>) -> Self {
        match e {
            Io::Flash(e) => FlushError::Flash(e),
            Io::BadBlock(block) => FlushError::BadBlock { block },
        }
    }
}
impl<E: core::fmt::Debug> From<Io<E>> for AppendError<E> {
    fn from(e: Io<E>) -> Self {
        FlushError::from(e).into()
    }
}
impl<E: core::fmt::Debug> From<Io<E>> for CommitError<E> {
    fn from(e: Io<E>) -> Self {
        match e {
            Io::Flash(e) => CommitError::Flash(e),
            Io::BadBlock(block) => CommitError::BadBlock { block },
        }
    }
}

/// Outcome of looking for the next batch in a segment.
enum Next {
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
enum Found {
    /// A valid batch at this position.
    Batch(u32, BatchHeader),
    /// A resume marker for the position scanned from, at this position.
    Resume(u32),
    /// Neither.
    Nothing,
}

/// What [`Dev::count_non_erased`] found. Counts in bytes.
struct NonErased {
    /// Bytes not erased in both reads.
    both: u32,
    /// Bytes not erased in either read.
    any: u32,
    /// One past the last byte not erased in either read, relative to the start.
    used_end: u32,
}

/// A segment just before the tail whose header does not validate but whose batches do:
/// its records, `from` up to the tail's base offset, are lost to damage.
#[derive(Debug, Clone, Copy)]
struct DamagedBeforeTail {
    /// The tail segment when the damage was found (the range ends at its base).
    tail: u32,
    /// The damaged segment.
    seg: u32,
    /// Base offset of its first valid batch.
    from: u64,
}

/// Where a sequential reader left off in a segment.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    seg: u32,
    seq: u64,
    pos: u32,
    expected: u64,
}

/// Flash geometry and derived sizes, fixed at mount.
#[derive(Debug, Clone, Copy)]
struct Layout {
    geo: Geometry,
    bps: u32,
    seg_count: u32,
    seg_size: u32,
    data_start: u32,
}

impl Layout {
    fn new(geo: Geometry, bps: u32) -> Self {
        Layout {
            geo,
            bps,
            seg_count: segments_for(&geo, bps),
            // Saturates on a crafted segment size: `segments_for` then finds no segment.
            seg_size: bps.saturating_mul(geo.erase_size),
            data_start: align_up(SEGMENT_HEADER_LEN as u32, geo.write_size),
        }
    }
    fn seg_addr(&self, seg: u32) -> u32 {
        (JOURNAL_BLOCKS + seg * self.bps) * self.geo.erase_size
    }
    fn ws(&self) -> u32 {
        self.geo.write_size
    }
}

/// Thin wrapper that counts flash operations and remembers the first failed write, erase
/// or sync (after which the log is poisoned).
struct Dev<F: Flash> {
    flash: F,
    l: Layout,
    stats: Stats,
    failed: Option<StorageOp>,
}

impl<F: Flash> Dev<F> {
    /// Reads `buf.len()` bytes at `addr`, retrying a failed read up to [`READ_ATTEMPTS`]
    /// times in all (the last error is returned).
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), F::Error> {
        let mut attempt = 1;
        loop {
            self.stats.flash_reads += 1;
            self.stats.flash_bytes_read += buf.len() as u64;
            match self.flash.read(addr, buf) {
                Ok(()) => return Ok(()),
                Err(e) if attempt >= READ_ATTEMPTS => return Err(e),
                Err(_) => {
                    warn!("flash read at {} failed; reading again", addr);
                    attempt += 1;
                }
            }
        }
    }

    /// Notes a failed write, erase or sync: the first one poisons the log.
    fn fail<T>(&mut self, op: StorageOp, r: Result<T, F::Error>) -> Result<T, F::Error> {
        if r.is_err() && self.failed.is_none() {
            warn!(
                "flash {} failed: the log is poisoned until remounted",
                op.as_str()
            );
            self.failed = Some(op);
        }
        r
    }

    /// Writes `data` at `addr` (aligned), padding the last word with the erased value.
    fn write_padded(&mut self, addr: u32, data: &[u8]) -> Result<(), F::Error> {
        let ws = self.l.ws() as usize;
        let full = data.len() & !(ws - 1);
        if full > 0 {
            let r = self.flash.write(addr, &data[..full]);
            self.fail(StorageOp::Write, r)?;
            self.stats.flash_bytes_programmed += full as u64;
        }
        let rest = data.len() - full;
        if rest > 0 {
            let mut word = [self.l.geo.erased; 32];
            word[..rest].copy_from_slice(&data[full..]);
            let r = self.flash.write(addr + full as u32, &word[..ws]);
            self.fail(StorageOp::Write, r)?;
            self.stats.flash_bytes_programmed += ws as u64;
        }
        Ok(())
    }

    fn is_blank(&mut self, addr: u32, len: u32) -> Result<bool, F::Error> {
        let mut chunk = [0u8; CHUNK];
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut chunk[..n])?;
            // A fold without an early exit: the compiler vectorizes it, where a byte loop
            // that stops at the first programmed byte runs one byte at a time (this check
            // follows every erase, so it is on the append path).
            let erased = self.l.geo.erased;
            if chunk[..n].iter().fold(0u8, |acc, &b| acc | (b ^ erased)) != 0 {
                return Ok(false);
            }
            at += n as u32;
        }
        Ok(true)
    }

    /// Counts the bytes of `addr .. addr + len` that are not erased. A chunk with such bytes
    /// is read a second time: `both` counts bytes not erased in both reads (what a read
    /// that went wrong once cannot fake, so a report of damage is not made of one bad
    /// read); `any` and `used_end` count and bound (relative to `addr`) the bytes either
    /// read saw not erased (what decides where the region may be written again, where a
    /// doubtful bit must count).
    fn count_non_erased(&mut self, addr: u32, len: u32) -> Result<NonErased, F::Error> {
        let erased = self.l.geo.erased;
        let (mut a, mut b) = ([0u8; CHUNK], [0u8; CHUNK]);
        let mut out = NonErased {
            both: 0,
            any: 0,
            used_end: 0,
        };
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut a[..n])?;
            if a[..n].iter().any(|&x| x != erased) {
                self.read(addr + at, &mut b[..n])?;
                for (i, (&x, &y)) in a[..n].iter().zip(&b[..n]).enumerate() {
                    if x != erased && y != erased {
                        out.both += 1;
                    }
                    if x != erased || y != erased {
                        out.any += 1;
                        out.used_end = at + i as u32 + 1;
                    }
                }
            }
            at += n as u32;
        }
        Ok(out)
    }

    /// Erases `count` blocks from `first` and verifies them blank, erasing again if an
    /// interrupted or failed erase left bits behind.
    fn erase_verified(&mut self, first: u32, count: u32) -> Result<(), Io<F::Error>> {
        let e = self.l.geo.erase_size;
        for block in first..first + count {
            let mut ok = false;
            for _ in 0..ERASE_ATTEMPTS {
                let r = self.flash.erase(block);
                self.fail(StorageOp::Erase, r).map_err(Io::Flash)?;
                self.stats.erases += 1;
                if self.is_blank(block * e, e).map_err(Io::Flash)? {
                    ok = true;
                    break;
                }
                warn!("erase block {} not blank after erase; erasing again", block);
            }
            if !ok {
                return Err(Io::BadBlock(block));
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), F::Error> {
        self.stats.syncs += 1;
        let r = self.flash.sync();
        self.fail(StorageOp::Sync, r)
    }

    /// CRC-32 of `len` bytes at `addr`, streamed.
    fn crc_of(&mut self, h: &mut crate::crc::Hasher, addr: u32, len: u32) -> Result<(), F::Error> {
        let mut chunk = [0u8; CHUNK];
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut chunk[..n])?;
            h.update(&chunk[..n]);
            at += n as u32;
        }
        Ok(())
    }

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
    fn read_segment_header(&mut self, addr: u32) -> Result<Option<SegmentHeader>, F::Error> {
        let mut hb = [0u8; SEGMENT_HEADER_LEN];
        for _ in 0..READ_ATTEMPTS {
            self.read(addr, &mut hb)?;
            if hb.iter().all(|&b| b == self.l.geo.erased) {
                return Ok(None);
            }
            if let Some(h) = SegmentHeader::decode(&hb) {
                return Ok(Some(h));
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
    fn next_batch(&mut self, seg: u32, pos: u32, expected: u64) -> Result<Next, F::Error> {
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
        match self.rescan_once(seg, pos, expected, batches)? {
            Found::Nothing => self.rescan_once(seg, pos, expected, batches),
            found => Ok(found),
        }
    }

    /// One pass of [`Dev::rescan`].
    fn rescan_once(
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
        Ok(Found::Nothing)
    }

    /// Reads the resume marker whose magic was seen at `addr`, [`READ_ATTEMPTS`] reads in
    /// all until it decodes: one bad read (a transient bit flip) must not turn the torn
    /// write it bounds, and every durable record after it, into bytes never written.
    fn read_resume_marker(&mut self, addr: u32) -> Result<Option<ResumeMarker>, F::Error> {
        let mut mb = [0u8; RESUME_LEN];
        for _ in 0..READ_ATTEMPTS {
            self.read(addr, &mut mb)?;
            if let Some(m) = ResumeMarker::decode(&mb) {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// Reads the batch at `pos` straight into `dst` if its header is plausible, it holds
    /// offset `want` (from its base, at or after `expected`) and its body fits in `dst`;
    /// returns its header if the CRC then checks. `None` means: take the slow path.
    fn read_wanted_batch(
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
    fn record_len_at(&mut self, addr: u32, limit: u32) -> Result<Option<u32>, F::Error> {
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

/// The log. `'a` is the lifetime of the caller-provided [`Memory`].
pub struct Log<'a, F: Flash> {
    dev: Dev<F>,
    cfg: Config,
    log_id: u128,
    slots: &'a mut [SegmentSlot],
    max_seq: u64,
    head: Option<u32>,
    head_pos: u32,
    head_writable: bool,
    /// The next segment opened follows an unclean shutdown (its header says so).
    unclean_pending: bool,
    /// After an unclean mount that found a torn write in the head segment: the resume
    /// marker to write at `head_pos` before the next batch.
    resume: Option<ResumeMarker>,
    tail: Option<u32>,

    next_offset: u64,
    flash_end: u64,
    durable_end: u64,
    flash_last_crc: u32,
    last_crc: u32,
    lease: u64,

    buf: &'a mut [u8],
    buf_cap: usize,
    buf_len: usize,
    buf_count: u32,
    buf_base: u64,
    buf_prev_crc: u32,
    buf_first_us: u64,

    consumers: Vec<Consumer, MAX_CONSUMERS>,
    /// With no consumer left: records below this offset were read (the highest committed
    /// offset of the consumers deleted since the mount); reclaiming the rest counts them
    /// as dropped unread.
    released: u64,
    /// Corrupt ranges already counted in [`Stats::corrupt_offsets`], oldest first.
    corrupt_seen: Vec<(u64, u64), CORRUPT_RANGES_REMEMBERED>,
    producers: Vec<ProducerState, MAX_PRODUCERS>,
    dirty: bool,
    last_persist_us: u64,
    now_us: u64,

    jblock: u32,
    jpos: Option<u32>,
    jseq: u64,

    damaged: Option<DamagedBeforeTail>,
    cursor: Option<Cursor>,
    index_seg: Option<(u32, u64)>,
    index: Vec<(u32, u64), INDEX_ENTRIES>,
}

impl<F: Flash> core::fmt::Debug for Log<'_, F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Log")
            .field("log_id", &self.log_id)
            .field("first_offset", &self.first_offset())
            .field("durable_offset", &self.durable_end)
            .field("next_offset", &self.next_offset)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

impl<'a, F: Flash> Log<'a, F> {
    /// Formats the partition as an empty log with id `log_id` (random, chosen by the
    /// caller) and segments of `blocks_per_segment` erase blocks. Erases the journal and
    /// the first segment only: segments of other logs are told apart by their log id, so
    /// give every format a fresh random id. Registers the consumer `bridge` at offset 0.
    ///
    /// Errors: [`FormatError::Geometry`] for an unusable geometry (erase size below
    /// [`MIN_ERASE_SIZE`] included), [`FormatError::TooFewSegments`] if fewer than two
    /// segments fit, storage errors.
    pub fn format(
        flash: &mut F,
        log_id: u128,
        blocks_per_segment: u32,
    ) -> Result<(), FormatError<F::Error>> {
        let geo = flash.geometry();
        if !geo.is_valid() || geo.erase_size < MIN_ERASE_SIZE {
            return Err(FormatError::Geometry);
        }
        let l = Layout::new(geo, blocks_per_segment);
        if l.seg_count < 2 {
            return Err(FormatError::TooFewSegments {
                segments: l.seg_count,
                blocks_per_segment,
            });
        }
        let mut dev = Dev {
            flash,
            l,
            stats: Stats::default(),
            failed: None,
        };
        let map = |e: Io<F::Error>| match e {
            Io::Flash(e) => FormatError::Flash(e),
            Io::BadBlock(block) => FormatError::BadBlock { block },
        };
        dev.erase_verified(0, JOURNAL_BLOCKS).map_err(map)?;
        dev.erase_verified(JOURNAL_BLOCKS, blocks_per_segment)
            .map_err(map)?;
        let hdr = SegmentHeader {
            version: FORMAT_VERSION,
            erase_size: geo.erase_size,
            write_size: geo.write_size,
            erased: geo.erased,
            blocks_per_segment,
            segment_count: l.seg_count,
            log_id,
            seq: 1,
            base_offset: 0,
            prev_crc: 0,
            erase_count: 1,
            after_unclean: false,
        };
        dev.write_padded(l.seg_addr(0), &hdr.encode())
            .map_err(FormatError::Flash)?;
        let mut entry = [0u8; journal::MAX_ENTRY_LEN];
        let len = journal::encode(
            &mut entry,
            geo.erase_size as usize,
            1,
            0,
            0,
            log_id,
            (
                geo.erase_size,
                geo.write_size,
                geo.erased,
                blocks_per_segment,
            ),
            true,
            [(BRIDGE_CONSUMER, 0u64)].into_iter(),
            core::iter::empty(),
        );
        dev.write_padded(0, &entry[..len])
            .map_err(FormatError::Flash)?;
        dev.flash.sync().map_err(FormatError::Flash)?;
        info!(
            "formatted log {:x}: {} segments of {} blocks",
            log_id, l.seg_count, blocks_per_segment
        );
        Ok(())
    }

    /// Mounts a formatted partition and recovers its state. Recovery never fails on bad
    /// data: torn writes, corrupt batches and interrupted erases are reported in the
    /// [`RecoveryReport`], never returned as errors and never handed out as records.
    ///
    /// `now_us` is the caller's monotonic clock (µs). Errors: storage errors, an unusable
    /// or mismatching geometry, an unformatted partition, a too small [`Memory`].
    pub fn mount(
        flash: F,
        cfg: Config,
        mem: Memory<'a>,
        now_us: u64,
    ) -> Result<(Self, RecoveryReport), MountError<F::Error>> {
        let geo = flash.geometry();
        if !geo.is_valid() || geo.erase_size < MIN_ERASE_SIZE {
            return Err(MountError::Geometry);
        }
        if mem.buffer.len() < MIN_BUFFER {
            return Err(MountError::BufferTooSmall {
                len: mem.buffer.len(),
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
        let (entry, jblock, jpos) = Self::scan_journal(&mut dev)
            .map_err(|(block, error)| MountError::JournalUnreadable { block, error })?;

        // 2. Geometry and log id: from the journal, else from the first valid segment
        // header found at an erase block start where a segment of its own geometry begins
        // (no single damaged header decides whether the partition is a log).
        let (log_id, bps) = match &entry {
            Some(e) => {
                same_geometry(&geo, e.erase_size, e.write_size, e.erased)?;
                (e.log_id, e.blocks_per_segment)
            }
            None => {
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
            }
        };
        let l = Layout::new(geo, bps);
        if bps == 0 || l.seg_count < 2 {
            return Err(MountError::NotFormatted);
        }
        dev.l = l;
        if mem.segments.len() < l.seg_count as usize {
            return Err(MountError::SegmentTable {
                segments: l.seg_count,
                slots: mem.segments.len(),
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
            let slot = &mut mem.segments[s as usize];
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
            if head.is_none_or(|x| mem.segments[x as usize].seq < h.seq) {
                head = Some(s);
            }
            if tail.is_none_or(|x| mem.segments[x as usize].seq > h.seq) {
                tail = Some(s);
            }
        }
        if entry.is_none() && valid == 0 {
            return Err(MountError::NotFormatted);
        }
        // Valid segments must have increasing bases in ring order; a header that breaks
        // that (possible only on a damaged image) is ignored.
        if let (Some(t), Some(_)) = (tail, head) {
            let mut last_base = 0u64;
            for i in 0..l.seg_count {
                let s = ((t + i) % l.seg_count) as usize;
                if mem.segments[s].valid {
                    if mem.segments[s].base < last_base {
                        mem.segments[s].valid = false;
                        valid -= 1;
                    } else {
                        last_base = mem.segments[s].base;
                    }
                }
            }
            head = (0..l.seg_count)
                .filter(|&s| mem.segments[s as usize].valid)
                .max_by_key(|&s| mem.segments[s as usize].seq);
        }

        let mut log = Log {
            dev,
            cfg,
            log_id,
            slots: mem.segments,
            max_seq,
            head,
            head_pos: 0,
            head_writable: false,
            unclean_pending: false,
            resume: None,
            tail,
            next_offset: 0,
            flash_end: 0,
            durable_end: 0,
            flash_last_crc: 0,
            last_crc: 0,
            lease: 0,
            buf_cap: 0,
            buf: mem.buffer,
            buf_len: BATCH_HEADER_LEN,
            buf_count: 0,
            buf_base: 0,
            buf_prev_crc: 0,
            buf_first_us: now_us,
            consumers: Vec::new(),
            released: 0,
            corrupt_seen: Vec::new(),
            producers: Vec::new(),
            dirty: false,
            last_persist_us: now_us,
            now_us,
            jblock,
            jpos,
            jseq: entry.as_ref().map_or(0, |e| e.seq),
            damaged: None,
            cursor: None,
            index_seg: None,
            index: Vec::new(),
        };
        let seg_data = (l.seg_size - l.data_start) & !(l.ws() - 1);
        log.buf_cap = log.buf.len().min(seg_data as usize);
        log.find_damage_before_tail().map_err(MountError::Flash)?;

        // 4. Scan the head segment.
        let mut report = RecoveryReport {
            segments: l.seg_count,
            segments_valid: valid,
            head_records: 0,
            torn_tail_bytes: 0,
            clean: false,
            journal_found: entry.is_some(),
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
        if let Some(h) = head {
            let slot = log.slots[h as usize];
            let mut pos = l.data_start;
            let mut expected = slot.base;
            let mut last_batch: Option<(u32, BatchHeader)> = None;
            loop {
                match log
                    .dev
                    .next_batch(h, pos, expected)
                    .map_err(MountError::Flash)?
                {
                    Next::Batch {
                        pos: p,
                        h: bh,
                        after_corruption,
                    } => {
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
                    Next::End { pos: p, corrupt } => {
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
            log.flash_last_crc =
                slot_prev_crc_or(&mut log, h, last_batch).map_err(MountError::Flash)?;
        }

        // 5. Offsets, consumers, producers.
        let (jlease, jdurable, jclean) = entry
            .as_ref()
            .map_or((0, 0, false), |e| (e.lease, e.durable_next, e.clean));
        // A clean shutdown leaves a head that ends in erased flash. (The journal's durable
        // end may be past the head's data: records consumed from RAM and never written.)
        report.clean = jclean && head_clean && jdurable >= log.flash_end && head.is_some();
        report.journal_clean = jclean;
        log.durable_end = log.flash_end.max(jdurable);
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
        log.last_crc = log.flash_last_crc;
        log.buf_base = log.next_offset;
        log.buf_prev_crc = log.last_crc;
        match &entry {
            Some(e) => {
                for (name, off) in &e.consumers {
                    let c = (*off).min(log.durable_end);
                    let _ = log.consumers.push(Consumer {
                        name: name.clone(),
                        committed: c,
                        persisted: c,
                    });
                }
                for p in &e.producers {
                    let _ = log.producers.push(ProducerState::from_snapshot(p));
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
        let rebuild_from = entry.as_ref().map_or(jdurable, |e| {
            producers::rebuild_from(jdurable, &e.producers)
        });
        log.rebuild_producers(rebuild_from)
            .map_err(MountError::Flash)?;

        // 6. Mark the log as running (clears the clean flag) with the lease in place.
        log.persist_journal(false).map_err(|e| match e {
            Io::Flash(e) => MountError::Flash(e),
            Io::BadBlock(block) => MountError::WornJournal { block },
        })?;
        report.first_offset = log.first_offset();
        report.next_offset = log.next_offset;
        report.flash_reads = log.dev.stats.flash_reads;
        info!(
            "mounted log {:x}: offsets {}..{}, clean {}, torn {} B",
            log_id, report.first_offset, report.next_offset, report.clean, report.torn_tail_bytes
        );
        return Ok((log, report));

        /// CRC of the last record of the segment's last batch, or the header's prev CRC.
        fn slot_prev_crc_or<F: Flash>(
            log: &mut Log<'_, F>,
            seg: u32,
            last: Option<(u32, BatchHeader)>,
        ) -> Result<u32, F::Error> {
            match last {
                Some((pos, h)) => log.last_record_crc(seg, pos, &h),
                None => {
                    let addr = log.dev.l.seg_addr(seg);
                    Ok(log.dev.read_segment_header(addr)?.map_or(0, |h| h.prev_crc))
                }
            }
        }
    }

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
    fn torn_extent(&mut self, seg: u32, from: u32, used_end: u32) -> Result<u32, F::Error> {
        let l = self.dev.l;
        let resume = format::RESUME_MAGIC.to_le_bytes();
        let mut at = from;
        while at < used_end && at + BATCH_HEADER_LEN as u32 <= l.seg_size {
            let mut hb = [0u8; BATCH_HEADER_LEN];
            self.dev.read(l.seg_addr(seg) + at, &mut hb)?;
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

    /// Looks at the segment just before the tail in ring order: if it is not the next one
    /// to open (so no erase or reclaim of it was under way) yet its header does not
    /// validate while a batch inside does, with offsets below the tail's, the segment was
    /// damaged and its offsets are reported corrupt rather than dropped. Costs one read
    /// when that segment is blank.
    fn find_damage_before_tail(&mut self) -> Result<(), F::Error> {
        let n = self.dev.l.seg_count;
        let (Some(t), Some(h)) = (self.tail, self.head) else {
            return Ok(());
        };
        let p = (t + n - 1) % n;
        if self.slots[p as usize].valid || p == (h + 1) % n {
            return Ok(());
        }
        let tail_base = self.slots[t as usize].base;
        let start = self.dev.l.data_start;
        if let Next::Batch { h: bh, .. } = self.dev.next_batch(p, start, 0)?
            && bh.base_offset < tail_base
            && bh.end_offset() <= tail_base
        {
            warn!(
                "segment {} is damaged: offsets {}..{} lost",
                p, bh.base_offset, tail_base
            );
            self.damaged = Some(DamagedBeforeTail {
                tail: t,
                seg: p,
                from: bh.base_offset,
            });
        }
        Ok(())
    }

    /// The damaged range before the tail, `from..tail base`, while the tail is unchanged.
    fn damaged_before_tail(&self) -> Option<(u64, u64)> {
        let d = self.damaged?;
        (self.tail == Some(d.tail)).then(|| (d.from, self.slots[d.tail as usize].base))
    }

    /// Record CRC of the last record of the (valid) batch at `pos` of `seg`.
    fn last_record_crc(&mut self, seg: u32, pos: u32, h: &BatchHeader) -> Result<u32, F::Error> {
        let l = self.dev.l;
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
    fn rebuild_producers(&mut self, from: u64) -> Result<(), F::Error> {
        let mut at = from.max(self.first_offset());
        while at < self.flash_end {
            let buf = core::mem::take(&mut self.buf);
            let r = self.read_flash(at, buf);
            self.buf = buf;
            let out = match r {
                Ok(o) => o,
                Err(ReadError::Flash(e)) => return Err(e),
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

    /// Notes a stored record of producer `id` at `offset` (appended, or found by the
    /// mount's rebuild): a record of an earlier session, or not after the last remembered
    /// one, changes nothing.
    fn note_producer(&mut self, id: u64, seq: u32, offset: u64) {
        if let Some(p) = self.producers.iter_mut().find(|p| p.id == id) {
            let after_last = match p.window.last() {
                Some(&(l, lo)) => offset > lo && seq_before(l, seq),
                None => true,
            };
            if offset >= p.session_from && after_last {
                p.push(seq, offset);
            }
            return;
        }
        self.make_room_for_producer();
        let _ = self.producers.push(ProducerState::new(id, seq, offset));
    }

    /// Forgets the producer heard from least recently when the table is full.
    fn make_room_for_producer(&mut self) {
        if self.producers.is_full()
            && let Some((i, _)) = self
                .producers
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_active())
        {
            self.producers.swap_remove(i);
        }
    }

    /// Reads the journal blocks: the newest valid entry, the block it is in, and where the
    /// next entry may go in that block (`None` if the rest of the block is not blank).
    #[allow(clippy::type_complexity)]
    fn scan_journal(
        dev: &mut Dev<F>,
    ) -> Result<(Option<journal::Entry>, u32, Option<u32>), (u32, F::Error)> {
        let e = dev.l.geo.erase_size;
        let ws = dev.l.ws();
        let mut best: Option<(journal::Entry, u32, u32)> = None;
        let mut buf = [0u8; journal::MAX_ENTRY_LEN];
        for blk in 0..JOURNAL_BLOCKS {
            let mut pos = 0u32;
            while pos + 16 <= e {
                // An entry that does not validate is read again (a flaky cell), unless its
                // start reads blank: the end of the block's entries.
                let mut found = None;
                for _ in 0..READ_ATTEMPTS {
                    let mut head = [0u8; 16];
                    dev.read(blk * e + pos, &mut head).map_err(|x| (blk, x))?;
                    if head.iter().all(|&b| b == dev.l.geo.erased) {
                        break;
                    }
                    let Some(len) = journal::entry_len(&head, (e - pos) as usize) else {
                        continue;
                    };
                    dev.read(blk * e + pos, &mut buf[..len])
                        .map_err(|x| (blk, x))?;
                    if let Some(entry) = journal::decode(&buf[..len]) {
                        found = Some((entry, len));
                        break;
                    }
                }
                let Some((entry, len)) = found else {
                    break;
                };
                pos += align_up(len as u32, ws);
                if best.as_ref().is_none_or(|b| entry.seq > b.0.seq) {
                    best = Some((entry, blk, pos));
                }
            }
        }
        match best {
            Some((entry, blk, pos)) => {
                let blank = dev.is_blank(blk * e + pos, e - pos).map_err(|x| (blk, x))?;
                Ok((Some(entry), blk, blank.then_some(pos)))
            }
            None => Ok((None, 0, None)),
        }
    }

    /// Writes a journal snapshot: committed offsets (clamped to the durable end), the
    /// lease, the durable end, producers whose last record is durable. Syncs.
    fn persist_journal(&mut self, clean: bool) -> Result<(), Io<F::Error>> {
        let l = self.dev.l;
        let e = l.geo.erase_size;
        let mut buf = [0u8; journal::MAX_ENTRY_LEN];
        let durable = self.durable_end;
        let seq = self.jseq + 1;
        let len = journal::encode(
            &mut buf,
            e as usize,
            seq,
            self.lease.max(self.next_offset),
            durable,
            self.log_id,
            (l.geo.erase_size, l.geo.write_size, l.geo.erased, l.bps),
            clean,
            self.consumers
                .iter()
                .map(|c| (c.name.as_str(), c.committed.min(durable))),
            self.producers.iter().filter_map(|p| p.snapshot(durable)),
        );
        let padded = align_up(len as u32, l.ws());
        let (block, pos) = match self.jpos {
            Some(pos) if pos + padded <= e => (self.jblock, pos),
            _ => {
                // `self.jblock` holds the newest valid entry and stays the journal's block
                // until an entry in the other one is written and synced: a failure on the
                // way leaves that copy alone, and the next attempt erases the other again.
                let other = 1 - self.jblock.min(1);
                self.dev.erase_verified(other, 1)?;
                (other, 0)
            }
        };
        let written = self
            .dev
            .write_padded(block * e + pos, &buf[..len])
            .and_then(|()| self.dev.sync());
        if let Err(err) = written {
            // Words from `pos` may be programmed (partly, or not durably): never write
            // them again. In the current block that means: switch at the next entry.
            if block == self.jblock {
                self.jpos = None;
            }
            return Err(Io::Flash(err));
        }
        self.jblock = block;
        self.jpos = Some(pos + padded);
        self.jseq = seq;
        self.dev.stats.journal_writes += 1;
        for c in self.consumers.iter_mut() {
            c.persisted = c.committed.min(durable);
        }
        for p in self.producers.iter_mut() {
            if let Some(s) = p.snapshot(durable) {
                p.persisted = s.last;
            }
        }
        self.dirty = false;
        self.last_persist_us = self.now_us;
        Ok(())
    }

    // ----- Accessors -------------------------------------------------------------------

    /// The log id fixed at format time.
    pub fn log_id(&self) -> u128 {
        self.log_id
    }

    /// The next offset [`Log::append`] will hand out.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Every offset below this one survives a power cut (it is on flash and synced, or it
    /// was committed by every consumer and discarded, or it never existed). It only
    /// advances after a successful sync, and never again once the log is
    /// [poisoned](Log::poisoned).
    pub fn durable_offset(&self) -> u64 {
        self.durable_end
    }

    /// Whether the log is poisoned: a flash write, erase or sync failed since mount. A
    /// poisoned log writes nothing more, its [`Log::durable_offset`] never advances again,
    /// and every operation that would write ([`Log::append`], [`Log::flush`], [`Log::tick`],
    /// [`Log::commit`], [`Log::persist`], [`Log::delete_consumer`], [`Log::close`]) fails
    /// with a `Poisoned` error. Reads serve only offsets below the durable offset. To go
    /// on, take the storage back with [`Log::into_flash`] (for a file image: drop it and open
    /// it again) and mount it again.
    pub fn poisoned(&self) -> bool {
        self.dev.failed.is_some()
    }

    /// The operation whose failure poisoned the log, if it is poisoned.
    pub fn poisoned_by(&self) -> Option<StorageOp> {
        self.dev.failed
    }

    /// The first offset still retained (older ones were dropped or reused). Offsets of a
    /// damaged segment just before the oldest valid one count as retained: reads report
    /// them lost as corrupt.
    pub fn first_offset(&self) -> u64 {
        if let Some((from, _)) = self.damaged_before_tail() {
            return from;
        }
        match self.tail {
            Some(t) => self.slots[t as usize].base,
            None => self.durable_end,
        }
    }

    /// Record CRC of the last record appended (0 if none).
    pub fn last_crc(&self) -> u32 {
        self.last_crc
    }

    /// Counters since mount.
    pub fn stats(&self) -> Stats {
        self.dev.stats
    }

    /// The flash geometry.
    pub fn geometry(&self) -> Geometry {
        self.dev.l.geo
    }

    /// Erase blocks per segment.
    pub fn blocks_per_segment(&self) -> u32 {
        self.dev.l.bps
    }

    /// Segments in the ring.
    pub fn segment_count(&self) -> u32 {
        self.dev.l.seg_count
    }

    /// Largest record the log accepts, in encoded bytes (see [`Record::encoded_len`]).
    pub fn max_record_len(&self) -> usize {
        self.buf_cap - BATCH_HEADER_LEN
    }

    /// Bytes of records waiting in the RAM buffer.
    pub fn buffered_bytes(&self) -> usize {
        self.buf_len - BATCH_HEADER_LEN
    }

    /// Records waiting in the RAM buffer.
    pub fn buffered_records(&self) -> u32 {
        self.buf_count
    }

    /// The run-time configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Changes the run-time configuration (takes effect at the next operation).
    pub fn set_config(&mut self, cfg: Config) {
        self.cfg = cfg;
    }

    /// Segment slots of the ring in ring order (oldest first): `(physical index, sequence
    /// number, base offset, erase count)`, for inspection tools.
    pub fn segments(&self) -> impl Iterator<Item = (u32, u64, u64, u32)> + '_ {
        let n = self.dev.l.seg_count;
        let t = self.tail.unwrap_or(0);
        (0..n)
            .map(move |i| (t + i) % n)
            .filter(|&s| self.slots[s as usize].valid)
            .map(|s| {
                let sl = self.slots[s as usize];
                (s, sl.seq, sl.base, sl.erase_count)
            })
    }

    /// Gives the storage back without a clean shutdown (what a power cut would leave).
    pub fn into_flash(self) -> F {
        self.dev.flash
    }

    /// Access to the storage (for counters of a simulated flash).
    pub fn flash(&self) -> &F {
        &self.dev.flash
    }

    // ----- Appending -------------------------------------------------------------------

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
    /// [`AppendError::SequenceTooOld`], [`AppendError::Poisoned`] once a flash write, erase
    /// or sync has failed (see [`Log::poisoned`]), storage errors (the first failure).
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
            self.lease = self.next_offset.saturating_add(self.cfg.lease_step.max(1));
            if let Err(e) = self.persist_journal(false) {
                self.lease = old;
                return Err(e.into());
            }
        }
        let offset = self.next_offset;
        let start = self.buf_len;
        rec.encode_into(&mut self.buf[start..start + len]);
        let crc = record_crc(offset, &self.buf[start..start + len]);
        if self.buf_count == 0 {
            self.buf_base = offset;
            self.buf_prev_crc = self.last_crc;
            self.buf_first_us = now_us;
        }
        self.buf_len += len;
        self.buf_count += 1;
        self.next_offset += 1;
        self.last_crc = crc;
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

    /// What the producer table answers to a record of producer `p` under `epoch` (0: no
    /// session): `Some` for a duplicate (nothing to append), `None` to append, or the error.
    fn check_producer(
        &mut self,
        p: Producer,
        epoch: u32,
    ) -> Result<Option<Appended>, AppendError<F::Error>> {
        let Some(st) = self.producers.iter().find(|s| s.id == p.id) else {
            return if epoch == 0 {
                Ok(None)
            } else {
                Err(AppendError::UnknownSession {
                    producer: p.id,
                    epoch,
                    current: 0,
                })
            };
        };
        match st.check(epoch, p.seq) {
            Verdict::Append => Ok(None),
            Verdict::Duplicate { offset } => {
                self.dev.stats.duplicates += 1;
                Ok(Some(Appended {
                    offset,
                    duplicate: true,
                }))
            }
            Verdict::StoredBelow {
                stored_below,
                last_seq,
            } => Err(AppendError::SequenceTooOld {
                producer: p.id,
                seq: p.seq,
                last_seq,
                stored_below,
            }),
            Verdict::Unknown { last_seq } => Err(AppendError::SequenceUnknown {
                producer: p.id,
                seq: p.seq,
                last_seq,
            }),
            Verdict::OutOfSequence { expected } => Err(AppendError::OutOfSequence {
                producer: p.id,
                epoch,
                seq: p.seq,
                expected,
            }),
            Verdict::Fenced { current } => Err(AppendError::Fenced {
                producer: p.id,
                epoch,
                current,
            }),
            Verdict::UnknownSession { current } => Err(AppendError::UnknownSession {
                producer: p.id,
                epoch,
                current,
            }),
        }
    }

    /// Opens a session for producer id `id` and returns it (see [`producers`]).
    ///
    /// Without `resume`, a new session: the id's next epoch (1 for an id the log does not
    /// know), sequences from 1; records of the id's earlier sessions are never taken for
    /// this one's, and publishes under an earlier epoch are fenced from now on. The epoch is
    /// written to the journal (one entry, synced) before this returns, so it survives a
    /// power cut.
    ///
    /// With `resume`, the id's current session goes on: the RAM buffer is flushed first, so
    /// [`Session::last_seq`] is the last sequence stored *durably*, and the producer sends
    /// `last_seq + 1` next (skipping the `last_seq` records it already had stored). An id
    /// without a session gets a new one, with [`Session::resumed`] false.
    ///
    /// Cancel-safety: an interruption is a power cut; a new epoch is either in the journal
    /// or never handed out. Errors: [`SessionError::EpochsExhausted`], storage errors (the
    /// journal write, or the flush of a resume: [`SessionError::Full`] under `reject-new`),
    /// [`SessionError::Poisoned`].
    pub fn open_session(
        &mut self,
        now_us: u64,
        id: u64,
        resume: bool,
    ) -> Result<Session, SessionError<F::Error>> {
        self.now_us = now_us;
        if let Some(op) = self.dev.failed {
            return Err(SessionError::Poisoned { op });
        }
        let current = self.producers.iter().position(|s| s.id == id);
        if resume && let Some(i) = current.filter(|&i| self.producers[i].epoch > 0) {
            self.flush(now_us)?;
            let st = &self.producers[i];
            return Ok(Session {
                producer: id,
                epoch: st.epoch,
                last_seq: st.last_seq(),
                resumed: true,
            });
        }
        let epoch = match current {
            Some(i) => self.producers[i]
                .epoch
                .checked_add(1)
                .ok_or(SessionError::EpochsExhausted { producer: id })?,
            None => 1,
        };
        let fresh = ProducerState::session(id, epoch, self.next_offset);
        let old = match current {
            Some(i) => Some(core::mem::replace(&mut self.producers[i], fresh)),
            None => {
                self.make_room_for_producer();
                let _ = self.producers.push(fresh);
                None
            }
        };
        if let Err(e) = self.persist_journal(false) {
            // The epoch was not handed out: the table stays as it was (the log is poisoned
            // anyway; the next mount reads the journal's newest valid entry).
            match (old, self.producers.iter().position(|s| s.id == id)) {
                (Some(o), Some(i)) => self.producers[i] = o,
                (None, Some(i)) => {
                    self.producers.swap_remove(i);
                }
                _ => {}
            }
            return Err(match e {
                Io::Flash(e) => SessionError::Flash(e),
                Io::BadBlock(block) => SessionError::BadBlock { block },
            });
        }
        Ok(Session {
            producer: id,
            epoch,
            last_seq: 0,
            resumed: false,
        })
    }

    /// The current session of producer `id`: `(epoch, last stored sequence)`, `None` if the
    /// log remembers no state for the id (epoch 0: a producer without a session).
    pub fn producer_session(&self, id: u64) -> Option<(u32, u32)> {
        self.producers
            .iter()
            .find(|s| s.id == id)
            .map(|s| (s.epoch, s.last_seq()))
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
    /// back.
    ///
    /// Errors: as [`Log::flush`]. A poisoned log cannot shut down cleanly: it fails with
    /// [`FlushError::Poisoned`] without writing (use [`Log::into_flash`] to get the storage
    /// back for a remount).
    pub fn close(mut self, now_us: u64) -> Result<F, FlushError<F::Error>> {
        self.now_us = now_us;
        self.check_poisoned()?;
        self.spill()?;
        // A torn write left in the head is closed off, so the next mount finds the head
        // ending in erased flash (a clean shutdown).
        if self.resume.is_some() {
            self.write_resume_marker()?;
            self.dev.sync().map_err(FlushError::Flash)?;
        }
        self.lease = self.next_offset;
        self.persist_journal(true)?;
        Ok(self.dev.flash)
    }

    /// [`FlushError::Poisoned`] if a flash write, erase or sync failed since mount.
    fn check_poisoned(&self) -> Result<(), FlushError<F::Error>> {
        match self.dev.failed {
            Some(op) => Err(FlushError::Poisoned { op }),
            None => Ok(()),
        }
    }

    /// Whether the flash can take `bytes` of records now (looking at the head segment and
    /// the one after it).
    fn flash_has_room(&self, bytes: usize) -> bool {
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

    fn min_commit(&self, f: impl Fn(&Consumer) -> u64) -> u64 {
        self.consumers.iter().map(f).min().unwrap_or(u64::MAX)
    }

    /// One past the last offset segment `seg` can hold: the base of the next valid segment
    /// in ring order, or for the head the start of the RAM buffer.
    fn segment_end(&self, seg: u32) -> u64 {
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
    fn buffered_fit(&self, k: u32, max_bytes: usize) -> (u32, usize, u32) {
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
        // Only the last counted record's CRC is needed; when that is the newest record,
        // `append` already computed it.
        let crc = match last {
            Some(_) if n == self.buf_count => self.last_crc,
            Some(r) => record_crc(self.buf_base + n as u64 - 1, &self.buf[r]),
            None => self.buf_prev_crc,
        };
        (n, at - BATCH_HEADER_LEN, crc)
    }

    fn drop_buffered(&mut self, k: u32, bytes: usize, last_crc: u32) {
        let from = BATCH_HEADER_LEN + bytes;
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
            let (k, body, crc) = self.buffered_fit(self.buf_count, max_body);
            if k == 0 {
                if self.head_pos == l.data_start {
                    // Cannot happen: a buffered record never exceeds an empty segment.
                    return Err(FlushError::Unwritable {
                        offset: self.buf_base,
                        room: max_body,
                    });
                }
                self.head_writable = false;
                continue;
            }
            let len = BATCH_HEADER_LEN + body;
            let mut hdr = BatchHeader {
                len: len as u32,
                crc: 0,
                base_offset: self.buf_base,
                count: k,
                prev_crc: self.buf_prev_crc,
            };
            let mut h = crate::crc::Hasher::new();
            h.update(&hdr.encode()[16..]);
            h.update(&self.buf[BATCH_HEADER_LEN..len]);
            hdr.crc = h.finalize();
            self.buf[..BATCH_HEADER_LEN].copy_from_slice(&hdr.encode());
            self.write_resume_marker()?;
            let addr = l.seg_addr(head) + self.head_pos;
            if let Err(e) = self.dev.write_padded(addr, &self.buf[..len]) {
                // The words from `addr` may be partly programmed: seal the head so that
                // they are never programmed again; the log is poisoned from here on.
                self.head_writable = false;
                return Err(FlushError::Flash(e));
            }
            self.head_pos += align_up(len as u32, l.ws());
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

    /// Opens the next segment in the ring for the records starting at the buffer's base,
    /// reclaiming (or, under `DropOldest`, dropping) the oldest segment if the ring is full.
    fn roll(&mut self) -> Result<(), FlushError<F::Error>> {
        let l = self.dev.l;
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
    /// a resume marker, damage) goes through the full check of [`Dev::next_batch`], so a
    /// corrupt batch's records, lost already, are not counted.
    fn count_records(&mut self, seg: u32, from: u64, to: u64) -> Result<u64, Io<F::Error>> {
        let l = self.dev.l;
        let mut pos = l.data_start;
        let mut expected = self.slots[seg as usize].base;
        let mut n = 0u64;
        while expected < to && pos < l.seg_size {
            let mut hb = [0u8; BATCH_HEADER_LEN];
            let quick = if pos + BATCH_HEADER_LEN as u32 <= l.seg_size {
                self.dev
                    .read(l.seg_addr(seg) + pos, &mut hb)
                    .map_err(Io::Flash)?;
                match BatchHeader::check(&hb, l.geo.erased, l.seg_size - pos) {
                    // Erased may still be followed by a resume marker: the full search.
                    HeadCheck::Erased | HeadCheck::Invalid => None,
                    HeadCheck::Plausible => Some(BatchHeader::decode(&hb))
                        .filter(|h| h.base_offset >= expected && h.end_offset() <= to),
                }
            } else {
                None
            };
            let (p, h) = match quick {
                Some(h) => (pos, h),
                None => match self.dev.next_batch(seg, pos, expected).map_err(Io::Flash)? {
                    Next::End { .. } => break,
                    Next::Batch { pos: p, h, .. } => (p, h),
                },
            };
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
    fn next_valid_after(&self, seg: u32) -> Option<u32> {
        let n = self.dev.l.seg_count;
        (1..n)
            .map(|i| (seg + i) % n)
            .find(|&s| self.slots[s as usize].valid)
    }

    // ----- Reading ---------------------------------------------------------------------

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
        if let Some(l) = out.lost
            && l.reason == LostReason::Corrupt
        {
            self.count_corrupt(l.from, l.to);
        }
        Ok(out)
    }

    /// Adds the offsets of the corrupt range `from..to` not counted yet to
    /// [`Stats::corrupt_offsets`] (a range read again, or overlapping one counted, adds only
    /// what is new).
    fn count_corrupt(&mut self, from: u64, to: u64) {
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
            return Ok(ReadOutcome {
                first_offset: from,
                count: 0,
                len: 0,
                prev_crc: if from == self.next_offset {
                    self.last_crc
                } else {
                    0
                },
                next_offset: from,
                lost: None,
            });
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
            return Ok(ReadOutcome {
                first_offset: from,
                count: 0,
                len: 0,
                prev_crc: self.last_crc,
                next_offset: from,
                lost: None,
            });
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

    fn read_flash(
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
        let seg_end = self.segment_end(seg);
        // Where to start scanning: the cursor, the sparse index, or the segment start.
        let (mut pos, mut expected) = (l.data_start, slot.base);
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
        if let Some(c) = self.cursor
            && c.seg == seg
            && c.seq == slot.seq
            && c.expected <= from
            && c.expected >= expected
        {
            (pos, expected) = (c.pos, c.expected);
        }
        let mut corrupt_before = false;
        let mut out = ReadOutcome {
            first_offset: from,
            count: 0,
            len: 0,
            prev_crc: 0,
            next_offset: from,
            lost: None,
        };
        loop {
            // Fast path: the batch at `pos` holds the next wanted offset and fits in the
            // rest of `buf`: it is read once, straight into `buf`, and checked there.
            let fast = self
                .dev
                .read_wanted_batch(seg, pos, expected, out.next_offset, &mut buf[out.len..])
                .map_err(ReadError::Flash)?;
            let next = match fast {
                Some(h) => Next::Batch {
                    pos,
                    h,
                    after_corruption: false,
                },
                None => self
                    .dev
                    .next_batch(seg, pos, expected)
                    .map_err(ReadError::Flash)?,
            };
            let (p, h) = match next {
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
                } => {
                    if after_corruption {
                        self.dev.stats.corrupt_batches += 1;
                    }
                    corrupt_before = after_corruption;
                    (p, h)
                }
            };
            let after = p + align_up(h.len, l.ws());
            if h.end_offset() <= from {
                self.note_index(p, h.base_offset);
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
            let body_len = (h.len as usize) - BATCH_HEADER_LEN;
            let room = buf.len() - out.len;
            let body_addr = l.seg_addr(seg) + p + BATCH_HEADER_LEN as u32;
            if body_len <= room {
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
                let Some((skip_len, prev)) = walked else {
                    // Changed since it was validated: treat as corrupt at the next read.
                    if out.count > 0 {
                        return Ok(out);
                    }
                    self.dev.stats.corrupt_batches += 1;
                    return Ok(lost(from, h.end_offset(), LostReason::Corrupt));
                };
                dst.copy_within(skip_len.., 0);
                if out.count == 0 {
                    out.prev_crc = prev;
                }
                out.len += body_len - skip_len;
                let got = h.count - skip as u32;
                out.count += got;
                out.next_offset = h.end_offset();
                self.cursor = Some(Cursor {
                    seg,
                    seq: slot.seq,
                    pos: after,
                    expected: h.end_offset(),
                });
                self.note_index(p, h.base_offset);
                pos = after;
                expected = h.end_offset();
                if out.next_offset >= seg_end || out.next_offset >= self.flash_end {
                    return Ok(out);
                }
                continue;
            }
            if out.count > 0 {
                return Ok(out);
            }
            // The batch is larger than the buffer: copy record by record.
            return self.read_large_batch(seg, p, &h, want, buf);
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
            let first = match self.read_large_batch_once(seg, pos, h, from, buf) {
                Err(ReadError::BufferTooSmall { needed }) => Err(needed),
                other => Ok(other?),
            };
            let first_crc = match &first {
                Ok(f) => format::crc32(&buf[..f.0.len.min(buf.len())]),
                Err(_) => 0,
            };
            let second = match self.read_large_batch_once(seg, pos, h, from, buf) {
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

    /// One copy pass of [`Log::read_large_batch`]: the outcome, the address and length of
    /// the record before `from` if it is in this batch, and the address of the first
    /// record copied.
    #[allow(clippy::type_complexity)]
    fn read_large_batch_once(
        &mut self,
        seg: u32,
        pos: u32,
        h: &BatchHeader,
        from: u64,
        buf: &mut [u8],
    ) -> Result<(ReadOutcome, Option<(u32, u32)>, u32), ReadError<F::Error>> {
        let l = self.dev.l;
        let mut prev_at = None;
        let mut copy_at = 0u32;
        let end = l.seg_addr(seg) + pos + h.len;
        let mut at = l.seg_addr(seg) + pos + BATCH_HEADER_LEN as u32;
        let mut prev = h.prev_crc;
        let mut out = ReadOutcome {
            first_offset: from,
            count: 0,
            len: 0,
            prev_crc: 0,
            next_offset: from,
            lost: None,
        };
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

    // ----- Consumers -------------------------------------------------------------------

    /// Commits `offset` for `consumer`: every offset below it is done. A consumer is created
    /// by its first commit (up to [`MAX_CONSUMERS`]); a commit that would go backwards
    /// changes nothing. Returns the consumer's committed offset after the call. The commit
    /// is persisted by [`Log::tick`] after `commit_interval_us`, by [`Log::persist`], or
    /// before a segment it frees is reused.
    ///
    /// Errors: [`CommitError::OffsetOutOfRange`] above the next offset,
    /// [`CommitError::BadName`], [`CommitError::TooManyConsumers`],
    /// [`CommitError::Poisoned`] once a flash write, erase or sync has failed.
    pub fn commit(&mut self, consumer: &str, offset: u64) -> Result<u64, CommitError<F::Error>> {
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        check_name(consumer)?;
        if offset > self.next_offset {
            return Err(CommitError::OffsetOutOfRange {
                offset,
                next: self.next_offset,
            });
        }
        if let Some(c) = self.consumers.iter_mut().find(|c| c.name == consumer) {
            if offset > c.committed {
                c.committed = offset;
                self.dirty = true;
            }
            return Ok(c.committed);
        }
        let mut name = heapless::String::new();
        let _ = name.push_str(consumer);
        let persisted = offset.min(self.durable_end);
        self.consumers
            .push(Consumer {
                name,
                committed: offset,
                persisted,
            })
            .map_err(|_| CommitError::TooManyConsumers { max: MAX_CONSUMERS })?;
        self.dirty = true;
        Ok(offset)
    }

    /// The committed offset of `consumer`, if it exists.
    pub fn committed(&self, consumer: &str) -> Option<u64> {
        self.consumers
            .iter()
            .find(|c| c.name == consumer)
            .map(|c| c.committed)
    }

    /// Consumers and their committed offsets.
    pub fn consumers(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.consumers
            .iter()
            .map(|c| (c.name.as_str(), c.committed))
    }

    /// Deletes a consumer (persisted at once); returns whether it existed.
    ///
    /// Errors: [`CommitError::Poisoned`] once a flash write, erase or sync has failed,
    /// storage errors (the first failure).
    pub fn delete_consumer(&mut self, consumer: &str) -> Result<bool, CommitError<F::Error>> {
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        let Some(i) = self.consumers.iter().position(|c| c.name == consumer) else {
            return Ok(false);
        };
        let gone = self.consumers.remove(i);
        self.released = self.released.max(gone.committed);
        self.persist_journal(false)?;
        Ok(true)
    }

    /// Persists committed offsets now (one journal write and a sync).
    ///
    /// Errors: [`CommitError::Poisoned`] once a flash write, erase or sync has failed,
    /// storage errors (the first failure).
    pub fn persist(&mut self, now_us: u64) -> Result<(), CommitError<F::Error>> {
        self.now_us = now_us;
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        self.persist_journal(false)?;
        Ok(())
    }
}

/// The geometry recorded in the image must be the storage's: an error otherwise, never a
/// reinterpretation.
fn same_geometry<E: core::fmt::Debug>(
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

fn check_name<E: core::fmt::Debug>(name: &str) -> Result<(), CommitError<E>> {
    if name.is_empty() || name.len() > MAX_CONSUMER_NAME_LEN {
        return Err(CommitError::BadName { len: name.len() });
    }
    Ok(())
}

/// Whether `b` holds exactly `count` well-formed record encodings, the first at `first`.
fn parses_exactly(b: &[u8], first: u64, count: u32) -> bool {
    let mut at = 0usize;
    for i in 0..u64::from(count) {
        match parse_record_fields(&b[at..], first + i) {
            Some((_, n)) => at += n,
            None => return false,
        }
    }
    at == b.len()
}

/// An outcome that reports `from..to` as lost.
fn lost(from: u64, to: u64, reason: LostReason) -> ReadOutcome {
    ReadOutcome {
        first_offset: from,
        count: 0,
        len: 0,
        prev_crc: 0,
        next_offset: to,
        lost: Some(LostRange { from, to, reason }),
    }
}

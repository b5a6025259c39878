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
//!
//! ## Source files
//! One concern each: `config` (settings and caller memory), `outcome` (what operations
//! report), `layout` (geometry and addresses), `device` (the flash wrapper and poisoning),
//! `scan` (finding valid batches in a segment), `recovery` (format and mount), `damage`
//! (a torn write's extent and damage before the tail, for the mount), `writer`
//! (append, the RAM buffer, flush), `ring` (segment rotation and retention), `reader`
//! (reads by offset), `find` (an offset by record time), `consumers`, `producers`
//! (idempotent producers and sessions), `journal` (the commit journal), `format` (byte
//! layouts), `compact` (the compact record layout of format version 4), `compact_io`
//! (compact batches written to and decoded from the flash), `short` (the short batch of
//! format version 5, a record flushed alone), `lz4` (per-batch compression,
//! feature `compression`) and `tests`. This file holds [`Log`] and its accessors.

pub mod compact;
mod compact_io;
mod config;
mod consumers;
mod damage;
mod device;
mod find;
pub mod format;
mod init;
mod journal;
mod layout;
pub mod lz4;
mod outcome;
pub mod producers;
mod reader;
mod recovery;
mod ring;
mod scan;
pub mod short;
#[cfg(test)]
mod tests;
mod writer;

use heapless::Vec;

use crate::error::StorageOp;
use crate::storage::{Flash, Geometry};
pub use config::{
    AUTO_MIN_BODY, Compression, Config, FullPolicy, MIN_BUFFER, MIN_ERASE_SIZE, Memory,
    SegmentSlot, SpillPolicy,
};
pub use consumers::BRIDGE_CONSUMER;
use damage::DamagedBeforeTail;
use device::Dev;
pub use device::READ_ATTEMPTS;
pub use find::FindStep;
use format::{BATCH_HEADER_LEN, ResumeMarker};
pub use format::{Producer, Record, RecordIter, RecordRef, record_crc};
use journal::Consumer;
pub use journal::{JournalGeometry, MAX_CONSUMERS, MAX_JOURNAL_ENTRY_LEN, journal_geometry};
pub use layout::segments_for;
#[cfg(feature = "compression")]
pub use lz4::scratch_len;
pub use outcome::{
    Appended, CORRUPT_RANGES_REMEMBERED, JournalInvalid, LostRange, LostReason, ReadOutcome,
    RecoveryReport, Session, Stats,
};
use producers::ProducerState;
pub use producers::{MAX_PRODUCERS, PRODUCER_WINDOW, seq_before};
use reader::{Cursor, INDEX_ENTRIES};

// Names the unit tests (here and in `format`) use through this module.
#[cfg(test)]
use crate::error::{CommitError, FlushError, MountError};
#[cfg(test)]
use layout::Layout;

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
    /// The last record written in the head segment since the mount, when a short batch
    /// may follow it (`FORMAT.md` section 3.5).
    short_link: Option<short::WriterLink>,
    tail: Option<u32>,

    next_offset: u64,
    flash_end: u64,
    durable_end: u64,
    flash_last_crc: u32,
    /// Record CRC of the newest record, unless `newest_crc_from` says it is still to be
    /// computed (see [`Log::newest_crc`]).
    last_crc: u32,
    /// Where the newest record starts in the RAM buffer while its record CRC has not been
    /// computed: an append does not compute it; only a flush (once per batch), a read at
    /// the next offset or [`Log::last_crc`] needs it.
    newest_crc_from: Option<usize>,
    lease: u64,

    buf: &'a mut [u8],
    buf_cap: usize,
    buf_len: usize,
    buf_count: u32,
    buf_base: u64,
    buf_prev_crc: u32,
    buf_first_us: u64,
    /// At mount: a compressed batch the mount had to read did not fit in the scratch.
    needs_scratch: Option<usize>,
    /// Scratch for compressing and decoding compressed batches (empty without one).
    scratch: lz4::Scratch<'a>,
    /// [`Compression::Auto`]: batches still to write uncompressed before trying again, and
    /// the back-off after the next batch that does not compress.
    #[cfg(feature = "compression")]
    lz4_skip: u8,
    #[cfg(feature = "compression")]
    lz4_backoff: u8,

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
    /// Durable offsets (below the journal's `durable_next`) that the head's last batches
    /// held when the mount found them failing their CRC after the head's valid data:
    /// reads report them corrupt, never as skipped.
    damaged_at_head_end: Option<(u64, u64)>,
    cursor: Option<Cursor>,
    /// The start of the last batch a read went through to its end: a read that resumes
    /// inside it (its caller kept only part of what the last read returned, e.g. a reply
    /// frame that filled) starts there rather than at the segment's start.
    last_batch: Option<Cursor>,
    /// The batch the last read copied its first record from: a caller that kept only part
    /// of what that read returned resumes at or after its first record, so a read that
    /// starts there walks at most one read's batches again, however small the batches,
    /// rather than walking from the last index entry (a fetch reply fills mid-read).
    read_start: Option<Cursor>,
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
        self.newest_crc()
    }

    /// Record CRC of the newest record (0 if none): kept, or computed from the RAM buffer
    /// when the newest record is buffered and its CRC was not needed yet.
    fn newest_crc(&self) -> u32 {
        match self.newest_crc_from {
            Some(from) => record_crc(self.next_offset - 1, &self.buf[from..self.buf_len]),
            None => self.last_crc,
        }
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

    /// The format version of the valid segment at physical `index` (as in
    /// [`Log::segments`]): 1 to 3 for segments whose batches hold layout 1 records, 4 and
    /// later for compact bodies. `None` for an index out of range or a segment without a
    /// valid header.
    pub fn segment_version(&self, index: u32) -> Option<u16> {
        let s = self.slots.get(index as usize)?;
        s.valid.then_some(s.version)
    }

    /// Gives the storage back without a clean shutdown (what a power cut would leave).
    pub fn into_flash(self) -> F {
        self.dev.flash
    }

    /// Access to the storage (for counters of a simulated flash).
    pub fn flash(&self) -> &F {
        &self.dev.flash
    }
}

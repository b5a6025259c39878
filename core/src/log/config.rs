//! What the caller gives a log: its run-time settings ([`Config`] and the spill and full
//! policies), the memory it works in ([`Memory`], one [`SegmentSlot`] per segment) and the
//! smallest erase block and buffer it accepts.

/// Smallest erase block the log accepts, bytes (a journal entry must fit in one).
pub const MIN_ERASE_SIZE: u32 = 1024;

/// Smallest RAM buffer, bytes.
pub const MIN_BUFFER: usize = 256;

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

/// Whether the writer compresses batches (`FORMAT.md` section 4.4). Compression needs the
/// crate feature `compression` and a log mounted with a scratch buffer
/// ([`Log::mount_with_scratch`](super::Log::mount_with_scratch)); without either, every
/// batch is written uncompressed whatever this says. Only segments of format version 4
/// hold compressed batches, and a batch is stored compressed only when that takes fewer
/// bytes than its compact body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Compression {
    /// Never compress.
    None,
    /// Try LZ4 on bodies of at least [`AUTO_MIN_BODY`] bytes; after a batch that did not
    /// come out smaller, skip the next 1, 2, 4, … up to 64 batches before trying again
    /// (incompressible streams cost little CPU), and try every batch again after one
    /// that did.
    Auto,
    /// Try LZ4 on every batch.
    Lz4,
}

/// [`Compression::Auto`] does not try bodies shorter than this, bytes: LZ4 rarely saves
/// its own prefix on them.
pub const AUTO_MIN_BODY: usize = 48;

/// Run-time settings of a mounted log. Times are in µs of the caller's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    /// Spill policy.
    pub spill: SpillPolicy,
    /// Full-storage policy.
    pub full: FullPolicy,
    /// Longest time a record waits in RAM before [`Log::tick`](super::Log::tick) writes it, µs.
    pub linger_us: u64,
    /// `OnPressure`: buffer fill, in percent, above which records are written.
    pub high_water_percent: u8,
    /// Longest time a commit waits in RAM before [`Log::tick`](super::Log::tick) persists it, µs.
    pub commit_interval_us: u64,
    /// Offsets reserved by one journal write of the offset lease. A crash skips at most
    /// this many offsets (handed out or not, they are never reused and read back as never
    /// persisted), so offsets count positions, not records.
    pub lease_step: u64,
    /// Per-batch compression (see [`Compression`]).
    pub compression: Compression,
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
            compression: Compression::None,
        }
    }
}

/// What the log knows of one physical segment (one slot per segment, caller-provided).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentSlot {
    pub(super) seq: u64,
    pub(super) base: u64,
    pub(super) erase_count: u32,
    pub(super) valid: bool,
    pub(super) after_unclean: bool,
    /// Format version of the segment's header.
    pub(super) version: u16,
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
    /// One slot per segment of the partition ([`segments_for`](super::segments_for) tells
    /// how many).
    pub segments: &'a mut [SegmentSlot],
}

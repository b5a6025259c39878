//! Errors, one enum per operation family, generic over the storage's error `E`.
//!
//! A scan outcome (valid, torn tail, corrupt batch) is not an error: it is reported in the
//! [`RecoveryReport`](crate::log::RecoveryReport) and in
//! [`ReadOutcome::lost`](crate::log::ReadOutcome::lost).

use core::fmt::Debug;

/// The kind of flash operation whose failure poisoned a log (see [`Log::poisoned`]).
///
/// [`Log::poisoned`]: crate::log::Log::poisoned
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StorageOp {
    /// Programming words ([`Flash::write`](crate::storage::Flash::write)).
    Write,
    /// Erasing an erase block ([`Flash::erase`](crate::storage::Flash::erase)).
    Erase,
    /// Making writes durable ([`Flash::sync`](crate::storage::Flash::sync)).
    Sync,
}

impl StorageOp {
    /// The operation's name: `"write"`, `"erase"` or `"sync"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            StorageOp::Write => "write",
            StorageOp::Erase => "erase",
            StorageOp::Sync => "sync",
        }
    }
}

impl core::fmt::Display for StorageOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of the format's sequence numbers ran out (each stays below
/// [`MAX_SEQ`](crate::log::format::MAX_SEQ), 2^62, `FORMAT.md` sections 2 and 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SeqSpace {
    /// Segment header `seq`: the next segment cannot be opened.
    Segment,
    /// Journal entry `seq`: no journal entry can be written (no commit, lease or segment
    /// is recorded any more).
    Journal,
}

impl SeqSpace {
    /// `"segment header"` or `"journal entry"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SeqSpace::Segment => "segment header",
            SeqSpace::Journal => "journal entry",
        }
    }
}

impl core::fmt::Display for SeqSpace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Formatting a partition failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError<E: Debug> {
    /// The storage failed.
    #[error("flash error during format: {0:?}")]
    Flash(E),
    /// The geometry is unusable (see [`Geometry::is_valid`](crate::storage::Geometry::is_valid));
    /// the log also needs an erase size of at least 1024 bytes.
    #[error("unsupported flash geometry")]
    Geometry,
    /// Fewer than 2 segments fit in the partition.
    #[error(
        "partition holds {segments} segments of {blocks_per_segment} erase blocks; at least 2 are needed"
    )]
    TooFewSegments {
        /// Segments that fit.
        segments: u32,
        /// Erase blocks per segment asked for.
        blocks_per_segment: u32,
    },
    /// An erase block stayed non-blank after repeated erases.
    #[error(fmt = msg::bad_block)]
    BadBlock {
        /// Index of the erase block.
        block: u32,
    },
}

/// Mounting a partition failed. Recovery itself never fails on bad data: this is about
/// storage errors and partitions that are not a Spillway log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError<E: Debug> {
    /// The storage failed.
    #[error("flash error during mount: {0:?}")]
    Flash(E),
    /// The storage's geometry is unusable.
    #[error("unsupported flash geometry")]
    Geometry,
    /// Neither a journal entry nor a segment header was found.
    #[error("partition is not formatted as a Spillway log")]
    NotFormatted,
    /// Reading a journal erase block failed (after the log's re-reads): the storage
    /// failed, not the format. Retryable after the storage recovers.
    #[error("reading journal erase block {block} failed: {error:?}")]
    JournalUnreadable {
        /// Index of the erase block in the partition (0 or 1).
        block: u32,
        /// The storage's error.
        error: E,
    },
    /// A journal erase block stayed non-blank after repeated erases when the mount wrote
    /// its journal entry (worn-out flash). The log itself was found and is intact; it
    /// cannot run because committed offsets and the offset lease can no longer be
    /// persisted. Copy the records off (`inspect` reads the log without writing) and
    /// replace the flash.
    #[error(
        "journal erase block {block} does not erase (worn-out flash): the log was found but its journal cannot be written"
    )]
    WornJournal {
        /// Index of the erase block in the partition (0 or 1).
        block: u32,
    },
    /// The partition was formatted with a different geometry than the storage reports.
    #[error(
        "image geometry (erase {image_erase_size} B, write {image_write_size} B) differs from the storage (erase {erase_size} B, write {write_size} B)"
    )]
    GeometryMismatch {
        /// Erase size recorded in the image, bytes.
        image_erase_size: u32,
        /// Write size recorded in the image, bytes.
        image_write_size: u32,
        /// Erase size of the storage, bytes.
        erase_size: u32,
        /// Write size of the storage, bytes.
        write_size: u32,
    },
    /// The caller's segment table is too small for the partition.
    #[error("partition has {segments} segments but the segment table holds {slots}")]
    SegmentTable {
        /// Segments in the partition.
        segments: u32,
        /// Slots provided.
        slots: usize,
    },
    /// The caller's RAM buffer is too small.
    #[error("RAM buffer of {len} bytes is below the minimum of {min}")]
    BufferTooSmall {
        /// Bytes provided.
        len: usize,
        /// Bytes needed.
        min: usize,
    },
    /// The mount had to read a compressed batch that decodes to more bytes than the
    /// scratch buffer holds (none, without `Log::mount_with_scratch`).
    #[error(
        "a compressed batch needs a scratch buffer of {needed} bytes, the mount was given {len}"
    )]
    ScratchTooSmall {
        /// Bytes the batch's body decodes to.
        needed: usize,
        /// Bytes of scratch given.
        len: usize,
    },
}

/// Appending a record failed; nothing was appended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError<E: Debug> {
    /// The storage failed.
    #[error("flash error during append: {0:?}")]
    Flash(E),
    /// The record is larger than the log accepts.
    #[error("record of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Encoded record length, bytes.
        len: usize,
        /// Largest encoded record, bytes.
        max: usize,
    },
    /// The topic is empty or longer than 255 bytes.
    #[error("topic must be 1 to 255 bytes, got {len}")]
    BadTopic {
        /// Topic length in bytes.
        len: usize,
    },
    /// Storage is full and the full policy is `reject-new` (backpressure: retry after the
    /// consumers commit).
    #[error("log is full")]
    Full,
    /// The log has handed out its last offset: its next offset is
    /// [`MAX_NEXT_OFFSET`](crate::log::format::MAX_NEXT_OFFSET) (2^62 − 1), and an offset is
    /// never reused or handed out past that. Only a crafted or damaged image (a segment
    /// base, journal lease or durable end near the limit) gets here: the records stored stay
    /// readable; drain them and format the storage again. Nothing was appended; a retry
    /// fails the same way.
    #[error(
        "the log's offsets are exhausted: next offset {next} is the last the format allows (the image was crafted or damaged); drain it and format again"
    )]
    OffsetsExhausted {
        /// The log's next offset.
        next: u64,
    },
    /// A resend of a producer sequence older than the last [`PRODUCER_WINDOW`] the log
    /// remembers for that producer: the record is already in the log, at an offset below
    /// `stored_below`, but its exact offset is no longer known. Producers treat it as
    /// acknowledged (Kafka's producer treats a duplicate sequence the same way); nothing was
    /// appended.
    ///
    /// [`PRODUCER_WINDOW`]: crate::log::PRODUCER_WINDOW
    #[error(
        "producer {producer} resent sequence {seq}, already stored below offset {stored_below} (older than the last remembered, {last_seq}; the exact offset is no longer known)"
    )]
    SequenceTooOld {
        /// Producer id.
        producer: u64,
        /// Sequence resent.
        seq: u32,
        /// Last sequence stored.
        last_seq: u32,
        /// The resent record's offset is below this one (the oldest remembered record's).
        stored_below: u64,
    },
    /// An erase block stayed non-blank after repeated erases (worn-out flash).
    #[error(fmt = msg::bad_block)]
    BadBlock {
        /// Index of the erase block in the partition.
        block: u32,
    },
    /// See [`FlushError::Unwritable`]: a bug, not a full log; nothing was appended.
    #[error(fmt = msg::unwritable)]
    Unwritable {
        /// Offset of the record.
        offset: u64,
        /// Bytes an empty segment takes for a batch's records.
        room: usize,
    },
    /// A resend older than the remembered window from before a skipped sequence (one the
    /// log refused, or that never arrived): whether it was stored is not known, so it is
    /// neither appended nor acknowledged. The producer must treat it as not acknowledged.
    #[error(
        "producer {producer} resent sequence {seq}, older than the remembered window and before a skipped sequence: whether it was stored is not known (last {last_seq})"
    )]
    SequenceUnknown {
        /// Producer id.
        producer: u64,
        /// Sequence resent.
        seq: u32,
        /// Last sequence stored.
        last_seq: u32,
    },
    /// An earlier flash write, erase or sync failed (`op` says which): the log is poisoned.
    /// It writes nothing more and never advances its durable offset again; mount the storage
    /// again to go on. Retryable after that remount. Records appended but not yet durable
    /// when the failure happened may or may not be on flash.
    #[error(fmt = msg::poisoned)]
    Poisoned {
        /// The operation whose failure poisoned the log.
        op: StorageOp,
    },
    /// A producer session's record is neither the next sequence (`expected`, the last
    /// stored + 1) nor a stored one: nothing was appended. The producer resends in order
    /// from its first unacknowledged record.
    #[error(
        "producer {producer} session {epoch}: sequence {seq} is out of sequence, expected {expected}; resend in order"
    )]
    OutOfSequence {
        /// Producer id.
        producer: u64,
        /// The session's epoch.
        epoch: u32,
        /// Sequence received.
        seq: u32,
        /// The sequence the session takes next.
        expected: u32,
    },
    /// The record names an older session of its producer id (or none, while the id has a
    /// session): a newer session owns the id. Nothing was appended.
    #[error("producer {producer}: session {epoch} is fenced by the id's newer session {current}")]
    Fenced {
        /// Producer id.
        producer: u64,
        /// The epoch the record named (0: no session).
        epoch: u32,
        /// The id's current epoch.
        current: u32,
    },
    /// The record names a session the log did not open for this producer id (its state
    /// was forgotten, or the epoch is made up): open a new session. Nothing was appended.
    #[error(
        "producer {producer}: session {epoch} is unknown (current session {current}); open a new session"
    )]
    UnknownSession {
        /// Producer id.
        producer: u64,
        /// The epoch the record named.
        epoch: u32,
        /// The id's current epoch, 0 if the log knows no session of it.
        current: u32,
    },
    /// See [`FlushError::SeqExhausted`]: nothing was appended; a retry fails the same way.
    #[error(fmt = msg::seq_exhausted)]
    SeqExhausted {
        /// Which sequence number ran out.
        what: SeqSpace,
    },
}

/// Opening or resuming a producer session failed; the producer table is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError<E: Debug> {
    /// The storage failed (writing the journal entry that holds the new epoch, or the flush
    /// before a resume).
    #[error("flash error opening a producer session: {0:?}")]
    Flash(E),
    /// An erase block of the journal stayed non-blank after repeated erases.
    #[error(fmt = msg::bad_block)]
    BadBlock {
        /// Index of the erase block in the partition.
        block: u32,
    },
    /// A resume flushes the RAM buffer first, and no segment can be reused (`reject-new`).
    #[error("log is full")]
    Full,
    /// See [`FlushError::Unwritable`]: a bug, not a full log.
    #[error(fmt = msg::unwritable)]
    Unwritable {
        /// Offset of the record.
        offset: u64,
        /// Bytes an empty segment takes for a batch's records.
        room: usize,
    },
    /// No 32-bit epoch is left: epochs are journal entry sequence numbers, and the journal
    /// has written `u32::MAX` entries (or the id's epoch is `u32::MAX`). Format the log again.
    #[error(
        "no session epoch is left for producer {producer}: the journal has used every 32-bit epoch; format the log again"
    )]
    EpochsExhausted {
        /// Producer id.
        producer: u64,
    },
    /// An earlier flash write, erase or sync failed: the log is poisoned until remounted.
    #[error(fmt = msg::poisoned)]
    Poisoned {
        /// The operation whose failure poisoned the log.
        op: StorageOp,
    },
    /// See [`FlushError::SeqExhausted`]: no session was opened or resumed.
    #[error(fmt = msg::seq_exhausted)]
    SeqExhausted {
        /// Which sequence number ran out.
        what: SeqSpace,
    },
}

/// Writing the RAM buffer to flash failed; the records stay in RAM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError<E: Debug> {
    /// The storage failed.
    #[error("flash error during flush: {0:?}")]
    Flash(E),
    /// No segment can be reused and the full policy is `reject-new`.
    #[error("log is full")]
    Full,
    /// The first record in the RAM buffer cannot be written even into an empty segment:
    /// it is longer than the segment's `room` bytes, or it no longer parses. The log never
    /// buffers such a record, so this is a bug (or RAM corruption), not a full log; the
    /// records stay in RAM.
    #[error(fmt = msg::unwritable)]
    Unwritable {
        /// Offset of the record.
        offset: u64,
        /// Bytes an empty segment takes for a batch's records.
        room: usize,
    },
    /// An erase block stayed non-blank after repeated erases (worn-out flash).
    #[error(fmt = msg::bad_block)]
    BadBlock {
        /// Index of the erase block in the partition.
        block: u32,
    },
    /// An earlier flash write, erase or sync failed (`op` says which): the log is poisoned.
    /// It writes nothing more and never advances its durable offset again; mount the storage
    /// again to go on. Retryable after that remount. Records appended but not yet durable
    /// when the failure happened may or may not be on flash.
    #[error(fmt = msg::poisoned)]
    Poisoned {
        /// The operation whose failure poisoned the log.
        op: StorageOp,
    },
    /// The next segment header or journal entry would need a sequence number at or past 2^62, which the format does not allow (only a crafted or damaged image gets near it). Nothing was written; the records stay in RAM (or, for an append, the record was not appended) and a retry fails the same way. The records stored stay readable: drain them and format the storage again.
    #[error(fmt = msg::seq_exhausted)]
    SeqExhausted {
        /// Which sequence number ran out.
        what: SeqSpace,
    },
}

/// `From<FlushError>` for an error enum that has each of [`FlushError`]'s variants under
/// the same name and fields (the operation flushed, and failed the way the flush did).
macro_rules! from_flush_error {
    ($($to:ident),*) => {$(
        impl<E: Debug> From<FlushError<E>> for $to<E> {
            fn from(e: FlushError<E>) -> Self {
                match e {
                    FlushError::Flash(e) => $to::Flash(e),
                    FlushError::Full => $to::Full,
                    FlushError::Unwritable { offset, room } => $to::Unwritable { offset, room },
                    FlushError::BadBlock { block } => $to::BadBlock { block },
                    FlushError::Poisoned { op } => $to::Poisoned { op },
                    FlushError::SeqExhausted { what } => $to::SeqExhausted { what },
                }
            }
        }
    )*};
}

from_flush_error!(AppendError, SessionError);

/// Reading failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError<E: Debug> {
    /// The storage failed.
    #[error("flash error during read: {0:?}")]
    Flash(E),
    /// The offset is above the next offset.
    #[error("offset {offset} is beyond the next offset {next}")]
    OffsetOutOfRange {
        /// Offset asked for.
        offset: u64,
        /// The log's next offset.
        next: u64,
    },
    /// The offset was dropped (retention or `drop-oldest`).
    #[error("offset {offset} was dropped; first available is {first_available}")]
    Dropped {
        /// Offset asked for.
        offset: u64,
        /// First offset still retained.
        first_available: u64,
    },
    /// The caller's buffer cannot hold the first record.
    #[error("read buffer too small: the record needs {needed} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
    /// The batch holding the offset is compressed and decodes to more bytes than the log's
    /// scratch buffer holds (it was written with a larger RAM buffer, or the log was
    /// mounted without a scratch: see `Log::mount_with_scratch`).
    #[error("a compressed batch needs a scratch buffer of {needed} bytes, the log has {len}")]
    ScratchTooSmall {
        /// Bytes the batch's body decodes to.
        needed: usize,
        /// Bytes of the log's scratch buffer.
        len: usize,
    },
}

/// Committing, deleting or persisting consumer offsets failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError<E: Debug> {
    /// The storage failed.
    #[error("flash error during commit: {0:?}")]
    Flash(E),
    /// The offset is above the next offset.
    #[error("offset {offset} is beyond the next offset {next}")]
    OffsetOutOfRange {
        /// Offset given.
        offset: u64,
        /// The log's next offset.
        next: u64,
    },
    /// The consumer table is full.
    #[error("too many consumers (maximum {max})")]
    TooManyConsumers {
        /// Table size.
        max: usize,
    },
    /// An erase block of the journal stayed non-blank after repeated erases.
    #[error(fmt = msg::bad_block)]
    BadBlock {
        /// Index of the erase block in the partition.
        block: u32,
    },
    /// The name is empty or longer than 31 bytes.
    #[error("consumer name must be 1 to 31 bytes, got {len}")]
    BadName {
        /// Name length in bytes.
        len: usize,
    },
    /// An earlier flash write, erase or sync failed (`op` says which): the log is poisoned.
    /// It writes nothing more and never advances its durable offset again; mount the storage
    /// again to go on. Retryable after that remount. Records appended but not yet durable
    /// when the failure happened may or may not be on flash.
    #[error(fmt = msg::poisoned)]
    Poisoned {
        /// The operation whose failure poisoned the log.
        op: StorageOp,
    },
    /// See [`FlushError::SeqExhausted`]: the commit is kept in RAM only (not persisted).
    #[error(fmt = msg::seq_exhausted)]
    SeqExhausted {
        /// Which sequence number ran out.
        what: SeqSpace,
    },
}

/// The messages of the failures that several operations share, written once.
mod msg {
    use core::fmt::{Formatter, Result};

    use super::{SeqSpace, StorageOp};

    pub(super) fn bad_block(block: &u32, f: &mut Formatter<'_>) -> Result {
        write!(f, "erase block {block} does not erase")
    }

    pub(super) fn poisoned(op: &StorageOp, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "log is poisoned by a failed flash {op}; remount to recover"
        )
    }

    pub(super) fn seq_exhausted(what: &SeqSpace, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "the log's {what} sequence numbers are used up (the next reaches 2^62: a crafted or damaged image); nothing was written; drain the log, format again"
        )
    }

    pub(super) fn unwritable(offset: &u64, room: &usize, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "buffered record at offset {offset} cannot be written: it does not parse or does not fit the {room} bytes of an empty segment (a bug, not a full log)"
        )
    }
}

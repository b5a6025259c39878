//! The bridge's checkpoints in a redb file (`--state FILE.redb`): the source of truth for
//! where a drain resumes.
//!
//! redb is synchronous: the async callers go through the `*_async` methods, which run the
//! blocking call on `smol::unblock`'s thread pool, never on the executor. Every write is one
//! redb transaction committed with redb's default durability (fsync before `commit`
//! returns), so a checkpoint that was saved survives a crash or power cut.
//!
//! A failed transaction leaves the redb handle unusable: the drain releases it and opens the
//! file again ([`Store::reopen`]). Every read-write open first syncs the file and drops its
//! cached pages ([`drop_cached_pages`]), so redb recovers from what is on disk, never from
//! pages of a commit whose fsync failed that Linux still shows.
//!
//! # Tables
//!
//! | table | key | value (JSON text) |
//! |---|---|---|
//! | `checkpoints` | (gateway id, consumer) | [`Checkpoint`]: log id, committed offset, CRC of the last forwarded record, counters |
//! | `consumer_gaps` | (log id, consumer, first lost offset) | [`Gap`]: the lost range, why, when |
//! | `resets` | (gateway id, consumer, reset number) | [`Reset`]: old and new log ids, why, when |
//! | `sink_resumes` | (log id, checkpoint offset it moved from) | [`SinkResume`]: a resume taken from the sink (records the sink already had) |
//!
//! State files of earlier versions keyed gaps by (log id, first lost offset) only, in a
//! table `gaps`, so two consumers meeting a gap at the same offset overwrote each other's
//! row. The first read-write open moves those rows into `consumer_gaps`, under the one
//! consumer the file holds a checkpoint for on the gap's gateway, or under the empty name
//! (never a consumer's) when there are several or none: the rows are kept, and
//! [`Store::gaps`] with `""` lists them.
//!
//! A checkpoint is keyed by the gateway's configured id (its `Welcome`), not by its log id:
//! a reflashed or replaced gateway keeps its id but gets a new log id, and that mismatch is
//! what the resume check ([`check_log_id`], [`check_prev_crc`]) detects.
//!
//! # Files of this module
//!
//! - `mod.rs`: what is stored ([`Checkpoint`], [`Gap`], [`Reset`], [`SinkResume`], the
//!   file sink's [`SinkFiles`]) and [`StoreError`].
//! - `store`: the state file ([`Store`]) and its tables.
//! - `resume`: the resume check ([`ResumeMismatch`]).

mod resume;
mod store;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::client::log_id_hex;

pub use resume::{ResumeMismatch, check_log_id, check_prev_crc};
pub use store::{Store, drop_cached_pages};

/// Errors of the state file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb failed (open, transaction, I/O, corruption).
    #[error("state file: {0}")]
    Redb(#[from] redb::Error),
    /// A stored value does not parse (written by an incompatible version).
    #[error("state file holds an unreadable value: {0}")]
    Decode(#[from] serde_json::Error),
    /// The blocking task was lost.
    #[error("state file task failed: {0}")]
    Task(String),
    /// A write to a state file opened read-only.
    #[error("state file is open read-only")]
    ReadOnly,
    /// The handle was closed by [`Store::reopen`] and opening the file again failed.
    #[error("state file is closed (reopening it failed)")]
    Closed,
    /// Another process (another drain) has the state file open: redb holds a `flock` on it.
    #[error("state file {} is in use by {}", path.display(), holder.map_or("another process".to_string(), |p| format!("process {p}")))]
    Locked {
        /// The state file.
        path: std::path::PathBuf,
        /// The pid holding it, when `/proc/locks` tells.
        holder: Option<u32>,
    },
    /// The state file was not closed cleanly (its drain was killed, or the machine lost
    /// power) and no drain has it open: it needs the repair redb runs when a drain opens
    /// it for writing, which a read-only open ([`Store::open_existing`]) cannot run.
    #[error(
        "state file {} was not closed cleanly (its drain was killed, or the machine lost power): the next drain repairs it when it opens it",
        .0.display()
    )]
    NeedsRepair(std::path::PathBuf),
}

impl StoreError {
    /// True for a failure of redb itself (I/O, a failed commit, a poisoned handle), which
    /// reopening the state file may cure (a lock another handle or drain holds included); false for a value that does not parse or a
    /// read-only handle, which reopening cannot change.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            StoreError::Redb(_)
                | StoreError::Task(_)
                | StoreError::Closed
                | StoreError::Locked { .. }
        )
    }
}

macro_rules! redb_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Redb(e.into())
            }
        }
    )*};
}
redb_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// Where a consumer of one gateway stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The gateway's log id this checkpoint belongs to, as 32 hex digits.
    pub log_id: String,
    /// First offset not yet handed on to the sink (every offset below is done).
    pub offset: u64,
    /// Record CRC of the record at `offset - 1`, if this bridge forwarded it (unknown after
    /// a gap, at offset 0, or after a resume taken from the sink).
    pub last_crc: Option<u32>,
    /// Records forwarded under this checkpoint, in total.
    pub records: u64,
    /// Payload bytes forwarded, in total.
    pub bytes: u64,
    /// Gaps met (ranges of offsets the gateway no longer had).
    pub gaps: u64,
    /// Offsets lost in those gaps, in total.
    pub lost: u64,
    /// Times the checkpoint was reset to a new log (`--accept-new-log`).
    pub resets: u64,
    /// Wall-clock time of the last update, ms since the Unix epoch.
    pub updated_unix_ms: u64,
    /// File sink only: what the sink had synced when this checkpoint was saved (absent in
    /// checkpoints written by earlier versions and for the Kafka sink). A restart cuts the
    /// files back to it before writing, see [`SinkFiles`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_files: Option<SinkFiles>,
}

/// The file sink's synced state saved with a checkpoint: per topic, the newest file and how
/// many of its bytes were fsynced when every record below the checkpoint offset had been
/// written. Bytes past these lengths in open files were written after the checkpoint (or
/// their fsync failed): the sink cuts them off, and syncs, before it writes again, and the
/// drain resends their records from the checkpoint (see `sink::file`, "Synced lengths").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkFiles {
    /// The sink directory, absolute (canonical); a checkpoint taken for another directory
    /// is not applied.
    pub dir: String,
    /// The file layout the state describes: [`crate::sink::file::LAYOUT`] (2,
    /// `<topic>/<first offset>.jsonl[.open]`); 0 (absent) in checkpoints of earlier
    /// versions (`<topic>.<n>.jsonl`), which are not applied.
    #[serde(default)]
    pub layout: u32,
    /// The log id (32 hex digits) whose lines were being written: only lines of this log
    /// (or lines that are not records at all, such as a torn line) are ever cut off.
    pub log_id: String,
    /// Every topic directory (percent-encoded topic) in the gateway's directory at that
    /// time, with its newest file. A topic not listed had no lines then.
    pub files: BTreeMap<String, SyncedFile>,
}

/// One topic's newest file in [`SinkFiles`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedFile {
    /// The file's first offset, its name (`<first>.jsonl` or `<first>.jsonl.open`, in
    /// whichever date directory); files of the topic named by lower offsets are closed and
    /// complete. Earlier versions stored their file number here under the key `n`.
    #[serde(alias = "n")]
    pub first: u64,
    /// Bytes of that file fsynced, always at a line boundary.
    pub len: u64,
}

impl Checkpoint {
    /// A fresh checkpoint for `log_id` at `offset`.
    pub fn new(log_id: u128, offset: u64) -> Self {
        Checkpoint {
            log_id: log_id_hex(log_id),
            offset,
            last_crc: None,
            records: 0,
            bytes: 0,
            gaps: 0,
            lost: 0,
            resets: 0,
            updated_unix_ms: now_ms(),
            sink_files: None,
        }
    }

    /// The log id as a number; `None` if the stored text is not 32 hex digits.
    pub fn log_id(&self) -> Option<u128> {
        if self.log_id.len() != 32 {
            return None;
        }
        u128::from_str_radix(&self.log_id, 16).ok()
    }
}

/// A range of offsets the gateway reported gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// Gateway id.
    pub gateway_id: String,
    /// First lost offset.
    pub from: u64,
    /// One past the last lost offset.
    pub to: u64,
    /// Why (`dropped-oldest`, `corrupt`, `not-persisted`, `dropped`).
    pub reason: String,
    /// When the bridge met it, ms since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A checkpoint reset to a new log (`--accept-new-log`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reset {
    /// The checkpoint's log id before (32 hex digits).
    pub old_log_id: String,
    /// Its offset before.
    pub old_offset: u64,
    /// The gateway's log id now.
    pub new_log_id: String,
    /// The offset the checkpoint restarts at.
    pub new_offset: u64,
    /// The resume check that failed, in words.
    pub reason: String,
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A checkpoint moved forward at start because the sink already held the records after it
/// (delivered before a crash, never checkpointed): the effectively-once resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkResume {
    /// Gateway id.
    pub gateway_id: String,
    /// Consumer name.
    pub consumer: String,
    /// Log id (32 hex digits).
    pub log_id: String,
    /// The checkpoint offset before.
    pub from: u64,
    /// The offset resumed at: the sink held every offset in `from..to`.
    pub to: u64,
    /// The highest offset of this log the sink held (≥ `to − 1`; more means a hole after
    /// `to`, whose records are sent again).
    pub highest_in_sink: u64,
    /// Records in `from..to` compared with the gateway's, field by field (topic, timestamp,
    /// payload); equal to `to − from` unless the gateway no longer had some of them.
    pub verified: u64,
    /// Where the records were found, e.g. `kafka topic "t" (3 partitions)`.
    pub sink: String,
    /// When, ms since the Unix epoch.
    pub at_unix_ms: u64,
}

/// Wall-clock now, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

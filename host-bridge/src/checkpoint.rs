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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::client::log_id_hex;

const CHECKPOINTS: TableDefinition<(&str, &str), &str> = TableDefinition::new("checkpoints");
const GAPS: TableDefinition<(u128, &str, u64), &str> = TableDefinition::new("consumer_gaps");
/// The gaps table of earlier versions, without the consumer (migrated at open).
const GAPS_V1: TableDefinition<(u128, u64), &str> = TableDefinition::new("gaps");
const RESETS: TableDefinition<(&str, &str, u64), &str> = TableDefinition::new("resets");
const SINK_RESUMES: TableDefinition<(u128, u64), &str> = TableDefinition::new("sink_resumes");

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

/// Why the bridge refuses to resume (Raft's log matching applied to a checkpoint).
///
/// The message says what differs, not what to do about it: the drain adds the
/// `--accept-new-log` hint when it refuses ([`DrainError::Resume`](crate::drain::DrainError::Resume)),
/// and says it is starting over when the flag is set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeMismatch {
    /// The gateway's log is not the one the checkpoint was taken on: reflashed or replaced.
    #[error(
        "gateway {gateway_id:?} now has log id {gateway} but the checkpoint is for log id \
         {stored} (offset {offset}): the gateway was reflashed or replaced"
    )]
    LogId {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id (32 hex digits).
        stored: String,
        /// The gateway's log id (32 hex digits).
        gateway: String,
        /// The checkpoint's offset.
        offset: u64,
    },
    /// Same log id, but the record before the resume offset is not the one forwarded.
    #[error(
        "gateway {gateway_id:?} (log id {gateway_log_id}, checkpoint log id {stored_log_id}): \
         the record before offset {offset} has CRC {gateway:#010x} but the last forwarded \
         record had CRC {stored:#010x}"
    )]
    Crc {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id.
        stored_log_id: String,
        /// The gateway's log id.
        gateway_log_id: String,
        /// The resume offset.
        offset: u64,
        /// CRC stored in the checkpoint.
        stored: u32,
        /// CRC the gateway reports for the record before `offset`.
        gateway: u32,
    },
    /// The checkpoint is past the end of the gateway's log.
    #[error(
        "gateway {gateway_id:?} (log id {gateway_log_id}, checkpoint log id {stored_log_id}): \
         the checkpoint offset {offset} is beyond the log's next offset {next_offset}"
    )]
    BeyondEnd {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id.
        stored_log_id: String,
        /// The gateway's log id.
        gateway_log_id: String,
        /// The checkpoint offset.
        offset: u64,
        /// The gateway's next offset.
        next_offset: u64,
    },
}

/// Checks that the gateway's log is the checkpoint's log.
pub fn check_log_id(
    cp: &Checkpoint,
    gateway_id: &str,
    gateway_log_id: u128,
) -> Result<(), ResumeMismatch> {
    if cp.log_id() == Some(gateway_log_id) {
        Ok(())
    } else {
        Err(ResumeMismatch::LogId {
            gateway_id: gateway_id.to_string(),
            stored: cp.log_id.clone(),
            gateway: log_id_hex(gateway_log_id),
            offset: cp.offset,
        })
    }
}

/// Checks the `prev_crc` of a fetch from `cp.offset` against the CRC of the last forwarded
/// record (skipped when the checkpoint does not know it).
pub fn check_prev_crc(
    cp: &Checkpoint,
    gateway_id: &str,
    gateway_log_id: u128,
    prev_crc: u32,
) -> Result<(), ResumeMismatch> {
    match cp.last_crc {
        Some(stored) if stored != prev_crc => Err(ResumeMismatch::Crc {
            gateway_id: gateway_id.to_string(),
            stored_log_id: cp.log_id.clone(),
            gateway_log_id: log_id_hex(gateway_log_id),
            offset: cp.offset,
            stored,
            gateway: prev_crc,
        }),
        _ => Ok(()),
    }
}

/// Syncs the file at `path` and asks the kernel to drop its cached pages
/// (`posix_fadvise(POSIX_FADV_DONTNEED)` on Linux; elsewhere only the sync), so that the
/// next open reads what is on disk. After a failed fsync, Linux may keep the pages that did
/// not reach the disk in its cache, marked clean: redb reopening the file would read them,
/// take a commit that is not on disk for durable, and build its next commits on it, which a
/// reboot then turns into a state file whose roots are all corrupt. A failed sync here is
/// logged and the pages are dropped all the same (they are clean after it).
pub fn drop_cached_pages(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    if let Err(e) = f.sync_data() {
        log::warn!("state file {}: sync before reopening: {e}", path.display());
    }
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `f` is an open file descriptor for the whole call; the advice only
        // affects the kernel's cache of that file.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Moves the rows of the earlier gaps table ([`GAPS_V1`]) into [`GAPS`] (module doc) and
/// deletes it; returns the rows moved.
fn migrate_gaps_v1(tx: &redb::WriteTransaction) -> Result<u64, StoreError> {
    let rows: Vec<(u128, u64, String)> = match tx.open_table(GAPS_V1) {
        Ok(t) => {
            let mut rows = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                let (log_id, from) = k.value();
                rows.push((log_id, from, v.value().to_string()));
            }
            rows
        }
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(redb::Error::from(e).into()),
    };
    // The consumers with a checkpoint on each gateway id.
    let mut consumers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in tx.open_table(CHECKPOINTS)?.iter()? {
        let (k, _) = item?;
        let (g, c) = k.value();
        consumers
            .entry(g.to_string())
            .or_default()
            .push(c.to_string());
    }
    let mut t = tx.open_table(GAPS)?;
    for (log_id, from, json) in &rows {
        let gap: Gap = serde_json::from_str(json)?;
        let consumer = match consumers.get(&gap.gateway_id).map(Vec::as_slice) {
            Some([only]) => only.as_str(),
            _ => "",
        };
        t.insert((*log_id, consumer, *from), json.as_str())?;
    }
    drop(t);
    tx.delete_table(GAPS_V1)?;
    Ok(rows.len() as u64)
}

/// The state file. Cheap to clone (one shared redb handle).
#[derive(Clone)]
pub struct Store {
    db: Arc<Db>,
}

/// The redb handle: read-write for a drain, read-only for `status` (which may look at the
/// state file of a running drain).
enum Db {
    ReadWrite(Database),
    ReadOnly(ReadOnlyDatabase),
    /// Released by [`Store::reopen`], which failed to open the file again.
    Closed,
}

impl Db {
    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        match self {
            Db::ReadWrite(db) => Ok(db.begin_read()?),
            Db::ReadOnly(db) => Ok(db.begin_read()?),
            Db::Closed => Err(StoreError::Closed),
        }
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        match self {
            Db::ReadWrite(db) => Ok(db.begin_write()?),
            Db::ReadOnly(_) => Err(StoreError::ReadOnly),
            Db::Closed => Err(StoreError::Closed),
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens or creates the state file and its tables. An existing file is first synced
    /// and its cached pages dropped (see [`drop_cached_pages`]), so that redb reads what is
    /// on disk.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if path.exists()
            && let Err(e) = drop_cached_pages(path)
        {
            log::warn!(
                "state file {}: dropping its cached pages failed: {e}",
                path.display()
            );
        }
        let db = match Database::create(path) {
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                use std::os::unix::fs::MetadataExt as _;
                let holder = std::fs::metadata(path)
                    .ok()
                    .and_then(|m| crate::sink::file::lock::holder_pid(m.ino()));
                return Err(StoreError::Locked {
                    path: path.to_path_buf(),
                    holder,
                });
            }
            other => other?,
        };
        let tx = db.begin_write()?;
        tx.open_table(CHECKPOINTS)?;
        tx.open_table(GAPS)?;
        tx.open_table(RESETS)?;
        tx.open_table(SINK_RESUMES)?;
        let moved = migrate_gaps_v1(&tx)?;
        tx.commit()?;
        if moved > 0 {
            log::info!(
                "state file {}: {moved} gap rows of an earlier version now keyed by consumer",
                path.display()
            );
        }
        Ok(Store {
            db: Arc::new(Db::ReadWrite(db)),
        })
    }

    /// Releases the redb handle and opens `path` again (read-write), as after a failed
    /// commit: redb refuses further transactions on a handle whose write failed, and opening
    /// the file again recovers it to its last durable commit. The old handle must not be
    /// shared any more (no clone of this `Store` alive), or the open fails because the file
    /// is still held; on failure this `Store` stays closed ([`StoreError::Closed`]) and
    /// `reopen` may be called again.
    pub fn reopen(&mut self, path: &Path) -> Result<(), StoreError> {
        self.db = Arc::new(Db::Closed);
        *self = Store::open(path)?;
        Ok(())
    }

    /// [`Store::reopen`] on the blocking pool.
    pub async fn reopen_async(&mut self, path: &Path) -> Result<(), StoreError> {
        self.db = Arc::new(Db::Closed);
        *self = Store::open_async(path).await?;
        Ok(())
    }

    /// A handle that refuses every transaction ([`StoreError::Closed`]): what stands in for
    /// a shared handle while it is being reopened.
    pub fn closed() -> Store {
        Store {
            db: Arc::new(Db::Closed),
        }
    }

    /// Opens the state file read-only if it exists (for `status`, which must not create
    /// one and may run beside a drain); `None` when there is no file at `path`. Tables a
    /// drain has not created yet read as empty.
    pub fn open_existing(path: &Path) -> Result<Option<Store>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        let db = ReadOnlyDatabase::open(path)?;
        Ok(Some(Store {
            db: Arc::new(Db::ReadOnly(db)),
        }))
    }

    /// The checkpoint of `consumer` on gateway `gateway_id`.
    pub fn load(&self, gateway_id: &str, consumer: &str) -> Result<Option<Checkpoint>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(CHECKPOINTS)?;
        match t.get((gateway_id, consumer))? {
            Some(v) => Ok(Some(serde_json::from_str(v.value())?)),
            None => Ok(None),
        }
    }

    /// Saves a checkpoint durably.
    pub fn save(
        &self,
        gateway_id: &str,
        consumer: &str,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(cp)?;
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(CHECKPOINTS)?;
            t.insert((gateway_id, consumer), json.as_str())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records a gap and saves the checkpoint that moves past it, in one transaction.
    pub fn save_with_gap(
        &self,
        consumer: &str,
        log_id: u128,
        gap: &Gap,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let cp_json = serde_json::to_string(cp)?;
        let gap_json = serde_json::to_string(gap)?;
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(GAPS)?;
            t.insert((log_id, consumer, gap.from), gap_json.as_str())?;
            let mut t = tx.open_table(CHECKPOINTS)?;
            t.insert((gap.gateway_id.as_str(), consumer), cp_json.as_str())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records a reset and saves the new checkpoint, in one transaction.
    pub fn save_with_reset(
        &self,
        gateway_id: &str,
        consumer: &str,
        reset: &Reset,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let cp_json = serde_json::to_string(cp)?;
        let reset_json = serde_json::to_string(reset)?;
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(RESETS)?;
            t.insert((gateway_id, consumer, cp.resets), reset_json.as_str())?;
            let mut t = tx.open_table(CHECKPOINTS)?;
            t.insert((gateway_id, consumer), cp_json.as_str())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records a resume taken from the sink and saves the checkpoint it moved to, in one
    /// transaction.
    pub fn save_with_sink_resume(&self, r: &SinkResume, cp: &Checkpoint) -> Result<(), StoreError> {
        let cp_json = serde_json::to_string(cp)?;
        let r_json = serde_json::to_string(r)?;
        let log_id = cp.log_id().unwrap_or(0);
        let tx = self.db.begin_write()?;
        {
            let mut t = tx.open_table(SINK_RESUMES)?;
            t.insert((log_id, r.from), r_json.as_str())?;
            let mut t = tx.open_table(CHECKPOINTS)?;
            t.insert(
                (r.gateway_id.as_str(), r.consumer.as_str()),
                cp_json.as_str(),
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The resumes taken from the sink for a log id, oldest first.
    pub fn sink_resumes(&self, log_id: u128) -> Result<Vec<SinkResume>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(SINK_RESUMES)?;
        let mut out = Vec::new();
        for item in t.range((log_id, 0)..=(log_id, u64::MAX))? {
            let (_, v) = item?;
            out.push(serde_json::from_str(v.value())?);
        }
        Ok(out)
    }

    /// Every checkpoint: (gateway id, consumer, checkpoint).
    pub fn list(&self) -> Result<Vec<(String, String, Checkpoint)>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(CHECKPOINTS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let (g, c) = k.value();
            out.push((
                g.to_string(),
                c.to_string(),
                serde_json::from_str(v.value())?,
            ));
        }
        Ok(out)
    }

    /// The gaps `consumer` recorded for a log id, oldest first (`""`: rows of an earlier
    /// version that could not be given to one consumer, see the module doc).
    pub fn gaps(&self, log_id: u128, consumer: &str) -> Result<Vec<Gap>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = match tx.open_table(GAPS) {
            Ok(t) => t,
            // A state file of an earlier version opened read-only (not migrated yet).
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(redb::Error::from(e).into()),
        };
        let mut out = Vec::new();
        for item in t.range((log_id, consumer, 0)..=(log_id, consumer, u64::MAX))? {
            let (_, v) = item?;
            out.push(serde_json::from_str(v.value())?);
        }
        Ok(out)
    }

    /// The resets recorded for a gateway's consumer, oldest first.
    pub fn resets(&self, gateway_id: &str, consumer: &str) -> Result<Vec<Reset>, StoreError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(RESETS)?;
        let mut out = Vec::new();
        for item in t.range((gateway_id, consumer, 0)..=(gateway_id, consumer, u64::MAX))? {
            let (_, v) = item?;
            out.push(serde_json::from_str(v.value())?);
        }
        Ok(out)
    }

    /// [`Store::open`] on the blocking pool.
    pub async fn open_async(path: &Path) -> Result<Store, StoreError> {
        let path = path.to_path_buf();
        smol::unblock(move || Store::open(&path)).await
    }

    /// [`Store::load`] on the blocking pool.
    pub async fn load_async(
        &self,
        gateway_id: &str,
        consumer: &str,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let (s, g, c) = (self.clone(), gateway_id.to_string(), consumer.to_string());
        smol::unblock(move || s.load(&g, &c)).await
    }

    /// [`Store::save`] on the blocking pool.
    pub async fn save_async(
        &self,
        gateway_id: &str,
        consumer: &str,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (s, g, c, cp) = (
            self.clone(),
            gateway_id.to_string(),
            consumer.to_string(),
            cp.clone(),
        );
        smol::unblock(move || s.save(&g, &c, &cp)).await
    }

    /// [`Store::save_with_gap`] on the blocking pool.
    pub async fn save_with_gap_async(
        &self,
        consumer: &str,
        log_id: u128,
        gap: &Gap,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (s, c, gap, cp) = (self.clone(), consumer.to_string(), gap.clone(), cp.clone());
        smol::unblock(move || s.save_with_gap(&c, log_id, &gap, &cp)).await
    }

    /// [`Store::save_with_sink_resume`] on the blocking pool.
    pub async fn save_with_sink_resume_async(
        &self,
        r: &SinkResume,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (s, r, cp) = (self.clone(), r.clone(), cp.clone());
        smol::unblock(move || s.save_with_sink_resume(&r, &cp)).await
    }

    /// [`Store::save_with_reset`] on the blocking pool.
    pub async fn save_with_reset_async(
        &self,
        gateway_id: &str,
        consumer: &str,
        reset: &Reset,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (s, g, c, r, cp) = (
            self.clone(),
            gateway_id.to_string(),
            consumer.to_string(),
            reset.clone(),
            cp.clone(),
        );
        smol::unblock(move || s.save_with_reset(&g, &c, &r, &cp)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("state.redb")).unwrap();
        (dir, s)
    }

    #[test]
    fn save_load_survives_reopen() {
        let (dir, s) = store();
        assert_eq!(s.load("gw", "bridge").unwrap(), None);
        let mut cp = Checkpoint::new(0xABCD, 10);
        cp.last_crc = Some(0xDEAD_BEEF);
        cp.records = 10;
        s.save("gw", "bridge", &cp).unwrap();
        drop(s);
        let s = Store::open(&dir.path().join("state.redb")).unwrap();
        let got = s.load("gw", "bridge").unwrap().unwrap();
        assert_eq!(got, cp);
        assert_eq!(got.log_id(), Some(0xABCD));
        assert_eq!(got.log_id, "0000000000000000000000000000abcd");
        assert_eq!(s.load("gw", "other").unwrap(), None);
        assert_eq!(s.load("gw2", "bridge").unwrap(), None);
        assert_eq!(s.list().unwrap().len(), 1);
    }

    #[test]
    fn gaps_and_resets_are_recorded_with_the_checkpoint() {
        let (_dir, s) = store();
        let mut cp = Checkpoint::new(7, 0);
        let gap = Gap {
            gateway_id: "gw".into(),
            from: 0,
            to: 40,
            reason: "dropped-oldest".into(),
            at_unix_ms: 1,
        };
        cp.offset = 40;
        cp.gaps = 1;
        cp.lost = 40;
        s.save_with_gap("bridge", 7, &gap, &cp).unwrap();
        assert_eq!(s.gaps(7, "bridge").unwrap(), vec![gap]);
        assert!(s.gaps(8, "bridge").unwrap().is_empty());
        assert!(s.gaps(7, "other").unwrap().is_empty());
        assert_eq!(s.load("gw", "bridge").unwrap().unwrap().offset, 40);

        let mut new = Checkpoint::new(9, 0);
        new.resets = cp.resets + 1;
        let reset = Reset {
            old_log_id: cp.log_id.clone(),
            old_offset: 40,
            new_log_id: new.log_id.clone(),
            new_offset: 0,
            reason: "log id".into(),
            at_unix_ms: 2,
        };
        s.save_with_reset("gw", "bridge", &reset, &new).unwrap();
        assert_eq!(s.resets("gw", "bridge").unwrap(), vec![reset]);
        assert_eq!(s.load("gw", "bridge").unwrap().unwrap().log_id(), Some(9));
    }

    fn gap(gateway_id: &str, from: u64, to: u64) -> Gap {
        Gap {
            gateway_id: gateway_id.into(),
            from,
            to,
            reason: "dropped-oldest".into(),
            at_unix_ms: 1,
        }
    }

    /// Two consumers of one gateway in one state file that meet a gap at the same offset
    /// each keep their own row (they were keyed without the consumer: the second
    /// overwrote the first).
    #[test]
    fn gaps_of_two_consumers_at_the_same_offset_are_both_kept() {
        let (_dir, s) = store();
        let (a, b) = (gap("gw", 10, 20), gap("gw", 10, 35));
        s.save_with_gap("archive", 7, &a, &Checkpoint::new(7, 20))
            .unwrap();
        s.save_with_gap("bridge", 7, &b, &Checkpoint::new(7, 35))
            .unwrap();
        assert_eq!(s.gaps(7, "archive").unwrap(), vec![a]);
        assert_eq!(s.gaps(7, "bridge").unwrap(), vec![b]);
    }

    /// A state file of the previous release (gaps keyed by log id and offset) opens: its
    /// gap rows move under the consumer that file drained the gateway with, or under ""
    /// when several consumers drained it; nothing is lost, and opening again changes
    /// nothing.
    #[test]
    fn a_previous_release_state_file_opens_with_its_gaps_keyed_by_consumer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.redb");
        let one = gap("gw-1", 5, 9);
        let shared = gap("gw-2", 3, 4);
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut cps = tx.open_table(CHECKPOINTS).unwrap();
                let cp = serde_json::to_string(&Checkpoint::new(1, 9)).unwrap();
                cps.insert(("gw-1", "bridge"), cp.as_str()).unwrap();
                let cp = serde_json::to_string(&Checkpoint::new(2, 4)).unwrap();
                cps.insert(("gw-2", "bridge"), cp.as_str()).unwrap();
                cps.insert(("gw-2", "audit"), cp.as_str()).unwrap();
                let mut gaps = tx.open_table(GAPS_V1).unwrap();
                let j = serde_json::to_string(&one).unwrap();
                gaps.insert((1u128, 5u64), j.as_str()).unwrap();
                let j = serde_json::to_string(&shared).unwrap();
                gaps.insert((2u128, 3u64), j.as_str()).unwrap();
            }
            tx.commit().unwrap();
        }
        for _ in 0..2 {
            let s = Store::open(&path).unwrap();
            assert_eq!(s.gaps(1, "bridge").unwrap(), vec![one.clone()]);
            assert_eq!(s.gaps(2, "").unwrap(), vec![shared.clone()]);
            assert!(s.gaps(2, "bridge").unwrap().is_empty());
            assert_eq!(s.load("gw-1", "bridge").unwrap().unwrap().offset, 9);
        }
    }

    #[test]
    fn sink_resumes_are_recorded_with_the_checkpoint() {
        let (_dir, s) = store();
        let mut cp = Checkpoint::new(0x77, 10);
        s.save("gw", "bridge", &cp).unwrap();
        let r = SinkResume {
            gateway_id: "gw".into(),
            consumer: "bridge".into(),
            log_id: cp.log_id.clone(),
            from: 10,
            to: 14,
            highest_in_sink: 13,
            verified: 4,
            sink: "kafka topic \"t\" (1 partitions)".into(),
            at_unix_ms: 5,
        };
        cp.offset = 14;
        cp.last_crc = Some(9);
        s.save_with_sink_resume(&r, &cp).unwrap();
        assert_eq!(s.sink_resumes(0x77).unwrap(), vec![r]);
        assert!(s.sink_resumes(0x78).unwrap().is_empty());
        assert_eq!(s.load("gw", "bridge").unwrap().unwrap(), cp);
    }

    #[test]
    fn resume_check_log_id() {
        let cp = Checkpoint::new(1, 5);
        assert!(check_log_id(&cp, "gw", 1).is_ok());
        let e = check_log_id(&cp, "gw", 2).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("00000000000000000000000000000001"), "{msg}");
        assert!(msg.contains("00000000000000000000000000000002"), "{msg}");
        assert!(msg.contains("reflashed or replaced"), "{msg}");
        // A checkpoint with a mangled log id never matches.
        let mut bad = cp.clone();
        bad.log_id = "zz".into();
        assert!(check_log_id(&bad, "gw", 1).is_err());
    }

    #[test]
    fn resume_check_crc() {
        let mut cp = Checkpoint::new(1, 5);
        // Unknown CRC: nothing to compare.
        assert!(check_prev_crc(&cp, "gw", 1, 1234).is_ok());
        cp.last_crc = Some(1234);
        assert!(check_prev_crc(&cp, "gw", 1, 1234).is_ok());
        let e = check_prev_crc(&cp, "gw", 1, 4321).unwrap_err();
        assert!(matches!(
            e,
            ResumeMismatch::Crc {
                offset: 5,
                stored: 1234,
                gateway: 4321,
                ..
            }
        ));
        assert!(e.to_string().contains("00000000000000000000000000000001"));
    }

    /// A checkpoint saved by an earlier version (no `sink_files`) still loads, and one
    /// with it round-trips.
    #[test]
    fn checkpoints_without_sink_files_still_load() {
        let (dir, s) = store();
        let path = dir.path().join("state.redb");
        let old = r#"{"log_id":"0000000000000000000000000000abcd","offset":10,"last_crc":7,"records":10,"bytes":40,"gaps":0,"lost":0,"resets":0,"updated_unix_ms":1}"#;
        {
            let Db::ReadWrite(db) = s.db.as_ref() else {
                panic!("read-write")
            };
            let tx = db.begin_write().unwrap();
            tx.open_table(CHECKPOINTS)
                .unwrap()
                .insert(("gw", "bridge"), old)
                .unwrap();
            tx.commit().unwrap();
        }
        drop(s);
        let s = Store::open(&path).unwrap();
        let mut cp = s.load("gw", "bridge").unwrap().unwrap();
        assert_eq!((cp.offset, cp.sink_files.clone()), (10, None));
        let mut files = BTreeMap::new();
        files.insert("t".to_string(), SyncedFile { first: 2, len: 300 });
        cp.sink_files = Some(SinkFiles {
            dir: "/var/spool/out".into(),
            layout: crate::sink::file::LAYOUT,
            log_id: cp.log_id.clone(),
            files,
        });
        s.save("gw", "bridge", &cp).unwrap();
        assert_eq!(s.load("gw", "bridge").unwrap().unwrap(), cp);
    }

    /// After a failed transaction the drain reopens the state file: the handle is
    /// released first (redb refuses a second open in one process), and the last durable
    /// checkpoint is there.
    #[test]
    fn reopen_releases_the_handle_and_keeps_the_checkpoint() {
        let (dir, mut s) = store();
        let path = dir.path().join("state.redb");
        let cp = Checkpoint::new(5, 99);
        s.save("gw", "bridge", &cp).unwrap();
        match Store::open(&path) {
            Err(StoreError::Locked { path: p, holder }) => {
                assert_eq!(p, path);
                assert_eq!(holder, Some(std::process::id()), "held by this handle");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened twice"),
        }
        s.reopen(&path).unwrap();
        assert_eq!(s.load("gw", "bridge").unwrap(), Some(cp));
        // A clone still alive keeps the file held: the reopen fails and the store is
        // closed until a later reopen succeeds.
        let clone = s.clone();
        let e = s.reopen(&path).unwrap_err();
        assert!(e.is_storage(), "{e}");
        assert!(matches!(s.load("gw", "bridge"), Err(StoreError::Closed)));
        drop(clone);
        s.reopen(&path).unwrap();
        assert_eq!(s.load("gw", "bridge").unwrap().unwrap().offset, 99);
    }

    #[test]
    fn async_wrappers_work() {
        let dir = tempfile::tempdir().unwrap();
        smol::block_on(async {
            let s = Store::open_async(&dir.path().join("s.redb")).await.unwrap();
            let cp = Checkpoint::new(3, 3);
            s.save_async("g", "c", &cp).await.unwrap();
            assert_eq!(s.load_async("g", "c").await.unwrap(), Some(cp));
        });
    }
}

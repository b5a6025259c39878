//! The state file ([`Store`]): its redb tables, the migration of earlier tables, and
//! reading back from disk after a failed sync ([`drop_cached_pages`]).

use super::*;

pub(super) const CHECKPOINTS: TableDefinition<(&str, &str), &str> =
    TableDefinition::new("checkpoints");
const GAPS: TableDefinition<(u128, &str, u64), &str> = TableDefinition::new("consumer_gaps");
/// The gaps table of earlier versions, without the consumer (migrated at open).
pub(super) const GAPS_V1: TableDefinition<(u128, u64), &str> = TableDefinition::new("gaps");
const RESETS: TableDefinition<(&str, &str, u64), &str> = TableDefinition::new("resets");
const SINK_RESUMES: TableDefinition<(u128, u64), &str> = TableDefinition::new("sink_resumes");

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
    pub(super) db: Arc<Db>,
}

/// The redb handle: read-write for a drain, read-only for `status` (which may look at the
/// state file of a running drain).
pub(super) enum Db {
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
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(locked(path)),
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
    ///
    /// # Errors
    /// [`StoreError::Locked`] while a drain has it open, [`StoreError::NeedsRepair`] after
    /// a drain was killed and before the next one opened it (a read-only open cannot
    /// repair it), else redb's error.
    pub fn open_existing(path: &Path) -> Result<Option<Store>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        let db = match ReadOnlyDatabase::open(path) {
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(locked(path)),
            Err(redb::DatabaseError::RepairAborted) => {
                return Err(StoreError::NeedsRepair(path.to_path_buf()));
            }
            other => other?,
        };
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
        self.save_beside(gateway_id, consumer, cp, |_| Ok(()))
    }

    /// Records a gap and saves the checkpoint that moves past it, in one transaction.
    pub fn save_with_gap(
        &self,
        consumer: &str,
        log_id: u128,
        gap: &Gap,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let gap_json = serde_json::to_string(gap)?;
        self.save_beside(&gap.gateway_id, consumer, cp, |tx| {
            let mut t = tx.open_table(GAPS)?;
            t.insert((log_id, consumer, gap.from), gap_json.as_str())?;
            Ok(())
        })
    }

    /// Records a reset and saves the new checkpoint, in one transaction.
    pub fn save_with_reset(
        &self,
        gateway_id: &str,
        consumer: &str,
        reset: &Reset,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let reset_json = serde_json::to_string(reset)?;
        self.save_beside(gateway_id, consumer, cp, |tx| {
            let mut t = tx.open_table(RESETS)?;
            t.insert((gateway_id, consumer, cp.resets), reset_json.as_str())?;
            Ok(())
        })
    }

    /// Records a resume taken from the sink and saves the checkpoint it moved to, in one
    /// transaction.
    pub fn save_with_sink_resume(&self, r: &SinkResume, cp: &Checkpoint) -> Result<(), StoreError> {
        let r_json = serde_json::to_string(r)?;
        let log_id = cp.log_id().unwrap_or(0);
        self.save_beside(&r.gateway_id, &r.consumer, cp, |tx| {
            let mut t = tx.open_table(SINK_RESUMES)?;
            t.insert((log_id, r.from), r_json.as_str())?;
            Ok(())
        })
    }

    /// Saves `cp` as the checkpoint of `consumer` on `gateway_id` and, in the same
    /// transaction, what `record` writes beside it (the event that moved the checkpoint).
    fn save_beside(
        &self,
        gateway_id: &str,
        consumer: &str,
        cp: &Checkpoint,
        record: impl FnOnce(&redb::WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let cp_json = serde_json::to_string(cp)?;
        let tx = self.db.begin_write()?;
        record(&tx)?;
        {
            let mut t = tx.open_table(CHECKPOINTS)?;
            t.insert((gateway_id, consumer), cp_json.as_str())?;
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

    /// Runs `f` on this store (a clone: the same database) on the blocking pool: how the
    /// `*_async` methods keep redb's synchronous calls off the executor.
    async fn unblocked<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> T {
        let s = self.clone();
        smol::unblock(move || f(&s)).await
    }

    /// [`Store::load`] on the blocking pool.
    pub async fn load_async(
        &self,
        gateway_id: &str,
        consumer: &str,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let (g, c) = (gateway_id.to_string(), consumer.to_string());
        self.unblocked(move |s| s.load(&g, &c)).await
    }

    /// [`Store::save`] on the blocking pool.
    pub async fn save_async(
        &self,
        gateway_id: &str,
        consumer: &str,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (g, c, cp) = (gateway_id.to_string(), consumer.to_string(), cp.clone());
        self.unblocked(move |s| s.save(&g, &c, &cp)).await
    }

    /// [`Store::save_with_gap`] on the blocking pool.
    pub async fn save_with_gap_async(
        &self,
        consumer: &str,
        log_id: u128,
        gap: &Gap,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (c, gap, cp) = (consumer.to_string(), gap.clone(), cp.clone());
        self.unblocked(move |s| s.save_with_gap(&c, log_id, &gap, &cp))
            .await
    }

    /// [`Store::save_with_sink_resume`] on the blocking pool.
    pub async fn save_with_sink_resume_async(
        &self,
        r: &SinkResume,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (r, cp) = (r.clone(), cp.clone());
        self.unblocked(move |s| s.save_with_sink_resume(&r, &cp))
            .await
    }

    /// [`Store::save_with_reset`] on the blocking pool.
    pub async fn save_with_reset_async(
        &self,
        gateway_id: &str,
        consumer: &str,
        reset: &Reset,
        cp: &Checkpoint,
    ) -> Result<(), StoreError> {
        let (g, c) = (gateway_id.to_string(), consumer.to_string());
        let (r, cp) = (reset.clone(), cp.clone());
        self.unblocked(move |s| s.save_with_reset(&g, &c, &r, &cp))
            .await
    }
}

/// [`StoreError::Locked`] for the state file at `path`, naming the process that holds its
/// lock when `/proc/locks` tells.
fn locked(path: &Path) -> StoreError {
    use std::os::unix::fs::MetadataExt as _;
    let holder = std::fs::metadata(path)
        .ok()
        .and_then(|m| crate::sink::file::lock::holder_pid(m.ino()));
    StoreError::Locked {
        path: path.to_path_buf(),
        holder,
    }
}

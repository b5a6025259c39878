//! The `file:DIR` sink: newline-delimited JSON, one directory per gateway and topic, files
//! named by their first offset and rotated by size, age or date.
//!
//! # Layout
//!
//! ```text
//! DIR/<gateway id>/<topic>/[YYYY-MM-DD/]<first offset>.jsonl
//! DIR/<gateway id>/<topic>/[YYYY-MM-DD/]<first offset>.jsonl.open
//! ```
//!
//! - `<gateway id>` and `<topic>` are percent-encoded ([`topic_stem`]: every byte but ASCII
//!   letters, digits, `-` and `_` becomes `%XX`, so `buoy/sst` is `buoy%2Fsst` and no topic
//!   is ever used as a path; the empty string is `%`). An encoded name longer than
//!   [`MAX_STEM`] bytes is cut there and followed by `~` and the CRC-32 of the name in 8 hex
//!   digits. The topic is in every line, so readers never need to decode names.
//! - `<first offset>` is the log offset of the file's first record, 20 digits with leading
//!   zeros (so names sort in offset order; a file that begins with a gap line is named by
//!   the gap's first offset). Offsets only grow within a log, so a name is never used twice
//!   for one gateway's log: moving closed files away does not make the sink reuse their
//!   names, unlike the earlier `<topic>.<n>.jsonl` counters, which restarted at
//!   `00000000`. A gateway whose log starts over (reflashed, `--accept-new-log`) counts
//!   from its new first offset again: give it a new directory, or the sink refuses to write
//!   a file whose closed name exists already (and retries) rather than replace it.
//! - A topic has at most one file being written, named `….jsonl.open`. When it is rotated
//!   it is synced and set aside as full, and the next line begins a new file; a full file
//!   is renamed to `….jsonl` (closed) once the drain has saved the checkpoint that covers
//!   its last record ([`FileSink::checkpointed`]), which is the drain's next checkpoint
//!   (see `--checkpoint-interval`). So a closed file never holds a record the drain would send again after a
//!   crash. A closed file is never written, cut or renamed again: a downstream job takes
//!   only `*.jsonl` files (`find DIR -name '*.jsonl'`), and may move or delete them as soon
//!   as they appear. A crash between the checkpoint and the rename leaves a full file
//!   open-named beside the newest one: it is closed at the next checkpoint.
//! - Rotation ([`Rotation`]): before a line that would take the open file past
//!   `--rotate-bytes` (a file always takes its first line, however long); before the first
//!   line written when the file has been open `--rotate-interval` or longer, and, when the
//!   drain is idle, at the end of that interval ([`FileSink::close_expired`]); with
//!   `--partition-by-date`, before a record whose UTC date is later than the file's. "Open
//!   for" counts from the file's creation (its birth time, as the file system reports it;
//!   the time the sink found it where the file system has none).
//! - `--partition-by-date` puts a topic's files in `YYYY-MM-DD/` directories below the
//!   topic's: the UTC date of the timestamp of the file's first record (the record's own
//!   timestamp, not the wall clock, so a backlog drained days later lands under the days it
//!   was recorded; a file that begins with a gap line takes the wall clock's date). A record
//!   stamped earlier than its file's date (clocks set back) stays in the current file.
//! - On a clean stop the `.open` file stays open-named and the next drain continues it. The
//!   sink cannot rename anything when it is killed, so a restart must continue open files
//!   anyway; closing on a clean stop too would leave a small file behind each restart and
//!   hand downstream jobs files whose size and span depend on when the bridge was
//!   restarted. `--rotate-interval` bounds how long a record can sit in an open file.
//!
//! Each line is one record with exactly the keys `gateway_id`, `log_id`, `offset`, `topic`,
//! `timestamp`, `timestamp_us`, `payload`, `payload_encoding` (see [`JsonRecord`](crate::sink::JsonRecord)).
//!
//! # Durability
//!
//! [`FileSink::write`] writes a batch without an fsync (holding its lines back in memory
//! until [`WRITE_BEHIND_BYTES`] of them make one trip to the blocking pool, or the next
//! sync or gap line takes them); [`FileSink::sync`] writes what is held back and fsyncs
//! (`fdatasync`) every file written since the last sync, and only then does the sink count
//! those bytes as synced ([`FileSink::synced_files`]). Meanwhile the writer starts the
//! write-back of every MiB appended to a file (`sync_file_range`, without waiting for
//! it), so that the fsync has little left to write. The drain syncs once per group
//! checkpoint, several batches at a time; [`FileSink::deliver`] does both. A rotation fsyncs the file before the next file is
//! created; closing a file renames it in one step that fails rather than replace an
//! existing file (`renameat2` with `RENAME_NOREPLACE`, so a crash leaves one of the two
//! names, never both: a downstream job that moved the closed name away never sees the file
//! closed twice) and fsyncs its directory; creating a file or a directory fsyncs the
//! directory holding it. Where the file system lacks that rename, a hard link to the closed
//! name and the removal of the open name stand in for it: a crash between them leaves both
//! names of one file, and the open name is removed on open. A crash, or a failed write
//! the bridge stopped after (a full disk with `--once`), can leave a torn last line in an
//! open file: on open it is cut back to its last newline (an open file left empty is
//! removed).
//!
//! # Synced lengths
//!
//! Bytes that were written but whose fsync failed may still be read back: Linux reports a
//! failed writeback once and can keep the pages in its cache, marked clean, though they are
//! not on disk (in the same process, and after a restart without a reboot). The duplicate
//! check below must never take such lines for written records. So the sink knows, per topic,
//! its newest file and how many bytes of it are synced ([`FileSink::synced_files`]); the
//! drain saves that with every checkpoint ([`SinkFiles`]), in the same redb transaction.
//!
//! - After a failed write or fsync the sink drops its handles, and before it writes
//!   anything again it cuts every open file back to the state after the last successful
//!   sync (an open file created since, removed), fsyncs each file it cut, and
//!   reopens. The drain resends the batches from its checkpoint, which is exactly that state.
//! - At a start, the drain hands the checkpoint's state to [`FileSink::restore`], which cuts
//!   back the same way before the first write: whatever was written into open files after
//!   that checkpoint (synced or not) is gone and is sent again. The open file is found by
//!   its name: the checkpoint records each topic's newest file by its first offset.
//! - Closed files are never cut: a file is renamed only after its fsync succeeded and a
//!   checkpoint covers it, so all of it is durable and none of it is sent again, and a
//!   downstream job may have taken it already. A full file not closed yet is cut back like
//!   an open one when the checkpoint has not covered it. (A file closed after the
//!   checkpoint, as an earlier version could leave, is never cut either: its records are
//!   skipped by the duplicate check when they are resent.)
//! - Only lines of the log being drained are cut (or lines that are not records, such as a
//!   torn line): if a line of another log follows a synced length, another drain writes
//!   into the same directory and that topic is left as it is. A checkpoint saved by an
//!   earlier version (no layout, or the earlier layout) is not applied: only torn last
//!   lines are cut then, as on open.
//!
//! # Exactly once
//!
//! The drain resends, after a restart, everything after its last checkpoint, and some of
//! it may already be in the files (in a file closed after the checkpoint; or written and
//! fsynced, but the bridge died before redb saved the checkpoint, and the checkpoint had no
//! synced lengths to cut back to: a state file saved by an earlier version, a new state
//! file, another directory). The sink therefore remembers, per topic and log id, the
//! highest offset written; on open it reads it from the last complete line of the topic's
//! newest non-empty file. A record at or below that offset for the same topic and log id is
//! acknowledged without being written again, and counted as a skipped duplicate.
//!
//! Why per topic and not per log: offsets are global across topics, and one batch is
//! written topic by topic, so a crash can leave topic `a`'s lines of a batch on disk and
//! topic `b`'s not. A single high-water mark per log would then skip `b`'s records for
//! good. Within one topic the lines are appended in offset order and the drain delivers
//! batches one after another, so every record of that topic and log at or below the mark is
//! already in the files.
//!
//! The mark only ever skips records that are known to be written. A log id that is not the
//! last one in a topic's files has no mark after a reopen: its resent records are written
//! again (at-least-once, never lost; duplicates carry the same `log_id` and `offset`). A
//! last line that does not parse is ignored the same way.
//!
//! # Files of this module
//!
//! - `mod.rs`: [`FileSink`]: the async face, the synced state saved with checkpoints, and
//!   the cut back after a failure or at a restore.
//! - `writer`: the blocking writer (open files, full files, rotation, fsync, the duplicate
//!   check's marks) and settling what a crash left.
//! - `lock`: the lock on the sink directory ([`DirLock`]): one drain per directory.
//! - `names`: names: topic and gateway directories ([`topic_stem`]), `<first>.jsonl[.open]`
//!   and date directories.
//! - `recovery`: reading the files back: the layout, torn last lines, each topic's last
//!   record (the duplicate check's marks), and cutting open files back to synced lengths
//!   ([`CutBack`]).
//! - `skipped`: the log lines about skipped duplicates, a few per run of batches that
//!   skip some ([`SKIPPED_LOG_EVERY`]).

pub(crate) mod lock;
mod names;
mod recovery;
mod skipped;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{DeliverError, GapNotice, SinkError, Source};
use crate::checkpoint::{SinkFiles, SyncedFile};
use crate::client::{OwnedRecord, log_id_hex};

pub use lock::DirLock;
pub use names::{file_name, parse_name, topic_stem, utc_date};
pub use recovery::CutBack;
use recovery::cut_back;
pub use skipped::SKIPPED_LOG_EVERY;
use skipped::SkippedLog;
use writer::{Inner, Job};

/// Lines [`FileSink::write`] holds back in memory before it takes them to the blocking
/// pool, bytes (with one gateway frame's records per batch, about 8 batches of 100-byte
/// records): one trip, and one write per topic, for several batches.
pub const WRITE_BEHIND_BYTES: usize = 1 << 20;
/// Default size at which a topic's file is rotated, bytes (64 MiB).
pub const DEFAULT_ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// Longest encoded topic or gateway id used as a directory name, bytes.
pub const MAX_STEM: usize = 200;
/// A closed file's name suffix.
pub const SUFFIX: &str = ".jsonl";
/// Added to [`SUFFIX`] while a file is written.
pub const OPEN_SUFFIX: &str = ".open";
/// The layout [`SinkFiles::layout`] records: 2 for `<topic>/<first offset>.jsonl[.open]`
/// (an absent value, 0, is the earlier `<topic>.<n>.jsonl`).
pub const LAYOUT: u32 = 2;
/// Longest line parsed when checking whose lines follow a synced length, bytes: far more
/// than any record's line (a record fits in one wire frame); a longer line is taken for
/// garbage, not a record of another log, and is never held in memory whole.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// When a topic's open file is closed and the next one begun (see the module doc,
/// "Layout").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Largest file, bytes (`--rotate-bytes`); at least 1.
    pub bytes: u64,
    /// Longest a file stays open (`--rotate-interval`); `None`: no limit.
    pub interval: Option<Duration>,
    /// Files under `YYYY-MM-DD/`, the UTC date of their first record
    /// (`--partition-by-date`).
    pub by_date: bool,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation::bytes(DEFAULT_ROTATE_BYTES)
    }
}

impl Rotation {
    /// Rotation by size alone, at `bytes`.
    pub fn bytes(bytes: u64) -> Self {
        Rotation {
            bytes: bytes.max(1),
            interval: None,
            by_date: false,
        }
    }
}

/// The file sink. Blocking file work runs on `smol::unblock`'s thread pool.
pub struct FileSink {
    dir: PathBuf,
    /// `dir` made absolute and canonical, as recorded in [`SinkFiles::dir`].
    canonical: String,
    rot: Rotation,
    /// `None` while a write is on the blocking pool, or after a failure (reopened before
    /// the next write, after cutting the files back to `synced`).
    inner: Option<Inner>,
    /// What the files hold durably: as found at open (or restored from a checkpoint by
    /// [`FileSink::restore`]), then as synced by each successful [`FileSink::sync`].
    synced: BTreeMap<String, SyncedFile>,
    /// The log whose lines were written last ([`SinkFiles::log_id`]).
    log_id: Option<u128>,
    /// Records acknowledged without writing because they were already in the files.
    skipped_duplicates: u64,
    /// Their payload bytes.
    skipped_bytes: u64,
    /// The lines logged about them.
    skipped_log: SkippedLog,
    /// `open` created `dir`: dropping the sink removes it again if it is still empty (a
    /// drain that ended before writing, e.g. refused by the resume check, leaves no empty
    /// directory behind; a directory that existed before is left as it was).
    made_dir: bool,
}

impl Drop for FileSink {
    fn drop(&mut self) {
        if let Some(line) = self.skipped_log.end(self.skipped_duplicates) {
            log::info!("{line}");
        }
        // Its open files are closed first (`remove_dir` removes an empty directory only).
        self.inner = None;
        if self.made_dir {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

impl FileSink {
    /// Opens (creating) `dir`, the directory of one gateway's topics, and settles what a
    /// crash left (see the module doc, "Durability"). Blocking.
    ///
    /// # Errors
    /// The I/O error of a directory or file operation.
    pub fn open(dir: PathBuf, rot: Rotation) -> std::io::Result<FileSink> {
        let made_dir = !dir.is_dir();
        let inner = Inner::open(dir.clone(), rot)?;
        let canonical = std::fs::canonicalize(&dir)?.to_string_lossy().into_owned();
        Ok(FileSink {
            dir,
            canonical,
            rot,
            synced: inner.state.clone(),
            inner: Some(inner),
            log_id: None,
            skipped_duplicates: 0,
            skipped_bytes: 0,
            skipped_log: SkippedLog::default(),
            made_dir,
        })
    }

    /// [`FileSink::open`] on the blocking pool.
    ///
    /// # Errors
    /// As [`FileSink::open`].
    pub async fn open_async(dir: PathBuf, rot: Rotation) -> std::io::Result<FileSink> {
        smol::unblock(move || FileSink::open(dir, rot)).await
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records acknowledged so far without being written, because the files already held
    /// them (resent by the drain after a restart).
    pub fn skipped_duplicates(&self) -> u64 {
        self.skipped_duplicates
    }

    /// The payload bytes of [`FileSink::skipped_duplicates`]' records.
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped_bytes
    }

    /// What the files hold durably after the last successful [`FileSink::sync`] (or
    /// [`FileSink::restore`]), for the checkpoint saved with it; `None` before anything was
    /// written or restored (the log id is not known yet).
    pub fn synced_files(&self) -> Option<SinkFiles> {
        Some(SinkFiles {
            dir: self.canonical.clone(),
            layout: LAYOUT,
            log_id: log_id_hex(self.log_id?),
            files: self.synced.clone(),
        })
    }

    /// Cuts the files back to what a checkpoint recorded as synced (see the module doc,
    /// "Synced lengths"), closes the full files it covers (`covered`: the checkpoint's log
    /// id and offset; a file whose last line is of that log and below that offset), and
    /// reopens, so that the duplicate check sees only lines
    /// that were durable at that checkpoint; the drain then resends everything after it. A checkpoint
    /// taken for another directory, or whose log id does not parse, is not applied (returns
    /// `Ok(None)`). Errors: the I/O error of a read, cut or fsync (nothing is written until
    /// a later `restore` or [`FileSink::deliver`] succeeds in cutting back).
    pub async fn restore(
        &mut self,
        files: &SinkFiles,
        covered: Option<(u128, u64)>,
    ) -> std::io::Result<Option<CutBack>> {
        if files.layout != LAYOUT {
            log::info!(
                "the checkpoint's file sink state is for the earlier file layout: not applied \
                 (torn last lines are still cut)"
            );
            return Ok(None);
        }
        if files.dir != self.canonical {
            log::info!(
                "the checkpoint's file sink state is for {:?}, not {:?}: not applied",
                files.dir,
                self.canonical
            );
            return Ok(None);
        }
        let Some(log_id) = (files.log_id.len() == 32)
            .then(|| u128::from_str_radix(&files.log_id, 16).ok())
            .flatten()
        else {
            log::warn!(
                "the checkpoint's file sink state has a bad log id {:?}: not applied",
                files.log_id
            );
            return Ok(None);
        };
        self.inner = None;
        self.synced = files.files.clone();
        self.log_id = Some(log_id);
        let (dir, rotate, synced) = (self.dir.clone(), self.rot, self.synced.clone());
        let (inner, cut) = smol::unblock(move || {
            let cut = cut_back(&dir, &synced, log_id)?;
            let mut inner = Inner::open(dir, rotate)?;
            // Full files the checkpoint covers (a crash came between it and their rename).
            inner.close_full(covered)?;
            Ok::<_, std::io::Error>((inner, cut))
        })
        .await?;
        self.synced = inner.state.clone();
        self.inner = Some(inner);
        Ok(Some(cut))
    }

    /// Writes and fsyncs `records`, except those already in the files (see the module doc,
    /// "Exactly once"), which are acknowledged as they are; all or nothing as far as the
    /// caller knows: [`FileSink::write`], then [`FileSink::sync`].
    pub async fn deliver(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        self.write(src, records).await?;
        self.sync().await.map_err(|e| DeliverError {
            delivered: 0,
            error: SinkError::Io(e),
        })
    }

    /// Writes `records`, except those already in the files (see the module doc, "Exactly
    /// once"), without fsyncing the newest files: they are durable, and count in
    /// [`FileSink::synced_files`], only after the next successful [`FileSink::sync`] (a
    /// file set aside as full by a rotation is fsynced at once). Their lines may be held
    /// back in memory, up to [`WRITE_BEHIND_BYTES`] with those of earlier batches, and
    /// written with the next trip to the blocking pool ([`FileSink::flush`], the next
    /// sync, gap line or write past that size): no trip per batch. After a failure, of
    /// this call or of a later write or sync, the next write first cuts every file back to
    /// the lengths of the last successful sync (module doc, "Synced lengths"), and lines
    /// held back are dropped with the writer: everything written since that sync must be
    /// written again.
    ///
    /// # Errors
    /// The I/O error of a write, a file's creation or a rotation's fsync, with 0 records
    /// delivered (of this batch; the batches written since the last sync are lost too).
    pub async fn write(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        let span = records.first().zip(records.last());
        // With the writer at hand, the lines are made here and held back until enough of
        // them make a trip to the blocking pool; after a failure the writer is reopened
        // there first (marks read back from the files), so the records go with it.
        let (job, skipped_here) = match self.inner.as_mut() {
            Some(i) => {
                let (lines, skipped) = i.lines(src, records);
                let held = i.hold(lines);
                ((held >= WRITE_BEHIND_BYTES).then_some(Job::Flush), skipped)
            }
            None => (Some(Job::Records(records.to_vec())), (0, 0)),
        };
        let skipped = match job {
            Some(job) => self.write_job(src, job).await,
            None => {
                self.log_id = Some(src.log_id);
                Ok((0, 0))
            }
        }
        .map(|(n, bytes)| (n + skipped_here.0, bytes + skipped_here.1))
        .map_err(|e| DeliverError {
            delivered: 0,
            error: SinkError::Io(e),
        })?;
        self.skipped_duplicates += skipped.0;
        self.skipped_bytes += skipped.1;
        if let Some((first, last)) = span {
            let span = (first.offset, last.offset);
            let total = self.skipped_duplicates;
            if let Some(line) = self
                .skipped_log
                .batch(span, skipped.0, total, Instant::now())
            {
                log::info!("{line}");
            }
        }
        Ok(())
    }

    /// The payload bytes of `records` that the files hold already (see the module doc,
    /// "Exactly once"), which [`FileSink::write`] would acknowledge without writing them:
    /// the uplink cap does not count them. 0 after a failure, until the next write reopens
    /// the files and reads the marks again.
    pub fn held_bytes(&self, src: &Source, records: &[OwnedRecord]) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.held_bytes(src, records))
    }

    /// Fsyncs (`fdatasync`) every file written since the last sync, so that
    /// [`FileSink::synced_files`] covers every record written so far. Nothing to do (no
    /// trip to the blocking pool) when nothing was written since.
    ///
    /// # Errors
    /// The I/O error of an fsync; the records written since the last successful sync are
    /// then lost to the sink (see [`FileSink::write`]).
    pub async fn sync(&mut self) -> std::io::Result<()> {
        match &self.inner {
            Some(i) if !i.unsynced.is_empty() || i.holds_lines() => {}
            Some(_) => return Ok(()),
            None => {
                return Err(std::io::Error::other(
                    "the file sink failed since the last sync",
                ));
            }
        }
        self.on_writer(|i| {
            i.flush()?;
            i.sync().map(|()| 0)
        })
        .await?;
        if let Some(i) = &self.inner {
            self.synced = i.state.clone();
        }
        Ok(())
    }

    /// Writes the lines [`FileSink::write`] holds back, without an fsync. Nothing to do
    /// when it holds none.
    ///
    /// # Errors
    /// As [`FileSink::write`]'s.
    pub async fn flush(&mut self, src: &Source) -> std::io::Result<()> {
        if self.inner.as_ref().is_some_and(Inner::holds_lines) {
            self.write_job(src, Job::Flush).await?;
        }
        Ok(())
    }

    /// Writes the gap line of `gap` into every topic's newest file and fsyncs them (see
    /// [`crate::sink::Sink::deliver_gap`]); failures are handled as for
    /// [`FileSink::deliver`].
    ///
    /// # Errors
    /// The I/O error of the write or fsync.
    pub async fn deliver_gap(&mut self, src: &Source, gap: &GapNotice) -> Result<(), SinkError> {
        self.write_job(src, Job::Gap(gap.to_line(src), gap.from))
            .await
            .map(|_| ())
            .map_err(SinkError::Io)
    }

    /// Closes (renames to `….jsonl`) every open file that has been open for the rotation
    /// interval or longer, so that a topic that went quiet does not keep its last records
    /// from downstream jobs; the drain calls it when it has nothing to deliver. Returns how
    /// many files were closed (0 without `--rotate-interval`). Failures are handled as for
    /// [`FileSink::deliver`].
    ///
    /// # Errors
    /// The I/O error of the rename or a directory fsync.
    pub async fn close_expired(&mut self) -> std::io::Result<u64> {
        if self.rot.interval.is_none() {
            return Ok(0);
        }
        let n = self
            .on_writer(|i| {
                i.flush()?;
                i.close_expired()
            })
            .await?;
        if let Some(i) = &self.inner {
            self.synced = i.state.clone();
        }
        Ok(n)
    }

    /// Closes (renames to `….jsonl`) the files that were full and set aside by earlier
    /// deliveries; the drain calls it once the checkpoint covering every record delivered
    /// so far is saved, with that checkpoint's log id and offset (see the module doc,
    /// "Layout"). Open files found at open are closed only if their last line is of that
    /// log and below that offset. Returns how many files were closed.
    /// Failures are handled as for [`FileSink::deliver`]: the files stay open-named, are
    /// found again as full at the reopen, and closed at a later checkpoint.
    ///
    /// # Errors
    /// The I/O error of the rename or a directory fsync.
    pub async fn checkpointed(&mut self, log_id: u128, offset: u64) -> std::io::Result<u64> {
        // Called after every checkpoint: no trip to the blocking pool when nothing waits.
        match &self.inner {
            Some(i) if !i.full.is_empty() || !i.found.is_empty() => {}
            _ => return Ok(0),
        }
        self.on_writer(move |i| i.close_full(Some((log_id, offset))))
            .await
    }

    /// Before the resend after a failed write or fsync, with the saved checkpoint's log id
    /// and offset: reopens the writer if the failure closed it (cut back to the synced
    /// lengths, as the resend's first write would), then closes the
    /// open-named files whose every record is below that checkpoint: older files found at
    /// the open, and the newest files too (a full one that filled the disk, one due for
    /// `--rotate-interval`). So a full disk whose
    /// checkpointed files keep their open names does not stay full: a downstream job can
    /// take them away while the writes fail. Files set aside since are left for
    /// [`FileSink::checkpointed`].
    ///
    /// # Errors
    /// The I/O error of the rename or a directory fsync.
    pub async fn before_resend(&mut self, log_id: u128, offset: u64) -> std::io::Result<u64> {
        let reopen = self.reopen_args(log_id);
        let inner = self.inner.take();
        let (inner, res) = smol::unblock(move || {
            let mut inner = match reopen.or_open(inner) {
                Ok(i) => i,
                Err(e) => return (None, Err(e)),
            };
            match inner.close_covered((log_id, offset)) {
                Ok(n) => (Some(inner), Ok(n)),
                Err(e) => (None, Err(e)),
            }
        })
        .await;
        self.inner = inner;
        if let Some(i) = &self.inner {
            self.synced = i.state.clone();
        }
        res
    }

    /// What reopening the writer after a failure needs, for a write of log `log_id`.
    fn reopen_args(&self, log_id: u128) -> Reopen {
        // Lines after the synced lengths were written by the last attempt, for its log.
        let cut_log = self.log_id.unwrap_or(log_id);
        Reopen {
            dir: self.dir.clone(),
            rotate: self.rot,
            synced: self.synced.clone(),
            cut_log,
        }
    }

    /// Runs `job` on the writer on the blocking pool and returns what it counted; 0 without
    /// a writer (after a failure the next write cuts back and reopens first). A failed job
    /// drops the writer's handles, as a failed write does.
    async fn on_writer(
        &mut self,
        job: impl FnOnce(&mut Inner) -> std::io::Result<u64> + Send + 'static,
    ) -> std::io::Result<u64> {
        let Some(mut inner) = self.inner.take() else {
            return Ok(0);
        };
        let (inner, res) = smol::unblock(move || match job(&mut inner) {
            Ok(n) => (Some(inner), Ok(n)),
            // Drop the handles: the next write cuts back to the synced lengths and reopens.
            Err(e) => (None, Err(e)),
        })
        .await;
        self.inner = inner;
        res
    }

    /// The rotation settings.
    pub fn rotation(&self) -> Rotation {
        self.rot
    }

    /// Runs `job` on the blocking pool, reopening first (cut back to the synced lengths)
    /// after a failure; returns the duplicates skipped and their payload bytes.
    async fn write_job(&mut self, src: &Source, job: Job) -> std::io::Result<(u64, u64)> {
        let inner = self.inner.take();
        let reopen = self.reopen_args(src.log_id);
        self.log_id = Some(src.log_id);
        let src = src.clone();
        let (inner, res) = smol::unblock(move || {
            let mut inner = match reopen.or_open(inner) {
                Ok(i) => i,
                Err(e) => return (None, Err(e)),
            };
            let res = inner.flush().and_then(|()| match job {
                Job::Records(records) => inner.write(&src, &records),
                Job::Flush => Ok((0, 0)),
                Job::Gap(line, from) => inner.write_gap(&line, from).map(|()| (0, 0)),
            });
            match res {
                Ok(skipped) => (Some(inner), Ok(skipped)),
                // Drop the handles: the next attempt cuts back to the synced lengths and
                // reopens.
                Err(e) => (None, Err(e)),
            }
        })
        .await;
        self.inner = inner;
        let skipped = res?;
        if let Some(i) = &self.inner {
            self.synced = i.state.clone();
        }
        Ok(skipped)
    }
}

/// How the writer reopens after a failure: its files cut back to the synced lengths
/// (`synced`; lines after them are of log `cut_log`), then [`Inner::open`] on `dir`.
struct Reopen {
    dir: PathBuf,
    rotate: Rotation,
    synced: BTreeMap<String, SyncedFile>,
    cut_log: u128,
}

impl Reopen {
    /// `inner` if the writer is open, else the writer reopened.
    fn or_open(self, inner: Option<Inner>) -> std::io::Result<Inner> {
        match inner {
            Some(i) => Ok(i),
            None => cut_back(&self.dir, &self.synced, self.cut_log)
                .and_then(|_| Inner::open(self.dir, self.rotate)),
        }
    }
}

//! The `file:DIR` sink: newline-delimited JSON, one file set per topic, rotated by size.
//!
//! # Layout
//!
//! `DIR/<topic>.<n>.jsonl`, where `<topic>` is the topic percent-encoded (every byte but
//! ASCII letters, digits, `-` and `_` becomes `%XX`, so `buoy/sst` is `buoy%2Fsst` and no
//! topic is ever used as a path) and `<n>` counts the topic's files from `00000000`, eight
//! digits at least. An encoded topic longer than [`MAX_STEM`] bytes is cut there and
//! followed by `~` and the CRC-32 of the topic in 8 hex digits. The topic is in every line,
//! so readers never need to decode file names.
//!
//! Each line is one record with exactly the keys `gateway_id`, `log_id`, `offset`, `topic`,
//! `timestamp`, `timestamp_us`, `payload`, `payload_encoding` (see
//! [`JsonRecord`]).
//!
//! # Durability
//!
//! A batch is written and every file it touched is fsynced (`fdatasync`) before
//! [`FileSink::deliver`] returns; when a file is created (first file of a topic, or a
//! rotation) the directory is fsynced too. A crash can leave a torn last line: on open, the
//! newest file of every topic is cut back to its last newline.
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
//!   anything again it cuts every file back to the state after the last batch that was
//!   synced whole (later files of a topic, and topics created since, to 0 bytes), fsyncs
//!   each file it cut, and reopens. The drain resends the batch from its checkpoint, which
//!   is exactly that state.
//! - At a start, the drain hands the checkpoint's state to [`FileSink::restore`], which cuts
//!   back the same way before the first write: whatever was written after that checkpoint
//!   (synced or not) is gone and is sent again.
//! - Only lines of the log being drained are cut (or lines that are not records, such as a
//!   torn line): if a line of another log follows a synced length, another drain writes
//!   into the same directory and that topic is left as it is. A checkpoint saved by an
//!   earlier version has no synced lengths: only torn last lines are cut then, as on open.
//!
//! # Exactly once
//!
//! The drain resends, after a restart, everything after its last checkpoint, and some of
//! it may already be in the files (written and fsynced, but the bridge died before redb
//! saved the checkpoint, and the checkpoint had no synced lengths to cut back to: a state
//! file saved by an earlier version, a new state file, another directory). The sink therefore remembers, per file set (topic stem) and log
//! id, the highest offset written; on open it reads it from the last complete line of each
//! topic's newest file (from an older file if the newest is empty, as after a crash right
//! after a rotation). A record at or below that offset for the same stem and log id is
//! acknowledged without being written again, and counted as a skipped duplicate.
//!
//! Why per stem and not per log: offsets are global across topics, and one batch is written
//! topic by topic, so a crash can leave topic `a`'s lines of a batch on disk and topic
//! `b`'s not. A single high-water mark per log would then skip `b`'s records for good.
//! Within one stem the lines are appended in offset order and the drain delivers batches
//! one after another, so every record of that stem and log at or below the mark is
//! already in the files.
//!
//! The mark only ever skips records that are known to be written. A log id that is not the
//! last one in a stem's files (two gateways draining into one directory in turns) has no
//! mark after a reopen: its resent records are written again (at-least-once, never lost;
//! duplicates carry the same `log_id` and `offset`). A last line that does not parse is
//! ignored the same way.
//!
//! # Files of this module
//!
//! - `mod.rs`: [`FileSink`] and its writer (open, write, rotate, fsync, cut back after a
//!   failure).
//! - `lock`: the lock on the sink directory ([`DirLock`]): one drain per directory.
//! - `names`: file names: topic stems ([`topic_stem`]) and `<stem>.<n>.jsonl`.
//! - `recovery`: reading the files back: torn last lines, each stem's last record (the
//!   duplicate check's marks), and cutting files back to synced lengths ([`CutBack`]).

pub(crate) mod lock;
mod names;
mod recovery;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{DeliverError, GapNotice, JsonRecord, SinkError, Source};
use crate::checkpoint::{SinkFiles, SyncedFile};
use crate::client::{OwnedRecord, log_id_hex};

pub use lock::DirLock;
pub use names::topic_stem;
use names::{file_name, parse_name};
pub use recovery::CutBack;
use recovery::{cut_back, cut_torn_tail, last_key, sync_dir};

/// Default size at which a topic's file is rotated, bytes (64 MiB).
pub const DEFAULT_ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// Longest encoded topic used in a file name, bytes.
pub const MAX_STEM: usize = 200;
/// File name suffix.
pub const SUFFIX: &str = ".jsonl";
/// Longest line parsed when checking whose lines follow a synced length, bytes: far more
/// than any record's line (a record fits in one wire frame); a longer line is taken for
/// garbage, not a record of another log, and is never held in memory whole.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// What one trip to the blocking pool writes.
enum Job {
    /// Records.
    Records(Vec<OwnedRecord>),
    /// A gap line.
    Gap(String),
}

struct TopicFile {
    n: u64,
    file: File,
    len: u64,
}

/// State that lives on the blocking thread during a write.
struct Inner {
    dir: PathBuf,
    rotate_bytes: u64,
    /// Newest file number per stem found on disk at open.
    newest: HashMap<String, u64>,
    open: HashMap<String, TopicFile>,
    /// Highest offset written per (stem, log id): see the module doc, "Exactly once".
    marks: HashMap<(String, u128), u64>,
    /// Per stem, the newest file and its length: as found at open, then as synced by the
    /// last successful [`Inner::write`] (see the module doc, "Synced lengths").
    state: BTreeMap<String, SyncedFile>,
}

impl Inner {
    fn open(dir: PathBuf, rotate_bytes: u64) -> std::io::Result<Inner> {
        let created = !dir.exists();
        std::fs::create_dir_all(&dir)?;
        if created && let Some(parent) = dir.parent() {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            let _ = sync_dir(parent);
        }
        let mut newest: HashMap<String, u64> = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some((stem, n)) = parse_name(name) {
                let e = newest.entry(stem.to_string()).or_insert(n);
                *e = (*e).max(n);
            }
        }
        let mut marks = HashMap::new();
        let mut state = BTreeMap::new();
        for (stem, n) in &newest {
            let len = cut_torn_tail(&dir.join(file_name(stem, *n)))?;
            state.insert(stem.clone(), SyncedFile { n: *n, len });
            if let Some((log_id, offset)) = last_key(&dir, stem, *n)? {
                marks.insert((stem.clone(), log_id), offset);
            }
        }
        Ok(Inner {
            dir,
            rotate_bytes: rotate_bytes.max(1),
            newest,
            open: HashMap::new(),
            marks,
            state,
        })
    }

    fn create(&mut self, stem: &str, n: u64) -> std::io::Result<TopicFile> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(file_name(stem, n)))?;
        let len = file.metadata()?.len();
        sync_dir(&self.dir)?;
        self.newest.insert(stem.to_string(), n);
        Ok(TopicFile { n, file, len })
    }

    fn topic_file(&mut self, stem: &str) -> std::io::Result<&mut TopicFile> {
        if !self.open.contains_key(stem) {
            let tf = match self.newest.get(stem) {
                Some(&n) => {
                    let file = OpenOptions::new()
                        .append(true)
                        .open(self.dir.join(file_name(stem, n)))?;
                    let len = file.metadata()?.len();
                    TopicFile { n, file, len }
                }
                None => self.create(stem, 0)?,
            };
            self.open.insert(stem.to_string(), tf);
        }
        self.open
            .get_mut(stem)
            .ok_or_else(|| std::io::Error::other("topic file vanished"))
    }

    /// Appends `line` (a gap line) to the newest file of every topic (the empty topic's
    /// file when there is none yet) and fsyncs them.
    fn write_gap(&mut self, line: &str) -> std::io::Result<()> {
        let mut stems: Vec<String> = self.newest.keys().cloned().collect();
        if stems.is_empty() {
            stems.push(topic_stem(""));
        }
        stems.sort();
        for stem in &stems {
            let tf = self.topic_file(stem)?;
            tf.file.write_all(line.as_bytes())?;
            tf.len += line.len() as u64;
        }
        for stem in stems {
            if let Some(tf) = self.open.get(&stem) {
                tf.file.sync_data()?;
                self.state.insert(
                    stem,
                    SyncedFile {
                        n: tf.n,
                        len: tf.len,
                    },
                );
            }
        }
        Ok(())
    }

    /// Writes the records not yet in the files; returns how many were skipped as already
    /// written. On error the caller drops `self` (the marks may be ahead of the files).
    fn write(&mut self, src: &Source, records: &[OwnedRecord]) -> std::io::Result<u64> {
        // Lines grouped by file, in record order within each topic.
        let mut order: Vec<String> = Vec::new();
        let mut lines: HashMap<String, Vec<String>> = HashMap::new();
        let mut skipped = 0u64;
        for rec in records {
            let stem = topic_stem(&rec.topic);
            let key = (stem.clone(), src.log_id);
            if self.marks.get(&key).is_some_and(|&m| rec.offset <= m) {
                skipped += 1;
                continue;
            }
            self.marks.insert(key, rec.offset);
            let line = JsonRecord::new(src, rec).to_line();
            lines
                .entry(stem.clone())
                .or_insert_with(|| {
                    order.push(stem.clone());
                    Vec::new()
                })
                .push(line);
        }
        let mut touched: Vec<String> = Vec::new();
        for stem in order {
            let Some(ls) = lines.remove(&stem) else {
                continue;
            };
            let rotate = self.rotate_bytes;
            let mut buf: Vec<u8> = Vec::new();
            for line in ls {
                let tf = self.topic_file(&stem)?;
                let pending = tf.len + buf.len() as u64;
                if pending > 0 && pending + line.len() as u64 > rotate {
                    // Finish the current file, then start the next one.
                    tf.file.write_all(&buf)?;
                    tf.len += buf.len() as u64;
                    buf.clear();
                    tf.file.sync_data()?;
                    let next = tf.n + 1;
                    let new = self.create(&stem, next)?;
                    self.open.insert(stem.clone(), new);
                }
                buf.extend_from_slice(line.as_bytes());
            }
            let tf = self.topic_file(&stem)?;
            tf.file.write_all(&buf)?;
            tf.len += buf.len() as u64;
            touched.push(stem);
        }
        for stem in &touched {
            if let Some(tf) = self.open.get(stem) {
                tf.file.sync_data()?;
            }
        }
        // Every touched file is synced: record what is now durable.
        for stem in touched {
            if let Some(tf) = self.open.get(&stem) {
                self.state.insert(
                    stem,
                    SyncedFile {
                        n: tf.n,
                        len: tf.len,
                    },
                );
            }
        }
        Ok(skipped)
    }
}

/// The file sink. Blocking file work runs on `smol::unblock`'s thread pool.
pub struct FileSink {
    dir: PathBuf,
    /// `dir` made absolute and canonical, as recorded in [`SinkFiles::dir`].
    canonical: String,
    rotate_bytes: u64,
    /// `None` while a write is on the blocking pool, or after a failure (reopened before
    /// the next write, after cutting the files back to `synced`).
    inner: Option<Inner>,
    /// What the files hold durably: as found at open (or restored from a checkpoint by
    /// [`FileSink::restore`]), then as synced by each successful [`FileSink::deliver`].
    synced: BTreeMap<String, SyncedFile>,
    /// The log whose lines were written last ([`SinkFiles::log_id`]).
    log_id: Option<u128>,
    /// Records acknowledged without writing because they were already in the files.
    skipped_duplicates: u64,
}

impl FileSink {
    /// Opens (creating) `dir`, cutting back torn last lines. Blocking.
    pub fn open(dir: PathBuf, rotate_bytes: u64) -> std::io::Result<FileSink> {
        let inner = Inner::open(dir.clone(), rotate_bytes)?;
        let canonical = std::fs::canonicalize(&dir)?.to_string_lossy().into_owned();
        Ok(FileSink {
            dir,
            canonical,
            rotate_bytes,
            synced: inner.state.clone(),
            inner: Some(inner),
            log_id: None,
            skipped_duplicates: 0,
        })
    }

    /// [`FileSink::open`] on the blocking pool.
    pub async fn open_async(dir: PathBuf, rotate_bytes: u64) -> std::io::Result<FileSink> {
        smol::unblock(move || FileSink::open(dir, rotate_bytes)).await
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

    /// What the files hold durably after the last successful [`FileSink::deliver`] (or
    /// [`FileSink::restore`]), for the checkpoint saved with it; `None` before anything was
    /// written or restored (the log id is not known yet).
    pub fn synced_files(&self) -> Option<SinkFiles> {
        Some(SinkFiles {
            dir: self.canonical.clone(),
            log_id: log_id_hex(self.log_id?),
            files: self.synced.clone(),
        })
    }

    /// Cuts the files back to what a checkpoint recorded as synced (see the module doc,
    /// "Synced lengths") and reopens, so that the duplicate check sees only lines that were
    /// durable at that checkpoint; the drain then resends everything after it. A checkpoint
    /// taken for another directory, or whose log id does not parse, is not applied (returns
    /// `Ok(None)`). Errors: the I/O error of a read, cut or fsync (nothing is written until
    /// a later `restore` or [`FileSink::deliver`] succeeds in cutting back).
    pub async fn restore(&mut self, files: &SinkFiles) -> std::io::Result<Option<CutBack>> {
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
        let (dir, rotate, synced) = (self.dir.clone(), self.rotate_bytes, self.synced.clone());
        let (inner, cut) = smol::unblock(move || {
            let cut = cut_back(&dir, &synced, log_id)?;
            Ok::<_, std::io::Error>((Inner::open(dir, rotate)?, cut))
        })
        .await?;
        self.synced = inner.state.clone();
        self.inner = Some(inner);
        Ok(Some(cut))
    }

    /// Writes and fsyncs `records`, except those already in the files (see the module doc,
    /// "Exactly once"), which are acknowledged as they are; all or nothing as far as the
    /// caller knows. After a failure the next call first cuts every file back to its synced
    /// length (module doc, "Synced lengths").
    pub async fn deliver(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        let first = records.first().map_or(0, |r| r.offset);
        let skipped = self
            .write_job(src, Job::Records(records.to_vec()))
            .await
            .map_err(|e| DeliverError {
                delivered: 0,
                error: SinkError::Io(e),
            })?;
        if skipped > 0 {
            self.skipped_duplicates += skipped;
            log::info!(
                "file sink: skipped {skipped} duplicates in the batch from offset {first} \
                 (already written before a restart; {} skipped so far)",
                self.skipped_duplicates
            );
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
        self.write_job(src, Job::Gap(gap.to_line(src)))
            .await
            .map(|_| ())
            .map_err(SinkError::Io)
    }

    /// Runs `job` on the blocking pool, reopening first (cut back to the synced lengths)
    /// after a failure; returns the duplicates skipped.
    async fn write_job(&mut self, src: &Source, job: Job) -> std::io::Result<u64> {
        let inner = self.inner.take();
        let (dir, rotate) = (self.dir.clone(), self.rotate_bytes);
        let synced = self.synced.clone();
        // Lines after the synced lengths were written by the last attempt, for its log.
        let cut_log = self.log_id.unwrap_or(src.log_id);
        self.log_id = Some(src.log_id);
        let src = src.clone();
        let (inner, res) = smol::unblock(move || {
            let mut inner = match inner {
                Some(i) => i,
                None => {
                    let reopened =
                        cut_back(&dir, &synced, cut_log).and_then(|_| Inner::open(dir, rotate));
                    match reopened {
                        Ok(i) => i,
                        Err(e) => return (None, Err(e)),
                    }
                }
            };
            let res = match &job {
                Job::Records(records) => inner.write(&src, records),
                Job::Gap(line) => inner.write_gap(line).map(|()| 0),
            };
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

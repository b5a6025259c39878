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

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{DeliverError, JsonRecord, SinkError, Source};
use crate::checkpoint::{SinkFiles, SyncedFile};
use crate::client::{OwnedRecord, log_id_hex};

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

const TOPIC_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// The file name stem of a topic (see the module doc).
pub fn topic_stem(topic: &str) -> String {
    if topic.is_empty() {
        // Never produced by the encoding itself, so it cannot collide.
        return "%".to_string();
    }
    let enc = utf8_percent_encode(topic, TOPIC_SET).to_string();
    if enc.len() <= MAX_STEM {
        return enc;
    }
    let bytes = enc.as_bytes();
    let mut cut = MAX_STEM;
    // Do not cut inside a %XX triple.
    while cut >= 2 && (bytes[cut - 1] == b'%' || bytes[cut - 2] == b'%') {
        cut -= 1;
    }
    format!(
        "{}~{:08x}",
        &enc[..cut],
        spillway_core::log::format::crc32(topic.as_bytes())
    )
}

/// Splits `<stem>.<n>.jsonl` into its stem and number.
fn parse_name(name: &str) -> Option<(&str, u64)> {
    let base = name.strip_suffix(SUFFIX)?;
    let (stem, n) = base.rsplit_once('.')?;
    if stem.is_empty() || n.len() < 8 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem, n.parse().ok()?))
}

fn file_name(stem: &str, n: u64) -> String {
    format!("{stem}.{n:08}{SUFFIX}")
}

/// Cuts `path` back to just after its last newline (to 0 if it has none); returns the new
/// length in bytes.
fn cut_torn_tail(path: &Path) -> std::io::Result<u64> {
    let mut f = OpenOptions::new().read(true).write(true).open(path)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(pos) = buf[..n].iter().rposition(|&b| b == b'\n') {
            let keep = start + pos as u64 + 1;
            if keep != len {
                log::warn!(
                    "{}: cutting a torn last line ({} bytes) left by a crash",
                    path.display(),
                    len - keep
                );
                f.set_len(keep)?;
                f.sync_all()?;
            }
            return Ok(keep);
        }
        if start == 0 {
            log::warn!(
                "{}: no complete line, cutting {len} bytes left by a crash",
                path.display()
            );
            f.set_len(0)?;
            f.sync_all()?;
            return Ok(0);
        }
        end = start;
    }
}

/// The last line of `path` without its newline; `None` if the file is empty or does not
/// end with a newline (it always does after [`cut_torn_tail`]).
fn last_line(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let mut last = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))?;
    f.read_exact(&mut last)?;
    if last[0] != b'\n' {
        return Ok(None);
    }
    // Chunks of the line, collected from its end backwards.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut end = len - 1;
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..n])?;
        if let Some(pos) = buf[..n].iter().rposition(|&b| b == b'\n') {
            chunks.push(buf[pos + 1..n].to_vec());
            break;
        }
        chunks.push(buf[..n].to_vec());
        end = start;
    }
    Ok(Some(chunks.into_iter().rev().flatten().collect()))
}

/// The two keys of a line that identify its record.
#[derive(serde::Deserialize)]
struct LineKey {
    log_id: String,
    offset: u64,
}

/// `(log id, offset)` of one output line, if it is one.
fn line_key(line: &[u8]) -> Option<(u128, u64)> {
    let k: LineKey = serde_json::from_slice(line).ok()?;
    if k.log_id.len() != 32 {
        return None;
    }
    Some((u128::from_str_radix(&k.log_id, 16).ok()?, k.offset))
}

/// The `(log id, offset)` of the last line of the stem's files, looking from file `newest`
/// back to the first non-empty one.
fn last_key(dir: &Path, stem: &str, newest: u64) -> std::io::Result<Option<(u128, u64)>> {
    for n in (0..=newest).rev() {
        let path = dir.join(file_name(stem, n));
        let line = match last_line(&path) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if let Some(line) = line {
            let key = line_key(&line);
            if key.is_none() {
                log::warn!(
                    "{}: last line is not a record of this sink; records of its topic \
                     are not checked for duplicates",
                    path.display()
                );
            }
            return Ok(key);
        }
    }
    Ok(None)
}

/// What cutting the files back to their synced lengths did ([`FileSink::restore`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CutBack {
    /// Files cut.
    pub files: u64,
    /// Bytes cut off in all.
    pub bytes: u64,
}

/// The log id of the first complete line in `path` from byte `from` on that is a record of
/// another log than `log_id`; lines that are not records (a torn line, garbage left by a
/// failed write) are not anyone's.
fn foreign_line(path: &Path, from: u64, log_id: u128) -> std::io::Result<Option<u128>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let mut r = BufReader::new(f);
    // The line so far; `None` once it is longer than any record line (not a record).
    let mut line: Option<Vec<u8>> = Some(Vec::new());
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            return Ok(None);
        }
        let (part, end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if let Some(l) = line.as_mut() {
            if l.len() + part.len() > MAX_LINE {
                line = None;
            } else {
                l.extend_from_slice(part);
            }
        }
        let used = end.unwrap_or(chunk.len());
        r.consume(used);
        if end.is_some() {
            if let Some((id, _)) = line.as_deref().and_then(line_key)
                && id != log_id
            {
                return Ok(Some(id));
            }
            line = Some(Vec::new());
        }
    }
}

/// Cuts every topic's files in `dir` back to `synced` (see the module doc, "Synced
/// lengths"), and fsyncs each file it cut: the newest file of a listed stem to its synced
/// length, its later files and every file of an unlisted stem to 0 bytes. Bytes past a synced
/// length are cut only if no line among them is a record of another log than `log_id`
/// (another drain writing into the same directory): such a stem is left as it is, with a
/// warning, and its records rely on the duplicate check. A file shorter than its synced
/// length lost synced bytes outside the bridge: logged at `error`, left as it is.
fn cut_back(
    dir: &Path,
    synced: &BTreeMap<String, SyncedFile>,
    log_id: u128,
) -> std::io::Result<CutBack> {
    let mut stems: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((stem, n)) = parse_name(name) {
            stems.entry(stem.to_string()).or_default().push(n);
        }
    }
    let mut done = CutBack::default();
    for (stem, ns) in stems {
        let target = synced.get(&stem);
        // (path, bytes to keep, bytes now)
        let mut cuts: Vec<(PathBuf, u64, u64)> = Vec::new();
        for n in ns {
            let keep = match target {
                Some(t) if n < t.n => continue,
                Some(t) if n == t.n => t.len,
                _ => 0,
            };
            let path = dir.join(file_name(&stem, n));
            let len = std::fs::metadata(&path)?.len();
            if len > keep {
                cuts.push((path, keep, len));
            } else if len < keep {
                log::error!(
                    "{}: {len} bytes, but {keep} bytes of it were synced when the checkpoint \
                     was saved: the file system lost synced lines (not written again)",
                    path.display()
                );
            }
        }
        let mut foreign = None;
        for (path, keep, _) in &cuts {
            if let Some(id) = foreign_line(path, *keep, log_id)? {
                foreign = Some((path.clone(), id));
                break;
            }
        }
        if let Some((path, id)) = foreign {
            log::warn!(
                "{}: holds lines of log {} after the length synced for log {}: another drain \
                 writes here; not cutting topic file set {stem:?} (its records are checked \
                 for duplicates only)",
                path.display(),
                log_id_hex(id),
                log_id_hex(log_id)
            );
            continue;
        }
        for (path, keep, len) in cuts {
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(keep)?;
            f.sync_all()?;
            log::warn!(
                "{}: cut back from {len} to {keep} bytes, the length synced at the last \
                 checkpoint ({} bytes written after it or not synced; their records are \
                 sent again)",
                path.display(),
                len - keep
            );
            done.files += 1;
            done.bytes += len - keep;
        }
    }
    Ok(done)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
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
        let fail = |e: std::io::Error| DeliverError {
            delivered: 0,
            error: SinkError::Io(e),
        };
        let inner = self.inner.take();
        let (dir, rotate) = (self.dir.clone(), self.rotate_bytes);
        let synced = self.synced.clone();
        // Lines after the synced lengths were written by the last attempt, for its log.
        let cut_log = self.log_id.unwrap_or(src.log_id);
        self.log_id = Some(src.log_id);
        let src = src.clone();
        let records = records.to_vec();
        let first = records.first().map_or(0, |r| r.offset);
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
            match inner.write(&src, &records) {
                Ok(skipped) => (Some(inner), Ok(skipped)),
                // Drop the handles: the next attempt cuts back to the synced lengths and
                // reopens.
                Err(e) => (None, Err(e)),
            }
        })
        .await;
        self.inner = inner;
        let skipped = res.map_err(fail)?;
        if let Some(i) = &self.inner {
            self.synced = i.state.clone();
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: u64, topic: &str, payload: &[u8]) -> OwnedRecord {
        OwnedRecord {
            offset,
            record_crc: 0,
            topic: topic.into(),
            timestamp_us: 1_700_000_000_000_000 + offset,
            producer: None,
            payload: payload.to_vec(),
        }
    }

    fn src() -> Source {
        Source {
            gateway_id: "gw".into(),
            log_id: 42,
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn stems_are_percent_encoded_and_bounded() {
        assert_eq!(topic_stem("buoy/sst"), "buoy%2Fsst");
        assert_eq!(topic_stem(".."), "%2E%2E");
        assert_eq!(topic_stem("a b_c-d"), "a%20b_c-d");
        assert_eq!(topic_stem("température"), "temp%C3%A9rature");
        assert_eq!(topic_stem(""), "%");
        let long = "/".repeat(255);
        let s = topic_stem(&long);
        assert!(s.len() <= MAX_STEM + 9, "{}", s.len());
        assert!(!s.contains('/'));
        let long2 = format!("{}x", "/".repeat(254));
        assert_ne!(topic_stem(&long2), s);
        assert_eq!(
            parse_name("buoy%2Fsst.00000003.jsonl"),
            Some(("buoy%2Fsst", 3))
        );
        assert_eq!(parse_name("a.b.00000000.jsonl"), Some(("a.b", 0)));
        assert_eq!(parse_name("x.3.jsonl"), None);
        assert_eq!(parse_name("x.00000001.json"), None);
    }

    #[test]
    fn writes_exact_lines_per_topic() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            let recs = vec![
                rec(0, "buoy/sst", b"21.5"),
                rec(1, "cgm", b"\xff\xfe"),
                rec(2, "buoy/sst", b"21.6"),
            ];
            s.deliver(&src(), &recs).await.unwrap();
        });
        let sst = lines(&out.join("buoy%2Fsst.00000000.jsonl"));
        assert_eq!(sst.len(), 2);
        assert_eq!(sst[0]["offset"], 0);
        assert_eq!(sst[1]["offset"], 2);
        assert_eq!(sst[1]["payload"], "21.6");
        assert_eq!(sst[0]["log_id"], "0000000000000000000000000000002a");
        let keys: Vec<&String> = sst[0].as_object().unwrap().keys().collect();
        let mut want = vec![
            "gateway_id",
            "log_id",
            "offset",
            "topic",
            "timestamp",
            "timestamp_us",
            "payload",
            "payload_encoding",
        ];
        want.sort();
        let mut got: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        got.sort();
        assert_eq!(got, want);
        let cgm = lines(&out.join("cgm.00000000.jsonl"));
        assert_eq!(cgm[0]["payload_encoding"], "base64");
        assert_eq!(cgm[0]["payload"], "//4=");
        // Only the two topic files, nothing named after a raw topic.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 2);
    }

    #[test]
    fn rotates_by_size_and_resumes_numbering() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), line_len * 3)
                .await
                .unwrap();
            let recs: Vec<_> = (0..7).map(|i| rec(i, "t", b"x")).collect();
            s.deliver(&src(), &recs).await.unwrap();
        });
        assert_eq!(lines(&out.join("t.00000000.jsonl")).len(), 3);
        assert_eq!(lines(&out.join("t.00000001.jsonl")).len(), 3);
        assert_eq!(lines(&out.join("t.00000002.jsonl")).len(), 1);
        // Reopen: appends to the newest file, then rotates on.
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), line_len * 3)
                .await
                .unwrap();
            let recs: Vec<_> = (7..10).map(|i| rec(i, "t", b"x")).collect();
            s.deliver(&src(), &recs).await.unwrap();
        });
        assert_eq!(lines(&out.join("t.00000002.jsonl")).len(), 3);
        assert_eq!(lines(&out.join("t.00000003.jsonl")).len(), 1);
        let all: Vec<u64> = (0..4)
            .flat_map(|n| lines(&out.join(file_name("t", n))))
            .map(|v| v["offset"].as_u64().unwrap())
            .collect();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn torn_last_line_is_cut_back_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            s.deliver(&src(), &[rec(0, "t", b"a"), rec(1, "t", b"b")])
                .await
                .unwrap();
        });
        let path = out.join("t.00000000.jsonl");
        let good = std::fs::read(&path).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"gateway_id\":\"gw\",\"log_i").unwrap();
        drop(f);
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), good);
            s.deliver(&src(), &[rec(2, "t", b"c")]).await.unwrap();
        });
        let offs: Vec<u64> = lines(&path)
            .iter()
            .map(|v| v["offset"].as_u64().unwrap())
            .collect();
        assert_eq!(offs, vec![0, 1, 2]);

        // A file with no newline at all is emptied.
        let p2 = out.join("u.00000000.jsonl");
        std::fs::write(&p2, b"{\"torn").unwrap();
        FileSink::open(out.clone(), DEFAULT_ROTATE_BYTES).unwrap();
        assert_eq!(std::fs::read(&p2).unwrap().len(), 0);
    }

    fn offsets(path: &Path) -> Vec<u64> {
        lines(path)
            .iter()
            .map(|v| v["offset"].as_u64().unwrap())
            .collect()
    }

    fn deliver(out: &Path, rotate: u64, src: &Source, recs: &[OwnedRecord]) -> u64 {
        smol::block_on(async {
            let mut s = FileSink::open_async(out.to_path_buf(), rotate)
                .await
                .unwrap();
            s.deliver(src, recs).await.unwrap();
            s.skipped_duplicates()
        })
    }

    #[test]
    fn resent_records_are_acknowledged_without_a_second_line() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let recs: Vec<_> = (0..8).map(|i| rec(i, "t", b"x")).collect();
        assert_eq!(deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &recs[..5]), 0);
        // The bridge died before its checkpoint: it resends from 3 after the restart.
        assert_eq!(deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &recs[3..]), 2);
        assert_eq!(
            offsets(&out.join("t.00000000.jsonl")),
            (0..8).collect::<Vec<_>>()
        );
        // The same within one open sink (a retried batch).
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            s.deliver(&src(), &recs[6..]).await.unwrap();
            s.deliver(&src(), &recs[6..]).await.unwrap();
            assert_eq!(s.skipped_duplicates(), 4);
        });
        assert_eq!(offsets(&out.join("t.00000000.jsonl")).len(), 8);
    }

    /// Guards against one high-water mark per log: offsets are global across topics and a
    /// batch is written topic by topic, so a crash can leave one topic's part of a batch
    /// on disk and not another's. The later topic's records must still be written.
    #[test]
    fn crash_between_the_topics_of_one_batch_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let batch: Vec<_> = (0..6)
            .map(|i| rec(i, if i % 2 == 0 { "a" } else { "b" }, b"x"))
            .collect();
        // What the crash left: topic a's lines of the batch (0, 2, 4), none of b's.
        let a_only: Vec<_> = batch.iter().filter(|r| r.topic == "a").cloned().collect();
        deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &a_only);
        // The drain resends the whole batch.
        assert_eq!(deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &batch), 3);
        assert_eq!(offsets(&out.join("a.00000000.jsonl")), vec![0, 2, 4]);
        assert_eq!(offsets(&out.join("b.00000000.jsonl")), vec![1, 3, 5]);
    }

    #[test]
    fn mark_survives_rotation_and_an_empty_newest_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
        let rotate = line_len * 3;
        let recs: Vec<_> = (0..10).map(|i| rec(i, "t", b"x")).collect();
        deliver(&out, rotate, &src(), &recs[..6]);
        assert_eq!(offsets(&out.join("t.00000001.jsonl")), vec![3, 4, 5]);
        // A crash right after a rotation created the next file, and one torn line in it.
        std::fs::write(out.join("t.00000002.jsonl"), b"{\"gateway_id\":").unwrap();
        assert_eq!(deliver(&out, rotate, &src(), &recs[2..]), 4);
        let all: Vec<u64> = (0..4)
            .flat_map(|n| {
                let p = out.join(file_name("t", n));
                if p.exists() { offsets(&p) } else { Vec::new() }
            })
            .collect();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn another_log_id_is_never_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let recs: Vec<_> = (0..4).map(|i| rec(i, "t", b"x")).collect();
        deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &recs);
        let new_log = Source {
            gateway_id: "gw".into(),
            log_id: 43,
        };
        // A reflashed gateway starts again at offset 0 with a new log id.
        assert_eq!(deliver(&out, DEFAULT_ROTATE_BYTES, &new_log, &recs[..2]), 0);
        let v = lines(&out.join("t.00000000.jsonl"));
        assert_eq!(v.len(), 6);
        assert_eq!(v[5]["log_id"], "0000000000000000000000000000002b");
        // And the old log's mark is kept in memory while the sink stays open.
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            s.deliver(&new_log, &recs[..3]).await.unwrap();
            assert_eq!(s.skipped_duplicates(), 2);
        });
    }

    #[test]
    fn a_foreign_last_line_disables_skipping_for_its_topic() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("t.00000000.jsonl"), b"not json\n").unwrap();
        let recs: Vec<_> = (0..2).map(|i| rec(i, "t", b"x")).collect();
        assert_eq!(deliver(&out, DEFAULT_ROTATE_BYTES, &src(), &recs), 0);
        let text = std::fs::read_to_string(out.join("t.00000000.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 3);
    }

    #[test]
    fn last_line_longer_than_the_scan_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.00000000.jsonl");
        let long = vec![b'y'; 150_000];
        let mut data = b"first\n".to_vec();
        data.extend_from_slice(&long);
        data.push(b'\n');
        std::fs::write(&p, &data).unwrap();
        assert_eq!(last_line(&p).unwrap(), Some(long.clone()));
        std::fs::write(&p, [&long[..], b"\n"].concat()).unwrap();
        assert_eq!(last_line(&p).unwrap(), Some(long));
        std::fs::write(&p, b"\n").unwrap();
        assert_eq!(last_line(&p).unwrap(), Some(Vec::new()));
        std::fs::write(&p, b"").unwrap();
        assert_eq!(last_line(&p).unwrap(), None);
        assert_eq!(
            line_key(br#"{"log_id":"0000000000000000000000000000002a","offset":7}"#),
            Some((42, 7))
        );
        assert_eq!(line_key(br#"{"log_id":"2a","offset":7}"#), None);
    }

    fn all_offsets(out: &Path) -> Vec<u64> {
        let mut names: Vec<_> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names.iter().flat_map(|n| offsets(&out.join(n))).collect()
    }

    /// Lines written after the checkpoint (their fsync may have failed, yet Linux can still
    /// show them) are cut off at a start, so the duplicate check cannot take them for
    /// written records; the resent records are written again, once.
    #[test]
    fn restore_cuts_back_to_the_checkpoints_synced_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let recs: Vec<_> = (0..8).map(|i| rec(i, "t", b"x")).collect();
        let synced = smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            assert_eq!(s.synced_files(), None);
            s.deliver(&src(), &recs[..5]).await.unwrap();
            let synced = s.synced_files().unwrap();
            // Written after the checkpoint was saved (not in it).
            s.deliver(&src(), &recs[5..7]).await.unwrap();
            synced
        });
        assert_eq!(synced.log_id, log_id_hex(42));
        assert_eq!(synced.files["t"].n, 0);
        let path = out.join("t.00000000.jsonl");
        let at_checkpoint = synced.files["t"].len;
        assert!(std::fs::metadata(&path).unwrap().len() > at_checkpoint);
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            let cut = s.restore(&synced).await.unwrap().unwrap();
            assert_eq!(cut.files, 1);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), at_checkpoint);
            // The drain resends from the checkpoint: nothing is skipped.
            s.deliver(&src(), &recs[5..]).await.unwrap();
            assert_eq!(s.skipped_duplicates(), 0);
        });
        assert_eq!(offsets(&path), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn restore_empties_files_and_topics_created_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
        let rotate = line_len * 3;
        let recs: Vec<_> = (0..10).map(|i| rec(i, "t", b"x")).collect();
        let synced = smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
            s.deliver(&src(), &recs[..4]).await.unwrap();
            let synced = s.synced_files().unwrap();
            s.deliver(&src(), &recs[4..8]).await.unwrap();
            s.deliver(&src(), &[rec(8, "new", b"y")]).await.unwrap();
            synced
        });
        assert_eq!(
            synced.files["t"],
            SyncedFile {
                n: 1,
                len: line_len
            }
        );
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
            let cut = s.restore(&synced).await.unwrap().unwrap();
            assert_eq!(cut.files, 3, "t.1 cut, t.2 and new.0 emptied");
            assert_eq!(all_offsets(&out), vec![0, 1, 2, 3]);
            s.deliver(&src(), &recs[4..]).await.unwrap();
            assert_eq!(s.skipped_duplicates(), 0);
        });
        assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
    }

    /// Another drain writing into the same directory: its lines are never cut.
    #[test]
    fn restore_leaves_lines_of_another_log() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let recs: Vec<_> = (0..4).map(|i| rec(i, "t", b"x")).collect();
        let other = Source {
            gateway_id: "gw2".into(),
            log_id: 43,
        };
        let synced = smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            s.deliver(&src(), &recs[..2]).await.unwrap();
            s.synced_files().unwrap()
        });
        deliver(&out, DEFAULT_ROTATE_BYTES, &other, &recs);
        let before = std::fs::read(out.join("t.00000000.jsonl")).unwrap();
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            assert_eq!(s.restore(&synced).await.unwrap().unwrap().files, 0);
        });
        assert_eq!(std::fs::read(out.join("t.00000000.jsonl")).unwrap(), before);
        // A checkpoint taken for another directory is not applied.
        let mut elsewhere = synced.clone();
        elsewhere.dir = "/nonexistent/out".into();
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), DEFAULT_ROTATE_BYTES)
                .await
                .unwrap();
            assert_eq!(s.restore(&elsewhere).await.unwrap(), None);
        });
    }

    /// A batch that fails half-way (here: the next file of a rotation cannot be created,
    /// after the current one was written and synced) is cut back whole before the resend,
    /// so the resent batch lands once.
    #[test]
    fn a_failed_batch_is_cut_back_before_it_is_resent() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
        let rotate = line_len * 3;
        let recs: Vec<_> = (0..6).map(|i| rec(i, "t", b"x")).collect();
        smol::block_on(async {
            let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
            s.deliver(&src(), &recs[..1]).await.unwrap();
            let blocker = out.join("t.00000001.jsonl");
            std::fs::create_dir(&blocker).unwrap();
            assert!(s.deliver(&src(), &recs[1..]).await.is_err());
            // Written and synced by the failed attempt, past the synced length.
            assert_eq!(offsets(&out.join("t.00000000.jsonl")), vec![0, 1, 2]);
            std::fs::remove_dir(&blocker).unwrap();
            s.deliver(&src(), &recs[1..]).await.unwrap();
            assert_eq!(s.skipped_duplicates(), 0);
        });
        assert_eq!(all_offsets(&out), (0..6).collect::<Vec<_>>());
    }

    #[test]
    fn foreign_lines_are_found_across_buffer_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.00000000.jsonl");
        let ours = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line();
        let theirs = JsonRecord::new(
            &Source {
                gateway_id: "gw2".into(),
                log_id: 43,
            },
            &rec(0, "t", &vec![b'y'; 100_000]),
        )
        .to_line();
        std::fs::write(
            &p,
            [ours.as_bytes(), b"garbage\n", theirs.as_bytes()].concat(),
        )
        .unwrap();
        assert_eq!(foreign_line(&p, 0, 42).unwrap(), Some(43));
        let theirs_at = (ours.len() + b"garbage\n".len()) as u64;
        assert_eq!(foreign_line(&p, theirs_at, 43).unwrap(), None);
        assert_eq!(foreign_line(&p, 0, 43).unwrap(), Some(42));
        // A torn copy of their line (no newline) is nobody's.
        std::fs::write(&p, &theirs.as_bytes()[..50_000]).unwrap();
        assert_eq!(foreign_line(&p, 0, 42).unwrap(), None);
    }

    #[test]
    fn torn_line_longer_than_the_scan_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.00000000.jsonl");
        let mut data = b"{\"ok\":1}\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', 200_000));
        std::fs::write(&p, &data).unwrap();
        assert_eq!(cut_torn_tail(&p).unwrap(), 9);
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"ok\":1}\n");
    }
}

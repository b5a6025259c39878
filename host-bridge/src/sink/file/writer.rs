//! The file sink's writer, which lives on the blocking pool: each topic's open file and
//! the full files waiting for their checkpoint, rotation, the duplicate check's marks, what
//! is synced, and settling what a crash left (see the parent module's doc).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::names::{self, file_name, topic_stem, utc_date};
use super::recovery::{
    Found, cut_torn_tail, last_key, last_line, line_key, scan, scan_topic, sync_dir,
};
use super::{Rotation, SyncedFile};
use crate::client::OwnedRecord;
use crate::sink::{LineWriter, Source};

/// Line buffers an [`Inner`] keeps for the next batches, at most (one per topic of a
/// batch is taken, and given back once written).
const SPARE_BUFFERS: usize = 8;

/// Bytes appended to a file after which the writer starts writing them back to the disk:
/// `sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`, which queues the write-back and does
/// not wait for it (as RocksDB's `bytes_per_sync` does). The group checkpoint's
/// `fdatasync` then finds most of the file on the disk already, and the drain, which
/// waits for it, stalls for less time: a 300,000-record drain (90 MB of lines) took a
/// median of 0.15 s instead of 0.20 s; 4 MiB did as well, 16 MiB less well. Only the
/// `fdatasync` decides what is durable.
pub(super) const WRITE_BACK_BYTES: u64 = 1 << 20;

/// Starts writing bytes `from..from + n` of `file` back to the disk without waiting
/// ([`WRITE_BACK_BYTES`]).
///
/// # Errors
/// The I/O error `sync_file_range` reports (`EIO`, `ENOSPC`: the writer is then dropped,
/// as after a failed write). A file or file system that does not support it (`ENOSYS`,
/// `EINVAL`, `ESPIPE`) is not an error: the `fdatasync` does all the work then.
pub(super) fn start_write_back(file: &File, from: u64, n: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(n)) = (libc::off64_t::try_from(from), libc::off64_t::try_from(n)) else {
        return Ok(());
    };
    // SAFETY: `file` keeps the descriptor open for the call, which reads no memory of ours.
    let r =
        unsafe { libc::sync_file_range(file.as_raw_fd(), from, n, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSYS | libc::EINVAL | libc::ESPIPE) => Ok(()),
        _ => Err(e),
    }
}

/// `e` with what the writer was doing, and on which file or directory, in its message:
/// `writing DIR/…/….jsonl.open: No space left on device (os error 28)`. Its kind is kept,
/// for the callers that match on it (its raw OS error is not).
pub(super) fn failed(what: &str, path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// One topic's lines of a batch ([`Inner::lines`]).
pub(super) struct Lines {
    /// The topic's directory name.
    stem: String,
    /// The duplicate check's mark of the topic and log, as it moves over the batch.
    mark: Option<u64>,
    /// The lines, back to back, newlines included.
    text: Vec<u8>,
    /// Per line: its record's offset and timestamp (µs), and its end in `text`.
    ends: Vec<LineEnd>,
}

/// A line of [`Lines`]: its record's offset and timestamp (µs), and its end in the text.
type LineEnd = (u64, u64, usize);

/// What one trip to the blocking pool does (each writes the lines held back first, see
/// [`Inner::hold`]).
pub(super) enum Job {
    /// Write records.
    Records(Vec<OwnedRecord>),
    /// Write the lines held back.
    Flush,
    /// Write a gap line; the offset names a file it has to begin.
    Gap(String, u64),
}

/// A topic's open file.
pub(super) struct OpenFile {
    first: u64,
    path: PathBuf,
    /// Opened for appending on first use.
    file: Option<File>,
    len: u64,
    /// Bytes from the start whose write-back to the disk was started
    /// ([`WRITE_BACK_BYTES`]).
    written_back: u64,
    /// When it was created (see the module doc, "Layout": "open for").
    since: SystemTime,
    /// Its date directory, with `--partition-by-date`.
    date: Option<String>,
}

impl OpenFile {
    fn handle(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .append(true)
                .open(&self.path)
                .map_err(|e| failed("opening", &self.path, e))?;
            self.file = Some(f);
        }
        self.file
            .as_mut()
            .ok_or_else(|| std::io::Error::other("file handle vanished"))
    }

    /// Appends `bytes` (not counted in `len`: the caller does that). Errors name the file.
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.handle()?
            .write_all(bytes)
            .map_err(|e| failed("writing", &self.path, e))
    }

    /// Fsyncs (`fdatasync`) the file. Errors name the file.
    fn sync_data(&mut self) -> std::io::Result<()> {
        self.handle()?
            .sync_data()
            .map_err(|e| failed("syncing", &self.path, e))
    }

    fn expired(&self, rot: &Rotation, now: SystemTime) -> bool {
        rot.interval
            .is_some_and(|i| now.duration_since(self.since).unwrap_or_default() >= i)
    }

    /// Its first offset and length, as [`Inner::state`] records them once it is synced.
    fn synced(&self) -> SyncedFile {
        SyncedFile {
            first: self.first,
            len: self.len,
        }
    }
}

/// State that lives on the blocking thread during a write.
pub(super) struct Inner {
    pub(super) dir: PathBuf,
    pub(super) rot: Rotation,
    /// Per topic stem, its open file.
    pub(super) open: HashMap<String, OpenFile>,
    /// Files that are full (rotated) and synced, still open-named: renamed by
    /// [`Inner::close_full`] once a checkpoint covers their records (see the module doc,
    /// "Layout"), oldest first.
    pub(super) full: Vec<OpenFile>,
    /// Open files older than a topic's newest, found at open (a crash between a checkpoint
    /// and the rename of its full files, or files of another log), with the `(log id,
    /// offset)` of their last line: closed only once a checkpoint of that log covers that
    /// offset ([`Inner::close_full`]), so a file holding records past the checkpoint, or of
    /// a log that started over and reuses offsets, is never handed downstream.
    pub(super) found: Vec<(OpenFile, Option<(u128, u64)>)>,
    /// Highest offset written per (stem, log id): see the module doc, "Exactly once".
    pub(super) marks: HashMap<(String, u128), u64>,
    /// Per stem, the newest file and its length: as found at open, then as synced by the
    /// last successful [`Inner::sync`] or gap line (see the module doc, "Synced lengths").
    pub(super) state: BTreeMap<String, SyncedFile>,
    /// Stems whose open file was written since the last [`Inner::sync`].
    pub(super) unsynced: BTreeSet<String>,
    /// Emptied buffers of written [`Lines`] (text, ends), at most [`SPARE_BUFFERS`], for the
    /// next batches: a batch's lines then go into memory already faulted in, with no
    /// allocation or reallocation as they grow. Each is as large as one topic's lines of
    /// one batch (one gateway frame's records) have needed.
    spare: Vec<(Vec<u8>, Vec<LineEnd>)>,
    /// Lines made by [`Inner::lines`] and held back ([`Inner::hold`]), not written yet;
    /// the marks already count them, so they go (or are dropped) with this writer.
    pending: Vec<Lines>,
    /// Bytes of text in `pending`.
    pending_bytes: usize,
}

/// Creates `dir` and its missing parents, fsyncing the directory that holds each one made.
/// A failure names the directory it could not create.
fn create_dirs(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        create_dirs(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Made meanwhile by another process, or a file in the way (`is_dir` said no above).
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!(
                    "cannot create {}: a file of that name is in the way",
                    dir.display()
                ),
            ));
        }
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("cannot create {}: {e}", dir.display()),
            ));
        }
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_dir(parent)
}

/// Renames the open file `path` to its closed name, never replacing a file of that name,
/// and fsyncs the directory (see the module doc, "Durability").
fn close_name(path: &Path, first: u64) -> std::io::Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let closed = dir.join(file_name(first, false));
    let context = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot close {} as {}: {e}",
                path.display(),
                closed.display()
            ),
        )
    };
    match rename_no_replace(path, &closed) {
        Ok(()) => {}
        // A file system without RENAME_NOREPLACE: a hard link, then the open name removed
        // (a crash in between leaves both names; `settle` removes the open one).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            std::fs::hard_link(path, &closed).map_err(context)?;
            std::fs::remove_file(path).map_err(|e| failed("removing", path, e))?;
        }
        Err(e) => return Err(context(e)),
    }
    sync_dir(dir)?;
    Ok(closed)
}

/// Renames `from` to `to` in one step, failing (`EEXIST`) rather than replacing `to`:
/// `renameat2(RENAME_NOREPLACE)`, so that a crash leaves exactly one of the two names (a
/// hard link and an unlink leave both for a moment, and a downstream job that moved the
/// closed name away then would see the file closed a second time). `EINVAL` or `ENOSYS`
/// where the file system or the platform lacks it.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let from = std::ffi::CString::new(from.as_os_str().as_bytes())?;
        let to = std::ffi::CString::new(to.as_os_str().as_bytes())?;
        // SAFETY: both are valid NUL-terminated paths that live across the call, and
        // AT_FDCWD makes them relative to the working directory as `std::fs` does.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, to);
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }
}

impl Inner {
    pub(super) fn open(dir: PathBuf, rot: Rotation) -> std::io::Result<Inner> {
        create_dirs(&dir)?;
        let mut marks = HashMap::new();
        let mut state = BTreeMap::new();
        let mut open = HashMap::new();
        let mut found = Vec::new();
        for (stem, files) in scan(&dir)? {
            let files = settle(&dir.join(&stem), files)?;
            let Some((newest, older)) = files.split_last() else {
                continue;
            };
            // Open files older than the newest: closed once a checkpoint covers them.
            for f in older.iter().filter(|f| f.open) {
                let key = last_line(&f.path)?.and_then(|l| line_key(&l));
                let of = OpenFile {
                    first: f.first,
                    path: f.path.clone(),
                    file: None,
                    len: 0,
                    written_back: 0,
                    since: SystemTime::now(),
                    date: None,
                };
                found.push((of, key));
            }
            let len = std::fs::metadata(&newest.path)?.len();
            state.insert(
                stem.clone(),
                SyncedFile {
                    first: newest.first,
                    len,
                },
            );
            if newest.open {
                let meta = std::fs::metadata(&newest.path)?;
                let since = meta.created().unwrap_or_else(|_| SystemTime::now());
                let date = newest
                    .path
                    .parent()
                    .and_then(|p| p.file_name())
                    .and_then(|n| n.to_str())
                    .filter(|n| names::is_date_dir(n))
                    .map(str::to_string);
                open.insert(
                    stem.clone(),
                    OpenFile {
                        first: newest.first,
                        path: newest.path.clone(),
                        file: None,
                        len,
                        written_back: len,
                        since,
                        date,
                    },
                );
            }
            if let Some((log_id, offset)) = last_key(&files)? {
                marks.insert((stem, log_id), offset);
            }
        }
        Ok(Inner {
            dir,
            rot: Rotation {
                bytes: rot.bytes.max(1),
                ..rot
            },
            open,
            full: Vec::new(),
            found,
            marks,
            state,
            unsynced: BTreeSet::new(),
            spare: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
        })
    }

    /// Creates the open file of `stem` whose first line is for `first` (dated `date`).
    fn create(&mut self, stem: &str, first: u64, date: Option<String>) -> std::io::Result<()> {
        let mut dir = self.dir.join(stem);
        if let Some(d) = &date {
            dir.push(d);
        }
        create_dirs(&dir)?;
        let closed = dir.join(file_name(first, false));
        if closed.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists: records from offset {first} were written there before (a log \
                     that started over?); not replacing it: move it away or drain into \
                     another directory",
                    closed.display()
                ),
            ));
        }
        let path = dir.join(file_name(first, true));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| failed("creating", &path, e))?;
        sync_dir(&dir)?;
        self.open.insert(
            stem.to_string(),
            OpenFile {
                first,
                path,
                file: Some(file),
                len: 0,
                written_back: 0,
                since: SystemTime::now(),
                date,
            },
        );
        Ok(())
    }

    /// Sets the open file of `stem` (already synced) aside as full: it keeps its open name
    /// until [`Inner::close_full`], and the next line begins a new file.
    fn set_full(&mut self, stem: &str) {
        if let Some(mut of) = self.open.remove(stem) {
            of.file = None;
            self.full.push(of);
        }
    }

    /// Renames every full file this writer set aside to its closed name (a checkpoint
    /// covers all their records now), and every open file found at open whose last line is
    /// of log `covered.0` at an offset below `covered.1` (the checkpoint's log and offset;
    /// `None`: none of them); returns how many. On an error the files not renamed yet stay
    /// open-named and are found again at the next open.
    pub(super) fn close_full(&mut self, covered: Option<(u128, u64)>) -> std::io::Result<u64> {
        let mut n = 0;
        while let Some(of) = self.full.first() {
            close_name(&of.path, of.first)?;
            self.full.remove(0);
            n += 1;
        }
        Ok(n + self.close_found(covered)?)
    }

    /// Renames every open file found at open whose last line is of log `covered.0` at an
    /// offset below `covered.1` (a saved checkpoint's log and offset; `None`: none of
    /// them) to its closed name; returns how many. The files set aside as full since are
    /// left alone: unlike [`Inner::close_full`], this may run when records written after
    /// the checkpoint were not synced (after a failed write).
    pub(super) fn close_found(&mut self, covered: Option<(u128, u64)>) -> std::io::Result<u64> {
        let mut n = 0;
        let mut i = 0;
        while let Some((of, key)) = self.found.get(i) {
            let due = matches!((key, covered), (Some((log, at)), Some((cp_log, cp)))
                if *log == cp_log && *at < cp);
            if due {
                close_name(&of.path, of.first)?;
                self.found.remove(i);
                n += 1;
            } else {
                i += 1;
            }
        }
        Ok(n)
    }

    /// After a failed write, with a saved checkpoint's log and offset: [`Inner::close_found`],
    /// and every open file whose last line is below the checkpoint (on a writer reopened
    /// after the failure, an open file holds only synced lines; on one still open, a file
    /// with lines past the checkpoint is left open), fsynced again first. Not only files
    /// due for `--rotate-interval`: a file that reached `--rotate-bytes` on a disk it
    /// filled stayed open-named for good, as the write that would close it, the next
    /// file's first, failed each time for want of the space the full file held. Returns
    /// how many files were closed.
    pub(super) fn close_covered(&mut self, covered: (u128, u64)) -> std::io::Result<u64> {
        let mut n = self.close_found(Some(covered))?;
        let mut due: Vec<(String, PathBuf)> = self
            .open
            .iter()
            .filter(|(_, of)| of.len > 0)
            .map(|(s, of)| (s.clone(), of.path.clone()))
            .collect();
        due.sort();
        for (stem, path) in due {
            let key = last_line(&path)?.and_then(|l| line_key(&l));
            if matches!(key, Some((log, at)) if log == covered.0 && at < covered.1) {
                // Its cut back (to the synced length) is made durable with it.
                self.unsynced.insert(stem.clone());
                self.close(&stem)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Closes the open file of `stem` (already synced); its stem's newest file is then that
    /// closed file.
    fn close(&mut self, stem: &str) -> std::io::Result<()> {
        let Some(mut of) = self.open.remove(stem) else {
            return Ok(());
        };
        if self.unsynced.remove(stem) {
            of.sync_data()?;
        }
        drop(of.file.take());
        close_name(&of.path, of.first)?;
        self.state.insert(stem.to_string(), of.synced());
        Ok(())
    }

    /// Closes every open file that has been open for the rotation interval; returns how
    /// many.
    pub(super) fn close_expired(&mut self) -> std::io::Result<u64> {
        let now = SystemTime::now();
        let mut stems: Vec<String> = self
            .open
            .iter()
            .filter(|(_, of)| of.len > 0 && of.expired(&self.rot, now))
            .map(|(s, _)| s.clone())
            .collect();
        stems.sort();
        let mut n = self.close_full(None)?;
        for stem in &stems {
            self.close(stem)?;
            n += 1;
        }
        Ok(n)
    }

    /// Appends `line` (a gap line) to the open file of every topic (beginning a file named
    /// `from` where there is none; the empty topic's when there is no topic yet) and fsyncs
    /// them.
    pub(super) fn write_gap(&mut self, line: &str, from: u64) -> std::io::Result<()> {
        let mut stems: Vec<String> = self.state.keys().chain(self.open.keys()).cloned().collect();
        if stems.is_empty() {
            stems.push(topic_stem(""));
        }
        stems.sort();
        stems.dedup();
        for stem in &stems {
            if !self.open.contains_key(stem) {
                let date = self.rot.by_date.then(|| utc_date(wall_clock_us()));
                self.create(stem, from, date)?;
            }
            self.append(stem, line.as_bytes())?;
        }
        for stem in stems {
            self.sync_open(stem)?;
        }
        Ok(())
    }

    /// Appends `bytes` to the open file of `stem`, which the caller has created.
    fn append(&mut self, stem: &str, bytes: &[u8]) -> std::io::Result<()> {
        let of = self
            .open
            .get_mut(stem)
            .ok_or_else(|| std::io::Error::other("open file vanished"))?;
        of.write_all(bytes)?;
        of.len += bytes.len() as u64;
        if of.len - of.written_back >= WRITE_BACK_BYTES {
            let (from, n) = (of.written_back, of.len - of.written_back);
            start_write_back(of.handle()?, from, n)
                .map_err(|e| failed("starting the write-back of", &of.path, e))?;
            of.written_back = of.len;
        }
        Ok(())
    }

    /// Fsyncs (`fdatasync`) the open file of `stem`, if there is one, and records its
    /// length in [`Inner::state`] as durable.
    fn sync_open(&mut self, stem: String) -> std::io::Result<()> {
        if let Some(of) = self.open.get_mut(&stem) {
            of.sync_data()?;
            self.state.insert(stem, of.synced());
        }
        Ok(())
    }

    /// Writes the records not yet in the files, rotating as [`Rotation`] says (a file set
    /// aside as full is fsynced first), and leaves the newest files unsynced until
    /// [`Inner::sync`]; returns how many records were skipped as already written, and their
    /// payload bytes. On error the caller drops `self` (the marks may be ahead of the
    /// files).
    pub(super) fn write(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> std::io::Result<(u64, u64)> {
        let (lines, skipped) = self.lines(src, records);
        self.write_lines(lines)?;
        Ok(skipped)
    }

    /// The lines of the records not yet in the files, per topic, moving the duplicate
    /// check's marks over them (CPU only, no I/O: the sink runs it before the trip to the
    /// blocking pool, so the batch is not copied there); and how many records were skipped
    /// as already written, with their payload bytes. Hand them to [`Inner::write_lines`], or
    /// drop `self` (the marks are ahead of the files).
    pub(super) fn lines(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> (Vec<Lines>, (u64, u64)) {
        let mut writer = LineWriter::new(src);
        // Per topic, in order of first appearance: its lines back to back, in record order,
        // and the end of each in `text` with its offset and timestamp.
        let mut groups: Vec<Lines> = Vec::new();
        let mut skipped = (0u64, 0u64);
        // The group of the previous record's topic (records come in runs of one topic).
        let mut cur: Option<(usize, &str)> = None;
        for rec in records {
            let g = match cur {
                Some((g, topic)) if topic == rec.topic => g,
                _ => {
                    let stem = topic_stem(&rec.topic);
                    let g = match groups.iter().position(|l| l.stem == stem) {
                        Some(g) => g,
                        None => {
                            let mark = self.marks.get(&(stem.clone(), src.log_id)).copied();
                            let (text, ends) = self.spare.pop().unwrap_or_default();
                            groups.push(Lines {
                                stem,
                                mark,
                                text,
                                ends,
                            });
                            groups.len() - 1
                        }
                    };
                    cur = Some((g, &rec.topic));
                    g
                }
            };
            let l = &mut groups[g];
            if l.mark.is_some_and(|m| rec.offset <= m) {
                skipped.0 += 1;
                skipped.1 += rec.payload.len() as u64;
                continue;
            }
            l.mark = Some(rec.offset);
            writer.write(rec, &mut l.text);
            l.ends.push((rec.offset, rec.timestamp_us, l.text.len()));
        }
        for l in &groups {
            if let Some(m) = l.mark {
                self.marks.insert((l.stem.clone(), src.log_id), m);
            }
        }
        (groups, skipped)
    }

    /// Writes `groups` (made by [`Inner::lines`]), rotating as [`Rotation`] says (a file
    /// set aside as full is fsynced first), and leaves the newest files unsynced until
    /// [`Inner::sync`]. On error the caller drops `self`.
    pub(super) fn write_lines(&mut self, groups: Vec<Lines>) -> std::io::Result<()> {
        let now = SystemTime::now();
        let rot = self.rot;
        let mut touched: Vec<String> = Vec::new();
        for Lines {
            stem, text, ends, ..
        } in groups
        {
            if ends.is_empty() {
                self.give_back(text, ends);
                continue;
            }
            // Where the bytes not written yet begin in `text`, and where the line begins.
            let (mut chunk, mut start) = (0usize, 0usize);
            // Most batches go whole into the open file: no line by line checks then.
            let whole = !rot.by_date
                && self.open.get(&stem).is_some_and(|of| {
                    of.len + text.len() as u64 <= rot.bytes && !of.expired(&rot, now)
                });
            for &(offset, ts, end) in ends.iter().filter(|_| !whole) {
                let date = rot.by_date.then(|| utc_date(ts));
                if let Some(of) = self.open.get_mut(&stem) {
                    let pending = of.len + (start - chunk) as u64;
                    let full = pending + (end - start) as u64 > rot.bytes;
                    let later_day = matches!((&date, &of.date), (Some(d), Some(f)) if d > f);
                    if pending > 0 && (full || of.expired(&rot, now) || later_day) {
                        // Finish the current file and set it aside (renamed once the
                        // checkpoint covers this batch), then begin the next one.
                        of.write_all(&text[chunk..start])?;
                        of.sync_data()?;
                        of.len += (start - chunk) as u64;
                        chunk = start;
                        self.set_full(&stem);
                    }
                }
                if !self.open.contains_key(&stem) {
                    self.create(&stem, offset, date)?;
                }
                start = end;
            }
            self.append(&stem, &text[chunk..])?;
            touched.push(stem);
            self.give_back(text, ends);
        }
        self.unsynced.extend(touched);
        Ok(())
    }

    /// Holds `groups` (made by [`Inner::lines`]) back, to be written with the next trip to
    /// the blocking pool ([`Inner::flush`]); returns the bytes held back now.
    pub(super) fn hold(&mut self, groups: Vec<Lines>) -> usize {
        self.pending_bytes += groups.iter().map(|l| l.text.len()).sum::<usize>();
        self.pending.extend(groups);
        self.pending_bytes
    }

    /// True if lines are held back.
    pub(super) fn holds_lines(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The payload bytes of the records of `records` (of log `src.log_id`) that the files
    /// hold already, by the duplicate check's marks: what [`Inner::write`] would skip.
    pub(super) fn held_bytes(&self, src: &Source, records: &[OwnedRecord]) -> u64 {
        let mut held = 0;
        // The mark of the previous record's topic (records come in runs of one topic).
        let mut cur: Option<(&str, Option<u64>)> = None;
        for rec in records {
            let mark = match cur {
                Some((topic, mark)) if topic == &*rec.topic => mark,
                _ => {
                    let key = (topic_stem(&rec.topic), src.log_id);
                    let mark = self.marks.get(&key).copied();
                    cur = Some((&rec.topic, mark));
                    mark
                }
            };
            if mark.is_some_and(|m| rec.offset <= m) {
                held += rec.payload.len() as u64;
            }
        }
        held
    }

    /// Writes the lines held back ([`Inner::hold`]), in the order they were made, as
    /// [`Inner::write_lines`] does. On error the caller drops `self`.
    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        self.pending_bytes = 0;
        let pending = std::mem::take(&mut self.pending);
        self.write_lines(pending)
    }

    /// Keeps the buffers of written lines, emptied, for the next batches (up to
    /// [`SPARE_BUFFERS`]).
    fn give_back(&mut self, mut text: Vec<u8>, mut ends: Vec<LineEnd>) {
        if self.spare.len() < SPARE_BUFFERS {
            text.clear();
            ends.clear();
            self.spare.push((text, ends));
        }
    }

    /// Fsyncs (`fdatasync`) every open file written since the last sync and records what
    /// is durable now: after it, [`Inner::state`] covers every record written. On error
    /// the caller drops `self`.
    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        while let Some(stem) = self.unsynced.pop_first() {
            self.sync_open(stem)?;
        }
        Ok(())
    }
}

/// Settles a topic's files after a crash (see the module doc, "Durability"): removes an
/// open name left beside its closed name by a rename cut short, cuts the torn last line of
/// every open file and removes the newest open file if nothing is left of it. Open files
/// older than the newest are full files whose checkpoint had not been saved, or not
/// followed by their rename, when the bridge stopped: they keep their open name (a restore
/// may still cut them back) and are closed at the next checkpoint. Returns the topic's
/// files as they are then.
fn settle(topic_dir: &Path, files: Vec<Found>) -> std::io::Result<Vec<Found>> {
    let mut changed = false;
    for f in files.iter().filter(|f| f.open) {
        let closed = f.path.with_file_name(file_name(f.first, false));
        if let (Ok(a), Ok(b)) = (std::fs::metadata(&f.path), std::fs::metadata(&closed))
            && a.dev() == b.dev()
            && a.ino() == b.ino()
        {
            log::warn!(
                "{}: also named {} (a rename cut short by a crash); removing the open name",
                f.path.display(),
                closed.display()
            );
            std::fs::remove_file(&f.path)?;
            sync_dir(f.path.parent().unwrap_or(topic_dir))?;
            changed = true;
        }
    }
    let files = if changed {
        scan_topic(topic_dir)?
    } else {
        files
    };
    let opens: Vec<&Found> = files.iter().filter(|f| f.open).collect();
    if let Some((newest, older)) = opens.split_last() {
        // One line per topic at `info` (after a restart with a small --rotate-bytes there
        // can be a hundred such files), each file at `debug`.
        match older {
            [] => {}
            [f] => log::info!(
                "{}: an open file older than {}: closed once a checkpoint covers its last line",
                f.path.display(),
                newest.path.display()
            ),
            [oldest, .., last] => log::info!(
                "{} open files older than {}, from {} to {}: each closed once a checkpoint \
                 covers its last line",
                older.len(),
                newest.path.display(),
                oldest.path.display(),
                last.path.display()
            ),
        }
        for f in older {
            if older.len() > 1 {
                log::debug!(
                    "{}: an open file older than {}: closed once a checkpoint covers its last \
                     line",
                    f.path.display(),
                    newest.path.display()
                );
            }
            cut_torn_tail(&f.path)?;
        }
        if cut_torn_tail(&newest.path)? == 0 {
            log::warn!(
                "{}: empty after a crash or a failed write; removing it",
                newest.path.display()
            );
            std::fs::remove_file(&newest.path)?;
            sync_dir(newest.path.parent().unwrap_or(topic_dir))?;
        }
        return scan_topic(topic_dir);
    }
    Ok(files)
}

/// The wall clock, µs since the Unix epoch.
pub(super) fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

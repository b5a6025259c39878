//! Reading the file sink's files back: finding every topic's files in the layout, cutting a
//! torn last line, finding the last record of a topic (the duplicate check's mark), and
//! cutting open files back to the synced lengths a checkpoint recorded (see the module doc
//! of `sink::file`, "Layout", "Synced lengths" and "Exactly once"). Closed files are only
//! ever read here.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::MAX_LINE;
use super::names::{is_date_dir, parse_name};
use super::writer::failed;
use crate::checkpoint::SyncedFile;
use crate::client::log_id_hex;

/// Cuts `path` back to just after its last newline (to 0 if it has none); returns the new
/// length in bytes.
pub(super) fn cut_torn_tail(path: &Path) -> std::io::Result<u64> {
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
                    "{}: cutting a torn last line ({} bytes) left by a crash or a failed write",
                    path.display(),
                    len - keep
                );
                f.set_len(keep)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| failed("cutting", path, e))?;
            }
            return Ok(keep);
        }
        if start == 0 {
            log::warn!(
                "{}: no complete line, cutting {len} bytes left by a crash or a failed write",
                path.display()
            );
            f.set_len(0)
                .and_then(|()| f.sync_all())
                .map_err(|e| failed("cutting", path, e))?;
            return Ok(0);
        }
        end = start;
    }
}

/// The last line of `path` without its newline; `None` if the file is empty or does not
/// end with a newline (it always does after [`cut_torn_tail`]).
pub(super) fn last_line(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
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
pub(super) fn line_key(line: &[u8]) -> Option<(u128, u64)> {
    let k: LineKey = serde_json::from_slice(line).ok()?;
    if k.log_id.len() != 32 {
        return None;
    }
    Some((u128::from_str_radix(&k.log_id, 16).ok()?, k.offset))
}

/// The `(log id, offset)` of the last line of a topic's files (`files` sorted by first
/// offset), looking from the newest back to the first non-empty one.
pub(super) fn last_key(files: &[Found]) -> std::io::Result<Option<(u128, u64)>> {
    for f in files.iter().rev() {
        let line = match last_line(&f.path) {
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
                    f.path.display()
                );
            }
            return Ok(key);
        }
    }
    Ok(None)
}

/// One file of a topic found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    /// The offset in its name: its first record's.
    pub first: u64,
    /// Named `….jsonl.open`: still written.
    pub open: bool,
    /// Where it is (in the topic's directory, or a date directory below it).
    pub path: PathBuf,
}

/// Every topic directory under `dir` (the gateway's directory) with its files, each list
/// sorted by first offset (a closed file before an open one of the same offset). Names the
/// layout does not make are passed over; files of the earlier layout
/// (`<topic>.<n>.jsonl` directly in `dir`) are left where they are, with one warning.
pub(super) fn scan(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<Found>>> {
    let mut out = BTreeMap::new();
    let mut earlier = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if entry.file_type()?.is_dir() {
            out.insert(name.to_string(), scan_topic(&entry.path())?);
        } else if name.ends_with(super::SUFFIX) {
            earlier += 1;
        }
    }
    if earlier > 0 {
        log::warn!(
            "{}: {earlier} files of the earlier flat layout (<topic>.<n>.jsonl) are left as \
             they are; new records go to <topic>/<first offset>.jsonl",
            dir.display()
        );
    }
    Ok(out)
}

pub(super) fn scan_topic(dir: &Path) -> std::io::Result<Vec<Found>> {
    let mut found = Vec::new();
    let add = |dir: &Path, found: &mut Vec<Found>| -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some((first, open)) = parse_name(name)
                && entry.file_type()?.is_file()
            {
                found.push(Found {
                    first,
                    open,
                    path: entry.path(),
                });
            }
        }
        Ok(())
    };
    add(dir, &mut found)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_date_dir) && entry.file_type()?.is_dir() {
            add(&entry.path(), &mut found)?;
        }
    }
    found.sort_by_key(|f| (f.first, f.open));
    Ok(found)
}

/// What cutting the files back to their synced lengths did ([`FileSink::restore`](super::FileSink::restore)).
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
pub(super) fn foreign_line(path: &Path, from: u64, log_id: u128) -> std::io::Result<Option<u128>> {
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

/// Cuts every topic's open file in `dir` back to `synced` (see the `sink::file` module doc,
/// "Synced lengths"), and fsyncs each file it cut: the open file that is the checkpoint's
/// newest file of its topic to its synced length, any later open file, and the open file
/// of a topic not listed, removed (it was created after the checkpoint). Closed files are
/// final (everything in them was synced before the rename) and never cut. Bytes past a
/// synced length are cut only if no line among them is a record of another log than
/// `log_id`: such a topic is left as it is, with a warning, and its records rely on the
/// duplicate check. A file shorter than its synced length lost synced bytes outside the
/// bridge: logged at `error`, left as it is.
pub(super) fn cut_back(
    dir: &Path,
    synced: &BTreeMap<String, SyncedFile>,
    log_id: u128,
) -> std::io::Result<CutBack> {
    let mut done = CutBack::default();
    for (stem, files) in scan(dir)? {
        let target = synced.get(&stem);
        // (path, bytes to keep, bytes now)
        let mut cuts: Vec<(PathBuf, u64, u64)> = Vec::new();
        for f in files.iter().filter(|f| f.open) {
            let keep = match target {
                Some(t) if f.first < t.first => continue,
                Some(t) if f.first == t.first => t.len,
                _ => 0,
            };
            if f.path
                .with_file_name(super::file_name(f.first, false))
                .exists()
            {
                // A rename cut short: the file is closed, and final (see `settle`).
                continue;
            }
            let len = std::fs::metadata(&f.path)?.len();
            if len > keep || keep == 0 {
                cuts.push((f.path.clone(), keep, len));
            } else if len < keep {
                log::error!(
                    "{}: {len} bytes, but {keep} bytes of it were synced when the checkpoint \
                     was saved: the file system lost synced lines (not written again)",
                    f.path.display()
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
                 writes here; not cutting topic {stem:?} (its records are checked for \
                 duplicates only)",
                path.display(),
                log_id_hex(id),
                log_id_hex(log_id)
            );
            continue;
        }
        for (path, keep, len) in cuts {
            if keep == 0 {
                std::fs::remove_file(&path).map_err(|e| failed("removing", &path, e))?;
                if let Some(parent) = path.parent() {
                    sync_dir(parent)?;
                }
                log::warn!(
                    "{}: removed ({len} bytes), created after the last checkpoint (its records \
                     are sent again)",
                    path.display()
                );
            } else {
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(keep).and_then(|()| f.sync_all()))
                    .map_err(|e| failed("cutting back", &path, e))?;
                log::warn!(
                    "{}: cut back from {len} to {keep} bytes, the length synced at the last \
                     checkpoint ({} bytes written after it or not synced; their records are \
                     sent again)",
                    path.display(),
                    len - keep
                );
            }
            done.files += 1;
            done.bytes += len - keep;
        }
    }
    Ok(done)
}

/// Fsyncs the directory `dir` (the names in it). Errors name the directory.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("syncing the directory", dir, e))
}

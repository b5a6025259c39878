//! Reading the file sink's files back: cutting a torn last line, finding the last record
//! of a stem (the duplicate check's mark), and cutting files back to the synced lengths a
//! checkpoint recorded (see the module doc of `sink::file`, "Synced lengths" and "Exactly
//! once").

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::MAX_LINE;
use super::names::{file_name, parse_name};
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

/// The `(log id, offset)` of the last line of the stem's files, looking from file `newest`
/// back to the first non-empty one.
pub(super) fn last_key(
    dir: &Path,
    stem: &str,
    newest: u64,
) -> std::io::Result<Option<(u128, u64)>> {
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

/// Cuts every topic's files in `dir` back to `synced` (see the `sink::file` module doc, "Synced
/// lengths"), and fsyncs each file it cut: the newest file of a listed stem to its synced
/// length, its later files and every file of an unlisted stem to 0 bytes. Bytes past a synced
/// length are cut only if no line among them is a record of another log than `log_id`
/// (another drain writing into the same directory): such a stem is left as it is, with a
/// warning, and its records rely on the duplicate check. A file shorter than its synced
/// length lost synced bytes outside the bridge: logged at `error`, left as it is.
pub(super) fn cut_back(
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

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

//! The lock on a file sink's directory: one drain writes into a directory at a time (two
//! would duplicate every record). The lock is an advisory `flock` on the directory itself
//! (no file is added to it, so readers of the sink see only record files); the kernel
//! releases it when the process ends, however it ends (kill -9 included), so a stale lock
//! never blocks. The holder's pid, for the refusal, is looked up in `/proc/locks` by the
//! directory's inode.
//!
//! The directories the lock created (the sink directory and any missing parents) are
//! removed again when it is dropped if they are still empty: a drain that ends before it
//! opened any gateway's sink (a port that is not a Spillway gateway, a gateway it never
//! reached) leaves no empty directory behind. A directory that existed before is left as
//! it was. So that a drain which opened the directory just before it was removed does not
//! hold a lock on a removed directory, a lock is only taken as the directory's path still
//! names it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sink::SinkError;

/// A held lock on a sink directory; released when dropped (or when the process ends),
/// after removing the directories it created if they are empty (see the module doc).
#[derive(Debug)]
pub struct DirLock {
    _dir: File,
    path: PathBuf,
    /// The directories `acquire` created, deepest first.
    created: Vec<PathBuf>,
}

/// Attempts at locking a directory whose path comes to name another directory meanwhile
/// (removed and made again by the drains before and after this one).
const LOCK_ATTEMPTS: usize = 8;

impl Drop for DirLock {
    fn drop(&mut self) {
        // Still under the lock (the fields drop after this). `remove_dir` removes an
        // empty directory only: one holding anything stays, and so do its parents.
        for d in &self.created {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
    }
}

/// `dir` and those of its parents that do not exist, deepest first: what
/// `create_dir_all(dir)` would create.
fn missing(dir: &Path) -> Vec<PathBuf> {
    dir.ancestors()
        .take_while(|a| {
            !a.as_os_str().is_empty()
                && std::fs::symlink_metadata(a)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        })
        .map(Path::to_path_buf)
        .collect()
}

impl DirLock {
    /// Creates `dir` if needed and locks it for this process, on the blocking pool.
    ///
    /// # Errors
    /// [`SinkError::Locked`] (naming the directory and the holder's pid) when another
    /// drain holds it; [`SinkError::Io`] when the directory cannot be made or opened.
    pub async fn acquire(dir: &Path) -> Result<DirLock, SinkError> {
        let dir = dir.to_path_buf();
        smol::unblock(move || Self::acquire_blocking(&dir)).await
    }

    fn acquire_blocking(dir: &Path) -> Result<DirLock, SinkError> {
        // Errors name the directory and the OS reason (e.g. the sink path is a file).
        let named = |what: &str, e: std::io::Error| {
            let hint = if e.kind() == std::io::ErrorKind::AlreadyExists
                || e.raw_os_error() == Some(libc::ENOTDIR)
            {
                " (the sink path, or a part of it, is a file, not a directory)"
            } else {
                ""
            };
            SinkError::Io(std::io::Error::new(
                e.kind(),
                format!("{what} {}: {e}{hint}", dir.display()),
            ))
        };
        for _ in 0..LOCK_ATTEMPTS {
            let created = missing(dir);
            std::fs::create_dir_all(dir)
                .map_err(|e| named("cannot create the sink directory", e))?;
            let file = File::open(dir).map_err(|e| named("cannot open the sink directory", e))?;
            // SAFETY: flock on a file descriptor this function owns; no memory is involved.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    let inode = file.metadata()?.ino();
                    return Err(SinkError::Locked {
                        dir: dir.to_path_buf(),
                        holder: holder_pid(inode),
                    });
                }
                return Err(SinkError::Io(err));
            }
            let held = file.metadata()?;
            match std::fs::metadata(dir) {
                Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => {
                    return Ok(DirLock {
                        _dir: file,
                        path: dir.to_path_buf(),
                        created,
                    });
                }
                // Removed (by the drain that held it, empty) since it was opened: again.
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(named("cannot open the sink directory", e)),
            }
        }
        Err(named(
            "cannot lock the sink directory",
            std::io::Error::other(format!(
                "it was removed and made again {LOCK_ATTEMPTS} times while it was being locked"
            )),
        ))
    }

    /// The locked directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid holding a `flock` on the file with inode `inode`, from `/proc/locks` (lines like
/// `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`); also names the drain holding a
/// state file (redb locks it with `flock`).
pub(crate) fn holder_pid(inode: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (kind, pid, dev) = (f.get(1)?, f.get(4)?, f.get(5)?);
        let ino: u64 = dev.rsplit(':').next()?.parse().ok()?;
        (*kind == "FLOCK" && ino == inode)
            .then(|| pid.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_directory_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let held = smol::block_on(DirLock::acquire(&out)).unwrap();
        // flock locks belong to the open file: a second open in this process conflicts too.
        match smol::block_on(DirLock::acquire(&out)) {
            Err(SinkError::Locked { dir, holder }) => {
                assert_eq!(dir, out);
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("{other:?}"),
        }
        drop(held);
        smol::block_on(DirLock::acquire(&out)).unwrap();
    }

    /// A lock dropped before anything was put in the directories it created removes them;
    /// a directory that existed before, or that holds something, stays.
    #[test]
    fn directories_the_lock_created_are_removed_while_empty() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a/b/out");
        drop(smol::block_on(DirLock::acquire(&out)).unwrap());
        assert!(!dir.path().join("a").exists());
        // Existed before: stays.
        std::fs::create_dir(dir.path().join("kept")).unwrap();
        drop(smol::block_on(DirLock::acquire(&dir.path().join("kept"))).unwrap());
        assert!(dir.path().join("kept").is_dir());
        // Holds something: stays, with its parents.
        let lock = smol::block_on(DirLock::acquire(&out)).unwrap();
        std::fs::create_dir(out.join("gw")).unwrap();
        drop(lock);
        assert!(out.join("gw").is_dir());
    }

    #[test]
    fn a_sink_path_that_is_a_file_is_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("afile");
        std::fs::write(&file, b"x").unwrap();
        let e = smol::block_on(DirLock::acquire(&file))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "cannot create the sink directory {}",
                file.display()
            )) && e.contains("File exists")
                && e.contains("is a file"),
            "{e}"
        );
    }
}

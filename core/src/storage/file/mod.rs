//! A flash partition kept in a preallocated image file, for the gateway on Linux and for
//! tools that inspect an image.
//!
//! The file holds the partition byte for byte (`capacity` bytes, offset 0 = address 0).
//! [`FileFlash`] keeps the [`Flash`] contract as strictly as the simulated flash does on the
//! points that catch engine bugs: writes must be word-aligned and may only target bytes that
//! read erased ([`FileFlashError::NotErased`]); an erase writes the erased value over the
//! block; [`Flash::sync`] is `fdatasync`. Reads and writes use positioned I/O, so the file
//! offset is never used.
//!
//! ## Storage errors and the page cache
//! Bytes that only the page cache holds are never trusted. On Linux a failed `fdatasync`
//! reports the writeback error once and leaves the pages it could not write in the page
//! cache marked clean: the next `fdatasync` succeeds, and a read in the same process, or in
//! a new process before a reboot, returns data that is not on disk. Hence:
//! - a write, erase or sync that fails poisons the open image: every later operation
//!   (reads included) fails with [`FileFlashError::Poisoned`], naming the path and the
//!   operation, until the value is dropped and the image opened again;
//! - [`FileFlash::open`] first `fdatasync`s the file, then drops its cached pages with
//!   `posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file, so that the mount reads
//!   what is on disk ([`FileFlash::open_read_only`] drops the clean pages without the
//!   sync). The advice is advisory: the
//!   kernel drops only pages that are clean, not under writeback, not mapped and not
//!   locked at that moment. After the `fdatasync` no page of the file is dirty or under
//!   writeback, the exclusive lock keeps other Spillway processes from writing or reading
//!   it, and Spillway never maps the file (it uses `pread`/`pwrite`), so every cached page,
//!   the clean pages a failed writeback left behind included, is dropped and the next read
//!   goes to the disk. (On systems without `posix_fadvise`, only the sync is done.)
//!
//! A new image is built aside and renamed into place ([`FileFlash::create_aside`],
//! [`FileFlash::install`]), so a crash or power cut while it is created never leaves a
//! partial image at its path; [`FileFlash::remove_aside`] clears what such a crash left.
//!
//! An image is opened by one process at a time: [`FileFlash::create`] and
//! [`FileFlash::open`] take an exclusive `flock` on the file (a second open fails with
//! [`FileFlashError::Locked`], in the same process too, since the lock belongs to the open
//! file); [`FileFlash::open_read_only`] takes a shared one.
//!
//! [`Flash`]: super::Flash
//! [`Flash::sync`]: super::Flash::sync

mod ahead;
mod ops;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::vec::Vec;

use super::Geometry;

/// Bytes written per system call when filling or erasing.
const CHUNK: usize = 64 * 1024;

/// Error of a [`FileFlash`] operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileFlashError {
    /// A system call on the image failed.
    #[error("cannot {op} flash image {}", path.display())]
    Io {
        /// What was being done ("create", "open", "lock", "read", "write", "erase", "sync",
        /// "drop cached pages of").
        op: &'static str,
        /// The image file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// Another open of the image holds its lock.
    #[error("flash image {} is in use (locked by another open)", path.display())]
    Locked {
        /// The image file.
        path: PathBuf,
    },
    /// The geometry fails [`Geometry::is_valid`].
    #[error("invalid flash geometry {geometry:?}")]
    InvalidGeometry {
        /// The rejected geometry.
        geometry: Geometry,
    },
    /// The image file's length is not a whole, nonzero number of erase blocks, or is 4 GiB
    /// or more.
    #[error("flash image {} is {len} bytes, not a multiple of the {erase_size}-byte erase block below 4 GiB", path.display())]
    BadLength {
        /// The image file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
        /// The erase size it was opened with, in bytes.
        erase_size: u32,
    },
    /// The range `addr .. addr + len` is not inside the image.
    #[error("range of {len} bytes at address {addr:#x} is outside the image")]
    OutOfBounds {
        /// Start of the range, in bytes.
        addr: u32,
        /// Length of the range in bytes.
        len: usize,
    },
    /// A write's address or length is not a multiple of `write_size`.
    #[error("write of {len} bytes at address {addr:#x} is not word-aligned")]
    Unaligned {
        /// Start of the write, in bytes.
        addr: u32,
        /// Length of the write in bytes.
        len: usize,
    },
    /// A write targets a byte that does not read erased (a word written twice without an
    /// erase). Nothing was written.
    #[error("byte at address {addr:#x} is not erased")]
    NotErased {
        /// Address of the first such byte.
        addr: u32,
    },
    /// The creation of an image was cancelled (see [`FileFlash::create_aside`]); the
    /// partly filled file was removed.
    #[error("creation of flash image {} cancelled", path.display())]
    Cancelled {
        /// The image that was being created.
        path: PathBuf,
    },
    /// The image was opened with [`FileFlash::open_read_only`].
    #[error("flash image is open read-only")]
    ReadOnly,
    /// An earlier write, erase or sync of this open image failed: what the file holds is
    /// not known (a failed `fdatasync` may have lost writes that the page cache still
    /// shows), so every later operation fails. Drop the value and open the image again,
    /// which re-reads it from disk.
    #[error("flash image {} is unusable after a failed {op}: reopen it", path.display())]
    Poisoned {
        /// The operation that failed first ("write", "erase" or "sync").
        op: &'static str,
        /// The image file.
        path: PathBuf,
    },
}

impl FileFlashError {
    /// [`FileFlashError::Io`]: `op` on the image at `path` failed with `source`.
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        FileFlashError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A flash partition in an image file. See the [module docs](self).
#[derive(Debug)]
pub struct FileFlash {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    writable: bool,
    /// `min(erase_size, CHUNK)` bytes of the erased value, for erases.
    erased_chunk: Vec<u8>,
    /// The first write, erase or sync that failed; every operation fails after it.
    failed: Option<&'static str>,
    /// Bytes read ahead for a sequential reader ([`ahead`]).
    ahead: ahead::ReadAhead,
}

impl FileFlash {
    /// Creates the image file `path` (it must not exist) atomically: the image is built
    /// aside ([`FileFlash::create_aside`]), then put in place ([`FileFlash::install`]), so
    /// `path` either does not exist or is a complete image of `capacity` bytes of the erased
    /// value. Opens it locked.
    ///
    /// # Errors
    /// As [`FileFlash::create_aside`] and [`FileFlash::install`].
    pub fn create(path: impl AsRef<Path>, geometry: Geometry) -> Result<Self, FileFlashError> {
        let path = path.as_ref();
        let mut flash = Self::create_aside(path, geometry, &AtomicBool::new(false))?;
        if let Err(e) = flash.install(path) {
            let aside = flash.path.clone();
            drop(flash);
            let _ = std::fs::remove_file(aside);
            return Err(e);
        }
        Ok(flash)
    }

    /// The path an image for `path` is built at before it is put in place: `.NAME.creating`
    /// in the same directory (so that the rename is atomic).
    pub fn aside_path(path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        let mut name = std::ffi::OsString::from(".");
        name.push(path.file_name().unwrap_or(path.as_os_str()));
        name.push(".creating");
        path.with_file_name(name)
    }

    /// First step of an atomic creation of the image `path` (which must not exist): creates
    /// the file [`FileFlash::aside_path`]`(path)`, locks it, fills it with
    /// `geometry.erased` to `geometry.capacity` bytes and syncs it. The returned flash works
    /// on that file; format it, then [`FileFlash::install`] it at `path`. Dropping it
    /// without installing leaves the file aside, for [`FileFlash::remove_aside`].
    ///
    /// `cancel` is checked between two chunks of the fill (64 KiB): once set, the file
    /// aside is removed and [`FileFlashError::Cancelled`] returned.
    ///
    /// # Errors
    /// [`FileFlashError::InvalidGeometry`]; [`FileFlashError::Io`] (op "create") if `path`
    /// exists or the file aside cannot be created, filled or synced (it is then removed);
    /// [`FileFlashError::Locked`] if another creation holds the file aside;
    /// [`FileFlashError::Cancelled`].
    pub fn create_aside(
        path: impl AsRef<Path>,
        geometry: Geometry,
        cancel: &AtomicBool,
    ) -> Result<Self, FileFlashError> {
        let path = path.as_ref();
        if !geometry.is_valid() {
            return Err(FileFlashError::InvalidGeometry { geometry });
        }
        let aside = Self::aside_path(path);
        let io = |source| FileFlashError::io("create", path, source);
        if path.symlink_metadata().is_ok() {
            return Err(io(io::Error::from(io::ErrorKind::AlreadyExists)));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&aside)
            .map_err(io)?;
        // Lock before touching the contents: a file aside that another process is filling
        // is never truncated or removed.
        let flash = Self::finish(file, &aside, geometry, true)?;
        let fill = || -> io::Result<bool> {
            flash.file.set_len(0)?;
            let chunk = std::vec![geometry.erased; CHUNK.min(geometry.capacity as usize)];
            let mut at = 0u64;
            while at < u64::from(geometry.capacity) {
                if cancel.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                let n = chunk
                    .len()
                    .min((u64::from(geometry.capacity) - at) as usize);
                flash.file.write_all_at(&chunk[..n], at)?;
                at += n as u64;
            }
            flash.file.sync_all()?;
            Ok(true)
        };
        match fill() {
            Ok(true) => Ok(flash),
            Ok(false) => {
                drop(flash);
                let _ = std::fs::remove_file(&aside);
                Err(FileFlashError::Cancelled {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => {
                drop(flash);
                let _ = std::fs::remove_file(&aside);
                Err(io(e))
            }
        }
    }

    /// Second step of an atomic creation: syncs the image built aside, renames it to `path`
    /// (which must not exist) and syncs the directory, so that after a power cut `path`
    /// is either absent or this whole image. The flash stays open and locked, now at `path`.
    ///
    /// # Errors
    /// [`FileFlashError::Io`] (op "install") if `path` exists or the sync, the rename or
    /// the directory sync fails.
    pub fn install(&mut self, path: impl AsRef<Path>) -> Result<(), FileFlashError> {
        let path = path.as_ref();
        let io = |source| FileFlashError::io("install", path, source);
        if path.symlink_metadata().is_ok() {
            return Err(io(io::Error::from(io::ErrorKind::AlreadyExists)));
        }
        self.file.sync_all().map_err(io)?;
        std::fs::rename(&self.path, path).map_err(io)?;
        self.path = path.to_path_buf();
        sync_parent_dir(path).map_err(io)
    }

    /// Removes the file an interrupted creation of `path` left aside (see
    /// [`FileFlash::create_aside`]), and syncs the directory. Returns whether there was one.
    ///
    /// # Errors
    /// [`FileFlashError::Locked`] if a creation in progress holds it;
    /// [`FileFlashError::Io`] (op "remove") if it cannot be opened or removed.
    pub fn remove_aside(path: impl AsRef<Path>) -> Result<bool, FileFlashError> {
        let aside = Self::aside_path(path);
        let io = |source| FileFlashError::io("remove", &aside, source);
        let file = match OpenOptions::new().read(true).write(true).open(&aside) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(FileFlashError::Locked { path: aside }),
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        std::fs::remove_file(&aside).map_err(io)?;
        drop(file);
        sync_parent_dir(&aside).map_err(io)?;
        Ok(true)
    }

    /// Opens the existing image `path` for reading and writing, with the given erase size and
    /// write size (bytes) and erased value; the capacity is the file's length. Takes an
    /// exclusive lock on the file. Then `fdatasync`s the file and drops its cached pages, so
    /// that what is read afterwards is what the disk holds (see the
    /// [module docs](self#storage-errors-and-the-page-cache)).
    ///
    /// # Errors
    /// [`FileFlashError::Io`] if the file cannot be opened or its length read, or (op
    /// "sync", "drop cached pages of") if the sync or the cache drop fails;
    /// [`FileFlashError::Locked`] if another open holds the lock;
    /// [`FileFlashError::BadLength`] if the length is not a nonzero multiple of `erase_size`
    /// below 4 GiB; [`FileFlashError::InvalidGeometry`] if the sizes fail
    /// [`Geometry::is_valid`].
    pub fn open(
        path: impl AsRef<Path>,
        erase_size: u32,
        write_size: u32,
        erased: u8,
    ) -> Result<Self, FileFlashError> {
        Self::open_with(path.as_ref(), erase_size, write_size, erased, true)
    }

    /// Opens the existing image `path` read-only, for inspection: writes, erases and syncs
    /// fail with [`FileFlashError::ReadOnly`]. Takes a shared lock, so it fails while a
    /// writer has the image open (and keeps writers out while it is open). Like
    /// [`open`](Self::open), it drops the file's clean cached pages first, so that it shows
    /// what the disk holds; it never writes, so it does not sync (pages a writer that has
    /// ended left dirty are writes still on their way to the disk, and are shown).
    ///
    /// # Errors
    /// As [`open`](Self::open), without its sync.
    pub fn open_read_only(
        path: impl AsRef<Path>,
        erase_size: u32,
        write_size: u32,
        erased: u8,
    ) -> Result<Self, FileFlashError> {
        Self::open_with(path.as_ref(), erase_size, write_size, erased, false)
    }

    /// The image file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_with(
        path: &Path,
        erase_size: u32,
        write_size: u32,
        erased: u8,
        writable: bool,
    ) -> Result<Self, FileFlashError> {
        let io = |op, source| FileFlashError::io(op, path, source);
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("open", e))?.len();
        let bad_length = FileFlashError::BadLength {
            path: path.to_path_buf(),
            len,
            erase_size,
        };
        let capacity = u32::try_from(len).map_err(|_| bad_length)?;
        let geometry = Geometry {
            erase_size,
            write_size,
            capacity,
            erased,
        };
        if erase_size != 0 && (capacity == 0 || !capacity.is_multiple_of(erase_size)) {
            return Err(FileFlashError::BadLength {
                path: path.to_path_buf(),
                len,
                erase_size,
            });
        }
        if !geometry.is_valid() {
            return Err(FileFlashError::InvalidGeometry { geometry });
        }
        let flash = Self::finish(file, path, geometry, writable)?;
        Self::drop_cached_pages(&flash.file, path, writable)?;
        Ok(flash)
    }

    /// Locks the open image and builds the value.
    fn finish(
        file: File,
        path: &Path,
        geometry: Geometry,
        writable: bool,
    ) -> Result<Self, FileFlashError> {
        let locked = if writable {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(FileFlashError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(TryLockError::Error(source)) => {
                return Err(FileFlashError::io("lock", path, source));
            }
        }
        let erased_chunk = if writable {
            std::vec![geometry.erased; CHUNK.min(geometry.erase_size as usize)]
        } else {
            Vec::new()
        };
        Ok(Self {
            file,
            path: path.to_path_buf(),
            geometry,
            writable,
            erased_chunk,
            failed: None,
            ahead: ahead::ReadAhead::default(),
        })
    }

    /// Syncs the file (if `sync`) and drops its cached pages (see the
    /// [module docs](self#storage-errors-and-the-page-cache)), under the lock.
    fn drop_cached_pages(file: &File, path: &Path, sync: bool) -> Result<(), FileFlashError> {
        let io = |op, source| FileFlashError::io(op, path, source);
        if sync {
            file.sync_data().map_err(|e| io("sync", e))?;
        }
        #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
        rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| io("drop cached pages of", e.into()))?;
        Ok(())
    }

    /// Fails if an earlier write, erase or sync failed.
    fn check_poisoned(&self) -> Result<(), FileFlashError> {
        match self.failed {
            Some(op) => Err(FileFlashError::Poisoned {
                op,
                path: self.path.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Maps a failed write, erase or sync to its error and poisons the open image.
    fn fail(&mut self, op: &'static str, source: io::Error) -> FileFlashError {
        self.failed = Some(op);
        self.io(op, source)
    }

    fn io(&self, op: &'static str, source: io::Error) -> FileFlashError {
        FileFlashError::io(op, &self.path, source)
    }

    fn check_range(&self, addr: u32, len: usize) -> Result<(), FileFlashError> {
        super::range_end(addr, len, self.geometry.capacity)
            .map(|_| ())
            .ok_or(FileFlashError::OutOfBounds { addr, len })
    }
}

/// Makes the directory entry of a newly created `path` durable.
fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

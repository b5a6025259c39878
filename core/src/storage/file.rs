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
//! An image is opened by one process at a time: [`FileFlash::create`] and
//! [`FileFlash::open`] take an exclusive `flock` on the file (a second open fails with
//! [`FileFlashError::Locked`], in the same process too, since the lock belongs to the open
//! file); [`FileFlash::open_read_only`] takes a shared one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::vec::Vec;

use super::{Flash, Geometry};

/// Bytes written per system call when filling or erasing.
const CHUNK: usize = 64 * 1024;

/// Error of a [`FileFlash`] operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileFlashError {
    /// A system call on the image failed.
    #[error("cannot {op} flash image {}", path.display())]
    Io {
        /// What was being done ("create", "open", "lock", "read", "write", "erase", "sync").
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
    /// The image was opened with [`FileFlash::open_read_only`].
    #[error("flash image is open read-only")]
    ReadOnly,
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
}

impl FileFlash {
    /// Creates the image file `path` (it must not exist), fills it with `geometry.erased` to
    /// `geometry.capacity` bytes, makes the file and its directory entry durable, and opens it
    /// locked.
    ///
    /// # Errors
    /// [`FileFlashError::InvalidGeometry`]; [`FileFlashError::Io`] (op "create") if the file
    /// exists or cannot be created, filled or synced (a partly filled file is removed).
    pub fn create(path: impl AsRef<Path>, geometry: Geometry) -> Result<Self, FileFlashError> {
        let path = path.as_ref();
        if !geometry.is_valid() {
            return Err(FileFlashError::InvalidGeometry { geometry });
        }
        let io = |source| FileFlashError::Io {
            op: "create",
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(io)?;
        let fill = || -> io::Result<()> {
            let chunk = std::vec![geometry.erased; CHUNK.min(geometry.capacity as usize)];
            let mut at = 0u64;
            while at < u64::from(geometry.capacity) {
                let n = chunk
                    .len()
                    .min((u64::from(geometry.capacity) - at) as usize);
                file.write_all_at(&chunk[..n], at)?;
                at += n as u64;
            }
            file.sync_all()?;
            sync_parent_dir(path)
        };
        if let Err(e) = fill() {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(io(e));
        }
        Self::finish(file, path, geometry, true)
    }

    /// Opens the existing image `path` for reading and writing, with the given erase size and
    /// write size (bytes) and erased value; the capacity is the file's length. Takes an
    /// exclusive lock on the file.
    ///
    /// # Errors
    /// [`FileFlashError::Io`] if the file cannot be opened or its length read;
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
    /// writer has the image open (and keeps writers out while it is open).
    ///
    /// # Errors
    /// As [`open`](Self::open).
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
        let io = |op, source| FileFlashError::Io {
            op,
            path: path.to_path_buf(),
            source,
        };
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
        Self::finish(file, path, geometry, writable)
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
                return Err(FileFlashError::Io {
                    op: "lock",
                    path: path.to_path_buf(),
                    source,
                });
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
        })
    }

    fn io(&self, op: &'static str, source: io::Error) -> FileFlashError {
        FileFlashError::Io {
            op,
            path: self.path.clone(),
            source,
        }
    }

    fn check_range(&self, addr: u32, len: usize) -> Result<(), FileFlashError> {
        u32::try_from(len)
            .ok()
            .and_then(|len| addr.checked_add(len))
            .filter(|&end| end <= self.geometry.capacity)
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

impl Flash for FileFlash {
    type Error = FileFlashError;

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Reads `buf.len()` bytes at `addr`, any alignment.
    ///
    /// # Errors
    /// [`FileFlashError::OutOfBounds`]; [`FileFlashError::Io`] (op "read").
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), FileFlashError> {
        self.check_range(addr, buf.len())?;
        self.file
            .read_exact_at(buf, u64::from(addr))
            .map_err(|e| self.io("read", e))
    }

    /// Programs `data` at `addr` after checking that every target byte reads erased.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::OutOfBounds`];
    /// [`FileFlashError::Unaligned`]; [`FileFlashError::NotErased`] (nothing written);
    /// [`FileFlashError::Io`] (op "read" or "write").
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        self.check_range(addr, data.len())?;
        let ws = self.geometry.write_size as usize;
        if !(addr as usize).is_multiple_of(ws) || !data.len().is_multiple_of(ws) {
            return Err(FileFlashError::Unaligned {
                addr,
                len: data.len(),
            });
        }
        let mut current = [0u8; 512];
        let mut at = addr;
        for part in data.chunks(current.len()) {
            let current = &mut current[..part.len()];
            self.read(at, current)?;
            if let Some(i) = current.iter().position(|&b| b != self.geometry.erased) {
                return Err(FileFlashError::NotErased {
                    addr: at + i as u32,
                });
            }
            at += part.len() as u32;
        }
        self.file
            .write_all_at(data, u64::from(addr))
            .map_err(|e| self.io("write", e))
    }

    /// Erases block `block` by writing the erased value over it.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::OutOfBounds`] if there is no such
    /// block; [`FileFlashError::Io`] (op "erase").
    fn erase(&mut self, block: u32) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        let size = self.geometry.erase_size;
        let start = block.saturating_mul(size);
        if block >= self.geometry.blocks() {
            return Err(FileFlashError::OutOfBounds {
                addr: start,
                len: size as usize,
            });
        }
        let end = u64::from(start) + u64::from(size);
        let mut at = u64::from(start);
        while at < end {
            let n = self.erased_chunk.len().min((end - at) as usize);
            self.file
                .write_all_at(&self.erased_chunk[..n], at)
                .map_err(|e| self.io("erase", e))?;
            at += n as u64;
        }
        Ok(())
    }

    /// `fdatasync`: every completed write and erase survives a crash of the machine.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::Io`] (op "sync").
    fn sync(&mut self) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        self.file.sync_data().map_err(|e| self.io("sync", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    const G: Geometry = Geometry {
        erase_size: 4096,
        write_size: 8,
        capacity: 4 * 4096,
        erased: 0xFF,
    };

    fn image_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("flash.img")
    }

    #[test]
    fn create_fills_with_the_erased_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = image_path(&dir);
        for erased in [0xFF, 0x00] {
            let _ = std::fs::remove_file(&path);
            let g = Geometry { erased, ..G };
            let flash = FileFlash::create(&path, g).unwrap();
            assert_eq!(flash.geometry(), g);
            drop(flash);
            let raw = std::fs::read(&path).unwrap();
            assert_eq!(raw.len(), G.capacity as usize);
            assert!(raw.iter().all(|&b| b == erased));
        }
    }

    #[test]
    fn create_refuses_an_existing_file_and_a_bad_geometry() {
        let dir = tempfile::tempdir().unwrap();
        let path = image_path(&dir);
        std::fs::write(&path, b"precious").unwrap();
        assert!(matches!(
            FileFlash::create(&path, G),
            Err(FileFlashError::Io { op: "create", .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        let bad = Geometry {
            capacity: 4095,
            ..G
        };
        assert!(matches!(
            FileFlash::create(dir.path().join("other.img"), bad),
            Err(FileFlashError::InvalidGeometry { .. })
        ));
    }

    #[test]
    fn write_read_erase_sync_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = image_path(&dir);
        let mut flash = FileFlash::create(&path, G).unwrap();
        flash.write(4096 + 8, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        flash.sync().unwrap();
        let mut buf = [0u8; 10];
        flash.read(4096 + 7, &mut buf).unwrap();
        assert_eq!(buf, [0xFF, 1, 2, 3, 4, 5, 6, 7, 8, 0xFF]);
        drop(flash);

        let mut flash = FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
        assert_eq!(flash.geometry(), G);
        assert_eq!(flash.path(), path);
        let mut word = [0u8; 8];
        flash.read(4096 + 8, &mut word).unwrap();
        assert_eq!(word, [1, 2, 3, 4, 5, 6, 7, 8]);
        flash.erase(1).unwrap();
        flash.read(4096 + 8, &mut word).unwrap();
        assert_eq!(word, [0xFF; 8]);
        flash.write(4096 + 8, &[0; 8]).unwrap();
    }

    #[test]
    fn rejects_bad_requests() {
        let dir = tempfile::tempdir().unwrap();
        let mut flash = FileFlash::create(image_path(&dir), G).unwrap();
        assert!(matches!(
            flash.write(4, &[0; 8]),
            Err(FileFlashError::Unaligned { addr: 4, len: 8 })
        ));
        assert!(matches!(
            flash.write(0, &[0; 12]),
            Err(FileFlashError::Unaligned { addr: 0, len: 12 })
        ));
        assert!(matches!(
            flash.write(G.capacity, &[0; 8]),
            Err(FileFlashError::OutOfBounds { .. })
        ));
        let mut buf = [0u8; 2];
        assert!(matches!(
            flash.read(G.capacity - 1, &mut buf),
            Err(FileFlashError::OutOfBounds { .. })
        ));
        assert!(matches!(
            flash.read(u32::MAX, &mut buf),
            Err(FileFlashError::OutOfBounds { .. })
        ));
        assert!(matches!(
            flash.erase(4),
            Err(FileFlashError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn not_erased_guard_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut flash = FileFlash::create(image_path(&dir), G).unwrap();
        flash.write(16, &[0xAB; 8]).unwrap();
        // A write covering an erased word and the programmed one is refused whole.
        let err = flash.write(8, &[0; 16]).unwrap_err();
        assert!(
            matches!(err, FileFlashError::NotErased { addr: 16 }),
            "{err:?}"
        );
        let mut buf = [0u8; 16];
        flash.read(8, &mut buf).unwrap();
        assert_eq!(&buf[..8], &[0xFF; 8]);
        assert_eq!(&buf[8..], &[0xAB; 8]);
        // A long write past the 512-byte check window finds a programmed byte far in.
        flash.write(2048, &[0x01; 8]).unwrap();
        let err = flash.write(1024, &[0; 2048]).unwrap_err();
        assert!(
            matches!(err, FileFlashError::NotErased { addr: 2048 }),
            "{err:?}"
        );
    }

    #[test]
    fn a_second_open_is_refused_while_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = image_path(&dir);
        let flash = FileFlash::create(&path, G).unwrap();
        let err = FileFlash::open(&path, 4096, 8, 0xFF).unwrap_err();
        assert!(matches!(err, FileFlashError::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains("in use"));
        assert!(matches!(
            FileFlash::open_read_only(&path, 4096, 8, 0xFF),
            Err(FileFlashError::Locked { .. })
        ));
        drop(flash);

        // Readers share; a writer waits for them.
        let mut r1 = FileFlash::open_read_only(&path, 4096, 8, 0xFF).unwrap();
        let _r2 = FileFlash::open_read_only(&path, 4096, 8, 0xFF).unwrap();
        assert!(matches!(
            FileFlash::open(&path, 4096, 8, 0xFF),
            Err(FileFlashError::Locked { .. })
        ));
        let mut buf = [0u8; 4];
        r1.read(0, &mut buf).unwrap();
        assert!(matches!(
            r1.write(0, &[0; 8]),
            Err(FileFlashError::ReadOnly)
        ));
        assert!(matches!(r1.erase(0), Err(FileFlashError::ReadOnly)));
        assert!(matches!(r1.sync(), Err(FileFlashError::ReadOnly)));
    }

    #[test]
    fn open_checks_the_length_and_geometry() {
        let dir = tempfile::tempdir().unwrap();
        let path = image_path(&dir);
        std::fs::write(&path, [0xFFu8; 4096 + 100]).unwrap();
        assert!(matches!(
            FileFlash::open(&path, 4096, 8, 0xFF),
            Err(FileFlashError::BadLength {
                len: 4196,
                erase_size: 4096,
                ..
            })
        ));
        std::fs::write(&path, []).unwrap();
        assert!(matches!(
            FileFlash::open(&path, 4096, 8, 0xFF),
            Err(FileFlashError::BadLength { len: 0, .. })
        ));
        std::fs::write(&path, [0xFFu8; 4096]).unwrap();
        assert!(matches!(
            FileFlash::open(&path, 4096, 3, 0xFF),
            Err(FileFlashError::InvalidGeometry { .. })
        ));
        assert!(matches!(
            FileFlash::open(&path, 0, 8, 0xFF),
            Err(FileFlashError::InvalidGeometry { .. })
        ));
        assert!(matches!(
            FileFlash::open(dir.path().join("missing.img"), 4096, 8, 0xFF),
            Err(FileFlashError::Io { op: "open", .. })
        ));
        FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
    }
}

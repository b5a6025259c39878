//! The [`Flash`] operations on the image file: positioned reads and writes, erases that
//! write the erased value over a block, `fdatasync`; a failed write, erase or sync poisons
//! the open image.

use std::os::unix::fs::FileExt;

use super::ahead::WINDOW;
use super::{FileFlash, FileFlashError};
use crate::storage::{Flash, Geometry};

impl Flash for FileFlash {
    type Error = FileFlashError;

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Reads `buf.len()` bytes at `addr`, any alignment.
    ///
    /// # Errors
    /// [`FileFlashError::Poisoned`] after a failed write, erase or sync;
    /// [`FileFlashError::OutOfBounds`]; [`FileFlashError::Io`] (op "read").
    /// A read that goes on from the previous one reads up to 64 KiB ahead at once and
    /// the next reads are served from those bytes, dropped when a write or erase touches
    /// them (module `storage::file::ahead`).
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), FileFlashError> {
        self.check_poisoned()?;
        self.check_range(addr, buf.len())?;
        // In range: `addr + buf.len() <= capacity`.
        let end = addr + buf.len() as u32;
        if let Some(held) = self.ahead.get(addr, buf.len()) {
            buf.copy_from_slice(held);
        } else if self.ahead.sequential(addr, buf.len()) {
            let len = WINDOW.min((self.geometry.capacity - addr) as usize);
            let window = self.ahead.refill(addr, len);
            if let Err(e) = self.file.read_exact_at(window, u64::from(addr)) {
                self.ahead.failed();
                return Err(self.io("read", e));
            }
            buf.copy_from_slice(&window[..buf.len()]);
        } else {
            self.read_direct(addr, buf)?;
        }
        self.ahead.ended(end);
        Ok(())
    }

    /// Programs `data` at `addr` after checking that every target byte reads erased.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::OutOfBounds`];
    /// [`FileFlashError::Unaligned`]; [`FileFlashError::NotErased`] (nothing written);
    /// [`FileFlashError::Io`] (op "read" or "write"; a failed write poisons the image);
    /// [`FileFlashError::Poisoned`] after a failed write, erase or sync.
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        self.check_poisoned()?;
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
            self.read_direct(at, current)?;
            if let Some(i) = current.iter().position(|&b| b != self.geometry.erased) {
                return Err(FileFlashError::NotErased {
                    addr: at + i as u32,
                });
            }
            at += part.len() as u32;
        }
        self.ahead.invalidate(addr, data.len() as u64);
        self.file
            .write_all_at(data, u64::from(addr))
            .map_err(|e| self.fail("write", e))
    }

    /// Erases block `block` by writing the erased value over it.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::OutOfBounds`] if there is no such
    /// block; [`FileFlashError::Io`] (op "erase"; it poisons the image);
    /// [`FileFlashError::Poisoned`] after a failed write, erase or sync.
    fn erase(&mut self, block: u32) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        self.check_poisoned()?;
        let size = self.geometry.erase_size;
        let start = block.saturating_mul(size);
        if block >= self.geometry.blocks() {
            return Err(FileFlashError::OutOfBounds {
                addr: start,
                len: size as usize,
            });
        }
        self.ahead.invalidate(start, u64::from(size));
        let end = u64::from(start) + u64::from(size);
        let mut at = u64::from(start);
        while at < end {
            let n = self.erased_chunk.len().min((end - at) as usize);
            if let Err(e) = self.file.write_all_at(&self.erased_chunk[..n], at) {
                return Err(self.fail("erase", e));
            }
            at += n as u64;
        }
        Ok(())
    }

    /// `fdatasync`: every completed write and erase survives a crash of the machine.
    ///
    /// # Errors
    /// [`FileFlashError::ReadOnly`]; [`FileFlashError::Io`] (op "sync"; it poisons the
    /// image: the writes since the last successful sync may be lost though they read back);
    /// [`FileFlashError::Poisoned`] after a failed write, erase or sync.
    fn sync(&mut self) -> Result<(), FileFlashError> {
        if !self.writable {
            return Err(FileFlashError::ReadOnly);
        }
        self.check_poisoned()?;
        self.file.sync_data().map_err(|e| self.fail("sync", e))
    }
}

impl FileFlash {
    /// `pread` of `buf.len()` bytes at `addr` (checked in range by the caller), past the
    /// read-ahead window.
    fn read_direct(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), FileFlashError> {
        self.file
            .read_exact_at(buf, u64::from(addr))
            .map_err(|e| self.io("read", e))
    }
}

//! A plain NOR flash in RAM behind the `embedded-storage` traits (blocking and async), with
//! operation counters: the storage the core benchmark gives to the peer queue.
//!
//! Geometry: erase blocks of [`ERASE_SIZE`] bytes, words of `WS` bytes, reads of any byte
//! range (`READ_SIZE` 1), erased value 0xFF. A write ANDs the data into memory (bits only go
//! from 1 to 0), which is also the `MultiwriteNorFlash` contract; it does not refuse a second
//! write to a word, since the peer relies on that contract to mark items popped.

use std::cell::Cell;
use std::rc::Rc;

use embedded_storage::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

/// Erase block size of every [`RamNor`], bytes.
pub const ERASE_SIZE: usize = 4096;

/// Operation counters of a [`RamNor`] (only operations that passed their checks count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NorCounters {
    /// Read calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Write calls.
    pub writes: u64,
    /// Bytes programmed.
    pub bytes_written: u64,
    /// Erase blocks erased.
    pub erases: u64,
}

/// Error of a [`RamNor`] operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamNorError {
    /// The range `addr .. addr + len` is outside the flash.
    OutOfBounds {
        /// Start of the range, bytes.
        addr: u32,
        /// Length of the range, bytes.
        len: usize,
    },
    /// A write or erase is not aligned to its unit.
    NotAligned {
        /// Start of the request, bytes.
        addr: u32,
        /// Length of the request, bytes.
        len: usize,
    },
}

impl NorFlashError for RamNorError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            RamNorError::OutOfBounds { .. } => NorFlashErrorKind::OutOfBounds,
            RamNorError::NotAligned { .. } => NorFlashErrorKind::NotAligned,
        }
    }
}

/// NOR flash in RAM with `WS`-byte words. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct RamNor<const WS: usize> {
    mem: Vec<u8>,
    counters: NorCounters,
    /// A copy of `counters` kept up to date for whoever holds the other end (see
    /// [`RamNor::shared_counters`]).
    shared: Option<Rc<Cell<NorCounters>>>,
}

impl<const WS: usize> RamNor<WS> {
    /// A fully erased flash of `capacity` bytes (a multiple of [`ERASE_SIZE`]).
    ///
    /// # Panics
    /// If `capacity` is not a nonzero multiple of [`ERASE_SIZE`].
    pub fn new(capacity: usize) -> Self {
        Self::from_image(vec![0xFF; capacity])
    }

    /// A flash holding `image` (its length a nonzero multiple of [`ERASE_SIZE`]).
    ///
    /// # Panics
    /// If the length of `image` is not a nonzero multiple of [`ERASE_SIZE`].
    pub fn from_image(image: Vec<u8>) -> Self {
        assert!(
            !image.is_empty() && image.len().is_multiple_of(ERASE_SIZE),
            "capacity must be a nonzero multiple of the erase size"
        );
        RamNor {
            mem: image,
            counters: NorCounters::default(),
            shared: None,
        }
    }

    /// The flash contents.
    pub fn image(&self) -> &[u8] {
        &self.mem
    }

    /// Gives the contents back.
    pub fn into_image(self) -> Vec<u8> {
        self.mem
    }

    /// The operation counters.
    pub fn counters(&self) -> NorCounters {
        self.counters
    }

    /// Zeroes the operation counters.
    pub fn reset_counters(&mut self) {
        self.counters = NorCounters::default();
        self.publish();
    }

    /// A cell that holds this flash's counters after every operation from now on: readable
    /// while the flash itself is borrowed by a storage engine that gives no access to it.
    pub fn shared_counters(&mut self) -> Rc<Cell<NorCounters>> {
        let cell = Rc::new(Cell::new(self.counters));
        self.shared = Some(cell.clone());
        cell
    }

    fn publish(&self) {
        if let Some(c) = &self.shared {
            c.set(self.counters);
        }
    }

    fn range(&self, addr: u32, len: usize) -> Result<core::ops::Range<usize>, RamNorError> {
        let start = addr as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.mem.len() => Ok(start..end),
            _ => Err(RamNorError::OutOfBounds { addr, len }),
        }
    }

    fn do_read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), RamNorError> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.mem[r]);
        self.counters.reads += 1;
        self.counters.bytes_read += buf.len() as u64;
        self.publish();
        Ok(())
    }

    fn do_write(&mut self, addr: u32, data: &[u8]) -> Result<(), RamNorError> {
        let r = self.range(addr, data.len())?;
        if !(addr as usize).is_multiple_of(WS) || !data.len().is_multiple_of(WS) {
            return Err(RamNorError::NotAligned {
                addr,
                len: data.len(),
            });
        }
        for (m, d) in self.mem[r].iter_mut().zip(data) {
            *m &= *d;
        }
        self.counters.writes += 1;
        self.counters.bytes_written += data.len() as u64;
        self.publish();
        Ok(())
    }

    fn do_erase(&mut self, from: u32, to: u32) -> Result<(), RamNorError> {
        let len = to.saturating_sub(from) as usize;
        let r = self.range(from, len)?;
        if to < from
            || !(from as usize).is_multiple_of(ERASE_SIZE)
            || !len.is_multiple_of(ERASE_SIZE)
        {
            return Err(RamNorError::NotAligned { addr: from, len });
        }
        self.mem[r].fill(0xFF);
        self.counters.erases += (len / ERASE_SIZE) as u64;
        self.publish();
        Ok(())
    }
}

impl<const WS: usize> ErrorType for RamNor<WS> {
    type Error = RamNorError;
}

impl<const WS: usize> ReadNorFlash for RamNor<WS> {
    const READ_SIZE: usize = 1;

    fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.do_read(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.mem.len()
    }
}

impl<const WS: usize> NorFlash for RamNor<WS> {
    const WRITE_SIZE: usize = WS;
    const ERASE_SIZE: usize = ERASE_SIZE;

    fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        self.do_erase(from, to)
    }

    fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        self.do_write(offset, bytes)
    }
}

impl<const WS: usize> MultiwriteNorFlash for RamNor<WS> {}

impl<const WS: usize> embedded_storage_async::nor_flash::ReadNorFlash for RamNor<WS> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.do_read(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.mem.len()
    }
}

impl<const WS: usize> embedded_storage_async::nor_flash::NorFlash for RamNor<WS> {
    const WRITE_SIZE: usize = WS;
    const ERASE_SIZE: usize = ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        self.do_erase(from, to)
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        self.do_write(offset, bytes)
    }
}

impl<const WS: usize> embedded_storage_async::nor_flash::MultiwriteNorFlash for RamNor<WS> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_erases_and_counts() {
        let mut f = RamNor::<4>::new(2 * ERASE_SIZE);
        NorFlash::write(&mut f, 8, &[0xF0, 0x0F, 0xFF, 0x00]).unwrap();
        NorFlash::write(&mut f, 8, &[0x3C; 4]).unwrap();
        assert_eq!(&f.image()[8..12], &[0x30, 0x0C, 0x3C, 0x00]);
        assert_eq!(
            NorFlash::write(&mut f, 2, &[0; 4]),
            Err(RamNorError::NotAligned { addr: 2, len: 4 })
        );
        let mut buf = [0u8; 3];
        ReadNorFlash::read(&mut f, 9, &mut buf).unwrap();
        assert_eq!(buf, [0x0C, 0x3C, 0x00]);
        assert!(matches!(
            ReadNorFlash::read(&mut f, 8190, &mut buf),
            Err(RamNorError::OutOfBounds { .. })
        ));
        NorFlash::erase(&mut f, 0, ERASE_SIZE as u32).unwrap();
        assert!(f.image().iter().all(|&b| b == 0xFF));
        assert_eq!(
            f.counters(),
            NorCounters {
                reads: 1,
                bytes_read: 3,
                writes: 2,
                bytes_written: 8,
                erases: 1,
            }
        );
    }
}

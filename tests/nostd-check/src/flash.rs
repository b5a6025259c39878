//! A NOR flash in RAM behind the `embedded-storage` traits, as a HAL driver would provide:
//! 4-byte words, 4 KiB erase blocks, erased bytes read 0xFF, programming only clears bits,
//! and a word is programmed at most once between erases (a second program is refused, so
//! the check also proves the log never writes a word twice).

use embedded_storage::nor_flash::{
    ErrorType, NorFlash, NorFlashErrorKind, ReadNorFlash, check_erase, check_read, check_write,
};

/// Erase blocks of the partition.
pub const BLOCKS: usize = 8;
/// Erase block size, bytes.
pub const ERASE_SIZE: usize = 4096;
/// Write granularity, bytes.
pub const WRITE_SIZE: usize = 4;
/// Partition size, bytes.
pub const CAPACITY: usize = BLOCKS * ERASE_SIZE;

/// The RAM flash. Starts out all zero (not erased): the log must erase before it writes.
pub struct RamFlash {
    mem: [u8; CAPACITY],
    /// Words programmed since the last erase of their block.
    written: [bool; CAPACITY / WRITE_SIZE],
    /// Program operations refused because a word was programmed twice.
    pub double_writes: u32,
}

impl RamFlash {
    /// A flash full of zeroes.
    pub const fn new() -> Self {
        RamFlash {
            mem: [0; CAPACITY],
            written: [false; CAPACITY / WRITE_SIZE],
            double_writes: 0,
        }
    }
}

impl ErrorType for RamFlash {
    type Error = NorFlashErrorKind;
}

impl ReadNorFlash for RamFlash {
    const READ_SIZE: usize = 1;

    fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        check_read(self, offset, bytes.len())?;
        let at = offset as usize;
        bytes.copy_from_slice(&self.mem[at..at + bytes.len()]);
        Ok(())
    }

    fn capacity(&self) -> usize {
        CAPACITY
    }
}

impl NorFlash for RamFlash {
    const WRITE_SIZE: usize = WRITE_SIZE;
    const ERASE_SIZE: usize = ERASE_SIZE;

    fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        check_erase(self, from, to)?;
        let (from, to) = (from as usize, to as usize);
        self.mem[from..to].fill(0xFF);
        self.written[from / WRITE_SIZE..to / WRITE_SIZE].fill(false);
        Ok(())
    }

    fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        check_write(self, offset, bytes.len())?;
        let at = offset as usize;
        let words = at / WRITE_SIZE..(at + bytes.len()) / WRITE_SIZE;
        if self.written[words.clone()].iter().any(|&w| w) {
            self.double_writes += 1;
            return Err(NorFlashErrorKind::Other);
        }
        self.written[words].fill(true);
        for (m, b) in self.mem[at..at + bytes.len()].iter_mut().zip(bytes) {
            *m &= *b;
        }
        Ok(())
    }
}

//! Flash storage seen by the log: one partition with its geometry known at run time.
//!
//! The contract is the base contract of `embedded_storage::nor_flash::NorFlash`, with the
//! geometry passed as values rather than constants so that one log type serves a HAL's flash,
//! a simulated flash and a flash image file:
//!
//! - the partition is `capacity` bytes long, made of erase blocks of `erase_size` bytes;
//! - [`Flash::erase`] sets every byte of one erase block to `erased` (0xFF on NOR flash);
//! - [`Flash::write`] programs whole words of `write_size` bytes at word-aligned addresses, and
//!   a word is programmed at most once between two erases of its block (no multiwrite);
//! - [`Flash::read`] reads any byte range (an adapter with a larger read size bounces);
//! - [`Flash::sync`] returns once everything written before it survives a power cut.
//!
//! A cut during a write may leave the word(s) being written with any subset of their
//! programmed bits done; a cut during an erase may leave the block with any content.
//! The log is built to recover from both.

#[cfg(feature = "std")]
pub mod file;
pub mod nor;
#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "std")]
pub use file::{FileFlash, FileFlashError};
pub use nor::{MAX_READ_SIZE, NorFlashAdapter, NorFlashAdapterError};
#[cfg(feature = "sim")]
pub use sim::{EraseTear, SimCounters, SimError, SimFaults, SimFlash};

/// Geometry of a flash partition. All sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Geometry {
    /// Size of the smallest erasable unit, in bytes (a power of two, at least 256).
    pub erase_size: u32,
    /// Write granularity in bytes: writes start at multiples of it and are multiples of it
    /// long (a power of two from 1 to 32).
    pub write_size: u32,
    /// Partition length in bytes (a multiple of `erase_size`).
    pub capacity: u32,
    /// The value every byte reads after an erase (0xFF on NOR flash).
    pub erased: u8,
}

impl Geometry {
    /// Number of erase blocks in the partition.
    pub const fn blocks(&self) -> u32 {
        self.capacity / self.erase_size
    }

    /// Checks the sizes the log relies on: powers of two, `write_size` in 1..=32,
    /// `erase_size` ≥ 256, `capacity` a multiple of `erase_size`.
    pub fn is_valid(&self) -> bool {
        self.erase_size.is_power_of_two()
            && self.erase_size >= 256
            && self.write_size.is_power_of_two()
            && self.write_size <= 32
            && self.capacity.is_multiple_of(self.erase_size)
            && self.capacity > 0
    }
}

/// The end of the byte range `addr .. addr + len` if it lies within the first `capacity`
/// bytes of a partition; `None` if it does not (a range that would pass 4 GiB included).
/// The bounds check of every [`Flash`] here.
fn range_end(addr: u32, len: usize, capacity: u32) -> Option<u32> {
    u32::try_from(len)
        .ok()
        .and_then(|len| addr.checked_add(len))
        .filter(|&end| end <= capacity)
}

/// A flash partition as the log uses it. See the [module docs](self) for the contract.
///
/// Addresses are byte offsets from the start of the partition.
pub trait Flash {
    /// The storage's own error.
    type Error: core::fmt::Debug;

    /// The partition's geometry; constant for the storage's lifetime.
    fn geometry(&self) -> Geometry;

    /// Reads `buf.len()` bytes starting at `addr`.
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), Self::Error>;

    /// Programs `data` at `addr`. Both `addr` and `data.len()` are multiples of
    /// `write_size`, and every word written has been erased since it was last written.
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), Self::Error>;

    /// Erases the erase block with index `block` (bytes `block * erase_size ..`).
    fn erase(&mut self, block: u32) -> Result<(), Self::Error>;

    /// Makes every completed write and erase durable (fdatasync for a file; a no-op on
    /// raw NOR flash, where a completed program is already durable).
    fn sync(&mut self) -> Result<(), Self::Error>;
}

impl<T: Flash + ?Sized> Flash for &mut T {
    type Error = T::Error;
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), Self::Error> {
        (**self).read(addr, buf)
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), Self::Error> {
        (**self).write(addr, data)
    }
    fn erase(&mut self, block: u32) -> Result<(), Self::Error> {
        (**self).erase(block)
    }
    fn sync(&mut self) -> Result<(), Self::Error> {
        (**self).sync()
    }
}

//! A NOR flash partition in the board's SSRAM behind the `embedded-storage` NOR traits, with
//! the rules of real NOR flash: erase sets a whole erase block to 0xFF; a program operation
//! writes whole words at word-aligned addresses and only clears bits; a word is programmed
//! only while it reads erased (as flash controllers that refuse to program a word twice
//! do), so a log that writes a word twice between erases gets an error instead of silently
//! merged bits.
//!
//! QEMU emulates the MPS2's code memory as RAM, not as programmable flash, so this is the
//! partition the log lives in: [`PARTITION_BYTES`] at the start of the linker region `NOR`
//! (`memory.x`), outside the image and outside the RAM budget. Its contents last until QEMU
//! stops (a cold boot starts from zeroes, which the log formats).

use embedded_storage::nor_flash::{
    ErrorType, NorFlash, NorFlashErrorKind, ReadNorFlash, check_erase, check_read, check_write,
};

/// Erase block size, bytes.
pub const ERASE_SIZE: usize = 4096;
/// Write granularity (word), bytes.
pub const WRITE_SIZE: usize = 4;
/// Erase blocks in the partition.
pub const BLOCKS: usize = 32;
/// Partition size, bytes.
pub const PARTITION_BYTES: usize = BLOCKS * ERASE_SIZE;

/// The log's RAM buffer, bytes, in every image that mounts the partition (the gateway, and
/// the log alone for the footprint table).
pub const BUFFER_BYTES: usize = 4096;
/// Erase blocks per segment of the log on the partition.
pub const BLOCKS_PER_SEGMENT: u32 = 2;
/// Segments of the log: the partition's blocks but the journal's 2, [`BLOCKS_PER_SEGMENT`]
/// a segment.
pub const SEGMENTS: usize = (BLOCKS - 2) / BLOCKS_PER_SEGMENT as usize;

/// The NOR partition. Only one exists ([`RamNor::take`]).
pub struct RamNor {
    mem: &'static mut [u8],
    /// Program operations refused because a word did not read erased.
    pub refused_writes: u32,
    /// Programs a word that does not read erased (bits still only clear), as NOR flash
    /// that allows several writes per word between erases does: for the
    /// `sequential-storage` peer of the footprint table, whose queue marks an item popped
    /// by writing its header again. Off by default; the log never needs it.
    pub multiwrite: bool,
}

unsafe extern "C" {
    /// Start of the `NOR` region, from `memory.x`.
    static mut _nor_start: u8;
    /// End of the `NOR` region, from `memory.x`.
    static mut _nor_end: u8;
}

impl RamNor {
    /// The partition, the first time; `None` after.
    pub fn take() -> Option<Self> {
        use core::sync::atomic::{AtomicBool, Ordering};
        static TAKEN: AtomicBool = AtomicBool::new(false);
        if TAKEN.swap(true, Ordering::AcqRel) {
            return None;
        }
        let start = &raw mut _nor_start;
        let end = &raw mut _nor_end;
        assert!((end as usize) - (start as usize) >= PARTITION_BYTES);
        // SAFETY: the `NOR` region is RAM reserved by `memory.x` for this partition: no
        // section is placed there, and `TAKEN` hands out this one slice once.
        let mem = unsafe { core::slice::from_raw_parts_mut(start, PARTITION_BYTES) };
        Some(RamNor {
            mem,
            refused_writes: 0,
            multiwrite: false,
        })
    }
}

impl ErrorType for RamNor {
    type Error = NorFlashErrorKind;
}

impl ReadNorFlash for RamNor {
    const READ_SIZE: usize = 1;

    fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        check_read(self, offset, bytes.len())?;
        let at = offset as usize;
        bytes.copy_from_slice(&self.mem[at..at + bytes.len()]);
        Ok(())
    }

    fn capacity(&self) -> usize {
        PARTITION_BYTES
    }
}

impl NorFlash for RamNor {
    const WRITE_SIZE: usize = WRITE_SIZE;
    const ERASE_SIZE: usize = ERASE_SIZE;

    fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        check_erase(self, from, to)?;
        self.mem[from as usize..to as usize].fill(0xFF);
        Ok(())
    }

    fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        check_write(self, offset, bytes.len())?;
        let at = offset as usize;
        let target = &mut self.mem[at..at + bytes.len()];
        if !self.multiwrite
            && target
                .chunks_exact(WRITE_SIZE)
                .zip(bytes.chunks_exact(WRITE_SIZE))
                .any(|(old, new)| new.iter().any(|&b| b != 0xFF) && old.iter().any(|&b| b != 0xFF))
        {
            self.refused_writes += 1;
            return Err(NorFlashErrorKind::Other);
        }
        for (m, b) in target.iter_mut().zip(bytes) {
            *m &= *b;
        }
        Ok(())
    }
}

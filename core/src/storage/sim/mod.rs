//! A simulated NOR flash in RAM, strict about the [`Flash`] contract and able to lose power
//! at a chosen point.
//!
//! # What it models
//! - An erase sets every byte of the block to the erased value (0xFF, or any other value the
//!   geometry names, 0x00 included).
//! - A write programs whole `write_size` words at word-aligned addresses. Programming only
//!   moves bits away from their erased state: with 0xFF erased a write ANDs, with 0x00
//!   erased it ORs (in general a bit that is erased in the data is left as it is).
//! - A word may be programmed once between two erases of its block; a second write to it is
//!   refused with [`SimError::Rewrite`] before anything is changed.
//! - [`SimFlash::cut_after_bytes`] and [`SimFlash::cut_after_erases`] arm a power cut: the
//!   operation it lands in is left half done (a torn word, a block of mixed content) and
//!   returns [`SimError::PowerCut`], as does every later operation until
//!   [`SimFlash::power_on`]. Memory survives the cut, as flash does.
//! - After a cut a word counts as programmed exactly when it no longer reads erased, so an
//!   engine that writes into space that reads erased is never refused.
//! - Counters of operations and bytes ([`SimCounters`]) and an erase count per block.
//!
//! Further faults, all off by default (so a plain simulator behaves as described above):
//! - [`SimFlash::set_program_unit`]: a cut inside a write leaves each program unit of that
//!   write complete, untouched or torn, chosen at random, so a later unit may be programmed
//!   while an earlier one is not (a write-back cache or an SD card reordering pages);
//! - [`SimFlash::set_erase_tear`]: what an interrupted erase leaves ([`EraseTear`]), from a
//!   mix of erased, old and random bytes (the default) to arbitrary bits everywhere or a
//!   block that reads erased but for a few stray bits;
//! - [`SimFlash::fail_write_after_bytes`]: a write that programs part of its words, tears
//!   one and fails with [`SimError::ProgramFailed`], the power staying on;
//! - [`SimFlash::fail_read_after`]: one read that fails with [`SimError::ReadFailed`]
//!   (a transient error: the same read succeeds when retried);
//! - [`SimFlash::flip_next_read`], [`SimFlash::flip_read_after`]: one read that returns a
//!   bit inverted (right on re-read);
//! - [`SimFlash::set_flaky`]: a flaky cell, one byte that reads wrong on a given share of
//!   reads, drawn from the seeded generator.
//!
//! Faults that fired are counted in [`SimFaults`]; they never change [`SimCounters`]
//! beyond the operation itself (a failed read or write counts as the call it is).
//!
//! Randomness (which bits of a torn word are done, what an interrupted erase leaves) comes
//! from a SplitMix64 generator seeded with [`SimFlash::set_seed`], so a failing case is
//! replayed from its seed.
//!
//! # Memory
//! The simulator allocates nothing: it works in one caller-provided byte buffer `S` (an
//! array, a `&mut [u8]`, or on `std` a `Vec<u8>` through [`SimFlash::new_vec`]) of at least
//! [`SimFlash::memory_len`] bytes, laid out as
//!
//! | bytes | content |
//! |---|---|
//! | `capacity` | the flash contents |
//! | `ceil(capacity / write_size / 8)` | one bit per word: programmed since the last erase |
//! | `4 × blocks` | erase count of each block, `u32` little-endian |
//!
//! # Source files
//! `cells` (the memory layout, what a program does to a byte, the seeded generator, torn
//! words and blocks), `ops` (the [`Flash`] operations, with the armed cut and faults) and
//! `tests`.
//!
//! [`Flash`]: super::Flash

mod cells;
mod ops;
#[cfg(test)]
mod tests;

use super::Geometry;

/// Error of a [`SimFlash`] operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum SimError {
    /// A write's address or length is not a multiple of `write_size`.
    #[error("write of {len} bytes at address {addr:#x} is not word-aligned")]
    Unaligned {
        /// Start of the write, in bytes.
        addr: u32,
        /// Length of the write in bytes.
        len: u32,
    },
    /// A write targets a word already programmed since its block was last erased.
    #[error("word at address {addr:#x} is written twice without an erase")]
    Rewrite {
        /// Address of the first such word, in bytes.
        addr: u32,
    },
    /// The range `addr .. addr + len` (or the block, or the bit) is not inside the flash.
    #[error("range of {len} bytes at address {addr:#x} is outside the flash")]
    OutOfBounds {
        /// Start of the range, in bytes (saturated at `u32::MAX`).
        addr: u32,
        /// Length of the range in bytes (saturated at `u32::MAX`).
        len: u32,
    },
    /// The power is (or was just) cut; call [`SimFlash::power_on`].
    #[error("power cut")]
    PowerCut,
    /// The geometry fails [`Geometry::is_valid`].
    #[error("invalid flash geometry")]
    InvalidGeometry,
    /// The memory buffer is shorter than [`SimFlash::memory_len`].
    #[error("simulator memory is {got} bytes, needs {needed}")]
    MemoryTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// A write armed with [`SimFlash::fail_write_after_bytes`] failed: the words before
    /// `addr` are programmed, the word at `addr` is torn, later words are untouched.
    #[error("program failure at address {addr:#x}")]
    ProgramFailed {
        /// Address of the torn word, in bytes.
        addr: u32,
    },
    /// A read armed with [`SimFlash::fail_read_after`] failed; nothing was returned and
    /// the flash is unchanged (the same read succeeds when retried).
    #[error("read of {len} bytes at address {addr:#x} failed")]
    ReadFailed {
        /// Start of the read, in bytes.
        addr: u32,
        /// Length of the read in bytes.
        len: u32,
    },
    /// An image given to [`SimFlash::load_image`] is not exactly `capacity` bytes long.
    #[error("image is {len} bytes, the flash is {capacity}")]
    ImageSize {
        /// Length of the image in bytes.
        len: usize,
        /// Capacity of the flash in bytes.
        capacity: u32,
    },
}

/// Operation counters of a [`SimFlash`]. Only operations that passed their checks count;
/// an operation interrupted by a power cut counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SimCounters {
    /// Read calls.
    pub reads: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Write calls.
    pub writes: u64,
    /// Bytes programmed: every byte of every word whose programming began, the torn word of
    /// a power cut included.
    pub bytes_written: u64,
    /// Block erases (the sum of the per-block counts since the last reset).
    pub erases: u64,
    /// Sync calls.
    pub syncs: u64,
}

/// Faults a [`SimFlash`] injected since it was created (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SimFaults {
    /// Power cuts that landed in a write with a program unit set (units left in random
    /// states).
    pub reordered_cuts: u64,
    /// Power cuts that landed in an erase.
    pub torn_erases: u64,
    /// Writes failed by [`SimFlash::fail_write_after_bytes`].
    pub failed_writes: u64,
    /// Reads failed by [`SimFlash::fail_read_after`].
    pub failed_reads: u64,
    /// Reads that returned a bit inverted by [`SimFlash::flip_next_read`].
    pub flipped_reads: u64,
    /// Reads that returned the flaky byte wrong ([`SimFlash::set_flaky`]).
    pub flaky_reads: u64,
}

/// What a power cut during an erase leaves in the block (see
/// [`SimFlash::set_erase_tear`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EraseTear {
    /// Each byte at random: erased, old, old with some bits erased, or random.
    #[default]
    Mixed,
    /// Every bit of the block at random.
    Arbitrary,
    /// The block reads erased except for 1 to 8 random bits left programmed: the hardest
    /// to tell from a finished erase.
    Sparse,
}

/// A byte that reads wrong on some reads ([`SimFlash::set_flaky`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flaky {
    addr: u32,
    mask: u8,
    percent: u8,
}

/// Simulated NOR flash over the memory buffer `S`. See the [module docs](self).
#[derive(Debug)]
pub struct SimFlash<S> {
    mem: S,
    geometry: Geometry,
    counters: SimCounters,
    seed: u64,
    rng: u64,
    /// Bytes that may still be programmed before the armed cut.
    cut_bytes: Option<u64>,
    /// Erases that may still complete before the armed cut.
    cut_erases: Option<u64>,
    cut: bool,
    /// Bytes of a program unit when cuts land out of order inside a write.
    program_unit: Option<u32>,
    erase_tear: EraseTear,
    /// Bytes that may still be programmed before the armed write failure.
    fail_bytes: Option<u64>,
    /// Reads that still succeed before the armed read failure.
    fail_reads: Option<u64>,
    /// The next read covering this address returns this bit inverted.
    flip_read: Option<(u32, u8)>,
    /// Reads that still return right before one returns a random bit inverted.
    flip_after: Option<u64>,
    flaky: Option<Flaky>,
    faults: SimFaults,
}

const DEFAULT_SEED: u64 = 0x5EED_F1A5_0000_0001;

impl SimFlash<&mut [u8]> {
    /// Bytes of memory a [`SimFlash`] of `geometry` needs (see the [module docs](self) for
    /// the layout); meaningful for a valid geometry only (0 if a size is 0). Usable in
    /// constants: `[0u8; SimFlash::memory_len(G)]`.
    pub const fn memory_len(geometry: Geometry) -> usize {
        if geometry.write_size == 0 || geometry.erase_size == 0 {
            return 0;
        }
        let words = (geometry.capacity / geometry.write_size) as usize;
        geometry.capacity as usize + words.div_ceil(8) + 4 * geometry.blocks() as usize
    }
}

#[cfg(feature = "std")]
impl SimFlash<std::vec::Vec<u8>> {
    /// A simulator of `geometry` in freshly allocated memory, fully erased.
    ///
    /// # Errors
    /// [`SimError::InvalidGeometry`] if the geometry fails [`Geometry::is_valid`].
    pub fn new_vec(geometry: Geometry) -> Result<Self, SimError> {
        if !geometry.is_valid() {
            return Err(SimError::InvalidGeometry);
        }
        Self::new(std::vec![0; SimFlash::memory_len(geometry)], geometry)
    }
}

impl<S: AsRef<[u8]> + AsMut<[u8]>> SimFlash<S> {
    /// A simulator of `geometry` working in `mem`, which it overwrites: the flash starts
    /// fully erased, with zero counters and the default seed.
    ///
    /// # Errors
    /// [`SimError::InvalidGeometry`] if the geometry fails [`Geometry::is_valid`];
    /// [`SimError::MemoryTooSmall`] if `mem` is shorter than [`SimFlash::memory_len`].
    pub fn new(mut mem: S, geometry: Geometry) -> Result<Self, SimError> {
        if !geometry.is_valid() {
            return Err(SimError::InvalidGeometry);
        }
        let needed = SimFlash::memory_len(geometry);
        let got = mem.as_ref().len();
        if got < needed {
            return Err(SimError::MemoryTooSmall { needed, got });
        }
        let m = mem.as_mut();
        m[..geometry.capacity as usize].fill(geometry.erased);
        m[geometry.capacity as usize..needed].fill(0);
        Ok(Self {
            mem,
            geometry,
            counters: SimCounters::default(),
            seed: DEFAULT_SEED,
            rng: DEFAULT_SEED,
            cut_bytes: None,
            cut_erases: None,
            cut: false,
            program_unit: None,
            erase_tear: EraseTear::Mixed,
            fail_bytes: None,
            fail_reads: None,
            flip_read: None,
            flip_after: None,
            flaky: None,
            faults: SimFaults::default(),
        })
    }

    /// Gives the memory buffer back.
    pub fn into_inner(self) -> S {
        self.mem
    }

    /// Restarts the random generator from `seed`; print it in a test so that a failure
    /// replays.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.rng = seed;
    }

    /// The seed last given to [`set_seed`](Self::set_seed) (a fixed default before).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Arms a power cut during programming: the next `n` bytes written (counted from now,
    /// across write calls) complete; the rest of the word holding byte `n + 1` gets a random
    /// subset of its bit transitions, later words are untouched, and that write returns
    /// [`SimError::PowerCut`]. Replaces any cut armed before.
    pub fn cut_after_bytes(&mut self, n: u64) {
        self.cut_bytes = Some(n);
        self.cut_erases = None;
    }

    /// Arms a power cut during an erase: the next `n` erases complete and erase `n + 1` leaves
    /// its block with mixed content (erased, old and random bytes) and returns
    /// [`SimError::PowerCut`]. Replaces any cut armed before.
    pub fn cut_after_erases(&mut self, n: u64) {
        self.cut_erases = Some(n);
        self.cut_bytes = None;
    }

    /// Makes cuts land out of order inside a write: when a cut lands in a write, each
    /// program unit of `unit` bytes of that write (counted from the write's start) is left
    /// complete, untouched or torn, at random, instead of the write being done in address
    /// order up to the cut. `None` (the default) restores address order. A unit that is not
    /// a multiple of `write_size` is rounded up to one.
    pub fn set_program_unit(&mut self, unit: Option<u32>) {
        let ws = self.geometry.write_size;
        self.program_unit = unit.map(|u| u.max(ws).div_ceil(ws) * ws);
    }

    /// Chooses what a power cut during an erase leaves in the block ([`EraseTear::Mixed`]
    /// by default).
    pub fn set_erase_tear(&mut self, tear: EraseTear) {
        self.erase_tear = tear;
    }

    /// Arms a write failure: the next `n` bytes written (counted from now, across write
    /// calls) complete; the write holding byte `n + 1` tears that word (a random subset of
    /// its bit transitions), leaves its later words untouched and returns
    /// [`SimError::ProgramFailed`]. The power stays on and later operations work. One-shot.
    pub fn fail_write_after_bytes(&mut self, n: u64) {
        self.fail_bytes = Some(n);
    }

    /// Arms a transient read failure: the next `n` reads succeed, the one after returns
    /// [`SimError::ReadFailed`] without data. One-shot.
    pub fn fail_read_after(&mut self, n: u64) {
        self.fail_reads = Some(n);
    }

    /// The next read whose range covers `addr` returns bit `bit` (0 to 7) of that byte
    /// inverted; the flash keeps the right value, so a re-read is right. One-shot.
    pub fn flip_next_read(&mut self, addr: u32, bit: u8) {
        self.flip_read = Some((addr, bit & 7));
    }

    /// Arms a one-shot bit flip by read count: the next `n` reads are right, the one after
    /// returns one random bit of its data inverted (a re-read is right).
    pub fn flip_read_after(&mut self, n: u64) {
        self.flip_after = Some(n);
    }

    /// Makes the byte at `addr` a flaky cell: every read covering it returns it XORed with
    /// `mask` (nonzero) on `percent`% of reads (0 to 100), drawn from the seeded generator.
    /// The flash keeps the right value. `clear_flaky` ends it.
    pub fn set_flaky(&mut self, addr: u32, mask: u8, percent: u8) {
        self.flaky = Some(Flaky {
            addr,
            mask: mask.max(1),
            percent: percent.min(100),
        });
    }

    /// Ends the flaky cell set by [`set_flaky`](Self::set_flaky).
    pub fn clear_flaky(&mut self) {
        self.flaky = None;
    }

    /// Cancels the armed write failure, read failure and one-shot read flips.
    pub fn disarm_faults(&mut self) {
        self.fail_bytes = None;
        self.fail_reads = None;
        self.flip_read = None;
        self.flip_after = None;
    }

    /// Faults injected so far.
    pub fn faults(&self) -> SimFaults {
        self.faults
    }

    /// Cancels an armed cut that has not happened.
    pub fn disarm(&mut self) {
        self.cut_bytes = None;
        self.cut_erases = None;
    }

    /// Whether the power is cut (every operation fails until [`power_on`](Self::power_on)).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Restores power after a cut (a reboot): memory is kept as the cut left it.
    pub fn power_on(&mut self) {
        self.cut = false;
    }

    /// The operation counters.
    pub fn counters(&self) -> SimCounters {
        self.counters
    }

    /// Zeroes the operation counters and every block's erase count.
    pub fn reset_counters(&mut self) {
        self.counters = SimCounters::default();
        let (_, _, counts) = self.parts();
        counts.fill(0);
    }

    /// How many times block `block` was erased since the last counter reset (interrupted
    /// erases included); `None` if there is no such block.
    pub fn erase_count(&self, block: u32) -> Option<u32> {
        if block >= self.geometry.blocks() {
            return None;
        }
        let g = self.geometry;
        let start = Self::counts_offset(g) + 4 * block as usize;
        let raw = self.mem.as_ref().get(start..start + 4)?;
        Some(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    /// The highest per-block erase count (wear of the most worn block).
    pub fn max_erase_count(&self) -> u32 {
        (0..self.geometry.blocks())
            .filter_map(|b| self.erase_count(b))
            .max()
            .unwrap_or(0)
    }

    /// The raw flash contents (`capacity` bytes), for inspection.
    pub fn bytes(&self) -> &[u8] {
        &self.mem.as_ref()[..self.geometry.capacity as usize]
    }

    /// The raw flash contents, to corrupt at will. Changes here bypass the programmed-word
    /// tracking and the counters.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let cap = self.geometry.capacity as usize;
        &mut self.mem.as_mut()[..cap]
    }

    /// Inverts bit `bit` (0 = least significant, up to 7) of the byte at `addr`.
    ///
    /// # Errors
    /// [`SimError::OutOfBounds`] if `addr` is outside the flash or `bit > 7`.
    pub fn flip_bit(&mut self, addr: u32, bit: u8) -> Result<(), SimError> {
        if addr >= self.geometry.capacity || bit > 7 {
            return Err(SimError::OutOfBounds { addr, len: 1 });
        }
        self.bytes_mut()[addr as usize] ^= 1 << bit;
        Ok(())
    }

    /// Replaces the whole contents with `image` (a saved or hand-made flash image). Words
    /// that do not read erased count as programmed. Counters are left alone.
    ///
    /// # Errors
    /// [`SimError::ImageSize`] if `image` is not exactly `capacity` bytes long.
    pub fn load_image(&mut self, image: &[u8]) -> Result<(), SimError> {
        let g = self.geometry;
        if image.len() != g.capacity as usize {
            return Err(SimError::ImageSize {
                len: image.len(),
                capacity: g.capacity,
            });
        }
        self.bytes_mut().copy_from_slice(image);
        self.mark_programmed_if_not_erased(0, g.capacity / g.write_size);
        Ok(())
    }
}

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

use super::{Flash, Geometry};

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

    fn bitmap_offset(g: Geometry) -> usize {
        g.capacity as usize
    }

    fn counts_offset(g: Geometry) -> usize {
        let words = (g.capacity / g.write_size) as usize;
        Self::bitmap_offset(g) + words.div_ceil(8)
    }

    /// Splits the memory into contents, programmed-word bitmap and erase counts.
    fn parts(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let g = self.geometry;
        let bitmap_at = Self::bitmap_offset(g);
        let counts_at = Self::counts_offset(g);
        let end = counts_at + 4 * g.blocks() as usize;
        let (data, rest) = self.mem.as_mut()[..end].split_at_mut(bitmap_at);
        let (bitmap, counts) = rest.split_at_mut(counts_at - bitmap_at);
        (data, bitmap, counts)
    }

    fn is_programmed(&self, word: u32) -> bool {
        let byte = Self::bitmap_offset(self.geometry) + (word / 8) as usize;
        self.mem.as_ref()[byte] & (1 << (word % 8)) != 0
    }

    fn set_programmed(bitmap: &mut [u8], word: u32, programmed: bool) {
        let bit = 1 << (word % 8);
        let byte = &mut bitmap[(word / 8) as usize];
        if programmed {
            *byte |= bit;
        } else {
            *byte &= !bit;
        }
    }

    /// Sets the programmed bit of words `first .. first + count` from their content.
    fn mark_programmed_if_not_erased(&mut self, first: u32, count: u32) {
        let g = self.geometry;
        let ws = g.write_size as usize;
        let (data, bitmap, _) = self.parts();
        for word in first..first + count {
            let at = word as usize * ws;
            let programmed = data[at..at + ws].iter().any(|&b| b != g.erased);
            Self::set_programmed(bitmap, word, programmed);
        }
    }

    /// SplitMix64.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn power(&self) -> Result<(), SimError> {
        if self.cut {
            Err(SimError::PowerCut)
        } else {
            Ok(())
        }
    }

    /// Checks `addr .. addr + len` against the capacity.
    fn check_range(&self, addr: u32, len: usize) -> Result<(), SimError> {
        let out = SimError::OutOfBounds {
            addr,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        };
        let len = u32::try_from(len).map_err(|_| out)?;
        match addr.checked_add(len) {
            Some(end) if end <= self.geometry.capacity => Ok(()),
            _ => Err(out),
        }
    }

    /// Programs the first `done` bytes of word `word` with `chunk` and gives the rest a
    /// random subset of their bit transitions; marks the word programmed if it changed.
    fn tear_word(&mut self, word: u32, chunk: &[u8], done: usize) {
        let erased = self.geometry.erased;
        let at = (word * self.geometry.write_size) as usize;
        for (j, &d) in chunk.iter().enumerate() {
            let random = self.next_random() as u8;
            let old = self.bytes()[at + j];
            let target = program(old, d, erased);
            let mask = if j < done { 0xFF } else { random };
            self.bytes_mut()[at + j] = old ^ ((old ^ target) & mask);
        }
        self.mark_programmed_if_not_erased(word, 1);
    }

    /// A cut inside the write of `data` at word `first` with out-of-order program units of
    /// `unit` bytes: each unit is left complete, untouched or torn, at random. Counts the
    /// bytes of the units whose programming began.
    fn cut_out_of_order(&mut self, first: u32, data: &[u8], unit: u32) -> SimError {
        let ws = self.geometry.write_size as usize;
        let words_per_unit = unit as usize / ws;
        for (u, unit_data) in data.chunks(unit as usize).enumerate() {
            let state = self.next_random() % 3;
            if state == 0 {
                continue;
            }
            for (i, chunk) in unit_data.chunks_exact(ws).enumerate() {
                let word = first + (u * words_per_unit + i) as u32;
                self.counters.bytes_written += ws as u64;
                let done = if state == 1 { ws } else { 0 };
                self.tear_word(word, chunk, done);
            }
        }
        self.faults.reordered_cuts += 1;
        self.cut_now()
    }

    fn cut_now(&mut self) -> SimError {
        self.cut = true;
        self.disarm();
        SimError::PowerCut
    }
}

/// The byte a program of `data` over `old` leaves: bits of `data` that differ from the
/// erased value are moved to their programmed state, the others are kept.
const fn program(old: u8, data: u8, erased: u8) -> u8 {
    let to_program = data ^ erased;
    (old & !to_program) | (!erased & to_program)
}

impl<S: AsRef<[u8]> + AsMut<[u8]>> Flash for SimFlash<S> {
    type Error = SimError;

    fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Reads `buf.len()` bytes at `addr`, any alignment.
    ///
    /// # Errors
    /// [`SimError::PowerCut`] while the power is cut; [`SimError::OutOfBounds`].
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), SimError> {
        self.power()?;
        self.check_range(addr, buf.len())?;
        self.counters.reads += 1;
        self.counters.bytes_read += buf.len() as u64;
        match self.fail_reads {
            Some(0) => {
                self.fail_reads = None;
                self.faults.failed_reads += 1;
                return Err(SimError::ReadFailed {
                    addr,
                    len: buf.len() as u32,
                });
            }
            Some(n) => self.fail_reads = Some(n - 1),
            None => {}
        }
        let at = addr as usize;
        buf.copy_from_slice(&self.bytes()[at..at + buf.len()]);
        let len = buf.len();
        let covers = |a: u32| a >= addr && ((a - addr) as usize) < len;
        if let Some((a, bit)) = self.flip_read
            && covers(a)
        {
            buf[(a - addr) as usize] ^= 1 << bit;
            self.flip_read = None;
            self.faults.flipped_reads += 1;
        }
        match self.flip_after {
            Some(0) if len > 0 => {
                let r = self.next_random();
                buf[(r >> 3) as usize % len] ^= 1 << (r % 8);
                self.flip_after = None;
                self.faults.flipped_reads += 1;
            }
            Some(0) => {}
            Some(n) => self.flip_after = Some(n - 1),
            None => {}
        }
        if let Some(f) = self.flaky
            && covers(f.addr)
            && self.next_random() % 100 < u64::from(f.percent)
        {
            buf[(f.addr - addr) as usize] ^= f.mask;
            self.faults.flaky_reads += 1;
        }
        Ok(())
    }

    /// Programs `data` at `addr`. Checks everything before changing anything.
    ///
    /// # Errors
    /// [`SimError::PowerCut`] while the power is cut or when an armed cut lands in this
    /// write; [`SimError::ProgramFailed`] when an armed write failure lands in it;
    /// [`SimError::OutOfBounds`]; [`SimError::Unaligned`]; [`SimError::Rewrite`].
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), SimError> {
        self.power()?;
        self.check_range(addr, data.len())?;
        let g = self.geometry;
        let ws = g.write_size;
        if !addr.is_multiple_of(ws) || !(data.len() as u32).is_multiple_of(ws) {
            return Err(SimError::Unaligned {
                addr,
                len: data.len() as u32,
            });
        }
        let first = addr / ws;
        let count = data.len() as u32 / ws;
        if let Some(word) = (first..first + count).find(|&w| self.is_programmed(w)) {
            return Err(SimError::Rewrite { addr: word * ws });
        }
        self.counters.writes += 1;
        if let (Some(unit), Some(budget)) = (self.program_unit, self.cut_bytes)
            && budget < data.len() as u64
        {
            return Err(self.cut_out_of_order(first, data, unit));
        }
        for (i, chunk) in data.chunks_exact(ws as usize).enumerate() {
            let word = first + i as u32;
            let at = (word * ws) as usize;
            self.counters.bytes_written += u64::from(ws);
            if let Some(budget) = self.fail_bytes {
                if budget < u64::from(ws) {
                    self.fail_bytes = None;
                    self.tear_word(word, chunk, budget as usize);
                    self.faults.failed_writes += 1;
                    if let Some(c) = self.cut_bytes {
                        self.cut_bytes = Some(c.saturating_sub(u64::from(ws)));
                    }
                    return Err(SimError::ProgramFailed { addr: word * ws });
                }
                self.fail_bytes = Some(budget - u64::from(ws));
            }
            match self.cut_bytes {
                Some(budget) if budget < u64::from(ws) => {
                    // The cut lands in this word: `budget` bytes finish, the rest tear.
                    self.tear_word(word, chunk, budget as usize);
                    return Err(self.cut_now());
                }
                Some(budget) => self.cut_bytes = Some(budget - u64::from(ws)),
                None => {}
            }
            let (mem, bitmap, _) = self.parts();
            for (m, &d) in mem[at..at + ws as usize].iter_mut().zip(chunk) {
                *m = program(*m, d, g.erased);
            }
            Self::set_programmed(bitmap, word, true);
        }
        Ok(())
    }

    /// Erases block `block` (bytes `block * erase_size ..`), counting it.
    ///
    /// # Errors
    /// [`SimError::PowerCut`] while the power is cut or when an armed cut lands in this
    /// erase; [`SimError::OutOfBounds`] if there is no such block.
    fn erase(&mut self, block: u32) -> Result<(), SimError> {
        self.power()?;
        let g = self.geometry;
        if block >= g.blocks() {
            return Err(SimError::OutOfBounds {
                addr: block.saturating_mul(g.erase_size),
                len: g.erase_size,
            });
        }
        let start = (block * g.erase_size) as usize;
        let end = start + g.erase_size as usize;
        let words_per_block = g.erase_size / g.write_size;
        self.counters.erases += 1;
        {
            let (_, _, counts) = self.parts();
            let c = &mut counts[4 * block as usize..4 * block as usize + 4];
            let n = u32::from_le_bytes([c[0], c[1], c[2], c[3]]).saturating_add(1);
            c.copy_from_slice(&n.to_le_bytes());
        }
        match self.cut_erases {
            Some(0) => {
                self.faults.torn_erases += 1;
                match self.erase_tear {
                    EraseTear::Mixed => {
                        for at in start..end {
                            let r = self.next_random();
                            let old = self.bytes()[at];
                            let byte = match r % 4 {
                                0 => g.erased,
                                1 => old,
                                // Some bits reached their erased state.
                                2 => old ^ ((old ^ g.erased) & (r >> 8) as u8),
                                _ => (r >> 16) as u8,
                            };
                            self.bytes_mut()[at] = byte;
                        }
                    }
                    EraseTear::Arbitrary => {
                        for at in start..end {
                            let r = self.next_random() as u8;
                            self.bytes_mut()[at] = r;
                        }
                    }
                    EraseTear::Sparse => {
                        self.bytes_mut()[start..end].fill(g.erased);
                        let stray = 1 + self.next_random() % 8;
                        for _ in 0..stray {
                            let r = self.next_random();
                            let at = start + (r >> 8) as usize % (end - start);
                            self.bytes_mut()[at] ^= 1 << (r % 8);
                        }
                    }
                }
                self.mark_programmed_if_not_erased(block * words_per_block, words_per_block);
                return Err(self.cut_now());
            }
            Some(n) => self.cut_erases = Some(n - 1),
            None => {}
        }
        let (mem, bitmap, _) = self.parts();
        mem[start..end].fill(g.erased);
        // `erase_size / write_size` ≥ 8 and both are powers of two, so a block's bits fill
        // whole bitmap bytes.
        let first_byte = (block * words_per_block / 8) as usize;
        bitmap[first_byte..first_byte + (words_per_block / 8) as usize].fill(0);
        Ok(())
    }

    /// Counts the call; nothing to flush in RAM.
    ///
    /// # Errors
    /// [`SimError::PowerCut`] while the power is cut.
    fn sync(&mut self) -> Result<(), SimError> {
        self.power()?;
        self.counters.syncs += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn geometry(write_size: u32, erased: u8) -> Geometry {
        Geometry {
            erase_size: 256,
            write_size,
            capacity: 1024,
            erased,
        }
    }

    const G: Geometry = geometry(4, 0xFF);
    const LEN: usize = SimFlash::memory_len(G);

    fn sim(mem: &mut [u8], g: Geometry) -> SimFlash<&mut [u8]> {
        SimFlash::new(mem, g).unwrap()
    }

    #[test]
    fn memory_layout_and_construction_checks() {
        // 1024 content + 256 words / 8 + 4 blocks * 4.
        assert_eq!(LEN, 1024 + 32 + 16);
        let mut small = [0u8; LEN - 1];
        assert_eq!(
            SimFlash::new(&mut small[..], G).unwrap_err(),
            SimError::MemoryTooSmall {
                needed: LEN,
                got: LEN - 1
            }
        );
        let mut mem = [0u8; LEN];
        let bad = Geometry { write_size: 3, ..G };
        assert_eq!(
            SimFlash::new(&mut mem[..], bad).unwrap_err(),
            SimError::InvalidGeometry
        );
        // An owned array works too, and starts erased.
        let flash = SimFlash::new([0u8; LEN], G).unwrap();
        assert!(flash.bytes().iter().all(|&b| b == 0xFF));
        assert_eq!(flash.bytes().len(), 1024);
    }

    #[test]
    fn rejects_unaligned_and_out_of_bounds() {
        for ws in [1u32, 4, 8, 16, 32] {
            let g = geometry(ws, 0xFF);
            let mut mem = [0u8; SimFlash::memory_len(geometry(1, 0xFF))];
            let mut f = sim(&mut mem, g);
            if ws > 1 {
                assert_eq!(
                    f.write(1, &[0; 32][..ws as usize]),
                    Err(SimError::Unaligned { addr: 1, len: ws })
                );
                assert_eq!(
                    f.write(0, &[0; 33][..ws as usize + 1]),
                    Err(SimError::Unaligned {
                        addr: 0,
                        len: ws + 1
                    })
                );
            }
            assert_eq!(
                f.write(1024, &[0; 32][..ws as usize]),
                Err(SimError::OutOfBounds {
                    addr: 1024,
                    len: ws
                })
            );
            assert!(f.bytes().iter().all(|&b| b == 0xFF), "ws {ws}");
            assert_eq!(f.counters().writes, 0);
        }
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        let mut buf = [0u8; 8];
        assert_eq!(
            f.read(1020, &mut buf),
            Err(SimError::OutOfBounds { addr: 1020, len: 8 })
        );
        assert!(matches!(
            f.read(u32::MAX, &mut buf),
            Err(SimError::OutOfBounds { .. })
        ));
        assert!(matches!(f.erase(4), Err(SimError::OutOfBounds { .. })));
        assert!(matches!(
            f.flip_bit(0, 8),
            Err(SimError::OutOfBounds { .. })
        ));
        assert!(matches!(
            f.flip_bit(1024, 0),
            Err(SimError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn rejects_rewrite_until_erased() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.write(8, &[0xF0; 8]).unwrap();
        // Even a write that would change nothing is a rewrite.
        assert_eq!(f.write(12, &[0xFF; 4]), Err(SimError::Rewrite { addr: 12 }));
        // Checked before anything changes: word 4 stays erased.
        assert_eq!(f.write(4, &[0; 8]), Err(SimError::Rewrite { addr: 8 }));
        assert_eq!(&f.bytes()[4..8], &[0xFF; 4]);
        f.write(4, &[0x0F; 4]).unwrap();
        // Another block is independent.
        f.write(256, &[1; 4]).unwrap();
        f.erase(0).unwrap();
        assert!(f.bytes()[..256].iter().all(|&b| b == 0xFF));
        assert_eq!(&f.bytes()[256..260], &[1; 4]);
        f.write(8, &[0x3C; 4]).unwrap();
        assert_eq!(&f.bytes()[8..12], &[0x3C; 4]);
        assert_eq!(f.write(256, &[1; 4]), Err(SimError::Rewrite { addr: 256 }));
    }

    #[test]
    fn programming_moves_bits_away_from_the_erased_value() {
        assert_eq!(program(0xFF, 0x5A, 0xFF), 0x5A);
        assert_eq!(program(0xF0, 0x3C, 0xFF), 0x30); // AND
        assert_eq!(program(0x00, 0x5A, 0x00), 0x5A);
        assert_eq!(program(0x0F, 0x3C, 0x00), 0x3F); // OR

        let g = geometry(4, 0x00);
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, g);
        assert!(f.bytes().iter().all(|&b| b == 0x00));
        f.bytes_mut()[0] = 0x0F; // stray bits, as after a torn erase
        f.write(0, &[0x3C, 0, 0xFF, 0x81]).unwrap();
        assert_eq!(&f.bytes()[..4], &[0x3F, 0, 0xFF, 0x81]);
        f.erase(0).unwrap();
        assert!(f.bytes()[..256].iter().all(|&b| b == 0x00));
        f.write(0, &[7; 4]).unwrap();
        let mut buf = [0u8; 6];
        f.read(0, &mut buf).unwrap();
        assert_eq!(buf, [7, 7, 7, 7, 0, 0]);
    }

    #[test]
    fn counters_are_exact() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        let mut buf = [0u8; 10];
        f.read(3, &mut buf).unwrap();
        f.read(0, &mut buf[..1]).unwrap();
        f.write(0, &[0; 16]).unwrap();
        f.write(768, &[0; 4]).unwrap();
        f.erase(2).unwrap();
        f.erase(2).unwrap();
        f.erase(0).unwrap();
        f.sync().unwrap();
        // Rejected operations do not count.
        let _ = f.write(1, &[0; 4]);
        let _ = f.read(1024, &mut buf);
        assert_eq!(
            f.counters(),
            SimCounters {
                reads: 2,
                bytes_read: 11,
                writes: 2,
                bytes_written: 20,
                erases: 3,
                syncs: 1,
            }
        );
        assert_eq!(f.erase_count(0), Some(1));
        assert_eq!(f.erase_count(1), Some(0));
        assert_eq!(f.erase_count(2), Some(2));
        assert_eq!(f.erase_count(4), None);
        assert_eq!(f.max_erase_count(), 2);
        f.reset_counters();
        assert_eq!(f.counters(), SimCounters::default());
        assert_eq!(f.max_erase_count(), 0);
        // The contents survive a counter reset.
        assert_eq!(&f.bytes()[768..772], &[0; 4]);
    }

    #[test]
    fn power_cut_tears_only_the_interrupted_word() {
        for ws in [1u32, 4, 8, 16, 32] {
            for n in 0..80u64 {
                let seed = u64::from(ws) << 32 | n;
                let g = geometry(ws, 0xFF);
                let mut mem = [0u8; SimFlash::memory_len(geometry(1, 0xFF))];
                let mut f = sim(&mut mem, g);
                f.set_seed(seed);
                let mut data = [0u8; 64];
                for (i, b) in data.iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(37) ^ 0xA5;
                }
                // Two writes: the budget carries across calls.
                let (a, b) = data.split_at(32);
                f.cut_after_bytes(n);
                let r1 = f.write(0, a);
                let r2 = f.write(32, b);
                let n = n as usize;
                if n >= 64 {
                    assert_eq!((r1, r2), (Ok(()), Ok(())));
                    assert_eq!(&f.bytes()[..64], &data);
                    continue;
                }
                assert!(r1.is_err() || r2 == Err(SimError::PowerCut), "seed {seed}");
                if n < 32 {
                    assert_eq!(r1, Err(SimError::PowerCut), "seed {seed}");
                }
                assert!(f.is_cut());
                let word_end = (n / ws as usize + 1) * ws as usize;
                let mem = f.bytes();
                assert_eq!(&mem[..n], &data[..n], "seed {seed}: completed bytes");
                for i in n..word_end {
                    // Only 1 → 0 transitions, and only toward the target.
                    assert_eq!(mem[i] & data[i], data[i], "seed {seed}: byte {i}");
                }
                assert!(
                    mem[word_end..].iter().all(|&b| b == 0xFF),
                    "seed {seed}: later bytes untouched"
                );
                assert_eq!(f.counters().bytes_written, word_end as u64, "seed {seed}");
            }
        }
    }

    #[test]
    fn torn_words_show_partial_programming_for_some_seed() {
        // Over many seeds a torn word must come out neither erased nor complete at least
        // once, in both erased polarities.
        for erased in [0xFF, 0x00] {
            let mut partial = false;
            for seed in 0..64 {
                let mut mem = [0u8; LEN];
                let mut f = sim(&mut mem, geometry(4, erased));
                f.set_seed(seed);
                f.cut_after_bytes(0);
                assert_eq!(f.write(0, &[0x55; 4]), Err(SimError::PowerCut));
                let word = &f.bytes()[..4];
                for &b in word {
                    // Bits only move away from the erased value, toward the target.
                    if erased == 0xFF {
                        assert_eq!(b & 0x55, 0x55, "seed {seed}");
                    } else {
                        assert_eq!(b & !0x55, 0, "seed {seed}");
                    }
                }
                partial |= word != [erased; 4] && word != [0x55; 4];
            }
            assert!(partial, "erased {erased:#x}");
        }
    }

    #[test]
    fn a_cut_blocks_everything_until_power_on() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.cut_after_bytes(4);
        assert_eq!(f.write(0, &[0; 8]), Err(SimError::PowerCut));
        let mut buf = [0u8; 4];
        assert_eq!(f.read(0, &mut buf), Err(SimError::PowerCut));
        assert_eq!(f.write(64, &[0; 4]), Err(SimError::PowerCut));
        assert_eq!(f.erase(1), Err(SimError::PowerCut));
        assert_eq!(f.sync(), Err(SimError::PowerCut));
        f.power_on();
        assert!(!f.is_cut());
        f.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0; 4]);
        // The cut is spent: writing goes on normally.
        f.write(64, &[0; 32]).unwrap();
        // The first word was complete, so it counts as programmed.
        assert_eq!(f.write(0, &[0; 4]), Err(SimError::Rewrite { addr: 0 }));
    }

    #[test]
    fn a_torn_word_that_reads_erased_may_be_written() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.cut_after_bytes(0);
        // Writing the erased value itself leaves nothing to tear.
        assert_eq!(f.write(0, &[0xFF; 4]), Err(SimError::PowerCut));
        f.power_on();
        f.write(0, &[1; 4]).unwrap();
    }

    #[test]
    fn erase_cut_leaves_mixed_content() {
        for seed in 0..16u64 {
            let mut mem = [0u8; LEN];
            let mut f = sim(&mut mem, G);
            f.set_seed(seed);
            f.write(256, &[0x00; 256]).unwrap();
            f.write(512, &[0x00; 256]).unwrap();
            f.cut_after_erases(1);
            f.erase(3).unwrap();
            assert_eq!(f.erase(1), Err(SimError::PowerCut), "seed {seed}");
            assert_eq!(f.erase(2), Err(SimError::PowerCut));
            f.power_on();
            let block = &f.bytes()[256..512];
            let erased = block.iter().filter(|&&b| b == 0xFF).count();
            let old = block.iter().filter(|&&b| b == 0x00).count();
            assert!(erased > 0 && old > 0 && erased + old < 256, "seed {seed}");
            // Block 2 was never reached.
            assert!(f.bytes()[512..768].iter().all(|&b| b == 0), "seed {seed}");
            assert_eq!(f.erase_count(1), Some(1));
            assert_eq!(f.counters().erases, 2);
            // Words that read erased may be written; others need a new erase.
            let first_dirty = block.chunks(4).position(|w| w != [0xFF; 4]).unwrap() as u32;
            let clean = block.chunks(4).position(|w| w == [0xFF; 4]);
            assert_eq!(
                f.write(256 + 4 * first_dirty, &[0; 4]),
                Err(SimError::Rewrite {
                    addr: 256 + 4 * first_dirty
                })
            );
            if let Some(clean) = clean {
                f.write(256 + 4 * clean as u32, &[0; 4]).unwrap();
            }
            f.erase(1).unwrap();
            assert!(f.bytes()[256..512].iter().all(|&b| b == 0xFF));
            f.write(256 + 4 * first_dirty, &[0; 4]).unwrap();
        }
    }

    #[test]
    fn same_seed_same_damage() {
        let run = |seed| {
            let mut mem = [0u8; LEN];
            let mut f = sim(&mut mem, G);
            f.set_seed(seed);
            f.write(0, &[0; 256]).unwrap();
            f.cut_after_erases(0);
            let _ = f.erase(0);
            let mut out = [0u8; 256];
            out.copy_from_slice(&f.bytes()[..256]);
            out
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn hostile_images_and_bit_flips() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        let mut image = [0xFFu8; 1024];
        image[5] = 0x12;
        assert_eq!(
            f.load_image(&image[..100]),
            Err(SimError::ImageSize {
                len: 100,
                capacity: 1024
            })
        );
        f.load_image(&image).unwrap();
        assert_eq!(f.write(4, &[0; 4]), Err(SimError::Rewrite { addr: 4 }));
        f.write(8, &[0; 4]).unwrap();
        f.flip_bit(8, 3).unwrap();
        assert_eq!(f.bytes()[8], 0x08);
        f.flip_bit(8, 3).unwrap();
        assert_eq!(f.bytes()[8], 0x00);
        assert_eq!(f.counters().writes, 1);
    }

    #[test]
    fn out_of_order_cut_can_leave_a_later_unit_done_and_an_earlier_not() {
        let mut seen = false;
        for seed in 0..64u64 {
            let mut mem = [0u8; LEN];
            let mut f = sim(&mut mem, G);
            f.set_seed(seed);
            f.set_program_unit(Some(16));
            f.cut_after_bytes(100);
            // A 128-byte write: the cut lands in it, units end in random states.
            assert_eq!(f.write(0, &[0x00; 128]), Err(SimError::PowerCut));
            let units: std::vec::Vec<bool> = f.bytes()[..128]
                .chunks(16)
                .map(|u| u.iter().all(|&b| b == 0x00))
                .collect();
            let untouched: std::vec::Vec<bool> = f.bytes()[..128]
                .chunks(16)
                .map(|u| u.iter().all(|&b| b == 0xFF))
                .collect();
            // Bytes written counts the units begun, exactly.
            let begun = f.bytes()[..128]
                .chunks(16)
                .zip(&untouched)
                .filter(|(u, t)| !**t || u.iter().any(|&b| b != 0xFF))
                .count() as u64;
            assert!(f.counters().bytes_written >= begun * 16, "seed {seed}");
            assert!(f.bytes()[128..].iter().all(|&b| b == 0xFF));
            assert_eq!(f.faults().reordered_cuts, 1);
            seen |= (1..8).any(|i| units[i] && untouched[i - 1]);
            f.power_on();
            // A unit left untouched reads erased and may be written.
            if let Some(i) = untouched.iter().position(|&t| t) {
                f.write(16 * i as u32, &[1; 16]).unwrap();
            }
        }
        assert!(
            seen,
            "some seed programs a later unit but not an earlier one"
        );
        // Without a program unit, the same cut is in address order.
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.cut_after_bytes(100);
        assert_eq!(f.write(0, &[0x00; 128]), Err(SimError::PowerCut));
        assert!(f.bytes()[..100].iter().all(|&b| b == 0));
        assert!(f.bytes()[104..].iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn torn_erase_modes() {
        for (tear, min_random) in [(EraseTear::Arbitrary, 100), (EraseTear::Sparse, 0)] {
            let mut mem = [0u8; LEN];
            let mut f = sim(&mut mem, G);
            f.set_erase_tear(tear);
            f.write(256, &[0x00; 256]).unwrap();
            f.cut_after_erases(0);
            assert_eq!(f.erase(1), Err(SimError::PowerCut));
            f.power_on();
            let block = &f.bytes()[256..512];
            let not_old_or_erased = block.iter().filter(|&&b| b != 0 && b != 0xFF).count();
            assert!(not_old_or_erased >= min_random, "{tear:?}");
            if tear == EraseTear::Sparse {
                let stray: u32 = block.iter().map(|b| (!b).count_ones()).sum();
                assert!((1..=8).contains(&stray), "{stray} stray bits");
            }
            assert_eq!(f.faults().torn_erases, 1);
            f.erase(1).unwrap();
            assert!(f.bytes()[256..512].iter().all(|&b| b == 0xFF));
        }
    }

    #[test]
    fn a_failed_write_leaves_partial_data_and_the_power_on() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.fail_write_after_bytes(10);
        f.write(0, &[0x11; 8]).unwrap();
        assert_eq!(
            f.write(8, &[0x22; 8]),
            Err(SimError::ProgramFailed { addr: 8 })
        );
        assert!(!f.is_cut());
        assert_eq!(
            &f.bytes()[..10],
            &[0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x22, 0x22]
        );
        assert_eq!(&f.bytes()[12..16], &[0xFF; 4], "later words untouched");
        assert_eq!(f.faults().failed_writes, 1);
        assert_eq!(f.counters().bytes_written, 12);
        // One-shot: later writes work.
        f.write(16, &[0x33; 4]).unwrap();
        assert_eq!(f.write(8, &[0; 4]), Err(SimError::Rewrite { addr: 8 }));
    }

    #[test]
    fn read_faults_are_transient() {
        let mut mem = [0u8; LEN];
        let mut f = sim(&mut mem, G);
        f.write(0, &[0x5A; 8]).unwrap();
        let mut buf = [0u8; 8];
        f.fail_read_after(1);
        f.read(0, &mut buf).unwrap();
        assert_eq!(
            f.read(0, &mut buf),
            Err(SimError::ReadFailed { addr: 0, len: 8 })
        );
        f.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0x5A; 8]);
        // A one-shot flip: wrong once, right on re-read; reads elsewhere do not spend it.
        f.flip_next_read(5, 0);
        f.read(6, &mut buf[..2]).unwrap();
        f.read(0, &mut buf).unwrap();
        assert_eq!(buf[5], 0x5B);
        f.read(0, &mut buf).unwrap();
        assert_eq!(buf, [0x5A; 8]);
        assert_eq!(f.bytes()[5], 0x5A);
        let faults = f.faults();
        assert_eq!((faults.failed_reads, faults.flipped_reads), (1, 1));
        assert_eq!(f.counters().reads, 6);
        // A flaky cell: wrong on about the given share of reads, never in memory.
        f.set_seed(7);
        f.set_flaky(3, 0x10, 70);
        let wrong = (0..1000)
            .filter(|_| {
                f.read(0, &mut buf).unwrap();
                buf[3] != 0x5A
            })
            .count();
        assert!((620..780).contains(&wrong), "{wrong} of 1000");
        f.set_flaky(3, 0x10, 100);
        f.read(3, &mut buf[..1]).unwrap();
        assert_eq!(buf[0], 0x4A);
        f.clear_flaky();
        f.read(3, &mut buf[..1]).unwrap();
        assert_eq!(buf[0], 0x5A);
    }

    #[cfg(feature = "std")]
    #[test]
    fn vec_memory() {
        let mut f = SimFlash::new_vec(G).unwrap();
        f.write(0, &[1, 2, 3, 4]).unwrap();
        assert_eq!(&f.bytes()[..4], &[1, 2, 3, 4]);
        assert_eq!(f.into_inner().len(), LEN);
    }
}

//! The simulated cells: where the contents, the programmed-word bitmap and the erase counts
//! sit in the memory buffer, what a program does to a byte, the seeded generator, and the
//! torn words and blocks a power cut leaves.

use super::{SimError, SimFlash};
use crate::storage::Geometry;

impl<S: AsRef<[u8]> + AsMut<[u8]>> SimFlash<S> {
    fn bitmap_offset(g: Geometry) -> usize {
        g.capacity as usize
    }

    pub(super) fn counts_offset(g: Geometry) -> usize {
        let words = (g.capacity / g.write_size) as usize;
        Self::bitmap_offset(g) + words.div_ceil(8)
    }

    /// Splits the memory into contents, programmed-word bitmap and erase counts.
    pub(super) fn parts(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let g = self.geometry;
        let bitmap_at = Self::bitmap_offset(g);
        let counts_at = Self::counts_offset(g);
        let end = counts_at + 4 * g.blocks() as usize;
        let (data, rest) = self.mem.as_mut()[..end].split_at_mut(bitmap_at);
        let (bitmap, counts) = rest.split_at_mut(counts_at - bitmap_at);
        (data, bitmap, counts)
    }

    pub(super) fn is_programmed(&self, word: u32) -> bool {
        let byte = Self::bitmap_offset(self.geometry) + (word / 8) as usize;
        self.mem.as_ref()[byte] & (1 << (word % 8)) != 0
    }

    pub(super) fn set_programmed(bitmap: &mut [u8], word: u32, programmed: bool) {
        let bit = 1 << (word % 8);
        let byte = &mut bitmap[(word / 8) as usize];
        if programmed {
            *byte |= bit;
        } else {
            *byte &= !bit;
        }
    }

    /// Sets the programmed bit of words `first .. first + count` from their content.
    pub(super) fn mark_programmed_if_not_erased(&mut self, first: u32, count: u32) {
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
    pub(super) fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn power(&self) -> Result<(), SimError> {
        if self.cut {
            Err(SimError::PowerCut)
        } else {
            Ok(())
        }
    }

    /// Checks `addr .. addr + len` against the capacity.
    pub(super) fn check_range(&self, addr: u32, len: usize) -> Result<(), SimError> {
        match super::super::range_end(addr, len, self.geometry.capacity) {
            Some(_) => Ok(()),
            None => Err(SimError::OutOfBounds {
                addr,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            }),
        }
    }

    /// Programs the first `done` bytes of word `word` with `chunk` and gives the rest a
    /// random subset of their bit transitions; marks the word programmed if it changed.
    pub(super) fn tear_word(&mut self, word: u32, chunk: &[u8], done: usize) {
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
    pub(super) fn cut_out_of_order(&mut self, first: u32, data: &[u8], unit: u32) -> SimError {
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

    pub(super) fn cut_now(&mut self) -> SimError {
        self.cut = true;
        self.disarm();
        SimError::PowerCut
    }
}

/// The byte a program of `data` over `old` leaves: bits of `data` that differ from the
/// erased value are moved to their programmed state, the others are kept.
pub(super) const fn program(old: u8, data: u8, erased: u8) -> u8 {
    let to_program = data ^ erased;
    (old & !to_program) | (!erased & to_program)
}

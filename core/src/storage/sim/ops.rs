//! The [`Flash`] operations of the simulated flash: reads, writes, erases and syncs, each
//! checked against the contract and subject to the armed power cut and faults.

use super::cells::program;
use super::{EraseTear, SimError, SimFlash};
use crate::storage::{Flash, Geometry};

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

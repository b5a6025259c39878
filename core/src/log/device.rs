//! The flash wrapper the log works through: reads retried on failure, writes padded to the
//! write size, erases verified blank, syncs; it counts every operation and remembers the
//! first failed write, erase or sync, which poisons the log.

use super::layout::Layout;
use super::outcome::Stats;
use crate::error::{AppendError, CommitError, FlushError, StorageOp};
use crate::storage::Flash;

/// Erase attempts before an erase block is declared bad.
pub(super) const ERASE_ATTEMPTS: u32 = 3;

/// Reads of one piece of flash before the log gives up on it: a read that returns an error
/// is retried until it has failed this many times (then the error is returned), and a
/// batch, segment header or journal entry that does not validate is read again until it
/// has failed this many times (then it is declared corrupt). A cell that reads wrong on
/// some reads only (a weak bit, a marginal supply) so costs a re-read, not a permanent gap;
/// a batch wrong on every read is reported corrupt after `READ_ATTEMPTS - 1` re-reads.
/// Blank (erased) regions are never re-read.
pub const READ_ATTEMPTS: u32 = 16;

/// Bytes read at a time when scanning flash.
pub(super) const CHUNK: usize = 256;

/// Internal error of a flash operation that can also meet a bad block, or of a write
/// refused because its sequence number would reach the format's limit.
pub(super) enum Io<E> {
    Flash(E),
    BadBlock(u32),
    SeqExhausted(crate::error::SeqSpace),
}

impl<E: core::fmt::Debug> From<Io<E>> for FlushError<E> {
    fn from(e: Io<E>) -> Self {
        match e {
            Io::Flash(e) => FlushError::Flash(e),
            Io::BadBlock(block) => FlushError::BadBlock { block },
            Io::SeqExhausted(what) => FlushError::SeqExhausted { what },
        }
    }
}

impl<E: core::fmt::Debug> From<Io<E>> for AppendError<E> {
    fn from(e: Io<E>) -> Self {
        FlushError::from(e).into()
    }
}

impl<E: core::fmt::Debug> From<Io<E>> for CommitError<E> {
    fn from(e: Io<E>) -> Self {
        match e {
            Io::Flash(e) => CommitError::Flash(e),
            Io::BadBlock(block) => CommitError::BadBlock { block },
            Io::SeqExhausted(what) => CommitError::SeqExhausted { what },
        }
    }
}

/// What [`Dev::count_non_erased`] found. Counts in bytes.
pub(super) struct NonErased {
    /// Bytes not erased in both reads.
    pub(super) both: u32,
    /// Bytes not erased in either read.
    pub(super) any: u32,
    /// One past the last byte not erased in either read, relative to the start.
    pub(super) used_end: u32,
}

/// Thin wrapper that counts flash operations and remembers the first failed write, erase
/// or sync (after which the log is poisoned).
pub(super) struct Dev<F: Flash> {
    pub(super) flash: F,
    pub(super) l: Layout,
    pub(super) stats: Stats,
    pub(super) failed: Option<StorageOp>,
}

impl<F: Flash> Dev<F> {
    /// Reads `buf.len()` bytes at `addr`, retrying a failed read up to [`READ_ATTEMPTS`]
    /// times in all (the last error is returned).
    pub(super) fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), F::Error> {
        let mut attempt = 1;
        loop {
            self.stats.flash_reads += 1;
            self.stats.flash_bytes_read += buf.len() as u64;
            match self.flash.read(addr, buf) {
                Ok(()) => return Ok(()),
                Err(e) if attempt >= READ_ATTEMPTS => return Err(e),
                Err(_) => {
                    warn!("flash read at {} failed; reading again", addr);
                    attempt += 1;
                }
            }
        }
    }

    /// Notes a failed write, erase or sync: the first one poisons the log.
    fn fail<T>(&mut self, op: StorageOp, r: Result<T, F::Error>) -> Result<T, F::Error> {
        if r.is_err() && self.failed.is_none() {
            warn!(
                "flash {} failed: the log is poisoned until remounted",
                op.as_str()
            );
            self.failed = Some(op);
        }
        r
    }

    /// Writes `data` at `addr` (aligned), padding the last word with the erased value.
    pub(super) fn write_padded(&mut self, addr: u32, data: &[u8]) -> Result<(), F::Error> {
        let ws = self.l.ws() as usize;
        let full = data.len() & !(ws - 1);
        if full > 0 {
            let r = self.flash.write(addr, &data[..full]);
            self.fail(StorageOp::Write, r)?;
            self.stats.flash_bytes_programmed += full as u64;
        }
        let rest = data.len() - full;
        if rest > 0 {
            let mut word = [self.l.geo.erased; 32];
            word[..rest].copy_from_slice(&data[full..]);
            let r = self.flash.write(addr + full as u32, &word[..ws]);
            self.fail(StorageOp::Write, r)?;
            self.stats.flash_bytes_programmed += ws as u64;
        }
        Ok(())
    }

    pub(super) fn is_blank(&mut self, addr: u32, len: u32) -> Result<bool, F::Error> {
        let mut chunk = [0u8; CHUNK];
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut chunk[..n])?;
            // A fold without an early exit: the compiler vectorizes it, where a byte loop
            // that stops at the first programmed byte runs one byte at a time (this check
            // follows every erase, so it is on the append path).
            let erased = self.l.geo.erased;
            if chunk[..n].iter().fold(0u8, |acc, &b| acc | (b ^ erased)) != 0 {
                return Ok(false);
            }
            at += n as u32;
        }
        Ok(true)
    }

    /// Counts the bytes of `addr .. addr + len` that are not erased. A chunk with such bytes
    /// is read a second time: `both` counts bytes not erased in both reads (what a read
    /// that went wrong once cannot fake, so a report of damage is not made of one bad
    /// read); `any` and `used_end` count and bound (relative to `addr`) the bytes either
    /// read saw not erased (what decides where the region may be written again, where a
    /// doubtful bit must count).
    pub(super) fn count_non_erased(&mut self, addr: u32, len: u32) -> Result<NonErased, F::Error> {
        let erased = self.l.geo.erased;
        let (mut a, mut b) = ([0u8; CHUNK], [0u8; CHUNK]);
        let mut out = NonErased {
            both: 0,
            any: 0,
            used_end: 0,
        };
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut a[..n])?;
            if a[..n].iter().any(|&x| x != erased) {
                self.read(addr + at, &mut b[..n])?;
                for (i, (&x, &y)) in a[..n].iter().zip(&b[..n]).enumerate() {
                    if x != erased && y != erased {
                        out.both += 1;
                    }
                    if x != erased || y != erased {
                        out.any += 1;
                        out.used_end = at + i as u32 + 1;
                    }
                }
            }
            at += n as u32;
        }
        Ok(out)
    }

    /// Erases `count` blocks from `first` and verifies them blank, erasing again if an
    /// interrupted or failed erase left bits behind.
    pub(super) fn erase_verified(&mut self, first: u32, count: u32) -> Result<(), Io<F::Error>> {
        let e = self.l.geo.erase_size;
        for block in first..first + count {
            let mut ok = false;
            for _ in 0..ERASE_ATTEMPTS {
                let r = self.flash.erase(block);
                self.fail(StorageOp::Erase, r).map_err(Io::Flash)?;
                self.stats.erases += 1;
                if self.is_blank(block * e, e).map_err(Io::Flash)? {
                    ok = true;
                    break;
                }
                warn!("erase block {} not blank after erase; erasing again", block);
            }
            if !ok {
                return Err(Io::BadBlock(block));
            }
        }
        Ok(())
    }

    pub(super) fn sync(&mut self) -> Result<(), F::Error> {
        self.stats.syncs += 1;
        let r = self.flash.sync();
        self.fail(StorageOp::Sync, r)
    }

    /// CRC-32 of `len` bytes at `addr`, streamed.
    pub(super) fn crc_of(
        &mut self,
        h: &mut crate::crc::Hasher,
        addr: u32,
        len: u32,
    ) -> Result<(), F::Error> {
        let mut chunk = [0u8; CHUNK];
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(CHUNK as u32) as usize;
            self.read(addr + at, &mut chunk[..n])?;
            h.update(&chunk[..n]);
            at += n as u32;
        }
        Ok(())
    }
}

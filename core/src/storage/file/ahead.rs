//! Read-ahead for sequential readers of the image file.
//!
//! The log reads a batch as its header and then its body, one batch after another: the
//! body whole when the caller's read buffer holds it, else through a 256-byte window (a
//! drain of an image would cost one `pread` per 256 bytes then, about one system call per
//! two records of 100 B). A read that starts where the previous one ended
//! (or at most [`SLACK`] bytes after it: batches are padded to the write size) is taken as
//! part of a sequential walk: [`WINDOW`] bytes are read from there at once and the reads
//! that follow are served from them. Other reads (a segment header, a binary search, the
//! erased checks of a write) go to the file as they are, so a mount reads no more than
//! before.
//!
//! The window holds bytes of the file as `pread` returned them: it is dropped when a write
//! or erase of [`FileFlash`](super::FileFlash) touches its range, and a poisoned image
//! serves no read from it (the checks come first), so a read returns what `pread` would.
//! The image's exclusive lock keeps other writers out.

use std::vec::Vec;

/// Bytes read at once by a sequential reader.
pub(super) const WINDOW: usize = 64 * 1024;

/// Largest gap, in bytes, between the end of a read and the start of the next for the two
/// to count as sequential (a batch is padded to at most 32-byte words).
pub(super) const SLACK: u32 = 64;

/// Reads this long or longer go to the file as they are.
pub(super) const DIRECT_FROM: usize = WINDOW / 4;

/// The bytes read ahead and where the last read ended.
#[derive(Debug, Default)]
pub(super) struct ReadAhead {
    /// Bytes of the file from address `at` (empty: no window).
    bytes: Vec<u8>,
    at: u32,
    /// One past the last byte of the previous read.
    next: Option<u32>,
}

impl ReadAhead {
    /// The `len` bytes at `addr`, if the window holds all of them.
    pub(super) fn get(&self, addr: u32, len: usize) -> Option<&[u8]> {
        let off = addr.checked_sub(self.at)? as usize;
        self.bytes.get(off..off.checked_add(len)?)
    }

    /// Whether a read of `len` bytes at `addr` goes on from the previous one and should
    /// fill the window.
    pub(super) fn sequential(&self, addr: u32, len: usize) -> bool {
        len < DIRECT_FROM && self.next.is_some_and(|n| addr >= n && addr - n <= SLACK)
    }

    /// The window, `len` bytes at `addr`, for the caller to fill with the file's bytes
    /// there; [`ReadAhead::failed`] empties it if that read fails.
    pub(super) fn refill(&mut self, addr: u32, len: usize) -> &mut [u8] {
        self.bytes.clear();
        self.bytes.resize(len, 0);
        self.at = addr;
        &mut self.bytes
    }

    /// The read into the buffer of [`ReadAhead::refill`] failed: nothing is held.
    pub(super) fn failed(&mut self) {
        self.bytes.clear();
    }

    /// A read ended at `end`.
    pub(super) fn ended(&mut self, end: u32) {
        self.next = Some(end);
    }

    /// Bytes `addr .. addr + len` of the file change: the window is dropped if it holds
    /// any of them.
    pub(super) fn invalidate(&mut self, addr: u32, len: u64) {
        let (a, b) = (u64::from(addr), u64::from(addr) + len);
        let (wa, wb) = (
            u64::from(self.at),
            u64::from(self.at) + self.bytes.len() as u64,
        );
        if a < wb && wa < b {
            self.bytes.clear();
        }
    }
}

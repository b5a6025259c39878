//! Shared pieces of the fuzz targets: an in-memory transport and a small formatted
//! simulated flash.

use std::convert::Infallible;

use spillway_core::log::{Config, Log, Memory, SegmentSlot, segments_for};
use spillway_core::storage::{Geometry, SimFlash};

/// Geometry of the fuzzed flash: 1 KiB erase blocks, 4-byte writes, 2 journal blocks and 8
/// data blocks (4 segments of 2 blocks).
pub const GEO: Geometry = Geometry {
    erase_size: 1024,
    write_size: 4,
    capacity: 1024 * 10,
    erased: 0xFF,
};

/// Erase blocks per segment of the fuzzed flash.
pub const BPS: u32 = 2;

/// Serves `input` `chunk` bytes per read (then end of stream) and drops what is written.
pub struct FeedIo<'a> {
    /// Bytes not yet read.
    pub input: &'a [u8],
    /// Largest read, bytes (at least 1).
    pub chunk: usize,
    /// Bytes written so far.
    pub written: usize,
}

impl embedded_io::ErrorType for FeedIo<'_> {
    type Error = Infallible;
}

impl embedded_io::Read for FeedIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = self.input.len().min(buf.len()).min(self.chunk.max(1));
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl embedded_io::Write for FeedIo<'_> {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        self.written += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

/// A freshly formatted flash of [`GEO`].
pub fn formatted() -> SimFlash<Vec<u8>> {
    let mut flash = SimFlash::new_vec(GEO).expect("valid geometry");
    Log::format(&mut flash, 0x5157, BPS).expect("format");
    flash
}

/// The RAM a log on [`GEO`] works in: a `buffer`-byte write buffer and the segment table.
pub fn memory(buffer: usize) -> (Vec<u8>, Vec<SegmentSlot>) {
    (
        vec![0u8; buffer],
        vec![SegmentSlot::EMPTY; segments_for(&GEO, BPS) as usize],
    )
}

/// Mounts `flash` in `buf`/`slots` with the default config.
pub fn mount<'a>(
    flash: &'a mut SimFlash<Vec<u8>>,
    buf: &'a mut [u8],
    slots: &'a mut [SegmentSlot],
) -> Option<Log<'a, &'a mut SimFlash<Vec<u8>>>> {
    let mem = Memory {
        buffer: buf,
        segments: slots,
    };
    Log::mount(flash, Config::default(), mem, 0)
        .ok()
        .map(|m| m.0)
}

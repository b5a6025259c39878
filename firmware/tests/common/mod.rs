//! The in-memory transport the gateway's integration tests drive a `Session` over.
#![allow(dead_code)]

use std::convert::Infallible;

/// Input delivered at most `chunk` bytes per read; every reply written is collected in
/// `output`.
pub struct MemIo {
    /// Bytes the session reads.
    pub input: Vec<u8>,
    /// How far the session has read.
    pub pos: usize,
    /// Most bytes one read returns.
    pub chunk: usize,
    /// Bytes the session wrote.
    pub output: Vec<u8>,
}

impl Default for MemIo {
    /// Empty, with reads as large as the caller's buffer.
    fn default() -> Self {
        MemIo {
            input: Vec::new(),
            pos: 0,
            chunk: usize::MAX,
            output: Vec::new(),
        }
    }
}

impl embedded_io::ErrorType for MemIo {
    type Error = Infallible;
}

impl embedded_io::Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = (self.input.len() - self.pos).min(buf.len()).min(self.chunk);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl embedded_io::Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

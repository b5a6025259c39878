//! The CMSDK APB UART of the MPS2 boards (QEMU `cmsdk-apb-uart`) as a blocking
//! `embedded-io` transport, polled (no interrupts).
//!
//! Registers (32-bit, from the base): `DATA` 0x00, `STATE` 0x04 (bit 0 TX buffer full,
//! bit 1 RX buffer full), `CTRL` 0x08 (bit 0 TX enable, bit 1 RX enable), `INTSTATUS`
//! 0x0C, `BAUDDIV` 0x10 (at least 16). The receive buffer holds one byte; QEMU holds back
//! further input until it is read, so nothing is lost however slowly the firmware reads.

use core::ptr::{read_volatile, write_volatile};

use embedded_io::{ErrorKind, ErrorType, Read, Write};

/// Base address of UART0 on the MPS2 AN385/AN386 (QEMU connects it to the first
/// `-serial`).
pub const UART0_BASE: usize = 0x4000_4000;

const DATA: usize = 0x00;
const STATE: usize = 0x04;
const CTRL: usize = 0x08;
const BAUDDIV: usize = 0x10;
const STATE_TX_FULL: u32 = 1 << 0;
const STATE_RX_FULL: u32 = 1 << 1;
const CTRL_TX_EN: u32 = 1 << 0;
const CTRL_RX_EN: u32 = 1 << 1;

/// A read found no byte within the read timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout;

impl core::fmt::Display for Timeout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("no byte on the UART within the read timeout")
    }
}

impl core::error::Error for Timeout {}

impl embedded_io::Error for Timeout {
    fn kind(&self) -> ErrorKind {
        ErrorKind::TimedOut
    }
}

/// One CMSDK UART. A `read` waits for its first byte at most `read_timeout_us` µs of
/// `clock` (then fails with [`Timeout`], so the caller can run timers), and returns the
/// bytes that follow back to back.
pub struct Uart {
    base: usize,
    clock: fn() -> u64,
    read_timeout_us: u64,
}

impl Uart {
    /// Enables transmitter and receiver of the UART at `base` (e.g. [`UART0_BASE`]) at
    /// divider `bauddiv` (core clock / baud rate; QEMU ignores the rate but wants ≥ 16).
    ///
    /// # Safety
    /// `base` must be the address of a CMSDK APB UART that nothing else drives.
    pub unsafe fn new(base: usize, bauddiv: u32, clock: fn() -> u64, read_timeout_us: u64) -> Self {
        let u = Uart {
            base,
            clock,
            read_timeout_us,
        };
        u.set(BAUDDIV, bauddiv.max(16));
        u.set(CTRL, CTRL_TX_EN | CTRL_RX_EN);
        u
    }

    fn get(&self, reg: usize) -> u32 {
        // SAFETY: `new`'s contract: `base` is a CMSDK UART; `reg` is one of its registers.
        unsafe { read_volatile((self.base + reg) as *const u32) }
    }

    fn set(&self, reg: usize, v: u32) {
        // SAFETY: as in `get`.
        unsafe { write_volatile((self.base + reg) as *mut u32, v) }
    }

    fn try_read_byte(&self) -> Option<u8> {
        (self.get(STATE) & STATE_RX_FULL != 0).then(|| self.get(DATA) as u8)
    }
}

impl ErrorType for Uart {
    type Error = Timeout;
}

impl Read for Uart {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Timeout> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = (self.clock)().saturating_add(self.read_timeout_us);
        let first = loop {
            if let Some(b) = self.try_read_byte() {
                break b;
            }
            if (self.clock)() >= deadline {
                return Err(Timeout);
            }
        };
        buf[0] = first;
        let mut n = 1;
        // The bytes already on their way: QEMU refills the one-byte buffer within a few
        // polls while the sender has more.
        let mut idle = 0u32;
        while n < buf.len() && idle < 64 {
            match self.try_read_byte() {
                Some(b) => {
                    buf[n] = b;
                    n += 1;
                    idle = 0;
                }
                None => idle += 1,
            }
        }
        Ok(n)
    }
}

impl Write for Uart {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Timeout> {
        for &b in buf {
            while self.get(STATE) & STATE_TX_FULL != 0 {}
            self.set(DATA, u32::from(b));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), Timeout> {
        while self.get(STATE) & STATE_TX_FULL != 0 {}
        Ok(())
    }
}

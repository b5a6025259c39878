//! The simulated flash as the tests share it, their deterministic randomness, and the
//! record their oracles keep ([`Rec`]). Needs only `alloc`: the Cortex-M build of the power-cut sweep uses this module too
//! (firmware/boards/mps2-an386).

extern crate alloc;

use alloc::vec::Vec;
use core::cell::RefCell;

use spillway_core::log::{Producer, Record};
use spillway_core::storage::{Flash, Geometry, SimError, SimFlash};

/// The simulated flash the tests use.
pub type Sim = SimFlash<Vec<u8>>;

/// A NOR flash of `capacity` bytes in erase blocks of `erase_size` bytes, programmed in
/// 4-byte words and erased to `0xFF`: the geometry of most tests.
pub const fn nor(erase_size: u32, capacity: u32) -> Geometry {
    Geometry {
        erase_size,
        write_size: 4,
        capacity,
        erased: 0xFF,
    }
}

/// The simulated flash behind a `RefCell`, so the test can power it on between two mount
/// attempts while the memory of a failed attempt is still borrowed.
#[derive(Clone, Copy)]
pub struct Shared<'s>(pub &'s RefCell<Sim>);

impl Flash for Shared<'_> {
    type Error = SimError;
    fn geometry(&self) -> Geometry {
        self.0.borrow().geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), SimError> {
        self.0.borrow_mut().read(addr, buf)
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), SimError> {
        self.0.borrow_mut().write(addr, data)
    }
    fn erase(&mut self, block: u32) -> Result<(), SimError> {
        self.0.borrow_mut().erase(block)
    }
    fn sync(&mut self) -> Result<(), SimError> {
        self.0.borrow_mut().sync()
    }
}

/// Deterministic randomness (SplitMix64), so every failing case replays from its seed.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with the given chance in percent.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A seed derived from two numbers (a campaign seed and a run index).
pub fn mix(a: u64, b: u64) -> u64 {
    Rng(a ^ b.rotate_left(32)).next()
}

/// A record as a test's oracle keeps it: what was appended, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rec {
    /// The topic.
    pub topic: &'static str,
    /// The timestamp, µs.
    pub ts: u64,
    /// The producer id and sequence, if any.
    pub producer: Option<Producer>,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Rec {
    /// The record to append (or to compare with what was read).
    pub fn as_record(&self) -> Record<'_> {
        Record {
            topic: self.topic,
            timestamp_us: self.ts,
            producer: self.producer,
            payload: &self.payload,
        }
    }
}

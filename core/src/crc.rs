//! The CRC-32 of the on-flash format and of the wire frames: IEEE 802.3 polynomial,
//! reflected, initial value and final XOR 0xFFFFFFFF (as in zlib and Ethernet).
//!
//! By default it is `crc32fast` (slice-by-16 tables, 16 KiB of read-only data, or the CPU's
//! CRC instructions where `std` detects them). With the feature `small-crc` it is
//! [`Small`]: one byte per step through a 1 KiB table built at compile time, for
//! microcontrollers whose flash the 16 KiB table would not fit. Both compute the same
//! values; only size and speed differ.

/// The incremental CRC-32 the crate uses (see the [module docs](self)).
#[cfg(not(feature = "small-crc"))]
pub type Hasher = crc32fast::Hasher;
/// The incremental CRC-32 the crate uses (see the [module docs](self)).
#[cfg(feature = "small-crc")]
pub type Hasher = Small;

/// CRC-32 of `data` (see the [module docs](self)).
#[inline]
pub fn hash(data: &[u8]) -> u32 {
    let mut h = Hasher::new();
    h.update(data);
    h.finalize()
}

/// A [`Hasher`] fed through a small buffer: many short pieces (a record's head of a byte or
/// two, then its payload) cost one hasher update per [`Gather::BUF`] bytes instead of one
/// each. Pieces longer than the buffer go to the hasher directly. Same values as
/// [`Hasher`].
pub struct Gather {
    h: Hasher,
    buf: [u8; Gather::BUF],
    n: usize,
}

impl Default for Gather {
    fn default() -> Self {
        Self::new()
    }
}

impl Gather {
    /// Bytes gathered before the hasher is updated (none with `small-crc`, whose cost is
    /// per byte, not per update: no buffer on a microcontroller's stack).
    pub const BUF: usize = if cfg!(feature = "small-crc") { 0 } else { 256 };

    /// A CRC over nothing yet.
    pub fn new() -> Self {
        Gather {
            h: Hasher::new(),
            buf: [0; Gather::BUF],
            n: 0,
        }
    }

    /// Adds `data` to the CRC.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        if self.n + data.len() > Self::BUF {
            self.h.update(&self.buf[..self.n]);
            self.n = 0;
            if data.len() > Self::BUF {
                self.h.update(data);
                return;
            }
        }
        self.buf[self.n..self.n + data.len()].copy_from_slice(data);
        self.n += data.len();
    }

    /// The CRC of everything added.
    pub fn finalize(mut self) -> u32 {
        self.h.update(&self.buf[..self.n]);
        self.h.finalize()
    }
}

/// Reflected IEEE 802.3 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// The byte-step table: the CRC register after shifting each byte value through.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32 one byte at a time through a 1 KiB table (feature `small-crc` makes it the
/// crate's [`Hasher`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Small {
    state: u32,
}

impl Default for Small {
    fn default() -> Self {
        Self::new()
    }
}

impl Small {
    /// A CRC over nothing yet.
    pub const fn new() -> Self {
        Small { state: !0 }
    }

    /// Adds `data` to the CRC.
    pub fn update(&mut self, data: &[u8]) {
        let mut c = self.state;
        for &b in data {
            c = TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
        }
        self.state = c;
    }

    /// The CRC of everything added.
    pub fn finalize(self) -> u32 {
        !self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_equals_one_update_on_every_split() {
        let data: std::vec::Vec<u8> = (0..700u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for piece in [1, 2, 7, 33, 127, 128, 129, 300] {
            let mut g = Gather::new();
            for (k, c) in data.chunks(piece).enumerate() {
                // Mixed piece sizes: every other piece cut in two.
                let (a, b) = c.split_at(if k % 2 == 0 { c.len() / 2 } else { 0 });
                g.update(a);
                g.update(b);
            }
            assert_eq!(g.finalize(), hash(&data), "pieces of {piece}");
        }
        assert_eq!(Gather::new().finalize(), hash(&[]));
    }

    #[test]
    fn small_crc_matches_the_check_value() {
        let mut h = Small::new();
        h.update(b"123456789");
        assert_eq!(h.finalize(), 0xCBF4_3926);
        assert_eq!(Small::new().finalize(), 0);
    }

    #[test]
    fn small_crc_equals_crc32fast_on_every_split() {
        let data: std::vec::Vec<u8> = (0..600u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 599, 600] {
            for split in [0, 1.min(len), len / 2, len] {
                let mut s = Small::new();
                s.update(&data[..split]);
                s.update(&data[split..len]);
                assert_eq!(
                    s.finalize(),
                    crc32fast::hash(&data[..len]),
                    "len {len} split {split}"
                );
            }
        }
    }
}

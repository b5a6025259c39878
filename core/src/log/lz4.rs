//! Per-batch LZ4 compression of compact bodies (feature `compression`; `FORMAT.md` section
//! 4.4): the scratch buffer it works in, the compressor (the block compressor of the
//! `lz4_flex` crate, without `alloc`, into caller buffers) and a block decoder that takes
//! the compressed bytes straight from the flash through a [`Source`] window.
//!
//! The decoder is this crate's own: `lz4_flex`'s block decoder wants the whole compressed
//! block as one slice, which would need a second buffer the size of the batch besides the
//! one the body decodes into. The LZ4 block format is the one of the reference
//! implementation's `lz4_Block_format.md`: a sequence of (token, literal length, literals,
//! match offset, match length), the last sequence literals only.
//!
//! [`compress`] and [`decompress`] are public for tools and benchmarks that measure the codec
//! alone; the log calls them itself.

#[cfg(feature = "compression")]
use super::compact::Source;

#[cfg(feature = "compression")]
/// The compact body flag of a compressed body (`FORMAT.md` section 4.4): the byte is
/// followed by the varint length of the compact body and its LZ4 block.
pub const BODY_LZ4: u8 = 0x04;

#[cfg(feature = "compression")]
/// Bytes of scratch a log with a RAM buffer of `buffer_len` bytes needs to write and read
/// compressed batches: the LZ4 worst-case output for an input the size of the buffer
/// (`lz4_flex::block::get_maximum_output_size`, about 1.1 times the buffer plus 20 bytes).
/// The compressor also takes a hash table on the stack while it runs (8 KiB for bodies
/// below 64 KiB, 16 KiB above).
pub const fn scratch_len(buffer_len: usize) -> usize {
    lz4_flex::block::get_maximum_output_size(buffer_len)
}

#[cfg(feature = "compression")]
/// Compresses `input` into `out` as one LZ4 block; returns its length, or `None` if `out` is
/// smaller than the worst case for `input` ([`scratch_len`] of its length).
pub fn compress(input: &[u8], out: &mut [u8]) -> Option<usize> {
    lz4_flex::block::compress_into(input, out).ok()
}

#[cfg(feature = "compression")]
/// Reads one byte of an LZ4 block, counting down the bytes left in it.
fn byte<S: Source>(src: &mut S, left: &mut usize) -> Result<Option<u8>, S::Error> {
    if *left == 0 {
        return Ok(None);
    }
    let mut b = [0u8];
    if !src.take(&mut b)? {
        return Ok(None);
    }
    *left -= 1;
    Ok(Some(b[0]))
}

#[cfg(feature = "compression")]
/// Reads the length extension of a token nibble of 15 (bytes of 255 then a last one).
fn extend<S: Source>(
    src: &mut S,
    left: &mut usize,
    mut n: usize,
) -> Result<Option<usize>, S::Error> {
    loop {
        let Some(b) = byte(src, left)? else {
            return Ok(None);
        };
        let Some(m) = n.checked_add(usize::from(b)) else {
            return Ok(None);
        };
        n = m;
        if b != 255 {
            return Ok(Some(n));
        }
    }
}

#[cfg(feature = "compression")]
/// Decodes an LZ4 block of `stored` bytes taken from `src` into `out`, which it must fill
/// exactly. `Ok(false)` if the block is malformed (a match before the start of the output,
/// an offset of 0, more output than `out` holds, fewer bytes than `out` or than `stored`):
/// never a panic.
pub fn decompress<S: Source>(src: &mut S, stored: usize, out: &mut [u8]) -> Result<bool, S::Error> {
    let mut left = stored;
    let mut at = 0usize;
    loop {
        let Some(token) = byte(src, &mut left)? else {
            return Ok(false);
        };
        let mut lits = usize::from(token >> 4);
        if lits == 15 {
            let Some(n) = extend(src, &mut left, lits)? else {
                return Ok(false);
            };
            lits = n;
        }
        if lits > left {
            return Ok(false);
        }
        let Some(dst) = at.checked_add(lits).and_then(|end| out.get_mut(at..end)) else {
            return Ok(false);
        };
        if !src.take(dst)? {
            return Ok(false);
        }
        (at, left) = (at + lits, left - lits);
        if left == 0 {
            // The last sequence: literals only.
            return Ok(at == out.len());
        }
        let (Some(lo), Some(hi)) = (byte(src, &mut left)?, byte(src, &mut left)?) else {
            return Ok(false);
        };
        let offset = usize::from(u16::from_le_bytes([lo, hi]));
        if offset == 0 || offset > at {
            return Ok(false);
        }
        let mut len = usize::from(token & 0x0F);
        if len == 15 {
            let Some(n) = extend(src, &mut left, len)? else {
                return Ok(false);
            };
            len = n;
        }
        let Some(end) = len.checked_add(4).and_then(|n| at.checked_add(n)) else {
            return Ok(false);
        };
        if end > out.len() {
            return Ok(false);
        }
        let from = at - offset;
        if offset >= end - at {
            out.copy_within(from..from + (end - at), at);
        } else {
            // An overlapping match repeats the last `offset` bytes.
            for i in at..end {
                out[i] = out[i - offset];
            }
        }
        at = end;
    }
}

/// The scratch buffer of a log that compresses or reads compressed batches, and which
/// batch's decoded body it holds (so that reads inside one batch decode it once).
#[derive(Debug)]
pub(super) struct Scratch<'a> {
    pub(super) buf: &'a mut [u8],
    /// The batch whose compact body is in `buf[..len]`: its flash address and header
    /// (offsets are never reused, so the two name one batch for good) and `len`.
    #[cfg(feature = "compression")]
    pub(super) holds: Option<Held>,
}

/// See [`Scratch::holds`].
#[cfg(feature = "compression")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) addr: u32,
    pub(super) h: super::format::BatchHeader,
    pub(super) len: usize,
}

#[cfg(all(test, feature = "compression"))]
mod tests {
    use super::*;
    use crate::log::compact::SliceSource;
    use std::vec::Vec;

    fn round_trip(input: &[u8]) -> usize {
        let mut c = std::vec![0u8; scratch_len(input.len())];
        let n = compress(input, &mut c).unwrap();
        let mut out = std::vec![0u8; input.len()];
        let mut src = SliceSource { rest: &c[..n] };
        assert!(
            decompress(&mut src, n, &mut out).unwrap(),
            "len {}",
            input.len()
        );
        assert_eq!(out, input);
        assert!(src.rest.is_empty());
        // The crate's own decoder agrees.
        let mut theirs = std::vec![0u8; input.len()];
        assert_eq!(
            lz4_flex::block::decompress_into(&c[..n], &mut theirs).ok(),
            Some(input.len())
        );
        assert_eq!(theirs, input);
        n
    }

    /// What lz4_flex compresses, this decoder decodes, for runs, text, noise and the
    /// lengths around the block format's limits (13 bytes, 15 and 270 literal or match
    /// bytes, offsets near 64 KiB).
    #[test]
    fn decodes_what_lz4_flex_compresses() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = || crate::log::tests::xorshift64(&mut x) as u8;
        for len in [
            0usize, 1, 12, 13, 14, 15, 16, 19, 20, 270, 271, 1000, 70_000,
        ] {
            let runs: Vec<u8> = (0..len).map(|i| (i / 300) as u8).collect();
            let text: Vec<u8> = (0..len)
                .map(|i| b"2025-11-24T16:00:00Z sst=18.4 "[i % 30] ^ (i / 97) as u8)
                .collect();
            let rand: Vec<u8> = (0..len).map(|_| noise()).collect();
            round_trip(&runs);
            round_trip(&text);
            round_trip(&rand);
        }
        // Far repeats: a block of noise and the same block again, 60 000 bytes later.
        let block: Vec<u8> = (0..4000).map(|_| noise()).collect();
        let mut far = block.clone();
        far.extend((0..56_000).map(|_| noise()));
        far.extend_from_slice(&block);
        let n = round_trip(&far);
        assert!(n < far.len() - 3000, "the repeat was found ({n})");
    }

    /// Every malformed block is refused without a panic: truncated, too long, into too
    /// small or too large an output, arbitrary bytes.
    #[test]
    fn malformed_blocks_are_refused() {
        let input: Vec<u8> = (0..500u32).map(|i| (i % 7) as u8).collect();
        let mut c = std::vec![0u8; scratch_len(input.len())];
        let n = compress(&input, &mut c).unwrap();
        let mut out = std::vec![0u8; input.len()];
        for cut in 0..n {
            let mut src = SliceSource { rest: &c[..cut] };
            assert!(!decompress(&mut src, cut, &mut out).unwrap(), "cut {cut}");
        }
        let mut src = SliceSource { rest: &c[..n] };
        assert!(!decompress(&mut src, n, &mut out[..499]).unwrap());
        let mut big = std::vec![0u8; 501];
        let mut src = SliceSource { rest: &c[..n] };
        assert!(!decompress(&mut src, n, &mut big).unwrap());
        // An offset of 0, and one before the start of the output.
        for bad in [
            [0x14u8, b'a', 0, 0, 0x10, b'b'],
            [0x14, b'a', 2, 0, 0x10, b'b'],
        ] {
            let mut src = SliceSource { rest: &bad };
            assert!(!decompress(&mut src, bad.len(), &mut [0u8; 7]).unwrap());
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut out = [0u8; 2048];
        for _ in 0..20_000 {
            crate::log::tests::xorshift64(&mut x);
            let len = (x % 48) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8)
                .collect();
            let want = (x >> 48) as usize % out.len();
            let mut src = SliceSource { rest: &bytes };
            let _ = decompress(&mut src, len, &mut out[..want]);
        }
    }
}

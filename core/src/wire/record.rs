//! [`RecordView`]'s own encoder and decoder: the item a `Records` reply carries thousands of
//! times per fetch. They write and read exactly the bytes of postcard's encoding of the
//! struct (varints as LEB128, 7 bits per byte, least significant group first; the topic
//! and the payload as a varint length and their bytes; the producer as a 0 or 1 tag and
//! its fields), and refuse exactly what postcard refuses, with its errors; the property
//! tests hold them to that. What they save is serde's call per field and postcard's byte
//! by byte copies: the gateway spent about a seventh of its fetch path in them.

use postcard::Error;

use super::RecordView;
use crate::log::format::Producer;

/// Bytes of the LEB128 varint of `v`: 1 to 10, `ceil(bits / 7)` computed as
/// `(bits * 9 + 64) / 64`, which agrees with it for every bit count from 1 to 64.
const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    (bits * 9 + 64) >> 6
}

/// The most bytes an encoding takes besides its topic and payload bytes: the varints of
/// the offset (10), the record CRC (5), the topic length (10), the timestamp (10), the
/// producer tag (1), its id (10) and sequence (5), and the payload length (10).
const MAX_FIXED_LEN: usize = 10 + 5 + 10 + 10 + 1 + 10 + 5 + 10;

/// Writes into a slice the caller has checked to be large enough.
struct Out<'o> {
    buf: &'o mut [u8],
    at: usize,
}

impl Out<'_> {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf[self.at] = (v as u8) | 0x80;
            v >>= 7;
            self.at += 1;
        }
        self.buf[self.at] = v as u8;
        self.at += 1;
    }

    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// Reads from the front of a slice, with postcard's errors.
struct In<'a> {
    rest: &'a [u8],
}

impl<'a> In<'a> {
    #[inline]
    fn byte(&mut self) -> Result<u8, Error> {
        let (&b, rest) = self
            .rest
            .split_first()
            .ok_or(Error::DeserializeUnexpectedEnd)?;
        self.rest = rest;
        Ok(b)
    }

    /// A varint of at most `max` bytes whose last byte is at most `last_max` (so that the
    /// value fits its type), as postcard takes a `u32` (5, 0x0F) or a `u64` (10, 0x01).
    #[inline(always)]
    fn varint(&mut self, max: usize, last_max: u8) -> Result<u64, Error> {
        let bytes = self.rest;
        if bytes.len() < max {
            return self.varint_near_end(max, last_max);
        }
        // Every byte it may take is at hand: no end check per byte.
        let mut out = 0u64;
        for (i, &b) in bytes[..max].iter().enumerate() {
            out |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                if i == max - 1 && b > last_max {
                    return Err(Error::DeserializeBadVarint);
                }
                self.rest = &bytes[i + 1..];
                return Ok(out);
            }
        }
        Err(Error::DeserializeBadVarint)
    }

    /// [`In::varint`] within `max` bytes of the end.
    #[cold]
    fn varint_near_end(&mut self, max: usize, last_max: u8) -> Result<u64, Error> {
        let mut out = 0u64;
        for i in 0..max {
            let b = self.byte()?;
            out |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                if i == max - 1 && b > last_max {
                    return Err(Error::DeserializeBadVarint);
                }
                return Ok(out);
            }
        }
        Err(Error::DeserializeBadVarint)
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, Error> {
        // At most 5 bytes with a last byte of at most 0x0F: the value fits.
        self.varint(5, 0x0F).map(|v| v as u32)
    }

    #[inline]
    fn u64(&mut self) -> Result<u64, Error> {
        self.varint(10, 0x01)
    }

    /// A length, as postcard takes a `usize`: a `u64` varint on 64-bit targets, a `u32`
    /// one on 32-bit targets.
    #[inline]
    fn len(&mut self) -> Result<usize, Error> {
        #[cfg(target_pointer_width = "64")]
        let n = self.u64()? as usize;
        #[cfg(not(target_pointer_width = "64"))]
        let n = self.u32()? as usize;
        Ok(n)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.rest.len() {
            return Err(Error::DeserializeUnexpectedEnd);
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }
}

impl<'a> RecordView<'a> {
    /// Bytes of the record's encoding.
    #[inline]
    pub const fn encoded_len(&self) -> usize {
        let producer = match self.producer {
            Some(p) => 1 + varint_len(p.id) + varint_len(p.seq as u64),
            None => 1,
        };
        varint_len(self.offset)
            + varint_len(self.record_crc as u64)
            + varint_len(self.topic.len() as u64)
            + self.topic.len()
            + varint_len(self.timestamp_us)
            + producer
            + varint_len(self.payload.len() as u64)
            + self.payload.len()
    }

    /// Writes the record's encoding (postcard's bytes for the struct) at the start of `out`
    /// and returns its length in bytes, or `None`, writing nothing, when `out` is shorter
    /// ([`RecordView::encoded_len`]).
    #[inline]
    pub fn encode_into(&self, out: &mut [u8]) -> Option<usize> {
        // Most pushes have room for the longest encoding: they write in one pass, without
        // sizing the record first.
        let longest = MAX_FIXED_LEN
            .saturating_add(self.topic.len())
            .saturating_add(self.payload.len());
        let buf = if out.len() >= longest {
            out
        } else {
            out.get_mut(..self.encoded_len())?
        };
        let mut o = Out { buf, at: 0 };
        o.varint(self.offset);
        o.varint(u64::from(self.record_crc));
        o.varint(self.topic.len() as u64);
        o.bytes(self.topic.as_bytes());
        o.varint(self.timestamp_us);
        match self.producer {
            Some(p) => {
                o.bytes(&[1]);
                o.varint(p.id);
                o.varint(u64::from(p.seq));
            }
            None => o.bytes(&[0]),
        }
        o.varint(self.payload.len() as u64);
        o.bytes(self.payload);
        Some(o.at)
    }

    /// Decodes one record from the start of `bytes`, as `postcard::take_from_bytes` does;
    /// returns it, borrowing its topic and payload from `bytes`, and the bytes after it.
    ///
    /// # Errors
    /// As postcard's: [`Error::DeserializeUnexpectedEnd`] when `bytes` ends inside the
    /// record, [`Error::DeserializeBadVarint`] for a varint too long or too large for its
    /// field, [`Error::DeserializeBadUtf8`] for a topic that is not UTF-8,
    /// [`Error::DeserializeBadOption`] for a producer tag other than 0 or 1.
    #[inline]
    pub fn take_from(bytes: &'a [u8]) -> Result<(RecordView<'a>, &'a [u8]), Error> {
        let mut i = In { rest: bytes };
        let offset = i.u64()?;
        let record_crc = i.u32()?;
        let n = i.len()?;
        let topic = core::str::from_utf8(i.take(n)?).map_err(|_| Error::DeserializeBadUtf8)?;
        let timestamp_us = i.u64()?;
        let producer = match i.byte()? {
            0 => None,
            1 => Some(Producer {
                id: i.u64()?,
                seq: i.u32()?,
            }),
            _ => return Err(Error::DeserializeBadOption),
        };
        let n = i.len()?;
        let payload = i.take(n)?;
        let rec = RecordView {
            offset,
            record_crc,
            topic,
            timestamp_us,
            producer,
            payload,
        };
        Ok((rec, i.rest))
    }
}

#[cfg(test)]
mod tests {
    use super::varint_len;

    #[test]
    fn varint_len_is_seven_bits_a_byte_rounded_up() {
        assert_eq!(varint_len(0), 1);
        for bits in 1..=64u32 {
            let largest = u64::MAX >> (64 - bits);
            let want = bits.div_ceil(7) as usize;
            assert_eq!(varint_len(largest), want, "{bits} bits");
            assert_eq!(varint_len(1u64 << (bits - 1)), want, "{bits} bits");
        }
    }
}

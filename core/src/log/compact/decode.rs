//! Decoding a compact body (`FORMAT.md` section 4.3): the [`Decoder`] takes its bytes from a
//! [`Source`] (the flash through a window, or a body held in memory) and hands out each
//! record's fields ([`Head`]); [`expand`] turns a body held in memory into canonical
//! encodings.

use super::*;

/// Where a decoder gets a compact body's bytes from, in order.
pub trait Source {
    /// Error of the underlying storage.
    type Error;
    /// Fills `out` with the next bytes of the body; `Ok(false)` if the body ends first.
    fn take(&mut self, out: &mut [u8]) -> Result<bool, Self::Error>;

    /// The next bytes of the body that are at hand already (loaded, not taken yet), possibly
    /// none: a decoder reads a short field from them without a call per byte, then takes
    /// it with [`Source::consume`]. None by default.
    #[inline]
    fn ready(&self) -> &[u8] {
        &[]
    }

    /// Takes the first `n` bytes of [`Source::ready`] (`n` at most its length; more takes
    /// what there is).
    #[inline]
    fn consume(&mut self, n: usize) {
        let _ = n;
    }

    /// Passes over the next `n` bytes of the body; `Ok(false)` if the body ends first.
    fn skip(&mut self, mut n: usize) -> Result<bool, Self::Error> {
        let mut b = [0u8; 64];
        while n > 0 {
            let k = n.min(b.len());
            if !self.take(&mut b[..k])? {
                return Ok(false);
            }
            n -= k;
        }
        Ok(true)
    }
}

/// A compact body held in memory.
#[derive(Debug)]
pub struct SliceSource<'a> {
    /// The bytes not taken yet.
    pub rest: &'a [u8],
}

impl Source for SliceSource<'_> {
    type Error = core::convert::Infallible;
    #[inline]
    fn take(&mut self, out: &mut [u8]) -> Result<bool, Self::Error> {
        let Some((head, rest)) = self.rest.split_at_checked(out.len()) else {
            return Ok(false);
        };
        out.copy_from_slice(head);
        self.rest = rest;
        Ok(true)
    }

    fn skip(&mut self, n: usize) -> Result<bool, Self::Error> {
        let Some(rest) = self.rest.get(n..) else {
            return Ok(false);
        };
        self.rest = rest;
        Ok(true)
    }

    #[inline]
    fn ready(&self) -> &[u8] {
        self.rest
    }

    #[inline]
    fn consume(&mut self, n: usize) {
        self.rest = self.rest.get(n..).unwrap_or_default();
    }
}

/// The fields of one decoded record, before its payload (which the caller takes from the
/// source: `payload_len` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Wall-clock timestamp, µs since the Unix epoch.
    pub timestamp_us: u64,
    /// Producer id and sequence, if the record has them.
    pub producer: Option<Producer>,
    /// Payload bytes that follow in the source.
    pub payload_len: u32,
    own_topic: bool,
}

/// Decodes the records of one compact body, one [`Head`] at a time: after each
/// [`Decoder::next`] the caller takes the record's payload from the same source. Every
/// decoded number is checked: a malformed body gives `None`, never a panic.
#[derive(Debug, Clone)]
pub struct Decoder {
    flags: u8,
    prev_ts: u64,
    fixed_len: u32,
    left: u32,
    topic: [u8; MAX_TOPIC_LEN],
    topic_len: u8,
    own: [u8; MAX_TOPIC_LEN],
    own_len: u8,
}

/// [`take_varint`] with a varint of one or two bytes at hand ([`Source::ready`]) taken
/// inline (the timestamp steps and payload lengths of most records).
#[inline(always)]
pub(super) fn take_varint_fast<S: Source>(src: &mut S) -> Result<Option<u64>, S::Error> {
    match *src.ready() {
        [b0, ..] if b0 & 0x80 == 0 => {
            src.consume(1);
            Ok(Some(u64::from(b0)))
        }
        [b0, b1, ..] if b1 & 0x80 == 0 => {
            src.consume(2);
            Ok(Some(u64::from(b0 & 0x7F) | u64::from(b1) << 7))
        }
        _ => take_varint(src),
    }
}

/// The LEB128 varint at the start of `b`: its value and length, `None` if `b` ends
/// first, or the varint is longer than 10 bytes or does not fit in 64 bits.
#[inline]
fn varint_in(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &x) in b.iter().take(10).enumerate() {
        let bits = u64::from(x & 0x7F);
        if i == 9 && bits > 1 {
            return None;
        }
        v |= bits << (7 * i);
        if x & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Reads a LEB128 varint of at most 10 bytes that fits in 64 bits: from [`Source::ready`]
/// when the longest varint is there, else a byte at a time.
pub(in crate::log) fn take_varint<S: Source>(src: &mut S) -> Result<Option<u64>, S::Error> {
    let r = src.ready();
    if r.len() >= 10 {
        let got = varint_in(r);
        if let Some((_, n)) = got {
            src.consume(n);
        }
        return Ok(got.map(|(v, _)| v));
    }
    // A byte at a time up to the varint's last byte, then decoded as above.
    let mut b = [0u8; 10];
    for i in 0..b.len() {
        if !src.take(&mut b[i..=i])? {
            return Ok(None);
        }
        if b[i] & 0x80 == 0 {
            return Ok(varint_in(&b[..=i]).map(|(v, _)| v));
        }
    }
    Ok(None)
}

/// Reads a topic (length byte, 1 to 255 bytes of UTF-8) into `out`; returns its length.
fn take_topic<S: Source>(
    src: &mut S,
    out: &mut [u8; MAX_TOPIC_LEN],
) -> Result<Option<u8>, S::Error> {
    let mut n = [0u8];
    if !src.take(&mut n)? || n[0] == 0 {
        return Ok(None);
    }
    let t = &mut out[..n[0] as usize];
    if !src.take(t)? || core::str::from_utf8(t).is_err() {
        return Ok(None);
    }
    Ok(Some(n[0]))
}

impl Head {
    /// The head of a record of a [`Decoder::plain`] body: the batch topic, no producer.
    #[inline]
    pub(in crate::log) fn plain(timestamp_us: u64, payload_len: u32) -> Head {
        Head {
            timestamp_us,
            producer: None,
            payload_len,
            own_topic: false,
        }
    }

    /// Whether the record carries its own topic (else it has the batch topic).
    pub(in crate::log) fn own_topic(&self) -> bool {
        self.own_topic
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// A decoder of no body yet: [`Decoder::start`] sets it up.
    pub const fn new() -> Self {
        Decoder {
            flags: 0,
            prev_ts: 0,
            fixed_len: 0,
            left: 0,
            topic: [0; MAX_TOPIC_LEN],
            topic_len: 0,
            own: [0; MAX_TOPIC_LEN],
            own_len: 0,
        }
    }

    /// Reads the body's prefix (flags, base timestamp, batch topic, fixed payload length)
    /// for a batch of `count` records into this decoder, in place (it is over 500 bytes: no
    /// copy of it on the stack of a read). `false` if the prefix is malformed (the decoder
    /// then holds no body to decode).
    pub fn start<S: Source>(&mut self, src: &mut S, count: u32) -> Result<bool, S::Error> {
        (self.flags, self.prev_ts, self.fixed_len, self.left) = (0, 0, 0, 0);
        (self.topic_len, self.own_len) = (0, 0);
        let mut b = [0u8; 9];
        if !src.take(&mut b)? || b[0] & !BODY_FLAGS_KNOWN != 0 {
            return Ok(false);
        }
        let flags = b[0];
        self.prev_ts = u64::from_le_bytes([b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8]]);
        let Some(t) = take_topic(src, &mut self.topic)? else {
            return Ok(false);
        };
        self.topic_len = t;
        if flags & BODY_FIXED_LEN != 0 {
            let Some(n) = take_varint(src)?.and_then(|n| u32::try_from(n).ok()) else {
                return Ok(false);
            };
            self.fixed_len = n;
        }
        (self.flags, self.left) = (flags, count);
        Ok(true)
    }

    /// Where the decoder is: what [`Decoder::rewind`] takes it back to, the record it
    /// decodes next.
    pub(in crate::log) fn mark(&self) -> (u64, u32) {
        (self.prev_ts, self.left)
    }

    /// Takes the decoder back to `mark` (from [`Decoder::mark`] on the same body): the
    /// caller then hands it the same bytes again from that record on.
    pub(in crate::log) fn rewind(&mut self, mark: (u64, u32)) {
        (self.prev_ts, self.left) = mark;
    }

    /// Records not decoded yet.
    pub fn left(&self) -> u32 {
        self.left
    }

    /// Whether the body's records carry no attributes byte: every record has the batch
    /// topic and no producer fields ([`Decoder::next_plain`] decodes them).
    #[inline]
    pub fn plain(&self) -> bool {
        self.flags & BODY_MIXED == 0
    }

    /// [`Decoder::next`] of a [`Decoder::plain`] body (of another body: `None`): the
    /// record's timestamp (µs) and payload length, the rest of its [`Head`] being the
    /// batch topic and no producer. Inline, its result in registers: a read decodes most
    /// records here.
    #[inline(always)]
    pub fn next_plain<S: Source>(&mut self, src: &mut S) -> Result<Option<(u64, u32)>, S::Error> {
        if self.left == 0 || !self.plain() {
            return Ok(None);
        }
        let Some(delta) = take_varint_fast(src)? else {
            return Ok(None);
        };
        let payload_len = if self.flags & BODY_FIXED_LEN != 0 {
            self.fixed_len
        } else {
            let Some(n) = take_varint_fast(src)?.and_then(|n| u32::try_from(n).ok()) else {
                return Ok(None);
            };
            n
        };
        let timestamp_us = self.prev_ts.wrapping_add(unzigzag(delta) as u64);
        self.prev_ts = timestamp_us;
        self.left -= 1;
        Ok(Some((timestamp_us, payload_len)))
    }

    /// Decodes the next record's fields; the caller then takes its `payload_len` payload
    /// bytes from `src`. `None` if the body is malformed or every record was decoded.
    /// (A read decodes a [`Decoder::plain`] body with [`Decoder::next_plain`].)
    #[inline]
    pub fn next<S: Source>(&mut self, src: &mut S) -> Result<Option<Head>, S::Error> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut attrs = 0u8;
        if self.flags & BODY_MIXED != 0 {
            let mut a = [0u8];
            if !src.take(&mut a)? || a[0] & !ATTRS_KNOWN != 0 {
                return Ok(None);
            }
            attrs = a[0];
        }
        let Some(delta) = take_varint(src)? else {
            return Ok(None);
        };
        let timestamp_us = self.prev_ts.wrapping_add(unzigzag(delta) as u64);
        let own_topic = attrs & ATTR_TOPIC != 0;
        if own_topic {
            let Some(t) = take_topic(src, &mut self.own)? else {
                return Ok(None);
            };
            self.own_len = t;
        }
        let mut producer = None;
        if attrs & ATTR_PRODUCER != 0 {
            let mut id = [0u8; 8];
            if !src.take(&mut id)? {
                return Ok(None);
            }
            let Some(seq) = take_varint(src)?.and_then(|s| u32::try_from(s).ok()) else {
                return Ok(None);
            };
            producer = Some(Producer {
                id: u64::from_le_bytes(id),
                seq,
            });
        }
        let payload_len = if self.flags & BODY_FIXED_LEN != 0 {
            self.fixed_len
        } else {
            let Some(n) = take_varint(src)?.and_then(|n| u32::try_from(n).ok()) else {
                return Ok(None);
            };
            n
        };
        self.prev_ts = timestamp_us;
        self.left -= 1;
        Ok(Some(Head {
            timestamp_us,
            producer,
            payload_len,
            own_topic,
        }))
    }

    /// The topic of the record `h` (the last one decoded).
    #[inline]
    pub fn topic(&self, h: &Head) -> &[u8] {
        if h.own_topic {
            &self.own[..self.own_len as usize]
        } else {
            &self.topic[..self.topic_len as usize]
        }
    }

    /// Calls `f` with the pieces of the canonical (layout 1) encoding of `h`'s fields
    /// before its payload, in order (topic length and topic, timestamp, producer flag and
    /// fields, payload length); returns their total length, at most
    /// [`MAX_CANONICAL_HEAD`]. The record's canonical encoding is these bytes followed by
    /// its payload. In pieces, so that a caller that only hashes them needs no buffer.
    pub fn canonical_head_pieces(&self, h: &Head, mut f: impl FnMut(&[u8])) -> usize {
        let t = self.topic(h);
        record_head_pieces(t, h.timestamp_us, h.producer, h.payload_len, &mut f)
    }

    /// Length of the canonical head of `h` ([`Self::canonical_head_pieces`]), bytes.
    #[inline]
    pub fn canonical_head_len(&self, h: &Head) -> usize {
        let producer = if h.producer.is_some() {
            PRODUCER_LEN
        } else {
            0
        };
        RECORD_OVERHEAD + self.topic(h).len() + producer
    }

    /// Writes the canonical head of `h` ([`Self::canonical_head_pieces`]) at the start of
    /// `out`; returns its length, or `None` (nothing written) if `out` is shorter.
    #[inline]
    pub fn canonical_head(&self, h: &Head, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..self.canonical_head_len(h))?;
        let t = self.topic(h);
        Some(encode_record_head(
            t,
            h.timestamp_us,
            h.producer,
            h.payload_len,
            out,
        ))
    }
}

/// Expands a compact body of `count` records held in memory into their canonical
/// encodings, back to back in `out`; returns the bytes written. `None` if the body is
/// malformed, holds other than exactly `count` records, or `out` is too small.
pub fn expand(body: &[u8], count: u32, out: &mut [u8]) -> Option<usize> {
    let mut src = SliceSource { rest: body };
    let mut d = Decoder::new();
    if d.start(&mut src, count) != Ok(true) {
        return None;
    }
    let mut at = 0usize;
    while d.left() > 0 {
        let Ok(Some(h)) = d.next(&mut src) else {
            return None;
        };
        let n = d.canonical_head_len(&h);
        let end = at.checked_add(n)?.checked_add(h.payload_len as usize)?;
        let dst = out.get_mut(at..end)?;
        d.canonical_head(&h, dst)?;
        if src.take(&mut dst[n..]) != Ok(true) {
            return None;
        }
        at = end;
    }
    src.rest.is_empty().then_some(at)
}

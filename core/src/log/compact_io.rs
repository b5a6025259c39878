//! Compact batches (format version 4) on the flash: writing one from the canonical
//! encodings of the RAM buffer, and decoding one straight from the flash through a
//! [`CHUNK`]-byte window (no buffer the size of the batch), for reads and for the mount.
//! A read whose buffer holds the batch's body reads it whole into the end of that buffer
//! instead (one flash read, one CRC pass) and decodes it in place, each record written
//! before the body bytes not decoded yet. The layout itself is in
//! [`compact`](super::compact). A compressed body (feature `compression`) is decoded once
//! into the log's scratch buffer, its CRC checked over the stored bytes, and its records
//! are then taken from there; the scratch remembers the batch, so later reads inside it
//! do not touch the flash.

#[cfg(feature = "compression")]
use super::compact::SliceSource;
use super::compact::{self, Decoder, Head, Plan, Source};
use super::device::{CHUNK, Dev, READ_ATTEMPTS};
use super::format::{BATCH_HEADER_LEN, BatchHeader};
use super::lz4::Scratch;
#[cfg(feature = "compression")]
use super::lz4::{self, BODY_LZ4, Held};
use crate::storage::Flash;

mod in_place;

/// The body of a batch on flash, taken in order through a window; every byte loaded is
/// added to the batch CRC.
struct FlashSource<'a, F: Flash> {
    dev: &'a mut Dev<F>,
    /// Flash address of the next byte to load.
    addr: u32,
    /// One past the body's last byte.
    end: u32,
    win: [u8; CHUNK],
    at: usize,
    len: usize,
    crc: crate::crc::Hasher,
}

impl<'a, F: Flash> FlashSource<'a, F> {
    /// The body of the batch `h` at flash address `batch_addr`.
    fn new(dev: &'a mut Dev<F>, batch_addr: u32, h: &BatchHeader) -> Self {
        let mut crc = crate::crc::Hasher::new();
        crc.update(&h.encode()[16..]);
        FlashSource {
            dev,
            addr: batch_addr + BATCH_HEADER_LEN as u32,
            end: batch_addr + h.len,
            win: [0; CHUNK],
            at: 0,
            len: 0,
            crc,
        }
    }

    /// Loads the next window; `false` at the end of the body.
    fn load(&mut self) -> Result<bool, F::Error> {
        let n = (self.end - self.addr).min(CHUNK as u32) as usize;
        if n == 0 {
            return Ok(false);
        }
        self.dev.read(self.addr, &mut self.win[..n])?;
        self.crc.update(&self.win[..n]);
        self.addr += n as u32;
        (self.at, self.len) = (0, n);
        Ok(true)
    }

    /// Whether every byte of the body was taken.
    fn at_end(&self) -> bool {
        self.len == self.at && self.addr == self.end
    }

    /// The next byte of the body without taking it; `None` at its end.
    #[cfg(feature = "compression")]
    fn peek(&mut self) -> Result<Option<u8>, F::Error> {
        if self.at == self.len && !self.load()? {
            return Ok(None);
        }
        Ok(Some(self.win[self.at]))
    }

    /// Loads the rest of the body and says whether the batch CRC matches `want`.
    fn finish(mut self, want: u32) -> Result<bool, F::Error> {
        while self.load()? {}
        Ok(self.crc.finalize() == want)
    }
}

impl<F: Flash> Source for FlashSource<'_, F> {
    type Error = F::Error;
    #[inline]
    fn take(&mut self, out: &mut [u8]) -> Result<bool, F::Error> {
        // Most takes (a record's fields, a short payload, an LZ4 token) lie inside the
        // loaded window: this part is inlined where the length is known (one byte).
        if let Some(w) = self.win.get(self.at..self.len)
            && let Some(w) = w.get(..out.len())
        {
            out.copy_from_slice(w);
            self.at += out.len();
            return Ok(true);
        }
        self.take_across(out)
    }

    #[inline]
    fn ready(&self) -> &[u8] {
        self.win.get(self.at..self.len).unwrap_or_default()
    }

    #[inline]
    fn consume(&mut self, n: usize) {
        self.at = self.len.min(self.at.saturating_add(n));
    }

    fn skip(&mut self, mut n: usize) -> Result<bool, F::Error> {
        while n > 0 {
            if self.at == self.len && !self.load()? {
                return Ok(false);
            }
            let k = n.min(self.len - self.at);
            (n, self.at) = (n - k, self.at + k);
        }
        Ok(true)
    }
}

impl<F: Flash> FlashSource<'_, F> {
    /// [`Source::take`] of bytes that go past the loaded window.
    #[inline(never)]
    fn take_across(&mut self, out: &mut [u8]) -> Result<bool, F::Error> {
        let mut done = 0;
        while done < out.len() {
            if self.at == self.len && !self.load()? {
                return Ok(false);
            }
            let n = (out.len() - done).min(self.len - self.at);
            out[done..done + n].copy_from_slice(&self.win[self.at..self.at + n]);
            (done, self.at) = (done + n, self.at + n);
        }
        Ok(true)
    }
}

/// A batch on its way to the flash through a [`CHUNK`]-byte staging buffer: its header
/// first, then its body as pushed; every full chunk is written as it fills, the last
/// part (its last word padded with the erased value) by [`Stage::finish`].
struct Stage {
    buf: [u8; CHUNK],
    /// Bytes staged.
    n: usize,
    /// Flash address of the first staged byte.
    at: u32,
}

impl Stage {
    /// A batch at `addr` whose header (length and CRC filled in) is `hdr`.
    fn new(addr: u32, hdr: &BatchHeader) -> Self {
        let mut buf = [0u8; CHUNK];
        buf[..BATCH_HEADER_LEN].copy_from_slice(&hdr.encode());
        Stage {
            buf,
            n: BATCH_HEADER_LEN,
            at: addr,
        }
    }

    /// Adds `b` to the body, writing every chunk that fills.
    #[inline]
    fn push<F: Flash>(&mut self, dev: &mut Dev<F>, b: &[u8]) -> Result<(), F::Error> {
        // Most pieces (a record's head, a small payload) fill no chunk.
        let end = self.n + b.len();
        if end < CHUNK {
            self.buf[self.n..end].copy_from_slice(b);
            self.n = end;
            return Ok(());
        }
        self.push_filling(dev, b)
    }

    /// [`Stage::push`] of a piece that fills the chunk.
    fn push_filling<F: Flash>(&mut self, dev: &mut Dev<F>, mut b: &[u8]) -> Result<(), F::Error> {
        while !b.is_empty() {
            let k = b.len().min(CHUNK - self.n);
            self.buf[self.n..self.n + k].copy_from_slice(&b[..k]);
            (self.n, b) = (self.n + k, &b[k..]);
            if self.n == CHUNK {
                // CHUNK is a multiple of every write size: nothing is padded here.
                dev.write_padded(self.at, &self.buf)?;
                (self.at, self.n) = (self.at + CHUNK as u32, 0);
            }
        }
        Ok(())
    }

    /// Writes what is staged.
    fn finish<F: Flash>(self, dev: &mut Dev<F>) -> Result<(), F::Error> {
        if self.n > 0 {
            dev.write_padded(self.at, &self.buf[..self.n])?;
        }
        Ok(())
    }
}

/// Takes `len` payload bytes from `src` into the record CRC `h` only.
fn hash_payload<S: Source>(
    src: &mut S,
    h: &mut crate::crc::Hasher,
    mut len: usize,
) -> Result<bool, S::Error> {
    let mut b = [0u8; 64];
    while len > 0 {
        let n = len.min(b.len());
        if !src.take(&mut b[..n])? {
            return Ok(false);
        }
        h.update(&b[..n]);
        len -= n;
    }
    Ok(true)
}

/// The record CRC of the record at `offset` whose fields `d` decoded as `head`, before
/// its payload (the canonical head is hashed piece by piece, never held in a buffer).
fn head_hasher(d: &Decoder, offset: u64, head: &Head) -> crate::crc::Hasher {
    let mut h = crate::crc::Hasher::new();
    h.update(&offset.to_le_bytes());
    d.canonical_head_pieces(head, |piece| h.update(piece));
    h
}

/// What [`Dev::read_compact`] copied.
pub(super) enum CompactRead {
    /// `count` records (at least 1) copied as canonical encodings into the first `len`
    /// bytes of the buffer; `prev_crc` is the record CRC before the first of them.
    Records {
        count: u32,
        len: usize,
        prev_crc: u32,
    },
    /// The first wanted record alone needs this many bytes, more than the buffer.
    TooSmall { needed: usize },
    /// The batch did not read back valid (CRC or layout) on any attempt.
    Corrupt,
    /// The batch is compressed and its body decodes to `needed` bytes, more than the
    /// scratch buffer holds (or the log has none).
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    ScratchTooSmall { needed: usize },
}

/// What [`Dev::walk_compact`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walked {
    /// Every record was seen, the batch CRC checked.
    Done,
    /// The batch never read back valid.
    Corrupt,
    /// A compressed batch that decodes to `needed` bytes, more than the scratch holds.
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    ScratchTooSmall { needed: usize },
}

/// What [`Dev::open_compressed`] found at the start of a body.
// The source is a few hundred bytes that move once into the caller's frame (the core has
// no heap to box it on).
#[cfg(feature = "compression")]
#[allow(clippy::large_enum_variant)]
enum Opened<'a, F: Flash> {
    /// Not a compressed body: decode it from the flash, from this source (which holds the
    /// body's first bytes already, read to tell).
    Plain(FlashSource<'a, F>),
    /// The compact body is in the scratch, `len` bytes, its batch CRC checked.
    Decoded(usize),
    /// A compressed body that did not decode or check this time.
    Bad,
    /// A compressed body longer than the scratch once decoded.
    TooBig(usize),
}

/// Calls `f` with every record of the compact body in `src` (of the batch `h`): its offset,
/// fields, topic and record CRC. `Ok(false)` if the body is malformed (the caller checks
/// that it ended and its CRC).
fn walk_body<S: Source>(
    src: &mut S,
    h: &BatchHeader,
    f: &mut impl FnMut(u64, &Head, &[u8], u32),
) -> Result<bool, S::Error> {
    let mut d = Decoder::new();
    if !d.start(src, h.count)? {
        return Ok(false);
    }
    for i in 0..u64::from(h.count) {
        let Some(r) = d.next(src)? else {
            return Ok(false);
        };
        let mut crc = head_hasher(&d, h.base_offset + i, &r);
        if !hash_payload(src, &mut crc, r.payload_len as usize)? {
            return Ok(false);
        }
        f(h.base_offset + i, &r, d.topic(&r), crc.finalize());
    }
    Ok(true)
}

/// Copies the records at or after `from` of the compact body in `src` (of the batch `h`)
/// into `buf` as canonical encodings, as many as fit; `None` if the body is malformed
/// (the caller checks that it ended and its CRC).
fn copy_body<S: Source>(
    src: &mut S,
    h: &BatchHeader,
    from: u64,
    buf: &mut [u8],
) -> Result<Option<CompactRead>, S::Error> {
    let mut d = Decoder::new();
    if !d.start(src, h.count)? {
        return Ok(None);
    }
    let (mut count, mut len, mut prev_crc) = (0u32, 0usize, h.prev_crc);
    let mut needed = None;
    let mut full = false;
    let plain = d.plain();
    for i in 0..u64::from(h.count) {
        let offset = h.base_offset + i;
        // A plain body's fields come back in registers (most reads decode those).
        let r = if plain {
            let Some((timestamp_us, payload_len)) = d.next_plain(src)? else {
                return Ok(None);
            };
            Head::plain(timestamp_us, payload_len)
        } else {
            let Some(r) = d.next(src)? else {
                return Ok(None);
            };
            r
        };
        let n = d.canonical_head_len(&r);
        let plen = r.payload_len as usize;
        // Of the records not copied, only the one just before `from` needs its record
        // CRC (the read's `prev_crc`); the others are only passed over (the batch CRC
        // still covers their bytes).
        if offset + 1 == from {
            let mut crc = head_hasher(&d, offset, &r);
            if !hash_payload(src, &mut crc, plen)? {
                return Ok(None);
            }
            prev_crc = crc.finalize();
            continue;
        }
        if offset < from || full {
            if !src.skip(plen)? {
                return Ok(None);
            }
            continue;
        }
        let end = len.saturating_add(n).saturating_add(plen);
        if end > buf.len() {
            if count == 0 {
                needed = Some(n + plen);
            }
            full = true;
            if !src.skip(plen)? {
                return Ok(None);
            }
            continue;
        }
        if d.canonical_head(&r, &mut buf[len..len + n]).is_none() {
            return Ok(None);
        }
        if !src.take(&mut buf[len + n..end])? {
            return Ok(None);
        }
        (len, count) = (end, count + 1);
    }
    Ok(Some(match needed {
        Some(needed) => CompactRead::TooSmall { needed },
        None => CompactRead::Records {
            count,
            len,
            prev_crc,
        },
    }))
}

/// One way of decoding a compact body, from the flash or from the scratch alike.
trait Body {
    /// What a body that decoded gives.
    type Out;
    /// Decodes the compact body in `src` of the batch `h`; `None` if it is malformed.
    fn decode<S: Source>(
        &mut self,
        src: &mut S,
        h: &BatchHeader,
    ) -> Result<Option<Self::Out>, S::Error>;
}

/// [`walk_body`] with this callback.
struct Walk<W>(W);

impl<W: FnMut(u64, &Head, u32)> Body for Walk<W> {
    type Out = ();
    fn decode<S: Source>(&mut self, src: &mut S, h: &BatchHeader) -> Result<Option<()>, S::Error> {
        let f = &mut self.0;
        Ok(walk_body(src, h, &mut |offset, r, _topic, crc| f(offset, r, crc))?.then_some(()))
    }
}

/// [`copy_body`] of the records at or after `from` into `buf`.
struct CopyFrom<'b> {
    from: u64,
    buf: &'b mut [u8],
}

impl Body for CopyFrom<'_> {
    type Out = CompactRead;
    fn decode<S: Source>(
        &mut self,
        src: &mut S,
        h: &BatchHeader,
    ) -> Result<Option<CompactRead>, S::Error> {
        copy_body(src, h, self.from, self.buf)
    }
}

/// What [`Dev::decode_checked`] found.
enum Checked<T> {
    /// The body decoded to this, checked; from a body decoded into the scratch, of this
    /// many bytes.
    Got(T, Option<usize>),
    /// The batch never read back valid.
    Corrupt,
    /// A compressed batch that decodes to this many bytes, more than the scratch holds.
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    ScratchTooSmall(usize),
}

/// The result of a source that never fails ([`SliceSource`], the in-place body).
fn infallible<T>(r: Result<T, core::convert::Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(e) => match e {},
    }
}

/// What [`inflate`] made of a compressed body.
#[cfg(feature = "compression")]
enum Inflated {
    /// The compact body is in the scratch, this many bytes (the caller checks that the
    /// stored bytes ended and their CRC, then marks the scratch as holding it).
    Raw(usize),
    /// It decodes to this many bytes, more than the scratch holds.
    TooBig(usize),
    /// It does not decode.
    Bad,
}

/// Decodes the compressed body of the batch `h` in `src` (next in it: the body's flag
/// byte) into the scratch (`FORMAT.md` section 4.4); the scratch holds nothing after.
#[cfg(feature = "compression")]
fn inflate<S: Source>(
    src: &mut S,
    h: &BatchHeader,
    scratch: &mut Scratch<'_>,
) -> Result<Inflated, S::Error> {
    let mut flag = [0u8];
    if !src.take(&mut flag)? || flag[0] != BODY_LZ4 {
        return Ok(Inflated::Bad);
    }
    let Some(raw) = compact::take_varint(src)?.and_then(|n| usize::try_from(n).ok()) else {
        return Ok(Inflated::Bad);
    };
    if raw > scratch.buf.len() {
        return Ok(Inflated::TooBig(raw));
    }
    let prefix = 1 + compact::varint_len(raw as u64);
    let Some(stored) = (h.len as usize).checked_sub(BATCH_HEADER_LEN + prefix) else {
        return Ok(Inflated::Bad);
    };
    scratch.holds = None;
    Ok(if lz4::decompress(src, stored, &mut scratch.buf[..raw])? {
        Inflated::Raw(raw)
    } else {
        Inflated::Bad
    })
}

impl<F: Flash> Dev<F> {
    /// Writes the records `plan` chose from `canonical` (the RAM buffer's encodings, the
    /// first at `base`) as one compact batch at `addr`: the header is filled in (length,
    /// CRC) from `hdr` and written first, then the body through a [`CHUNK`]-byte staging
    /// buffer, the last word padded with the erased value. `crc`: the batch CRC when the
    /// plan's walk computed it ([`compact::plan_with_crc`]); else the body is encoded
    /// once more for it, before the header is written.
    pub(super) fn write_compact(
        &mut self,
        addr: u32,
        hdr: &mut BatchHeader,
        canonical: &[u8],
        plan: &Plan,
        crc: Option<u32>,
    ) -> Result<(), F::Error> {
        hdr.len = (BATCH_HEADER_LEN + plan.body_len) as u32;
        hdr.count = plan.count;
        let encoded_crc = || {
            // The CRC pass hands the hasher a few bytes per record, gathered.
            let mut h = crate::crc::Gather::new();
            h.update(&hdr.encode()[16..]);
            let _ = compact::encode::<()>(canonical, hdr.base_offset, plan, &mut |b| {
                h.update(b);
                Ok(())
            });
            h.finalize()
        };
        hdr.crc = match crc {
            Some(c) => {
                debug_assert_eq!(c, encoded_crc(), "the walk's CRC is the encoding's");
                c
            }
            None => encoded_crc(),
        };
        let mut stage = Stage::new(addr, hdr);
        compact::encode(canonical, hdr.base_offset, plan, &mut |b: &[u8]| {
            stage.push(self, b)
        })?;
        stage.finish(self)
    }

    /// Writes one batch at `addr` whose body is the bytes of `parts` back to back: the
    /// header is filled in (length, CRC) from `hdr`; header and body go through a
    /// [`CHUNK`]-byte staging buffer, the last word padded with the erased value.
    #[cfg(feature = "compression")]
    pub(super) fn write_body(
        &mut self,
        addr: u32,
        hdr: &mut BatchHeader,
        parts: &[&[u8]],
    ) -> Result<(), F::Error> {
        hdr.len = (BATCH_HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>()) as u32;
        let mut crc = crate::crc::Hasher::new();
        crc.update(&hdr.encode()[16..]);
        for p in parts {
            crc.update(p);
        }
        hdr.crc = crc.finalize();
        let mut stage = Stage::new(addr, hdr);
        for b in parts {
            stage.push(self, b)?;
        }
        stage.finish(self)
    }

    /// If the body of the batch `h` at `batch_addr` is compressed, decodes it into the
    /// scratch (or finds it there already), checking the batch CRC over the stored bytes
    /// as they are read. One attempt.
    #[cfg(feature = "compression")]
    fn open_compressed(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
    ) -> Result<Opened<'_, F>, F::Error> {
        let key = |len| Held {
            addr: batch_addr,
            h: *h,
            len,
        };
        if let Some(held) = scratch.holds
            && held == key(held.len)
        {
            return Ok(Opened::Decoded(held.len));
        }
        let mut src = FlashSource::new(self, batch_addr, h);
        if src.peek()? != Some(BODY_LZ4) {
            return Ok(Opened::Plain(src));
        }
        let raw = match inflate(&mut src, h, scratch)? {
            Inflated::Raw(raw) => raw,
            Inflated::TooBig(raw) => return Ok(Opened::TooBig(raw)),
            Inflated::Bad => return Ok(Opened::Bad),
        };
        if !(src.at_end() && src.finish(h.crc)?) {
            return Ok(Opened::Bad);
        }
        scratch.holds = Some(key(raw));
        Ok(Opened::Decoded(raw))
    }

    /// Decodes the valid compact batch `h` at `batch_addr` with `body`, checking that the
    /// body ended where the batch does and its CRC: from the scratch if the body is
    /// compressed (decoded there once, its CRC checked over the stored bytes), else from
    /// the flash. Read up to `attempts` times while the flash reads back bad; bytes that
    /// passed the batch CRC and still do not decode are corrupt at once. A compressed
    /// body longer than the scratch is believed when two reads in a row say so (its
    /// length is read before the CRC can check it: a bit flip on one read must not
    /// make a readable batch unreadable).
    fn decode_checked<B: Body>(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
        body: &mut B,
        attempts: u32,
    ) -> Result<Checked<B::Out>, F::Error> {
        let _ = &scratch;
        #[cfg(feature = "compression")]
        let mut too_big = None;
        for _ in 0..attempts {
            #[cfg(feature = "compression")]
            let mut src = match self.open_compressed(batch_addr, h, scratch)? {
                Opened::Plain(src) => src,
                Opened::Decoded(len) => {
                    let mut src = SliceSource {
                        rest: &scratch.buf[..len],
                    };
                    if let Some(got) = infallible(body.decode(&mut src, h))
                        && src.rest.is_empty()
                    {
                        return Ok(Checked::Got(got, Some(len)));
                    }
                    // The bytes passed the batch CRC: reading again cannot help.
                    scratch.holds = None;
                    return Ok(Checked::Corrupt);
                }
                Opened::Bad => {
                    too_big = None;
                    continue;
                }
                Opened::TooBig(needed) if too_big == Some(needed) => {
                    return Ok(Checked::ScratchTooSmall(needed));
                }
                Opened::TooBig(needed) => {
                    too_big = Some(needed);
                    continue;
                }
            };
            #[cfg(not(feature = "compression"))]
            let mut src = FlashSource::new(self, batch_addr, h);
            if let Some(got) = body.decode(&mut src, h)?
                && src.at_end()
                && src.finish(h.crc)?
            {
                return Ok(Checked::Got(got, None));
            }
        }
        Ok(Checked::Corrupt)
    }

    /// Decodes the valid compact batch `h` at `batch_addr`, calling `f` with every
    /// record's offset, fields and record CRC. Read again up to [`READ_ATTEMPTS`] times if
    /// the CRC or the layout does not check; [`Walked::Corrupt`] if it never does (`f` may
    /// have seen records of a failed attempt: callers keep only what the last call gave).
    pub(super) fn walk_compact(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
        f: impl FnMut(u64, &Head, u32),
    ) -> Result<Walked, F::Error> {
        Ok(
            match self.decode_checked(batch_addr, h, scratch, &mut Walk(f), READ_ATTEMPTS)? {
                Checked::Got((), _) => Walked::Done,
                Checked::Corrupt => Walked::Corrupt,
                Checked::ScratchTooSmall(needed) => Walked::ScratchTooSmall { needed },
            },
        )
    }

    /// Decodes the valid compact batch `h` at `batch_addr`, whose body is not compressed,
    /// straight from the flash, calling `f` with every record's offset, fields and record
    /// CRC; read again up to [`READ_ATTEMPTS`] times. `false` if it never checks (`f` may
    /// have seen records of a failed attempt).
    pub(super) fn walk_plain(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        mut f: impl FnMut(u64, &Head, &[u8], u32),
    ) -> Result<bool, F::Error> {
        for _ in 0..READ_ATTEMPTS {
            let mut src = FlashSource::new(self, batch_addr, h);
            if walk_body(&mut src, h, &mut f)? && src.at_end() && src.finish(h.crc)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Copies the records at or after `from` of the valid compact batch `h` at
    /// `batch_addr` into `buf` as canonical encodings, as many as fit. Every copy is
    /// checked against the batch CRC (the whole body is read for it, before the records
    /// are decoded when it fits in `buf`, in the same pass else), the body read up to
    /// `attempts` times ([`READ_ATTEMPTS`] for a batch already validated, 1 for one taken
    /// on its header alone).
    pub(super) fn read_compact(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
        from: u64,
        buf: &mut [u8],
        attempts: u32,
    ) -> Result<CompactRead, F::Error> {
        #[cfg(feature = "compression")]
        let held = scratch
            .holds
            .is_some_and(|held| held.addr == batch_addr && held.h == *h);
        #[cfg(not(feature = "compression"))]
        let held = false;
        let body_len = h.len as usize - BATCH_HEADER_LEN;
        if !held && body_len <= buf.len() {
            return self.read_compact_whole(batch_addr, h, scratch, from, buf, attempts);
        }
        self.read_compact_streaming(batch_addr, h, scratch, from, buf, attempts)
    }

    /// Counts a compressed batch read from its first record on in the stats.
    fn note_compressed_read(&mut self, h: &BatchHeader, from: u64, got: &CompactRead, raw: usize) {
        if from <= h.base_offset && matches!(got, CompactRead::Records { .. }) {
            self.stats.compressed_batches_read += 1;
            let stored = h.len as usize - BATCH_HEADER_LEN;
            self.stats.compressed_bytes_read_saved += raw.saturating_sub(stored) as u64;
        }
    }

    /// [`Dev::read_compact`] through a [`CHUNK`]-byte window: the body is decoded as it
    /// is read, its CRC checked at its end.
    fn read_compact_streaming(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
        from: u64,
        buf: &mut [u8],
        attempts: u32,
    ) -> Result<CompactRead, F::Error> {
        let copy = &mut CopyFrom { from, buf };
        Ok(
            match self.decode_checked(batch_addr, h, scratch, copy, attempts)? {
                Checked::Got(got, decoded) => {
                    if let Some(raw) = decoded {
                        self.note_compressed_read(h, from, &got, raw);
                    }
                    got
                }
                Checked::Corrupt => CompactRead::Corrupt,
                Checked::ScratchTooSmall(needed) => CompactRead::ScratchTooSmall { needed },
            },
        )
    }
}

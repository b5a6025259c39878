//! The compact record layout: how the body of a batch (the bytes after its 32-byte header)
//! is encoded in segments of format version 4 and later. `FORMAT.md` section 4.3 has the
//! byte tables.
//!
//! Segments of versions 1 to 3 hold bodies of layout 1 (every record carries its topic, an
//! 8-byte timestamp, a flags byte and a 4-byte payload length: 14 bytes plus the topic).
//! Layout 2 stores, in the spirit of Kafka's record batch v2:
//! - the topic once per batch (a record whose topic differs carries its own);
//! - the first record's timestamp once per batch, and per record the difference to the
//!   record before as a zigzag varint (one byte for records less than 64 µs apart);
//! - the payload length once per batch when every payload of the batch has the same length
//!   (fixed-size sensor records), else per record as a varint;
//! - an attributes byte per record only when the batch mixes topics or carries producer
//!   fields, and producer fields only on the records that have them.
//!
//! The record CRC ([`record_crc`]) is always computed over the record's layout-1 encoding
//! (its *canonical* encoding), whatever the layout on flash: a consumer's resume check
//! compares the same value for a record stored in either layout, and [`Log::read`]
//! hands out canonical encodings (what [`RecordIter`] parses) from both.
//!
//! The decoder reads through a [`Source`] so that a batch can be decoded straight from the
//! flash through a small window, with no buffer the size of the batch, or from a body held
//! in memory (a read's buffer, the decompression scratch).
//!
//! [`Log::read`]: super::Log::read
//! [`RecordIter`]: super::RecordIter
//! [`record_crc`]: super::record_crc

use super::format::{
    MAX_TOPIC_LEN, PRODUCER_LEN, Producer, RECORD_OVERHEAD, encode_record_head, record_head_pieces,
};

/// First segment header version whose batch bodies are in the compact layout (layout 2).
pub const COMPACT_VERSION: u16 = 4;

/// Body flag: records carry an attributes byte (the batch mixes topics or carries
/// producer fields).
const BODY_MIXED: u8 = 0x01;
/// Body flag: every payload of the batch has the length stored once after the topic.
const BODY_FIXED_LEN: u8 = 0x02;
const BODY_FLAGS_KNOWN: u8 = BODY_MIXED | BODY_FIXED_LEN;
/// Body flag: the body is compressed (`FORMAT.md` section 4.4; decoded by
/// [`lz4`](super::lz4) when the crate is built with compression).
pub(super) const BODY_LZ4_BIT: u8 = 0x04;

/// Record attribute: producer id (u64) and sequence (varint) follow the timestamp delta.
const ATTR_PRODUCER: u8 = 0x01;
/// Record attribute: the record's own topic (length byte and bytes) follows.
const ATTR_TOPIC: u8 = 0x02;
const ATTRS_KNOWN: u8 = ATTR_PRODUCER | ATTR_TOPIC;

/// Bytes of a compact body before the batch topic's bytes: flags (1), base timestamp (8),
/// topic length (1).
pub const BODY_PREFIX_LEN: usize = 10;

/// Fewest bytes a compact body of `count` records takes (a one-byte topic, fixed empty
/// payloads, one byte of timestamp delta per record). In 64 bits, so that a decoded count
/// never overflows a 32-bit `usize`.
pub const fn min_body_len(count: u32) -> u64 {
    (BODY_PREFIX_LEN + 1 + 1) as u64 + count as u64
}

/// Most bytes an LZ4 block decodes to per byte stored (a match's length grows by 255 per
/// extension byte): a compressed body (`FORMAT.md` section 4.4) of `n` bytes holds a
/// compact body of at most `255 · n` bytes.
pub const LZ4_MAX_EXPANSION: u64 = 255;

/// Whether a batch body of `body_len` stored bytes can hold `count` records: at least
/// [`min_body_len`] bytes once decoded, which a compressed body reaches from
/// `body_len / LZ4_MAX_EXPANSION` stored bytes. Bounds the record count a batch header may
/// claim for its length (a layout 1 body is held to its own, tighter, bound when its
/// records are walked).
pub const fn count_fits(count: u32, body_len: u64) -> bool {
    min_body_len(count) <= body_len.saturating_mul(LZ4_MAX_EXPANSION)
}

/// Longest canonical record encoding before the payload: topic length, topic, timestamp,
/// flags, producer, payload length.
pub const MAX_CANONICAL_HEAD: usize = RECORD_OVERHEAD + MAX_TOPIC_LEN + PRODUCER_LEN;

/// Bytes of the LEB128 varint of `v` (1 to 10).
pub(crate) const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Writes the LEB128 varint of `v` at the start of `out`, which has room for it
/// ([`varint_len`] bytes, at most 10); returns its length.
#[inline]
pub(super) fn put_varint(mut v: u64, out: &mut [u8]) -> usize {
    let mut n = 0;
    loop {
        let b = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out[n] = b;
            return n + 1;
        }
        out[n] = b | 0x80;
        n += 1;
    }
}

pub(super) fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

pub(super) fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// How a run of buffered records is encoded: what [`plan`] found fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Records of the batch (a prefix of the buffered ones; 0 if not even one fits).
    pub count: u32,
    /// Bytes those records take in the canonical (RAM buffer) layout.
    pub canonical_len: usize,
    /// Bytes of the compact body.
    pub body_len: usize,
    /// Where the last record of the batch starts in the canonical layout (0 if `count`
    /// is 0).
    pub last_start: usize,
    flags: u8,
}

/// The fields of one canonical (layout 1) record encoding in the RAM buffer, as the
/// compact walks need them (what [`parse_record_fields`] gives, the topic as bytes).
///
/// [`parse_record_fields`]: super::format::parse_record_fields
struct Canon<'b> {
    topic: &'b [u8],
    /// The topic equals the `known` one [`canon_at`] was given.
    known_topic: bool,
    timestamp_us: u64,
    producer: Option<Producer>,
    payload: &'b [u8],
}

/// Parses the canonical record encoding at the start of `b` (`FORMAT.md` section 4.1);
/// returns its fields and length, `None` where [`parse_record_fields`] gives `None`. A
/// topic equal to `known` (one this walk already checked) is not checked for UTF-8
/// again: a batch repeats its topic on every record. Topics are compared once, here
/// ([`Canon::known_topic`]).
///
/// [`parse_record_fields`]: super::format::parse_record_fields
#[inline]
fn canon_at<'b>(b: &'b [u8], known: &[u8]) -> Option<(Canon<'b>, usize)> {
    let t = *b.first()? as usize;
    let topic = b.get(1..1 + t)?;
    let known_topic = same_bytes(topic, known);
    if t == 0 || (!known_topic && core::str::from_utf8(topic).is_err()) {
        return None;
    }
    let rest = &b[1 + t..];
    let (ts, rest) = rest.split_first_chunk::<8>()?;
    let (&flags, rest) = rest.split_first()?;
    let (producer, rest) = match flags {
        0 => (None, rest),
        1 => {
            let (id, rest) = rest.split_first_chunk::<8>()?;
            let (seq, rest) = rest.split_first_chunk::<4>()?;
            let p = Producer {
                id: u64::from_le_bytes(*id),
                seq: u32::from_le_bytes(*seq),
            };
            (Some(p), rest)
        }
        _ => return None,
    };
    let (plen, rest) = rest.split_first_chunk::<4>()?;
    let payload = rest.get(..u32::from_le_bytes(*plen) as usize)?;
    let n = b.len() - rest.len() + payload.len();
    let c = Canon {
        topic,
        known_topic,
        timestamp_us: u64::from_le_bytes(*ts),
        producer,
        payload,
    };
    Some((c, n))
}

/// `a == b`, compared a byte at a time: topics are short (often a few bytes), where a call
/// to `memcmp` costs more than the comparison.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Running sums over a prefix of records, enough to size its compact body.
struct Sizes {
    topic: usize,
    first_len: usize,
    fixed: bool,
    mixed: bool,
    /// Σ (timestamp delta + payload) bytes.
    base: usize,
    /// Σ payload length varints.
    lens: usize,
    /// Σ attributes, own topics and producer fields.
    extra: usize,
}

impl Sizes {
    fn body_len(&self) -> usize {
        BODY_PREFIX_LEN
            + self.topic
            + self.base
            + if self.fixed {
                varint_len(self.first_len as u64)
            } else {
                self.lens
            }
            + if self.mixed { self.extra } else { 0 }
    }

    fn flags(&self) -> u8 {
        (if self.mixed { BODY_MIXED } else { 0 }) | if self.fixed { BODY_FIXED_LEN } else { 0 }
    }
}

/// Sizes the longest prefix of the `count` canonical encodings in `canonical` (the first
/// at offset `base`, which names them in the format but does not change their sizes) whose
/// compact body takes at most `max_body` bytes. Records that do not parse end the prefix
/// (the RAM buffer only holds records it encoded itself).
pub fn plan(canonical: &[u8], base: u64, count: u32, max_body: usize) -> Plan {
    let _ = base;
    walk(canonical, count, max_body, &mut None)
}

/// [`plan`], and the batch CRC of the plan when its walk could compute it on the way: when
/// the plan takes all `count` records and its body is the plain fixed-length one (one topic,
/// no producer fields, payloads of one length: [`encode`] then writes per record only a
/// timestamp step and the payload). `head` is what the batch CRC covers before the body
/// (the batch header's last 16 bytes, with `count` as its record count). Otherwise `None`:
/// the caller computes the CRC from [`encode`]'s output.
pub fn plan_with_crc(
    canonical: &[u8],
    count: u32,
    max_body: usize,
    head: &[u8],
) -> (Plan, Option<u32>) {
    let mut crc = crate::crc::Gather::new();
    crc.update(head);
    let mut crc = Some(crc);
    let plan = walk(canonical, count, max_body, &mut crc);
    let crc = crc
        .filter(|_| plan.count == count && plan.flags == BODY_FIXED_LEN)
        .map(crate::crc::Gather::finalize);
    (plan, crc)
}

/// [`plan`]'s walk; while the body is plain fixed-length (see [`plan_with_crc`]), the bytes
/// [`encode`] would write for the records that fit go into `crc` (set to `None` when the
/// body stops being plain).
fn walk(
    canonical: &[u8],
    count: u32,
    max_body: usize,
    crc: &mut Option<crate::crc::Gather>,
) -> Plan {
    let mut best = Plan {
        count: 0,
        canonical_len: 0,
        body_len: 0,
        last_start: 0,
        flags: 0,
    };
    let mut s = Sizes {
        topic: 0,
        first_len: 0,
        fixed: true,
        mixed: false,
        base: 0,
        lens: 0,
        extra: 0,
    };
    let (mut at, mut prev_ts, mut first_topic): (usize, u64, &[u8]) = (0, 0, &[]);
    for i in 0..count {
        let Some((r, n)) = canon_at(&canonical[at..], first_topic) else {
            break;
        };
        if i == 0 {
            s.topic = r.topic.len();
            s.first_len = r.payload.len();
            first_topic = r.topic;
            prev_ts = r.timestamp_us;
        }
        let delta = zigzag(r.timestamp_us.wrapping_sub(prev_ts) as i64);
        s.base += varint_len(delta) + r.payload.len();
        prev_ts = r.timestamp_us;
        s.lens += varint_len(r.payload.len() as u64);
        s.fixed &= r.payload.len() == s.first_len;
        s.extra += 1;
        if i > 0 && !r.known_topic {
            s.mixed = true;
            s.extra += 1 + r.topic.len();
        }
        if let Some(p) = r.producer {
            s.mixed = true;
            s.extra += 8 + varint_len(u64::from(p.seq));
        }
        let len = s.body_len();
        if len > max_body {
            break;
        }
        if let Some(h) = crc.as_mut() {
            if s.mixed || !s.fixed {
                *crc = None;
            } else {
                let mut v = [0u8; 10];
                if i == 0 {
                    let _ = body_prefix::<()>(BODY_FIXED_LEN, &r, &mut |b| {
                        h.update(b);
                        Ok(())
                    });
                }
                let n = put_varint(delta, &mut v);
                h.update(&v[..n]);
                h.update(r.payload);
            }
        }
        best = Plan {
            count: i + 1,
            canonical_len: at + n,
            body_len: len,
            last_start: at,
            flags: s.flags(),
        };
        at += n;
    }
    best
}

/// Hands `sink` the bytes of a compact body before its first record's (`FORMAT.md` section
/// 4.3): the body flags, `first`'s timestamp, the batch topic (`first`'s) and, with
/// [`BODY_FIXED_LEN`], the payload length every record has.
fn body_prefix<E>(
    flags: u8,
    first: &Canon<'_>,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut prefix = [0u8; BODY_PREFIX_LEN + 10];
    prefix[0] = flags;
    prefix[1..9].copy_from_slice(&first.timestamp_us.to_le_bytes());
    prefix[9] = first.topic.len() as u8;
    sink(&prefix[..BODY_PREFIX_LEN])?;
    sink(first.topic)?;
    if flags & BODY_FIXED_LEN != 0 {
        let k = put_varint(first.payload.len() as u64, &mut prefix[BODY_PREFIX_LEN..]);
        sink(&prefix[BODY_PREFIX_LEN..BODY_PREFIX_LEN + k])?;
    }
    Ok(())
}

/// Encodes the records `plan` chose from `canonical` (the first at offset `base`) as a
/// compact body, handing its bytes to `sink` in order (exactly `plan.body_len` bytes in
/// all). The first error of `sink` stops the encoding and is returned.
///
/// The bytes of a record before its payload (at most 30 besides an own topic) are handed
/// over in one piece, so that `sink` is called about twice per record.
pub fn encode<E>(
    canonical: &[u8],
    base: u64,
    plan: &Plan,
    sink: &mut impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let _ = base;
    let mut at = 0usize;
    let mut prev_ts = 0u64;
    let mut first_topic: &[u8] = &[];
    // Attributes (1), timestamp delta (10), producer id (8) and sequence (5), payload
    // length (5).
    let mut head = [0u8; 29];
    for i in 0..plan.count {
        let Some((r, n)) = canon_at(&canonical[at..], first_topic) else {
            // `plan` parsed these same bytes.
            break;
        };
        at += n;
        if i == 0 {
            first_topic = r.topic;
            prev_ts = r.timestamp_us;
            body_prefix(plan.flags, &r, sink)?;
        }
        let own_topic = i > 0 && !r.known_topic;
        let mut h = 0usize;
        if plan.flags & BODY_MIXED != 0 {
            head[0] = (if own_topic { ATTR_TOPIC } else { 0 })
                | if r.producer.is_some() {
                    ATTR_PRODUCER
                } else {
                    0
                };
            h = 1;
        }
        let delta = zigzag(r.timestamp_us.wrapping_sub(prev_ts) as i64);
        h += put_varint(delta, &mut head[h..]);
        prev_ts = r.timestamp_us;
        if own_topic {
            sink(&head[..h])?;
            sink(&[r.topic.len() as u8])?;
            sink(r.topic)?;
            h = 0;
        }
        if let Some(p) = r.producer {
            head[h..h + 8].copy_from_slice(&p.id.to_le_bytes());
            h += 8;
            h += put_varint(u64::from(p.seq), &mut head[h..]);
        }
        if plan.flags & BODY_FIXED_LEN == 0 {
            h += put_varint(r.payload.len() as u64, &mut head[h..]);
        }
        sink(&head[..h])?;
        sink(r.payload)?;
    }
    Ok(())
}

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
fn take_varint_fast<S: Source>(src: &mut S) -> Result<Option<u64>, S::Error> {
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

/// The LEB128 varint at the start of `b`, which holds at least 10 bytes (the longest
/// varint): its value and length, `None` if it is longer or does not fit in 64 bits.
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
pub(super) fn take_varint<S: Source>(src: &mut S) -> Result<Option<u64>, S::Error> {
    let r = src.ready();
    if r.len() >= 10 {
        let got = varint_in(r);
        if let Some((_, n)) = got {
            src.consume(n);
        }
        return Ok(got.map(|(v, _)| v));
    }
    let mut v = 0u64;
    for i in 0..10 {
        let mut b = [0u8];
        if !src.take(&mut b)? {
            return Ok(None);
        }
        let bits = u64::from(b[0] & 0x7F);
        if i == 9 && bits > 1 {
            return Ok(None);
        }
        v |= bits << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some(v));
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
    pub(super) fn plain(timestamp_us: u64, payload_len: u32) -> Head {
        Head {
            timestamp_us,
            producer: None,
            payload_len,
            own_topic: false,
        }
    }

    /// Whether the record carries its own topic (else it has the batch topic).
    pub(super) fn own_topic(&self) -> bool {
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
    pub(super) fn mark(&self) -> (u64, u32) {
        (self.prev_ts, self.left)
    }

    /// Takes the decoder back to `mark` (from [`Decoder::mark`] on the same body): the
    /// caller then hands it the same bytes again from that record on.
    pub(super) fn rewind(&mut self, mark: (u64, u32)) {
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

#[cfg(test)]
mod tests;

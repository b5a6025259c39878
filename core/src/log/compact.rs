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

mod decode;

pub(super) use decode::take_varint;
pub use decode::{Decoder, Head, SliceSource, Source, expand};

#[cfg(test)]
mod tests;

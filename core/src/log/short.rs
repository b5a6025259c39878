//! The short batch (format version 5): one record flushed alone, stored with 6 bytes of
//! framing instead of a 32-byte batch header and a compact body prefix. `FORMAT.md`
//! section 3.5 has the byte table.
//!
//! A short batch stores neither its offset, nor the record CRC before it, nor (unless they
//! change) its topic, nor its full timestamp: it continues the record just before it in the
//! same segment, which is either a short batch or a full batch of exactly one record whose
//! body is not compressed (an *anchor*). That previous record gives the [`Link`]: the
//! short batch's offset is the next one, its CRC covers that offset and the previous
//! record's CRC (so a short batch validates only where it belongs, and the record CRC
//! chain holds through it), its timestamp is a step from the previous record's, and its
//! topic is the previous record's unless it carries its own.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | tag: `0xA0`; bit 0: producer fields follow; bit 1: the record's own topic follows; bit 2: bit 8 of `L` |
//! | 1 | bits 0 to 7 of `L`, the length of the body, 1 to 511 |
//! | 2..6 | CRC-32 of offset (u64 LE) ‖ previous record CRC (u32 LE) ‖ bytes 0..2 ‖ the body |
//! | 6..6+L | body: timestamp step (zigzag varint), producer id (u64) and sequence (varint), topic (length byte and bytes), payload (the rest) |
//!
//! The tag (`0xA0` to `0xA7`) is never the erased value `0xFF` of NOR flash, `0x00`, nor
//! `S` (`0x53`), the first byte of every magic, so a short batch is told from erased flash,
//! a full batch and a resume marker by its first byte. A writer never writes a tag equal to
//! the flash's erased value. Tag bit 2 is clear in every short batch whose body takes at
//! most 255 bytes.

use super::compact::{put_varint, take_varint, unzigzag, varint_len, zigzag};
use super::format::{MAX_NEXT_OFFSET, MAX_TOPIC_LEN, Producer, record_head_pieces};

/// First segment header version whose segments may hold short batches.
pub const SHORT_VERSION: u16 = 5;

/// Tag of a short batch, flag bits clear.
pub const SHORT_TAG: u8 = 0xA0;
/// Tag bit: producer id and sequence follow the timestamp step.
pub const SHORT_PRODUCER: u8 = 0x01;
/// Tag bit: the record's own topic (length byte and bytes) follows.
pub const SHORT_TOPIC: u8 = 0x02;
/// Tag bit: bit 8 of the body length (its bits 0 to 7 are the second byte).
pub const SHORT_LEN_HIGH: u8 = 0x04;
const SHORT_TAG_MASK: u8 = !(SHORT_PRODUCER | SHORT_TOPIC | SHORT_LEN_HIGH);

/// Bytes of a short batch before its body: tag, length, CRC.
pub const SHORT_HEAD_LEN: usize = 6;
/// Longest body of a short batch, bytes: 9 bits of length (tag bit 2 and the length byte).
pub const SHORT_MAX_BODY: usize = 511;
/// Longest short batch, framing included (before padding), bytes.
pub const SHORT_MAX_LEN: usize = SHORT_HEAD_LEN + SHORT_MAX_BODY;
/// Most bytes of a short batch before its payload, bytes: the framing, the timestamp step
/// (a varint, at most 10 bytes as read), producer id and sequence (8, and a varint of at
/// most 10) and an own topic (1 and 255).
pub const SHORT_MAX_HEAD: usize = SHORT_HEAD_LEN + 10 + 8 + 10 + 1 + MAX_TOPIC_LEN;

/// Whether `b`, the first byte at a batch position, is a short batch tag on a flash whose
/// erased byte is `erased`.
pub const fn is_tag(b: u8, erased: u8) -> bool {
    b & SHORT_TAG_MASK == SHORT_TAG && b != erased
}

/// Length of the body of a short batch whose first two bytes are `tag, len`, bytes (0 to
/// 511; 0 is invalid): tag bit 2 is its bit 8, `len` its bits 0 to 7.
pub const fn body_len(tag: u8, len: u8) -> u32 {
    (((tag & SHORT_LEN_HIGH) as u32) << 6) | len as u32
}

/// Bytes a short batch whose first two bytes are `tag, len` takes, before padding (6 to
/// [`SHORT_MAX_LEN`]).
pub const fn total_len(tag: u8, len: u8) -> u32 {
    SHORT_HEAD_LEN as u32 + body_len(tag, len)
}

/// What a short batch continues: the record just before it, as a reader walking the
/// segment knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The short batch's offset (one past the previous record's).
    pub next: u64,
    /// Record CRC of the previous record.
    pub prev_crc: u32,
    /// Timestamp of the previous record, µs.
    pub ts: u64,
    /// Flash address of the previous record's topic bytes (checked by an earlier CRC).
    pub topic_addr: u32,
    /// Length of that topic, 1 to 255.
    pub topic_len: u8,
    /// CRC-32 of that topic as the check that covered it read it: a later read of the
    /// topic that differs (a bit flip on read) is not believed.
    pub topic_crc: u32,
}

/// A short batch's record, decoded from its bytes: where its parts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// The tag's flag bits.
    pub tag: u8,
    /// The record's timestamp, µs.
    pub ts: u64,
    /// Producer fields, if any.
    pub producer: Option<Producer>,
    /// Position and length of the record's own topic in the batch bytes, if any.
    pub own_topic: Option<(usize, u8)>,
    /// Position of the payload in the batch bytes (it runs to the end of the batch).
    pub payload_at: usize,
}

/// CRC-32 a short batch stores: over `offset`, `prev_crc`, the tag and length bytes and
/// the body.
pub fn crc(offset: u64, prev_crc: u32, head: [u8; 2], body: &[u8]) -> u32 {
    let mut h = crc_start(offset, prev_crc, head);
    h.update(body);
    h.finalize()
}

/// The CRC of [`crc`] before the body: fed `offset`, `prev_crc` and the tag and length
/// bytes. Feeding it the body gives the CRC the batch stores.
pub fn crc_start(offset: u64, prev_crc: u32, head: [u8; 2]) -> crate::crc::Hasher {
    let mut h = crate::crc::Hasher::new();
    h.update(&offset.to_le_bytes());
    h.update(&prev_crc.to_le_bytes());
    h.update(&head);
    h
}

/// Checks the short batch `b` (exactly its [`total_len`] bytes) against `link` and decodes
/// its body: `None` if the tag, the length, the CRC or the body is wrong (a varint too long
/// or out of range, an empty or non-UTF-8 topic, a body that ends inside a field), or if
/// its offset would reach [`MAX_NEXT_OFFSET`].
pub fn decode(b: &[u8], link: &Link) -> Option<Decoded> {
    let d = decode_head(b, b.len(), link)?;
    let stored = u32::from_le_bytes(b.get(2..6)?.try_into().ok()?);
    (crc(link.next, link.prev_crc, [b[0], b[1]], &b[SHORT_HEAD_LEN..]) == stored).then_some(d)
}

/// Decodes a short batch of `total` bytes from `head`, its first bytes (all of them, or
/// at least [`SHORT_MAX_HEAD`]: every field before the payload), as [`decode`] does but
/// without checking its CRC (the caller checks it over the whole batch): `None` if the
/// tag, the length or a field is wrong, or if its offset would reach
/// [`MAX_NEXT_OFFSET`].
pub fn decode_head(head: &[u8], total: usize, link: &Link) -> Option<Decoded> {
    let b = head;
    let (&tag, &len) = (b.first()?, b.get(1)?);
    if tag & SHORT_TAG_MASK != SHORT_TAG
        || body_len(tag, len) == 0
        || total != total_len(tag, len) as usize
        || (b.len() != total && (b.len() < SHORT_MAX_HEAD || b.len() > total))
        || b.len() < SHORT_HEAD_LEN
        || link.next >= MAX_NEXT_OFFSET
    {
        return None;
    }
    let mut src = super::compact::SliceSource {
        rest: &b[SHORT_HEAD_LEN..],
    };
    let step = take_varint(&mut src).ok()??;
    let ts = link.ts.wrapping_add(unzigzag(step) as u64);
    let mut producer = None;
    if tag & SHORT_PRODUCER != 0 {
        let id = src.rest.get(..8)?;
        let id = u64::from_le_bytes(id.try_into().ok()?);
        src.rest = &src.rest[8..];
        let seq = take_varint(&mut src)
            .ok()?
            .and_then(|s| u32::try_from(s).ok())?;
        producer = Some(Producer { id, seq });
    }
    let mut own_topic = None;
    if tag & SHORT_TOPIC != 0 {
        let (&tlen, rest) = src.rest.split_first()?;
        let t = rest.get(..tlen as usize)?;
        if tlen == 0 || core::str::from_utf8(t).is_err() {
            return None;
        }
        own_topic = Some((b.len() - rest.len(), tlen));
        src.rest = &rest[tlen as usize..];
    }
    Some(Decoded {
        tag,
        ts,
        producer,
        own_topic,
        payload_at: b.len() - src.rest.len(),
    })
}

/// Encodes the record `topic`, `ts`, `producer`, `payload` as a short batch at offset
/// `offset` after a record with CRC `prev_crc`, timestamp `prev_ts` and topic
/// `prev_topic`, into `out` (at least [`SHORT_MAX_LEN`] bytes). Returns its length, or
/// `None` if the body would pass [`SHORT_MAX_BODY`] bytes.
#[allow(clippy::too_many_arguments)]
pub fn encode(
    offset: u64,
    prev_crc: u32,
    prev_ts: u64,
    prev_topic: &[u8],
    topic: &[u8],
    ts: u64,
    producer: Option<Producer>,
    payload: &[u8],
    out: &mut [u8],
) -> Option<usize> {
    let step = zigzag(ts.wrapping_sub(prev_ts) as i64);
    let own = topic != prev_topic;
    let body = varint_len(step)
        + producer.map_or(0, |p| 8 + varint_len(u64::from(p.seq)))
        + if own { 1 + topic.len() } else { 0 }
        + payload.len();
    if body > SHORT_MAX_BODY || out.len() < SHORT_HEAD_LEN + body {
        return None;
    }
    let mut tag = SHORT_TAG;
    let mut at = SHORT_HEAD_LEN;
    let mut v = [0u8; 10];
    let n = put_varint(step, &mut v);
    out[at..at + n].copy_from_slice(&v[..n]);
    at += n;
    if let Some(p) = producer {
        tag |= SHORT_PRODUCER;
        out[at..at + 8].copy_from_slice(&p.id.to_le_bytes());
        let n = put_varint(u64::from(p.seq), &mut v);
        out[at + 8..at + 8 + n].copy_from_slice(&v[..n]);
        at += 8 + n;
    }
    if own {
        tag |= SHORT_TOPIC;
        out[at] = topic.len() as u8;
        out[at + 1..at + 1 + topic.len()].copy_from_slice(topic);
        at += 1 + topic.len();
    }
    out[at..at + payload.len()].copy_from_slice(payload);
    at += payload.len();
    let len = at - SHORT_HEAD_LEN;
    if len > 0xFF {
        tag |= SHORT_LEN_HIGH;
    }
    out[0] = tag;
    out[1] = len as u8;
    let c = crc(offset, prev_crc, [out[0], out[1]], &out[SHORT_HEAD_LEN..at]);
    out[2..6].copy_from_slice(&c.to_le_bytes());
    Some(at)
}

/// The record CRC of a decoded short batch's record at `offset`: over its canonical
/// encoding (`topic`, the decoded fields, `payload`).
pub fn record_crc(offset: u64, d: &Decoded, topic: &[u8], payload: &[u8]) -> u32 {
    let mut h = crate::crc::Hasher::new();
    h.update(&offset.to_le_bytes());
    record_head_pieces(topic, d.ts, d.producer, payload.len() as u32, &mut |p| {
        h.update(p)
    });
    h.update(payload);
    h.finalize()
}

/// Writes the canonical encoding of a decoded short batch's record into `out`; returns
/// its length, or `None` if `out` is too small.
pub fn canonical(d: &Decoded, topic: &[u8], payload: &[u8], out: &mut [u8]) -> Option<usize> {
    let (mut at, mut fits) = (0usize, true);
    record_head_pieces(topic, d.ts, d.producer, payload.len() as u32, &mut |p| {
        match out.get_mut(at..at + p.len()) {
            Some(dst) => dst.copy_from_slice(p),
            None => fits = false,
        }
        at += p.len();
    });
    let end = at.checked_add(payload.len())?;
    out.get_mut(at..end)?.copy_from_slice(payload);
    fits.then_some(end)
}

/// Length of the canonical encoding of a decoded short batch's record.
pub fn canonical_len(d: &Decoded, topic_len: usize, payload_len: usize) -> usize {
    super::format::RECORD_OVERHEAD
        + topic_len
        + payload_len
        + if d.producer.is_some() {
            super::format::PRODUCER_LEN
        } else {
            0
        }
}

/// Topic bytes, a copy of at most [`MAX_TOPIC_LEN`] bytes.
pub type TopicBuf = [u8; MAX_TOPIC_LEN];

/// What the writer keeps of the last record it wrote in the head segment, when a short
/// batch may continue it (it was a short batch or an anchor written since the mount).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterLink {
    /// The offset a short batch after it has.
    pub(crate) next: u64,
    /// The record's timestamp, µs.
    pub(crate) ts: u64,
    /// The record's topic.
    pub(crate) topic: TopicBuf,
    /// Its length.
    pub(crate) topic_len: u8,
}

impl WriterLink {
    /// Makes `slot` the link after the record `topic`, `ts` at offset `next - 1`, in place
    /// (the topic is copied only when it changed).
    pub(crate) fn set(slot: &mut Option<WriterLink>, next: u64, ts: u64, topic: &[u8]) {
        match slot {
            Some(l) => {
                (l.next, l.ts) = (next, ts);
                if l.topic[..l.topic_len as usize] != *topic {
                    let n = topic.len().min(MAX_TOPIC_LEN);
                    l.topic[..n].copy_from_slice(&topic[..n]);
                    l.topic_len = n as u8;
                }
            }
            None => *slot = Some(WriterLink::new(next, ts, topic)),
        }
    }

    /// The link after the record `topic`, `ts` at offset `next - 1`.
    pub(crate) fn new(next: u64, ts: u64, topic: &[u8]) -> Self {
        let mut t = [0u8; MAX_TOPIC_LEN];
        let n = topic.len().min(MAX_TOPIC_LEN);
        t[..n].copy_from_slice(&topic[..n]);
        WriterLink {
            next,
            ts,
            topic: t,
            topic_len: n as u8,
        }
    }
}

#[cfg(test)]
mod tests;

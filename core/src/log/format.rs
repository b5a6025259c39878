//! Byte layouts of the on-flash structures: segment header, batch header, record, journal
//! entry. Everything is explicit little-endian; `FORMAT.md` has the byte tables.
//!
//! Every structure starts with a 4-byte magic that is neither all-0x00 nor all-0xFF and
//! carries a CRC-32 (IEEE, as computed by `crc32fast`), so neither an erased nor a zeroed
//! region ever validates.

use crate::storage::Geometry;

/// Version of the on-flash format written by this crate, stored in every segment header.
/// Version 2 adds the resume marker ([`ResumeMarker`]); version 3 writes journal entries
/// whose producer table holds producer sessions (layout 1, see `FORMAT.md` section 5);
/// version 4 stores batch bodies in the compact record layout
/// ([`compact`](super::compact)). Segments of versions 1 to 3 and journal entries of
/// layout 0 and 1 are still mounted and read; a log upgrades by writing version 4 from its
/// next segment on.
pub const FORMAT_VERSION: u16 = 4;

/// Oldest segment header version a mount accepts.
pub const MIN_FORMAT_VERSION: u16 = 1;

/// Magic of a segment header: the bytes `S P W S`.
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"SPWS");
/// Magic of a batch header: the bytes `S P W B`.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"SPWB");
/// Magic of a journal entry: the bytes `S P W J`.
pub const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"SPWJ");
/// Magic of a resume marker: the bytes `S P W R`.
pub const RESUME_MAGIC: u32 = u32::from_le_bytes(*b"SPWR");

/// Length of a segment header in bytes (before padding to the write size).
pub const SEGMENT_HEADER_LEN: usize = 80;
/// Length of a batch header in bytes.
pub const BATCH_HEADER_LEN: usize = 32;
/// Length of a resume marker in bytes (a multiple of every write size).
pub const RESUME_LEN: usize = 32;
/// Length of the fixed part of a journal entry in bytes.
pub const JOURNAL_HEADER_LEN: usize = 72;

/// Erase blocks at the start of the partition that hold the commit journal.
pub const JOURNAL_BLOCKS: u32 = 2;

/// Longest topic name in bytes.
pub const MAX_TOPIC_LEN: usize = 255;
/// Longest consumer name in bytes.
pub const MAX_CONSUMER_NAME_LEN: usize = 31;

/// Offsets at or above this value are never handed out, and a decoded structure that
/// names one (a segment's base offset, a batch's last offset, a journal lease, a committed
/// offset) is refused as damaged: the log can then add 1 to any offset it holds without
/// wrapping. 2^62 records outlast the flash (146 years at 10^9 records/s).
pub const MAX_OFFSET: u64 = 1 << 62;

/// Segment and journal entry sequence numbers at or above this value are refused as
/// damaged when decoded, so the next one (`+ 1`) never wraps. One journal write per
/// microsecond would take 146,000 years to get there.
pub const MAX_SEQ: u64 = 1 << 62;

/// Bytes a record takes in a batch besides its topic and payload:
/// topic length (1) + timestamp (8) + flags (1) + payload length (4).
pub const RECORD_OVERHEAD: usize = 14;
/// Extra bytes of a record that carries a producer id (8) and sequence (4).
pub const PRODUCER_LEN: usize = 12;

const FLAG_PRODUCER: u8 = 0x01;
const FLAG_AFTER_UNCLEAN: u8 = 0x01;

/// Rounds `n` up to a multiple of `align` (a power of two).
pub(crate) const fn align_up(n: u32, align: u32) -> u32 {
    (n + align - 1) & !(align - 1)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
fn u128_at(b: &[u8], at: usize) -> u128 {
    let mut x = [0u8; 16];
    x.copy_from_slice(&b[at..at + 16]);
    u128::from_le_bytes(x)
}

/// CRC-32 (IEEE 802.3 polynomial, reflected, as in zlib and Ethernet) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    crate::crc::hash(data)
}

/// The record CRC: CRC-32 over the record's offset (u64, little-endian) followed by the
/// record's encoding in a batch (see [`RecordRef`]). Consumers compare it to check a resume
/// point; the offset is part of it so that equal records at different offsets differ.
pub fn record_crc(offset: u64, encoded: &[u8]) -> u32 {
    let mut h = crate::crc::Hasher::new();
    h.update(&offset.to_le_bytes());
    h.update(encoded);
    h.finalize()
}

/// The segment header, stored at the start of the first erase block of every segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Format version the header was written with ([`FORMAT_VERSION`] for new headers;
    /// decoding accepts [`MIN_FORMAT_VERSION`] up to it).
    pub version: u16,
    /// Erase block size of the partition, bytes.
    pub erase_size: u32,
    /// Write granularity of the partition, bytes.
    pub write_size: u32,
    /// Value of an erased byte.
    pub erased: u8,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
    /// Number of segments in the ring.
    pub segment_count: u32,
    /// The log id, fixed at format time.
    pub log_id: u128,
    /// Segment sequence number: orders the ring, +1 for every segment opened.
    pub seq: u64,
    /// Offset of the first record this segment may hold.
    pub base_offset: u64,
    /// Record CRC of the last record appended before `base_offset` (0 if none).
    pub prev_crc: u32,
    /// How many times this segment has been erased (wear figure).
    pub erase_count: u32,
    /// The segment was opened by the first write after an unclean shutdown: the segment
    /// before it was abandoned and may end in a torn write (offsets never durable), which
    /// readers report as skipped rather than corrupt. Flags bit 0.
    pub after_unclean: bool,
}

impl SegmentHeader {
    /// Encodes the header into its 80 bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&(SEGMENT_HEADER_LEN as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.erase_size.to_le_bytes());
        b[12..14].copy_from_slice(&(self.write_size as u16).to_le_bytes());
        b[14] = self.erased;
        b[15] = u8::from(self.after_unclean);
        b[16..20].copy_from_slice(&self.blocks_per_segment.to_le_bytes());
        b[20..24].copy_from_slice(&self.segment_count.to_le_bytes());
        b[24..40].copy_from_slice(&self.log_id.to_le_bytes());
        b[40..48].copy_from_slice(&self.seq.to_le_bytes());
        b[48..56].copy_from_slice(&self.base_offset.to_le_bytes());
        b[56..60].copy_from_slice(&self.prev_crc.to_le_bytes());
        b[60..64].copy_from_slice(&self.erase_count.to_le_bytes());
        b[64..68].copy_from_slice(&JOURNAL_BLOCKS.to_le_bytes());
        // 68..76 reserved, zero.
        let crc = crc32(&b[..76]);
        b[76..80].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header; `None` if the magic, length or CRC is wrong, the version is not
    /// one of [`MIN_FORMAT_VERSION`]`..=`[`FORMAT_VERSION`], or the numbers cannot describe
    /// a partition: a zero erase size, write size, segment size or segment count, a
    /// segment (`blocks_per_segment × erase_size` bytes) or a partition past 4 GiB, a base
    /// offset at or above [`MAX_OFFSET`], a sequence number at or above [`MAX_SEQ`].
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < SEGMENT_HEADER_LEN
            || u32_at(b, 0) != SEGMENT_MAGIC
            || !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&u16_at(b, 4))
            || u16_at(b, 6) as usize != SEGMENT_HEADER_LEN
            || crc32(&b[..76]) != u32_at(b, 76)
        {
            return None;
        }
        let h = SegmentHeader {
            version: u16_at(b, 4),
            erase_size: u32_at(b, 8),
            write_size: u16_at(b, 12) as u32,
            erased: b[14],
            blocks_per_segment: u32_at(b, 16),
            segment_count: u32_at(b, 20),
            log_id: u128_at(b, 24),
            seq: u64_at(b, 40),
            base_offset: u64_at(b, 48),
            prev_crc: u32_at(b, 56),
            erase_count: u32_at(b, 60),
            after_unclean: b[15] & FLAG_AFTER_UNCLEAN != 0,
        };
        let partition_blocks = h
            .blocks_per_segment
            .checked_mul(h.segment_count)?
            .checked_add(JOURNAL_BLOCKS)?;
        (h.erase_size != 0
            && h.write_size != 0
            && h.blocks_per_segment != 0
            && h.segment_count != 0
            && geometry_fits(h.erase_size, h.blocks_per_segment)
            && geometry_fits(h.erase_size, partition_blocks)
            && h.base_offset < MAX_OFFSET
            && h.seq < MAX_SEQ)
            .then_some(h)
    }

    /// The partition geometry this header describes (capacity derived from the ring).
    pub fn geometry(&self) -> Geometry {
        let blocks =
            JOURNAL_BLOCKS as u64 + self.blocks_per_segment as u64 * self.segment_count as u64;
        Geometry {
            erase_size: self.erase_size,
            write_size: self.write_size,
            capacity: (blocks * self.erase_size as u64).min(u32::MAX as u64) as u32,
            erased: self.erased,
        }
    }
}

/// Whether `blocks` erase blocks of `erase_size` bytes fit in a 32-bit flash address
/// space (checked multiplication of two decoded numbers).
pub(crate) fn geometry_fits(erase_size: u32, blocks: u32) -> bool {
    erase_size.checked_mul(blocks).is_some()
}

/// The fixed 32-byte header of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Length of the batch in bytes, header included, padding excluded.
    pub len: u32,
    /// CRC-32 over bytes 16..len (base offset, count, prev CRC and the records).
    pub crc: u32,
    /// Offset of the first record.
    pub base_offset: u64,
    /// Number of records (at least 1).
    pub count: u32,
    /// Record CRC of the last record appended before `base_offset` (0 if none).
    pub prev_crc: u32,
}

/// What the first 16 bytes of a would-be batch say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadCheck {
    /// Every byte of the header is the erased value: the end of written data.
    Erased,
    /// The magic and the length check agree; the length is plausible.
    Plausible,
    /// Anything else.
    Invalid,
}

impl BatchHeader {
    /// Encodes the header. `crc` must already be computed over bytes 16..len.
    pub fn encode(&self) -> [u8; BATCH_HEADER_LEN] {
        let mut b = [0u8; BATCH_HEADER_LEN];
        b[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&(!self.len).to_le_bytes());
        b[12..16].copy_from_slice(&self.crc.to_le_bytes());
        b[16..24].copy_from_slice(&self.base_offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.count.to_le_bytes());
        b[28..32].copy_from_slice(&self.prev_crc.to_le_bytes());
        b
    }

    /// Checks magic, length check and bounds (`max_len`: bytes available from the batch's
    /// position to the end of its segment; the batch's last offset below [`MAX_OFFSET`];
    /// a body long enough for `count` records in the compact layout, whose records are the
    /// smallest, compressed: see [`count_fits`](super::compact::count_fits)).
    pub fn check(b: &[u8; BATCH_HEADER_LEN], erased: u8, max_len: u32) -> HeadCheck {
        if b.iter().all(|&x| x == erased) {
            return HeadCheck::Erased;
        }
        let len = u32_at(b, 4);
        let count = u32_at(b, 24);
        if u32_at(b, 0) != BATCH_MAGIC
            || u32_at(b, 8) != !len
            || u64::from(len) < BATCH_HEADER_LEN as u64 + super::compact::min_body_len(1)
            || len > max_len
            || count == 0
            || !super::compact::count_fits(count, u64::from(len) - BATCH_HEADER_LEN as u64)
            || u64_at(b, 16)
                .checked_add(u64::from(count))
                .is_none_or(|end| end > MAX_OFFSET)
        {
            return HeadCheck::Invalid;
        }
        HeadCheck::Plausible
    }

    /// Decodes the fields (after [`BatchHeader::check`] said `Plausible`).
    pub fn decode(b: &[u8; BATCH_HEADER_LEN]) -> Self {
        BatchHeader {
            len: u32_at(b, 4),
            crc: u32_at(b, 12),
            base_offset: u64_at(b, 16),
            count: u32_at(b, 24),
            prev_crc: u32_at(b, 28),
        }
    }

    /// One past the last offset of the batch.
    pub fn end_offset(&self) -> u64 {
        self.base_offset.saturating_add(self.count as u64)
    }
}

/// The resume marker (format version 2): written in the head segment by the first write
/// after an unclean mount that found a torn write there, right after the torn bytes
/// (at the first write-size-aligned position past the last byte that does not read
/// erased). It tells a reader that the bytes from `torn_from` up to the marker are the
/// remains of a write cut by a power loss, never durable, and that the data goes on right
/// after the marker. 32 bytes:
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | magic `SPWR` |
/// | 4..8 | `len` = 32 |
/// | 8..12 | `!len` |
/// | 12..16 | CRC-32 of bytes 16..32 |
/// | 16..24 | `expected`: the offset the mount expected at `torn_from` (u64) |
/// | 24..28 | `torn_from`: segment position where the valid data ended (u32, bytes) |
/// | 28..32 | `torn_bytes`: non-erased bytes the mount found after `torn_from` (u32) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeMarker {
    /// Offset the mount expected at `torn_from` (one past the last valid record, or the
    /// segment's base offset).
    pub expected: u64,
    /// Position in the segment (bytes from its start) where the valid data ended.
    pub torn_from: u32,
    /// Non-erased bytes found from `torn_from` to the end of the segment (informative).
    pub torn_bytes: u32,
}

impl ResumeMarker {
    /// Encodes the marker into its 32 bytes.
    pub fn encode(&self) -> [u8; RESUME_LEN] {
        let mut b = [0u8; RESUME_LEN];
        b[0..4].copy_from_slice(&RESUME_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(RESUME_LEN as u32).to_le_bytes());
        b[8..12].copy_from_slice(&(!(RESUME_LEN as u32)).to_le_bytes());
        b[16..24].copy_from_slice(&self.expected.to_le_bytes());
        b[24..28].copy_from_slice(&self.torn_from.to_le_bytes());
        b[28..32].copy_from_slice(&self.torn_bytes.to_le_bytes());
        let crc = crc32(&b[16..]);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a marker; `None` unless the magic, the length pair and the CRC are right and
    /// `expected` is below [`MAX_OFFSET`].
    pub fn decode(b: &[u8; RESUME_LEN]) -> Option<Self> {
        if u32_at(b, 0) != RESUME_MAGIC
            || u32_at(b, 4) != RESUME_LEN as u32
            || u32_at(b, 8) != !(RESUME_LEN as u32)
            || crc32(&b[16..]) != u32_at(b, 12)
            || u64_at(b, 16) >= MAX_OFFSET
        {
            return None;
        }
        Some(ResumeMarker {
            expected: u64_at(b, 16),
            torn_from: u32_at(b, 24),
            torn_bytes: u32_at(b, 28),
        })
    }
}

/// Producer identity of an idempotent publisher (Kafka's idempotent producer idea):
/// a resend with the same `(id, seq)` is stored once. A producer numbers its records with
/// `seq` (0, 1, 2, …) and picks a new `id` when it cannot keep counting (e.g. a random
/// `u64` per boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Producer {
    /// Producer id, chosen by the publisher (random per boot of the publisher).
    pub id: u64,
    /// Sequence number, +1 per record of this producer.
    pub seq: u32,
}

/// A record as it is appended: the log assigns the offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Topic name, 1 to 255 bytes of UTF-8.
    pub topic: &'a str,
    /// Wall-clock time of the record in µs since the Unix epoch (set by the publisher or the
    /// gateway; not used by the log for timing).
    pub timestamp_us: u64,
    /// Producer id and sequence, for idempotent publishing.
    pub producer: Option<Producer>,
    /// Payload bytes.
    pub payload: &'a [u8],
}

impl Record<'_> {
    /// Bytes this record takes in a batch.
    pub fn encoded_len(&self) -> usize {
        RECORD_OVERHEAD
            + self.topic.len()
            + self.payload.len()
            + if self.producer.is_some() {
                PRODUCER_LEN
            } else {
                0
            }
    }

    /// Encodes the record into `out` (exactly [`Record::encoded_len`] bytes long).
    pub(crate) fn encode_into(&self, out: &mut [u8]) {
        let t = self.topic.as_bytes();
        out[0] = t.len() as u8;
        let mut at = 1;
        out[at..at + t.len()].copy_from_slice(t);
        at += t.len();
        out[at..at + 8].copy_from_slice(&self.timestamp_us.to_le_bytes());
        at += 8;
        match self.producer {
            Some(p) => {
                out[at] = FLAG_PRODUCER;
                out[at + 1..at + 9].copy_from_slice(&p.id.to_le_bytes());
                out[at + 9..at + 13].copy_from_slice(&p.seq.to_le_bytes());
                at += 13;
            }
            None => {
                out[at] = 0;
                at += 1;
            }
        }
        out[at..at + 4].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        at += 4;
        out[at..at + self.payload.len()].copy_from_slice(self.payload);
    }
}

/// A record read back from the log, borrowing its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The record's offset.
    pub offset: u64,
    /// The record CRC (see [`record_crc`]).
    pub crc: u32,
    /// Topic name.
    pub topic: &'a str,
    /// Wall-clock timestamp, µs since the Unix epoch.
    pub timestamp_us: u64,
    /// Producer id and sequence, if the publisher gave them.
    pub producer: Option<Producer>,
    /// Payload bytes.
    pub payload: &'a [u8],
    /// The record's whole encoding (what the record CRC covers, after the offset).
    pub encoded: &'a [u8],
}

/// Parses one record encoding at the start of `b`; returns it and its length in bytes.
/// `None` if the bytes are not a well-formed record (bounds, flags, UTF-8).
pub fn parse_record(b: &[u8], offset: u64) -> Option<(RecordRef<'_>, usize)> {
    let (mut r, n) = parse_record_fields(b, offset)?;
    r.crc = record_crc(offset, r.encoded);
    Some((r, n))
}

/// [`parse_record`] without the record CRC (left 0), for walks that need a record's length
/// or fields but not its CRC: the CRC is a pass over the record's bytes.
pub(crate) fn parse_record_fields(b: &[u8], offset: u64) -> Option<(RecordRef<'_>, usize)> {
    let tlen = *b.first()? as usize;
    if tlen == 0 {
        return None;
    }
    let mut at = 1;
    let topic = core::str::from_utf8(b.get(at..at + tlen)?).ok()?;
    at += tlen;
    let timestamp_us = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
    at += 8;
    let flags = *b.get(at)?;
    at += 1;
    let producer = match flags {
        0 => None,
        FLAG_PRODUCER => {
            let p = b.get(at..at + PRODUCER_LEN)?;
            at += PRODUCER_LEN;
            Some(Producer {
                id: u64_at(p, 0),
                seq: u32_at(p, 8),
            })
        }
        _ => return None,
    };
    let plen = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    let payload = b.get(at..at.checked_add(plen)?)?;
    at += plen;
    let encoded = &b[..at];
    Some((
        RecordRef {
            offset,
            crc: 0,
            topic,
            timestamp_us,
            producer,
            payload,
            encoded,
        },
        at,
    ))
}

/// Iterates the records of a buffer filled by [`Log::read`](super::Log::read): record
/// encodings back to back, offsets consecutive from `first_offset`. Stops at the first
/// malformed record (which a successful read never produces).
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    rest: &'a [u8],
    next_offset: u64,
    left: u32,
}

impl<'a> RecordIter<'a> {
    /// Iterates `count` records of `bytes`, the first one at `first_offset`.
    pub fn new(bytes: &'a [u8], first_offset: u64, count: u32) -> Self {
        RecordIter {
            rest: bytes,
            next_offset: first_offset,
            left: count,
        }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = RecordRef<'a>;
    fn next(&mut self) -> Option<RecordRef<'a>> {
        if self.left == 0 {
            return None;
        }
        let (r, n) = parse_record(self.rest, self.next_offset)?;
        self.rest = &self.rest[n..];
        self.next_offset += 1;
        self.left -= 1;
        Some(r)
    }
}

/// Walks the records of a batch body (bytes after the 32-byte header), checking that
/// exactly `count` well-formed records fill it. Returns the length of the first `skip`
/// records and the CRC of the record just before the `skip`-th one (or `prev_crc`).
pub(crate) fn walk_records(
    body: &[u8],
    base: u64,
    count: u32,
    skip: u64,
    prev_crc: u32,
) -> Option<(usize, u32)> {
    let mut at = 0usize;
    let mut crc = prev_crc;
    let mut skipped_len = 0usize;
    for i in 0..count as u64 {
        if i == skip {
            skipped_len = at;
        }
        let (r, n) = parse_record_fields(&body[at..], base + i)?;
        if i + 1 == skip.min(count as u64) {
            crc = record_crc(base + i, r.encoded);
        }
        at += n;
    }
    if at != body.len() {
        return None;
    }
    if skip >= count as u64 {
        skipped_len = at;
    }
    Some((skipped_len, crc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// The record of the worked example in `FORMAT.md`.
    const EXAMPLE: Record<'static> = Record {
        topic: "sst",
        timestamp_us: 1_764_000_000_000_000,
        producer: None,
        payload: b"18.4",
    };
    /// Base offset of the example batch.
    const EXAMPLE_BASE: u64 = 258;
    /// Record CRC of the record before it (offset 257), as given in `FORMAT.md`.
    const EXAMPLE_PREV_CRC: u32 = 0x1122_3344;

    /// Encodes `records` as one batch the way the log writes it: header, records back to
    /// back, padded to `write_size` with `erased`.
    fn encode_batch(
        base_offset: u64,
        prev_crc: u32,
        records: &[Record<'_>],
        write_size: u32,
        erased: u8,
    ) -> Vec<u8> {
        let len = BATCH_HEADER_LEN + records.iter().map(Record::encoded_len).sum::<usize>();
        let mut b = std::vec![0u8; len];
        let mut at = BATCH_HEADER_LEN;
        for r in records {
            r.encode_into(&mut b[at..at + r.encoded_len()]);
            at += r.encoded_len();
        }
        let mut h = BatchHeader {
            len: len as u32,
            crc: 0,
            base_offset,
            count: records.len() as u32,
            prev_crc,
        };
        b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
        h.crc = crc32(&b[16..]);
        b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
        b.resize(align_up(len as u32, write_size) as usize, erased);
        b
    }

    /// The bytes of the annotated hex dump that follows `marker` in `FORMAT.md`: the lines
    /// of the next ```text block that start with `0x`, each `0xOFFSET BYTES... | comment`,
    /// with the offsets checked to be contiguous.
    fn dump_in_format_md(marker: &str) -> Vec<u8> {
        let doc = include_str!("../../FORMAT.md");
        let after = &doc[doc.find(marker).expect("marker in FORMAT.md")..];
        let block = &after[after.find("```text\n").expect("hex block") + 8..];
        let block = &block[..block.find("```").expect("end of the hex block")];
        let mut bytes = Vec::new();
        for line in block.lines().filter(|l| l.starts_with("0x")) {
            let mut tokens = line.split('|').next().unwrap_or("").split_whitespace();
            let offset = tokens.next().expect("offset column");
            let offset =
                usize::from_str_radix(offset.trim_start_matches("0x"), 16).expect("hex offset");
            assert_eq!(offset, bytes.len(), "offset column of {line:?}");
            for t in tokens {
                bytes.push(u8::from_str_radix(t, 16).expect("hex byte"));
            }
        }
        bytes
    }

    #[test]
    fn format_md_batch_example_matches_the_encoder() {
        let want = encode_batch(EXAMPLE_BASE, EXAMPLE_PREV_CRC, &[EXAMPLE], 4, 0xFF);
        let doc = dump_in_format_md("format_md_batch_example_matches_the_encoder");
        assert_eq!(doc, want, "FORMAT.md's example differs from the encoder");

        // The values quoted in the text around the dump.
        assert_eq!(want.len(), 56);
        let h = BatchHeader::decode(want[..BATCH_HEADER_LEN].try_into().unwrap());
        assert_eq!((h.len, h.crc), (53, 0x432C_1522));
        assert_eq!(
            BatchHeader::check(want[..BATCH_HEADER_LEN].try_into().unwrap(), 0xFF, 4096),
            HeadCheck::Plausible
        );
        let (rec, n) = parse_record(&want[BATCH_HEADER_LEN..53], EXAMPLE_BASE).unwrap();
        assert_eq!(n, 21);
        assert_eq!(rec.crc, 0x4F6A_CD66);
        assert_eq!((rec.topic, rec.payload), (EXAMPLE.topic, EXAMPLE.payload));
    }

    /// Encodes `records` as one batch of a version 4 segment: header and compact body,
    /// padded to `write_size` with `erased`.
    fn encode_compact_batch(
        base_offset: u64,
        prev_crc: u32,
        records: &[Record<'_>],
        write_size: u32,
        erased: u8,
    ) -> Vec<u8> {
        let mut canonical = Vec::new();
        for r in records {
            let at = canonical.len();
            canonical.resize(at + r.encoded_len(), 0);
            r.encode_into(&mut canonical[at..]);
        }
        let n = records.len() as u32;
        let plan = super::super::compact::plan(&canonical, base_offset, n, usize::MAX);
        assert_eq!(plan.count, n);
        let mut b = std::vec![0u8; BATCH_HEADER_LEN];
        super::super::compact::encode::<()>(&canonical, base_offset, &plan, &mut |x| {
            b.extend_from_slice(x);
            Ok(())
        })
        .unwrap();
        let mut h = BatchHeader {
            len: b.len() as u32,
            crc: 0,
            base_offset,
            count: n,
            prev_crc,
        };
        b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
        h.crc = crc32(&b[16..]);
        b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
        let padded = align_up(b.len() as u32, write_size) as usize;
        b.resize(padded, erased);
        b
    }

    #[test]
    fn format_md_compact_example_matches_the_encoder() {
        let second = Record {
            timestamp_us: EXAMPLE.timestamp_us + 1_000_000,
            payload: b"18.5",
            ..EXAMPLE
        };
        let want =
            encode_compact_batch(EXAMPLE_BASE, EXAMPLE_PREV_CRC, &[EXAMPLE, second], 4, 0xFF);
        let doc = dump_in_format_md("format_md_compact_example_matches_the_encoder");
        assert_eq!(
            doc, want,
            "FORMAT.md's compact example differs from the encoder"
        );
        assert_eq!(want.len(), 60);
        let h = BatchHeader::decode(want[..BATCH_HEADER_LEN].try_into().unwrap());
        assert_eq!((h.len, h.crc), (58, 0x4716_80E0));
        assert_eq!(
            BatchHeader::check(want[..BATCH_HEADER_LEN].try_into().unwrap(), 0xFF, 4096),
            HeadCheck::Plausible
        );
        // Expanded, the records are their canonical encodings, with the CRCs quoted.
        let mut out = [0u8; 64];
        let n = super::super::compact::expand(&want[BATCH_HEADER_LEN..58], 2, &mut out).unwrap();
        let recs: Vec<_> = RecordIter::new(&out[..n], EXAMPLE_BASE, 2).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].crc, 0x4F6A_CD66);
        assert_eq!(recs[1].crc, 0xA610_8A7B);
        assert_eq!(
            (recs[1].timestamp_us, recs[1].payload),
            (second.timestamp_us, second.payload)
        );
    }

    /// The compressed batch of `FORMAT.md` section 10, as the log writes it: eight readings
    /// of `"18.4"` on `sst`, one second apart, flushed as the first batch of a fresh log with
    /// LZ4 compression.
    #[cfg(feature = "compression")]
    fn compressed_example_from_the_log() -> Vec<u8> {
        use crate::log::{Compression, Config, Log, Memory, SegmentSlot};
        use crate::storage::{Flash, SimFlash};

        let geo = Geometry {
            erase_size: 4096,
            write_size: 4,
            capacity: 4096 * 6,
            erased: 0xFF,
        };
        let mut flash = SimFlash::new_vec(geo).unwrap();
        Log::format(&mut flash, 7, 1).unwrap();
        let mut buf = [0u8; 512];
        let mut slots = [SegmentSlot::EMPTY; 4];
        let mut scratch = [0u8; crate::log::scratch_len(512)];
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let cfg = Config {
            compression: Compression::Lz4,
            ..Config::default()
        };
        let (mut log, _) = Log::mount_with_scratch(&mut flash, cfg, mem, &mut scratch, 0).unwrap();
        for i in 0..8 {
            let r = Record {
                timestamp_us: EXAMPLE.timestamp_us + i * 1_000_000,
                ..EXAMPLE
            };
            log.append(0, &r).unwrap();
        }
        log.flush(0).unwrap();
        assert_eq!(log.stats().batches_compressed, 1);
        drop(log);
        let mut hb = [0u8; BATCH_HEADER_LEN];
        flash.read(2 * 4096 + 80, &mut hb).unwrap();
        let len = BatchHeader::decode(&hb).len as usize;
        let mut got = std::vec![0u8; align_up(len as u32, 4) as usize];
        flash.read(2 * 4096 + 80, &mut got).unwrap();
        got
    }

    #[test]
    #[cfg(feature = "compression")]
    fn format_md_compressed_example_matches_the_log() {
        let got = compressed_example_from_the_log();
        let doc = dump_in_format_md("format_md_compressed_example_matches_the_log");
        assert_eq!(
            doc, got,
            "FORMAT.md's compressed example differs from the log's batch"
        );
        // The values quoted in the text around the dump.
        let h = BatchHeader::decode(got[..BATCH_HEADER_LEN].try_into().unwrap());
        assert_eq!((h.len, h.crc, h.count), (68, 0xC9E2_1E5E, 8));
        assert_eq!(got[32..34], [0x04, 68]);
        // The block decodes to the compact body of the eight records.
        let mut body = [0u8; 68];
        let mut src = super::super::compact::SliceSource { rest: &got[34..] };
        assert!(super::super::lz4::decompress(&mut src, 34, &mut body).unwrap());
        let mut out = [0u8; 256];
        let n = super::super::compact::expand(&body, 8, &mut out).unwrap();
        let recs: Vec<_> = RecordIter::new(&out[..n], 0, 8).collect();
        assert_eq!(recs.len(), 8);
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.timestamp_us, EXAMPLE.timestamp_us + i as u64 * 1_000_000);
            assert_eq!((r.topic, r.payload), ("sst", &b"18.4"[..]));
        }
    }

    /// Guards against the documented encoding drifting from what the log actually writes:
    /// the first batch of a fresh log is read back raw from the flash.
    #[test]
    fn the_log_writes_batches_as_encoded_here() {
        use crate::log::{Config, Log, Memory, SegmentSlot};
        use crate::storage::{Flash, SimFlash};

        let geo = Geometry {
            erase_size: 4096,
            write_size: 4,
            capacity: 4096 * 6,
            erased: 0xFF,
        };
        let mut flash = SimFlash::new_vec(geo).unwrap();
        Log::format(&mut flash, 7, 1).unwrap();
        let mut buf = [0u8; 512];
        let mut slots = [SegmentSlot::EMPTY; 4];
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
        log.append(0, &EXAMPLE).unwrap();
        log.flush(0).unwrap();
        drop(log);
        // A freshly formatted log writes version 4 segments: compact bodies.
        let want = encode_compact_batch(0, 0, &[EXAMPLE], 4, 0xFF);
        let mut got = std::vec![0u8; want.len() + 4];
        // Segment 0 starts at block 2; its data at the 80-byte header aligned to W = 4.
        flash.read(2 * 4096 + 80, &mut got).unwrap();
        assert_eq!(got[..want.len()], want[..]);
        assert_eq!(got[want.len()..], [0xFF; 4], "erased after the batch");
    }

    #[test]
    fn crc32_is_the_ieee_crc() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(&[0u8; 76]), 0xE038_A199);
        assert_eq!(crc32(&[0xFFu8; 76]), 0x9A06_CE8C);
    }

    #[test]
    fn erased_and_zeroed_regions_never_validate() {
        for fill in [0x00u8, 0xFF, 0x5A] {
            assert_eq!(SegmentHeader::decode(&[fill; SEGMENT_HEADER_LEN]), None);
            let other = !fill;
            assert_eq!(
                BatchHeader::check(&[fill; BATCH_HEADER_LEN], other, u32::MAX),
                HeadCheck::Invalid,
                "fill {fill:#x}"
            );
            assert_eq!(
                BatchHeader::check(&[fill; BATCH_HEADER_LEN], fill, u32::MAX),
                HeadCheck::Erased
            );
            assert_eq!(super::super::journal::entry_len(&[fill; 16], 4096), None);
            assert!(super::super::journal::decode(&[fill; 1024]).is_none());
            assert_eq!(ResumeMarker::decode(&[fill; RESUME_LEN]), None);
        }
        // A valid header stops validating once its CRC bytes read erased or zeroed.
        let mut b = SegmentHeader {
            version: FORMAT_VERSION,
            erase_size: 4096,
            write_size: 4,
            erased: 0xFF,
            blocks_per_segment: 1,
            segment_count: 4,
            log_id: 1,
            seq: 1,
            base_offset: 0,
            prev_crc: 0,
            erase_count: 1,
            after_unclean: false,
        }
        .encode();
        assert!(SegmentHeader::decode(&b).is_some());
        for fill in [0x00u8, 0xFF] {
            b[76..80].fill(fill);
            assert!(SegmentHeader::decode(&b).is_none());
        }
    }

    fn header(blocks_per_segment: u32, segment_count: u32, erase_size: u32) -> SegmentHeader {
        SegmentHeader {
            version: FORMAT_VERSION,
            erase_size,
            write_size: 4,
            erased: 0xFF,
            blocks_per_segment,
            segment_count,
            log_id: 3,
            seq: 1,
            base_offset: 0,
            prev_crc: 0,
            erase_count: 1,
            after_unclean: false,
        }
    }

    /// Segment headers whose numbers cannot describe a partition decode as `None`.
    #[test]
    fn segment_headers_with_impossible_geometry_are_refused() {
        assert!(SegmentHeader::decode(&header(1, 4, 4096).encode()).is_some());
        for h in [
            header(1 << 20, 4, 4096),
            header(u32::MAX, 4, 4096),
            header(1, u32::MAX, 4096),
            header(0, 4, 4096),
            header(1, 0, 4096),
            header(1, 4, 0),
            SegmentHeader {
                base_offset: u64::MAX,
                ..header(1, 4, 4096)
            },
            SegmentHeader {
                write_size: 0,
                ..header(1, 4, 4096)
            },
            SegmentHeader {
                seq: u64::MAX,
                ..header(1, 4, 4096)
            },
        ] {
            assert_eq!(SegmentHeader::decode(&h.encode()), None, "{h:?}");
        }
    }

    /// An image whose only segment header claims `2^20` erase blocks of 4 KiB per segment
    /// (no journal) mounts as not formatted; before, the mount multiplied the two unchecked
    /// (a panic with overflow checks, a wrapped segment size in release).
    #[test]
    fn a_crafted_segment_size_past_4_gib_does_not_mount() {
        use crate::log::{Config, Log, Memory, MountError, SegmentSlot};
        use crate::storage::{Flash, SimFlash};

        let geo = Geometry {
            erase_size: 4096,
            write_size: 4,
            capacity: 4096 * 6,
            erased: 0xFF,
        };
        let mut flash = SimFlash::new_vec(geo).unwrap();
        Log::format(&mut flash, 3, 1).unwrap();
        for block in 0..3 {
            flash.erase(block).unwrap();
        }
        flash
            .write(2 * 4096, &header(1 << 20, 4, 4096).encode())
            .unwrap();
        let mut buf = [0u8; 512];
        let mut slots = [SegmentSlot::EMPTY; 4];
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let got = Log::mount(&mut flash, Config::default(), mem, 0).map(|_| ());
        assert!(matches!(got, Err(MountError::NotFormatted)), "{got:?}");
    }

    /// A batch header whose last offset reaches [`MAX_OFFSET`] is not plausible.
    #[test]
    fn a_batch_header_past_the_offset_range_is_invalid() {
        let h = |base_offset, count| BatchHeader {
            len: 64,
            crc: 0,
            base_offset,
            count,
            prev_crc: 0,
        };
        assert_eq!(
            BatchHeader::check(&h(5, 2).encode(), 0xFF, 4096),
            HeadCheck::Plausible
        );
        for (base, count) in [(u64::MAX, 2), (MAX_OFFSET - 1, 2), (u64::MAX - 1, 1)] {
            assert_eq!(
                BatchHeader::check(&h(base, count).encode(), 0xFF, 4096),
                HeadCheck::Invalid,
                "base {base:#x}"
            );
        }
    }

    /// A resume marker round-trips, and any single bit it loses makes it invalid.
    #[test]
    fn a_resume_marker_round_trips_and_a_damaged_one_is_refused() {
        let m = ResumeMarker {
            expected: 0x0102_0304_0506_0708,
            torn_from: 4096 + 96,
            torn_bytes: 57,
        };
        let b = m.encode();
        assert_eq!(ResumeMarker::decode(&b), Some(m));
        for bit in 0..RESUME_LEN * 8 {
            let mut d = b;
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(ResumeMarker::decode(&d), None, "bit {bit}");
        }
    }

    /// A length pair cut short by a power loss (some of its 0 bits still 1) never passes the
    /// `len` / `!len` check unless both words are complete.
    #[test]
    fn a_torn_length_pair_never_matches() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u32
        };
        for _ in 0..200_000 {
            let len = next() >> (next() % 32);
            let (lost_len, lost_check) = (next() & !len, next() & len);
            if lost_len == 0 && lost_check == 0 {
                continue;
            }
            let (torn_len, torn_check) = (len | lost_len, !len | lost_check);
            assert_ne!(torn_check, !torn_len, "len {len:#x}");
        }
    }

    /// Encodes records of growing payloads back to back, as in a batch body.
    fn body(count: usize) -> std::vec::Vec<u8> {
        let mut out = std::vec::Vec::new();
        for i in 0..count {
            let payload = std::vec![i as u8; 3 + i];
            let rec = Record {
                topic: "topic",
                timestamp_us: 1000 + i as u64,
                producer: (i % 2 == 1).then_some(Producer {
                    id: 7,
                    seq: i as u32,
                }),
                payload: &payload,
            };
            let at = out.len();
            out.resize(at + rec.encoded_len(), 0);
            rec.encode_into(&mut out[at..]);
        }
        out
    }

    #[test]
    fn walk_records_gives_the_crc_before_the_skipped_prefix_end() {
        let (base, count, prev) = (40u64, 5u32, 0xDEAD_BEEF);
        let b = body(count as usize);
        // Every record's length and CRC, through the public parser.
        let mut recs = std::vec::Vec::new();
        let mut at = 0;
        for i in 0..u64::from(count) {
            let (r, n) = parse_record(&b[at..], base + i).unwrap();
            assert_eq!(r.crc, record_crc(base + i, &b[at..at + n]));
            recs.push((at, r.crc));
            at += n;
        }
        for skip in 0..=u64::from(count) + 1 {
            let (len, crc) = walk_records(&b, base, count, skip, prev).unwrap();
            let k = skip.min(u64::from(count)) as usize;
            let want_len = recs.get(k).map_or(b.len(), |r| r.0);
            let want_crc = if k == 0 { prev } else { recs[k - 1].1 };
            assert_eq!((len, crc), (want_len, want_crc), "skip {skip}");
        }
        // A body longer or shorter than `count` records is refused.
        assert_eq!(walk_records(&b, base, count - 1, 0, prev), None);
        assert_eq!(walk_records(&b[..b.len() - 1], base, count, 0, prev), None);
    }

    #[test]
    fn parse_record_fields_leaves_the_crc_out_only() {
        let b = body(2);
        let (full, n) = parse_record(&b, 9).unwrap();
        let (fields, m) = parse_record_fields(&b, 9).unwrap();
        assert_eq!(n, m);
        assert_eq!(
            RecordRef {
                crc: full.crc,
                ..fields
            },
            full
        );
        assert_eq!(fields.crc, 0);
        assert!(parse_record_fields(&b[..n - 1], 9).is_none());
    }
}

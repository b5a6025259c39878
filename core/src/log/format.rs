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
/// ([`compact`](super::compact)); version 5 adds the short batch for a record flushed
/// alone ([`short`](super::short)) and writes journal entries of producer layout 3.
/// Segments of versions 1 to 4 and journal entries of layouts 0 to 2 are still mounted and
/// read; a log upgrades by writing version 5 from its next segment on.
pub const FORMAT_VERSION: u16 = 5;

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
/// names one (a segment's base offset, a batch's end, a journal lease or durable end, a
/// committed offset) is refused as damaged: the log can then add 1 to any offset it holds
/// without wrapping. 2^62 records outlast the flash (146 years at 10^9 records/s).
pub const MAX_OFFSET: u64 = 1 << 62;

/// The highest next offset a log reaches, `MAX_OFFSET - 1`: every end it stores (a batch's
/// end, a lease, a durable end, a committed offset) stays below [`MAX_OFFSET`], so the last
/// offset it hands out is `MAX_OFFSET - 2`. A log whose next offset is here (only a crafted
/// or damaged image gets near) refuses appends with
/// [`AppendError::OffsetsExhausted`](crate::error::AppendError::OffsetsExhausted) and never
/// reuses an offset.
pub const MAX_NEXT_OFFSET: u64 = MAX_OFFSET - 1;

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

/// Calls `f` with a record's fields before its payload, in order: topic length (1 byte),
/// topic, timestamp (µs, u64 LE), flags (bit 0: a producer follows), producer id (u64 LE)
/// and sequence (u32 LE) if any, payload length (u32 LE); see `core/FORMAT.md` section
/// 4.1. Returns their total length. This is the record's layout in a batch and its
/// canonical encoding (the bytes its CRC covers, with the payload after them); in pieces,
/// so that a reader that only hashes them needs no buffer ([`encode_record_head`] writes
/// them into one).
#[inline]
pub(crate) fn record_head_pieces(
    topic: &[u8],
    timestamp_us: u64,
    producer: Option<Producer>,
    payload_len: u32,
    f: &mut impl FnMut(&[u8]),
) -> usize {
    f(&[topic.len() as u8]);
    f(topic);
    f(&timestamp_us.to_le_bytes());
    let producer_len = match producer {
        Some(p) => {
            f(&[FLAG_PRODUCER]);
            f(&p.id.to_le_bytes());
            f(&p.seq.to_le_bytes());
            1 + PRODUCER_LEN
        }
        None => {
            f(&[0]);
            1
        }
    };
    f(&payload_len.to_le_bytes());
    1 + topic.len() + 8 + producer_len + 4
}

/// Writes a record's fields before its payload ([`record_head_pieces`]) into `out`, which
/// must have room for them; returns the bytes written.
pub(crate) fn encode_record_head(
    topic: &[u8],
    timestamp_us: u64,
    producer: Option<Producer>,
    payload_len: u32,
    out: &mut [u8],
) -> usize {
    let mut at = 0;
    record_head_pieces(topic, timestamp_us, producer, payload_len, &mut |piece| {
        out[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    })
}

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
    record_crc_from(crate::crc::Hasher::new(), offset, encoded)
}

/// [`record_crc`] continued from `h`, a hasher over nothing yet (a copy of one made
/// earlier: making one detects the CPU's CRC instructions).
#[inline]
fn record_crc_from(mut h: crate::crc::Hasher, offset: u64, encoded: &[u8]) -> u32 {
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
    /// position to the end of its segment; the batch's end, one past its last offset, at
    /// most [`MAX_NEXT_OFFSET`];
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
                .is_none_or(|end| end > MAX_NEXT_OFFSET)
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
    /// Producer id, chosen by the publisher (random per boot of the publisher), below
    /// 2^63 for a client's records: ids with the top bit set are the gateway's own
    /// ([`crate::wire::GATEWAY_PRODUCER_BIT`]).
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
        let len = self.payload.len() as u32;
        let at = encode_record_head(
            self.topic.as_bytes(),
            self.timestamp_us,
            self.producer,
            len,
            out,
        );
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
    parse_fields_known(b, offset, "")
}

/// [`parse_record_fields`], except that a topic equal to `known` (a topic already checked,
/// such as the previous record's) is not checked for UTF-8 again.
#[inline]
fn parse_fields_known<'b>(
    b: &'b [u8],
    offset: u64,
    known: &'b str,
) -> Option<(RecordRef<'b>, usize)> {
    let tlen = *b.first()? as usize;
    if tlen == 0 {
        return None;
    }
    let mut at = 1;
    let t = b.get(at..at + tlen)?;
    let topic = if t == known.as_bytes() {
        known
    } else {
        core::str::from_utf8(t).ok()?
    };
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
    /// The previous record's topic (records of a read mostly share one).
    topic: &'a str,
    /// A hasher over nothing yet, copied for each record's CRC.
    fresh: crate::crc::Hasher,
}

impl<'a> RecordIter<'a> {
    /// Iterates `count` records of `bytes`, the first one at `first_offset`.
    pub fn new(bytes: &'a [u8], first_offset: u64, count: u32) -> Self {
        RecordIter {
            rest: bytes,
            next_offset: first_offset,
            left: count,
            topic: "",
            fresh: crate::crc::Hasher::new(),
        }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = RecordRef<'a>;
    #[inline]
    fn next(&mut self) -> Option<RecordRef<'a>> {
        if self.left == 0 {
            return None;
        }
        let (mut r, n) = parse_fields_known(self.rest, self.next_offset, self.topic)?;
        r.crc = record_crc_from(Clone::clone(&self.fresh), r.offset, r.encoded);
        self.topic = r.topic;
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
mod tests;

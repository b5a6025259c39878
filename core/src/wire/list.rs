//! Encoded lists: records and consumers carried as one block, written incrementally and
//! decoded lazily, without allocation.
//!
//! On the wire a list is `count` (varint u32) followed by the block as a postcard byte
//! string (varint length in bytes, then the bytes); the block is the `count` items, each
//! postcard-encoded, one after another. The byte length lets a decoder take the block as one
//! borrowed slice without parsing the items; [`EncodedList::iter`] parses them on demand.

use core::fmt;
use core::marker::PhantomData;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

use super::frame::{FrameError, max_encoded_len, seal};
use super::{ConsumerEntry, LostRange, RecordView};

/// A list of `T` encoded as one block, borrowed from a frame buffer (decoding) or from the
/// buffer of a [`ListWriter`] (encoding).
pub struct EncodedList<'a, T> {
    count: u32,
    bytes: &'a [u8],
    _item: PhantomData<fn() -> T>,
}

/// The records of [`Response::Records`](super::Response::Records).
pub type RecordList<'a> = EncodedList<'a, RecordView<'a>>;
/// The consumers of [`Response::Consumers`](super::Response::Consumers).
pub type ConsumerList<'a> = EncodedList<'a, ConsumerEntry<'a>>;
/// Iterator over a [`RecordList`].
pub type RecordIter<'a> = ListIter<'a, RecordView<'a>>;

impl<'a, T> EncodedList<'a, T> {
    /// An empty list.
    pub const fn empty() -> Self {
        Self {
            count: 0,
            bytes: &[],
            _item: PhantomData,
        }
    }

    /// A list from its wire parts: `count` items encoded one after another in `bytes`.
    /// Nothing is checked here; [`iter`](Self::iter) reports bad bytes.
    pub const fn from_raw(count: u32, bytes: &'a [u8]) -> Self {
        Self {
            count,
            bytes,
            _item: PhantomData,
        }
    }

    /// Number of items, as announced on the wire.
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// True if the list announces no items.
    pub const fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded items, in bytes.
    pub const fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Iterates over the items, decoding each on demand (zero-copy). Yields `count` items;
    /// an item that does not decode, or a block that ends early, yields one `Err` and ends
    /// the iteration.
    pub fn iter(&self) -> ListIter<'a, T> {
        ListIter {
            rest: self.bytes,
            left: self.count,
            _item: PhantomData,
        }
    }
}

/// An item of an [`EncodedList`]: how one is taken from the front of the block.
pub trait ListItem<'a>: Sized {
    /// Decodes one item from the start of `bytes`; returns it and the bytes after it.
    ///
    /// # Errors
    /// Postcard's error for bytes that are not an item.
    fn take(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), postcard::Error>;
}

impl<'a> ListItem<'a> for RecordView<'a> {
    /// [`RecordView::take_from`]: postcard's bytes and errors, without serde. Inlined into
    /// the caller's list iterator: a reply's thousands of records each paid a call into
    /// this crate.
    #[inline]
    fn take(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), postcard::Error> {
        RecordView::take_from(bytes)
    }
}

impl<'a> ListItem<'a> for ConsumerEntry<'a> {
    fn take(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), postcard::Error> {
        postcard::take_from_bytes(bytes)
    }
}

impl<'a, T: ListItem<'a>> EncodedList<'a, T> {
    /// Decodes every item once and checks that the block holds exactly `count` items.
    pub fn validate(&self) -> Result<(), postcard::Error> {
        let mut it = self.iter();
        for item in &mut it {
            item?;
        }
        if it.rest.is_empty() {
            Ok(())
        } else {
            Err(postcard::Error::DeserializeBadEncoding)
        }
    }
}

impl<T> Clone for EncodedList<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for EncodedList<'_, T> {}

impl<T> PartialEq for EncodedList<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.bytes == other.bytes
    }
}
impl<T> Eq for EncodedList<'_, T> {}

impl<T> fmt::Debug for EncodedList<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedList")
            .field("count", &self.count)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl<'a, T: ListItem<'a>> IntoIterator for &EncodedList<'a, T> {
    type Item = Result<T, postcard::Error>;
    type IntoIter = ListIter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Lazily decoding iterator over an [`EncodedList`].
pub struct ListIter<'a, T> {
    rest: &'a [u8],
    left: u32,
    _item: PhantomData<fn() -> T>,
}

impl<'a, T> ListIter<'a, T> {
    /// Encoded bytes not yet decoded.
    pub fn remaining_bytes(&self) -> &'a [u8] {
        self.rest
    }
}

impl<'a, T: ListItem<'a>> Iterator for ListIter<'a, T> {
    type Item = Result<T, postcard::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        match T::take(self.rest) {
            Ok((item, rest)) => {
                self.rest = rest;
                self.left -= 1;
                Some(Ok(item))
            }
            Err(e) => {
                self.left = 0;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, usize::try_from(self.left).ok())
    }
}

impl<T> Serialize for EncodedList<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Bytes<'b>(&'b [u8]);
        impl Serialize for Bytes<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(self.0)
            }
        }
        let mut t = serializer.serialize_tuple(2)?;
        t.serialize_element(&self.count)?;
        t.serialize_element(&Bytes(self.bytes))?;
        t.end()
    }
}

impl<'de: 'a, 'a, T> Deserialize<'de> for EncodedList<'a, T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<'a, T>(PhantomData<&'a ()>, PhantomData<fn() -> T>);
        impl<'de: 'a, 'a, T> Visitor<'de> for ListVisitor<'a, T> {
            type Value = EncodedList<'a, T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an item count and a borrowed byte block")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let count: u32 = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let bytes: &'de [u8] = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                Ok(EncodedList::from_raw(count, bytes))
            }
        }
        deserializer.deserialize_tuple(2, ListVisitor(PhantomData, PhantomData))
    }
}

/// The item did not fit; nothing was added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("list full: item of {needed} bytes, {available} bytes left")]
pub struct Full {
    /// Encoded size of the rejected item in bytes (a lower bound if it did not even fit the
    /// buffer).
    pub needed: usize,
    /// Bytes still available under the limit that refused it.
    pub available: usize,
}

/// Builds an [`EncodedList`] in a caller-provided buffer, one item at a time.
///
/// Used by the gateway for [`ConsumerList`]s (small: build in a scratch buffer, then pass
/// the list to [`encode_frame`](super::encode_frame)); records go straight into the frame
/// buffer with [`RecordsWriter`] instead.
pub struct ListWriter<'b, T> {
    buf: &'b mut [u8],
    len: usize,
    count: u32,
    _item: PhantomData<fn(T)>,
}

impl<'b, T: Serialize> ListWriter<'b, T> {
    /// A writer filling `buf` (the list's bytes are limited to `buf.len()`).
    pub fn new(buf: &'b mut [u8]) -> Self {
        Self {
            buf,
            len: 0,
            count: 0,
            _item: PhantomData,
        }
    }

    /// Appends one item, or returns [`Full`] and leaves the list unchanged.
    pub fn push(&mut self, item: &T) -> Result<(), Full> {
        let available = self.buf.len() - self.len;
        let full = Full {
            needed: available + 1,
            available,
        };
        if self.count == u32::MAX {
            return Err(full);
        }
        let n = postcard::to_slice(item, &mut self.buf[self.len..])
            .map_err(|_| full)?
            .len();
        self.len += n;
        self.count += 1;
        Ok(())
    }

    /// Items written so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The finished list, borrowing the buffer.
    pub fn finish(self) -> EncodedList<'b, T> {
        let bytes: &'b [u8] = self.buf;
        EncodedList::from_raw(self.count, &bytes[..self.len])
    }
}

/// Upper bound in bytes of everything in a `Records` response before its first record:
/// variant index (1), `seq` (≤ 5), `prev_crc` (≤ 5), `next_offset` (≤ 10), `lost`
/// (≤ 1 + 10 + 10 + 5), `count` (≤ 5), block length (≤ 10). [`RecordsWriter`] keeps this
/// much room at the front of its buffer.
pub const RECORDS_HEADER_MAX: usize = 64;

/// Variant index of `Response::Records` on the wire.
const RECORDS_VARIANT: u32 = 3;

/// Encodes a [`Response::Records`](super::Response::Records) frame for the gateway,
/// record by record, straight into the frame buffer (no second buffer, no allocation).
///
/// ```
/// # use spillway_core::wire::{RecordsWriter, RecordView, decode_message, Response};
/// let mut frame = [0u8; 512]; // the connection's frame buffer: max_frame_bytes long
/// let mut w = RecordsWriter::new(&mut frame, 7, 0x1234_5678, 1024);
/// for offset in 10..100 {
///     let rec = RecordView { offset, record_crc: 0, topic: "t", timestamp_us: 0,
///                            producer: None, payload: b"21.5" };
///     if w.push(&rec).is_err() {
///         break; // budget or frame full: this record goes in the next fetch
///     }
/// }
/// let next = 10 + u64::from(w.count());
/// let n = w.finish(next, None).unwrap();
/// // send frame[..n]
/// # let r: Response = decode_message(&mut frame[..n]).unwrap();
/// # assert!(matches!(r, Response::Records { seq: 7, .. }));
/// ```
///
/// Limits: a record is refused ([`Full`]) if the records block would pass the fetch's
/// `max_bytes` — except the first record, which is always taken if the frame can hold it —
/// or if the finished frame (header, records, CRC, COBS overhead, delimiter) would no longer
/// fit `buf`. If even the first record is refused, the frame cannot hold it: the gateway's
/// `max_frame_bytes` must be at least
/// [`max_encoded_len`]`(RECORDS_HEADER_MAX + largest encoded record)`.
pub struct RecordsWriter<'b> {
    buf: &'b mut [u8],
    seq: u32,
    prev_crc: u32,
    max_bytes: usize,
    len: usize,
    count: u32,
}

impl<'b> RecordsWriter<'b> {
    /// Starts a `Records` reply to request `seq` in `buf` (the frame buffer; its length is
    /// the frame limit in bytes). `prev_crc` is the CRC of the record before the first one
    /// that will be pushed; `max_bytes` is the fetch's byte budget for the records block.
    pub fn new(buf: &'b mut [u8], seq: u32, prev_crc: u32, max_bytes: u32) -> Self {
        Self {
            buf,
            seq,
            prev_crc,
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            len: 0,
            count: 0,
        }
    }

    /// Records pushed so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Size of the records block so far, in bytes.
    pub fn block_len(&self) -> usize {
        self.len
    }

    /// Appends one record, or returns [`Full`] and leaves the reply unchanged.
    #[inline]
    pub fn push(&mut self, record: &RecordView<'_>) -> Result<(), Full> {
        let start = RECORDS_HEADER_MAX.saturating_add(self.len);
        let end = if self.count == 0 {
            self.buf.len()
        } else {
            let budget = self.max_bytes.saturating_sub(self.len);
            start.saturating_add(budget).min(self.buf.len())
        };
        // Bytes the frame can still take after the header, the block so far, the CRC, the
        // COBS overhead and the delimiter (informational).
        let frame_room = self.buf.len().saturating_sub(max_encoded_len(start));
        let available = end.saturating_sub(start).min(frame_room);
        if self.count == u32::MAX {
            return Err(Full {
                needed: 0,
                available: 0,
            });
        }
        let target = self.buf.get_mut(start..end).ok_or(Full {
            needed: 1,
            available,
        })?;
        let n = record.encode_into(target).ok_or(Full {
            needed: record.encoded_len(),
            available,
        })?;
        if max_encoded_len(start + n) > self.buf.len() {
            return Err(Full {
                needed: n,
                available,
            });
        }
        self.len += n;
        self.count += 1;
        Ok(())
    }

    /// Writes the header (`next_offset`, `lost`, the record count) and seals the frame:
    /// returns its length in bytes, delimiter included, at the start of the buffer.
    pub fn finish(self, next_offset: u64, lost: Option<LostRange>) -> Result<usize, FrameError> {
        let mut header = [0u8; RECORDS_HEADER_MAX];
        let h = postcard::to_slice(
            &(
                RECORDS_VARIANT,
                self.seq,
                self.prev_crc,
                next_offset,
                lost,
                self.count,
                self.len,
            ),
            &mut header,
        )?
        .len();
        let start = RECORDS_HEADER_MAX - h;
        let max = self.buf.len();
        self.buf
            .get_mut(start..RECORDS_HEADER_MAX)
            .ok_or(FrameError::Oversize {
                len: RECORDS_HEADER_MAX,
                max,
            })?
            .copy_from_slice(&header[..h]);
        seal(self.buf, start, h + self.len)
    }
}

/// The start of a `Records` reply, as [`peek_records_header`] reads it before the rest of
/// its frame has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordsHeader {
    /// The request's `seq`.
    pub seq: u32,
    /// CRC of the record before the first one returned.
    pub prev_crc: u32,
    /// Offset to fetch from next.
    pub next_offset: u64,
    /// The lost range reported before the records, if any.
    pub lost: Option<LostRange>,
    /// Records in the reply.
    pub count: u32,
}

/// Bytes of a frame's start (COBS-encoded, as received) that [`peek_records_header`]
/// reads: enough to decode [`RECORDS_HEADER_MAX`] bytes of message whatever they are
/// (COBS adds one code byte in front, and a decoder holds back at most one byte).
pub const RECORDS_PEEK_BYTES: usize = RECORDS_HEADER_MAX + 2;

/// The header of the `Records` reply whose frame begins with `frame_start` (the bytes
/// received so far, COBS-encoded, no delimiter), or `None` when fewer than
/// [`RECORDS_PEEK_BYTES`] have arrived, the frame is not a `Records` reply, or its start
/// does not decode. The header is unchecked: the frame's CRC covers it only once the
/// frame is whole. A receiver may act on it early only where the check of the whole frame
/// can undo what it did; the bridge sends the fetch that follows this reply, whose own
/// reply it drops if this frame then fails its check or says otherwise.
pub fn peek_records_header(frame_start: &[u8]) -> Option<RecordsHeader> {
    let start = frame_start.get(..RECORDS_PEEK_BYTES)?;
    let mut decoded = [0u8; RECORDS_PEEK_BYTES];
    let mut cobs = cobs::CobsDecoder::new(&mut decoded);
    // No delimiter in `start`: the decoder takes it all without finishing a frame.
    if !matches!(cobs.push(start), Ok(None)) {
        return None;
    }
    let (variant, seq, prev_crc, next_offset, lost, count): (u32, u32, u32, u64, _, u32) =
        postcard::take_from_bytes(decoded.get(..RECORDS_HEADER_MAX)?)
            .ok()?
            .0;
    (variant == RECORDS_VARIANT).then_some(RecordsHeader {
        seq,
        prev_crc,
        next_offset,
        lost,
        count,
    })
}

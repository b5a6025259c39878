//! The Spillway wire protocol: messages, framing and the line mode.
//!
//! One protocol runs on every transport (serial line, TCP, Unix socket). The byte-level
//! contract, with tables a client in any language can be written from, is `PROTOCOL.md` next
//! to this crate's `Cargo.toml`; this module is its Rust implementation.
//!
//! # Layers
//!
//! - **Message**: a [`Request`] (client → gateway) or a [`Response`] (gateway → client),
//!   encoded with the postcard wire format (varint integers, length-prefixed strings and byte
//!   strings, enums as a varint variant index). Messages borrow their strings and payloads
//!   from the frame buffer they were decoded from: decoding never allocates or copies.
//! - **Frame**: `COBS(message ‖ CRC-32(message) as 4 bytes little endian) ‖ 0x00`. COBS
//!   (Consistent Overhead Byte Stuffing, Cheshire & Baker, 1999) removes every 0x00 from the
//!   body so 0x00 marks the end of a frame and a receiver resynchronises at the next 0x00
//!   after noise. The CRC is CRC-32/IEEE 802.3 (the zlib / Ethernet CRC). See
//!   [`encode_frame`], [`decode_frame`], and [`FrameDecoder`], the one stream splitter.
//! - **Line mode**: one record per text line, see [`parse_line`].
//!
//! # Conversation
//!
//! The client opens with [`Request::Hello`]; the gateway answers [`Response::Welcome`] or
//! [`Response::Error`] with [`ErrorCode::UnsupportedVersion`]. Every other request carries a
//! client sequence number `seq` (any `u32` the client chooses; the gateway only echoes it)
//! and gets exactly one response echoing it — except a [`Request::Publish`] with
//! [`AckLevel::None`], which gets none. Errors that cannot be tied to a request (a frame that
//! does not decode, a request before the handshake) carry `seq` 0.
//!
//! # Evolution rules
//!
//! Enum variants (requests, responses, error codes, lost reasons, ack levels) are only ever
//! appended, never reordered or removed, because postcard encodes the variant index. Fields
//! are only appended at the end of a message (postcard ignores trailing bytes, so an older
//! decoder still reads the fields it knows). A gateway only sends a variant or field that
//! exists in the protocol version the client announced in its `Hello`.

mod frame;
mod line;
mod list;
mod record;
#[cfg(test)]
mod tests;

#[cfg(feature = "std")]
pub use frame::GrowingFrameBuffer;
pub use frame::{
    CRC_LEN, CobsFault, FeedResult, FrameAccumulator, FrameBuffer, FrameDecoder, FrameError,
    decode_frame, decode_message, encode_frame, max_encoded_len,
};
pub use line::{LineError, parse_line};
pub use list::{
    ConsumerList, EncodedList, Full, ListItem, ListIter, ListWriter, RECORDS_HEADER_MAX,
    RECORDS_PEEK_BYTES, RecordIter, RecordList, RecordsHeader, RecordsWriter, peek_records_header,
};

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks, sent in [`Request::Hello`] and
/// [`Response::Welcome`]. Version 2 added [`ErrorCode::StorageFailed`]. Version 3 added
/// producer sessions ([`Request::OpenSession`], [`Request::SessionPublish`],
/// [`Response::Session`], error codes 13 to 15), the credential of the `Hello`
/// ([`HelloV3`], error code 16) and the producer window of the `Welcome` ([`WelcomeV3`]).
/// Version 4 added the search of an offset by record time ([`Request::FindOffset`],
/// [`Response::FoundOffset`]). Version 5 added the delete that keeps the last consumer
/// ([`Request::DeleteConsumerIfNotLast`], [`ErrorCode::LastConsumer`]).
pub const PROTOCOL_VERSION: u16 = 5;

/// The producer ids with this bit set (2^63 and up) are the gateway's own: the Linux
/// gateway gives them to the records of its MQTT sessions and reads them back as such at a
/// start. A client's `Publish`, `SessionPublish` or `OpenSession` naming one is refused with
/// `BadRequest` (`PROTOCOL.md` §6).
pub const GATEWAY_PRODUCER_BIT: u64 = 1 << 63;

/// The first protocol version that has producer sessions ([`Request::OpenSession`],
/// [`Request::SessionPublish`], [`Response::Session`]): a client that announced an earlier
/// one gets `BadRequest` for them, never a variant its version does not have.
pub const SESSION_VERSION: u16 = 3;

/// The first protocol version that has [`Request::FindOffset`] and
/// [`Response::FoundOffset`].
pub const FIND_OFFSET_VERSION: u16 = 4;

/// The first protocol version that has [`Request::DeleteConsumerIfNotLast`] and
/// [`ErrorCode::LastConsumer`].
pub const GUARDED_DELETE_VERSION: u16 = 5;

/// The fields protocol version 3 appends to [`Request::Hello`], encoded right after it in
/// the same message (a version 1 or 2 gateway ignores them). Encode a version 3 hello as the
/// tuple `(Request::Hello { .. }, HelloV3 { .. })`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HelloV3<'a> {
    /// Credential for the gateway (reserved for authentication): `None` or empty when the
    /// client has none. A gateway without credentials configured refuses a non-empty one
    /// with [`ErrorCode::Unauthorized`].
    #[serde(borrow)]
    pub credential: Option<&'a [u8]>,
}

/// The fields protocol version 3 appends to [`Response::Welcome`], encoded right after it
/// in the same message, only to clients that announced version 3 or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WelcomeV3 {
    /// `(sequence, offset)` pairs the gateway remembers per producer id: a resend of one of
    /// a producer's last `producer_window` records is answered with its original offset, an
    /// older one with [`ErrorCode::DuplicateSequenceUnknownOffset`]. It does not limit how
    /// many records a producer may have in flight.
    pub producer_window: u32,
}

/// The fields protocol version 3 appends to [`Response::StatsReply`], encoded right after
/// it in the same message, only to clients that announced version 3 or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatsV3 {
    /// The log is full: the last append was refused `Full` (policy `reject-new`) and no
    /// record has been taken since.
    pub full: bool,
}

/// Splits a message into the first value (`Request` or `Response`) and the bytes after it,
/// where version 3 puts [`HelloV3`] and [`WelcomeV3`]. Errors: the message does not
/// decode.
pub fn take_message<'a, T: Deserialize<'a>>(msg: &'a [u8]) -> Result<(T, &'a [u8]), FrameError> {
    Ok(postcard::take_from_bytes(msg)?)
}

/// The producer of a [`Request::SessionPublish`]: id, session epoch and sequence. Encoded
/// as `id` (varint u64), `epoch` (varint u32), `seq` (varint u32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionProducer {
    /// Producer id.
    pub id: u64,
    /// The session's epoch, from [`Response::Session`].
    pub epoch: u32,
    /// Sequence number: 1 for the session's first record, +1 per record (wrapping after
    /// `u32::MAX` to 0; compared in RFC 1982 serial number arithmetic).
    pub seq: u32,
}

/// How far a publish must have got before the gateway acknowledges it.
///
/// Encoded as a varint variant index: `None` = 0, `Buffered` = 1, `Durable` = 2,
/// `GatewayDefault` = 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AckLevel {
    /// Fire and forget: the gateway sends no reply at all, not even an error.
    None,
    /// Reply once the record has an offset in the gateway's RAM buffer (lost if the gateway
    /// loses power before the buffer is written to flash).
    Buffered,
    /// Reply once the record is written to flash and synced: it survives a power cut.
    Durable,
    /// Whatever level the gateway is configured to use for publishes that do not name one
    /// (its `--ack` setting; buffered unless configured otherwise).
    GatewayDefault,
}

/// Identity of an idempotent producer (the log's type, carried as is): encoded as `id`
/// (varint u64) then `seq` (varint u32).
pub use crate::log::Producer;

/// A request, sent by a client (sensor, bridge, tool) to the gateway.
///
/// Variant indexes on the wire: `Hello` 0, `Publish` 1, `Fetch` 2, `Commit` 3,
/// `ListConsumers` 4, `DeleteConsumer` 5, `Stats` 6, `OpenSession` 7 (version 3),
/// `SessionPublish` 8 (version 3), `FindOffset` 9 (version 4), `DeleteConsumerIfNotLast` 10
/// (version 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request<'a> {
    /// Handshake, the first message of a connection. Answered by [`Response::Welcome`] or
    /// by [`Response::Error`] (`seq` 0) with [`ErrorCode::UnsupportedVersion`].
    Hello {
        /// The highest protocol version the client speaks ([`PROTOCOL_VERSION`]).
        protocol_version: u16,
        /// Free-form client name for the gateway's logs (UTF-8).
        client_name: &'a str,
    },
    /// Append one record. Answered by [`Response::Ack`] or [`Response::Error`], or not at
    /// all when `ack` is [`AckLevel::None`].
    Publish {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Topic (UTF-8), e.g. `"buoy/sst"`.
        topic: &'a str,
        /// Wall-clock time of the measurement in µs since the Unix epoch; `None` lets the
        /// gateway stamp the record with its own clock on arrival.
        timestamp_us: Option<u64>,
        /// Record payload, opaque bytes (at most `max_record_bytes` of the `Welcome`).
        #[serde(serialize_with = "as_bytes")]
        payload: &'a [u8],
        /// When to acknowledge.
        ack: AckLevel,
        /// Set for idempotent publishing (resends are deduplicated).
        producer: Option<Producer>,
    },
    /// Read records from an offset. Answered by [`Response::Records`] (at least one record
    /// if any exists at or after `from_offset`), [`Response::Dropped`] or
    /// [`Response::Error`].
    Fetch {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// The consumer reading, for the gateway's bookkeeping; a fetch never creates a
        /// consumer and never commits.
        consumer: Option<&'a str>,
        /// First offset wanted.
        from_offset: u64,
        /// Soft limit on the encoded size of the returned records in bytes; the gateway
        /// stops adding records once the next one would pass it, but always returns at
        /// least one record if one exists (and the frame limit always applies).
        max_bytes: u32,
        /// Long poll: if no record exists at `from_offset` yet, wait up to this many
        /// milliseconds for one before answering with an empty `Records`. `None` or 0
        /// answers at once.
        wait_ms: Option<u32>,
    },
    /// Record that `consumer` has safely handed on every offset below `offset`. Creates the
    /// consumer if it does not exist (up to the gateway's maximum). A commit that would go
    /// backwards changes nothing. Answered by [`Response::Committed`] with the consumer's
    /// committed offset after the request.
    Commit {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Consumer name (UTF-8).
        consumer: &'a str,
        /// First offset not yet handed on.
        offset: u64,
    },
    /// List the registered consumers. Answered by [`Response::Consumers`].
    ListConsumers {
        /// Client sequence number, echoed in the reply.
        seq: u32,
    },
    /// Remove a consumer (its committed offset no longer holds back retention). Answered by
    /// [`Response::Deleted`].
    DeleteConsumer {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Consumer name (UTF-8).
        consumer: &'a str,
    },
    /// Ask for the gateway's counters. Answered by [`Response::StatsReply`].
    Stats {
        /// Client sequence number, echoed in the reply.
        seq: u32,
    },
    /// (Version 3) Open a producer session for `producer_id`, or resume its current one.
    /// Answered by [`Response::Session`], or [`Response::Error`] (`Full` when a resume
    /// cannot flush, `BadRequest` when the id has used every epoch, `StorageFailed`).
    ///
    /// Without `resume` a new session starts: a new epoch, sequences from 1; publishes
    /// under the id's earlier epochs are fenced from then on. With `resume` the id's current
    /// session goes on: the answer carries the last sequence stored durably, and the
    /// producer continues with the next one (an id without a session gets a new one).
    OpenSession {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Producer id, chosen and kept by the publisher.
        producer_id: u64,
        /// Continue the id's current session instead of starting a new one.
        resume: bool,
    },
    /// (Version 3) Append one record of a producer session: like [`Request::Publish`], with
    /// the session rules. Answered by [`Response::Ack`] (with `duplicate` for a resend of
    /// a stored sequence), [`Response::Error`] (those of `Publish`, and `OutOfSequence`,
    /// `Fenced`, `UnknownSession`), or nothing if `ack` is [`AckLevel::None`].
    SessionPublish {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Topic (UTF-8).
        topic: &'a str,
        /// Wall-clock time of the measurement in µs since the Unix epoch; `None` lets the
        /// gateway stamp it.
        timestamp_us: Option<u64>,
        /// Record payload (at most `max_record_bytes` of the `Welcome`).
        #[serde(serialize_with = "as_bytes")]
        payload: &'a [u8],
        /// When to acknowledge.
        ack: AckLevel,
        /// Producer id, session epoch and sequence.
        producer: SessionProducer,
    },
    /// (Version 4) Find the first offset, in offset order from `from_offset`, whose record
    /// is stamped at or after `timestamp_us`; the gateway reads the records itself, so the
    /// log does not travel to the client. Answered by [`Response::FoundOffset`], or
    /// [`Response::Error`] (`OffsetOutOfRange` above the log's next offset, `BadRequest`
    /// from a client that announced a version below 4, `TooLarge` for a record larger than the
    /// gateway's read buffer, `Internal` when the flash cannot be read).
    ///
    /// Timestamps are the publishers' and need not grow with the offset: the answer is the
    /// first offset whose timestamp is ≥ `timestamp_us`, records before it may carry later
    /// stamps and records after it earlier ones. The gateway reads a bounded number of
    /// bytes per request: when that is used up first, the reply says so (`done` false) and
    /// the client asks again from the reply's `offset`.
    FindOffset {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// The time searched for, µs since the Unix epoch.
        timestamp_us: u64,
        /// Where the search starts (0, or the previous reply's `offset`); below the log's
        /// first retained offset it starts there.
        from_offset: u64,
    },
    /// (Version 5) [`Request::DeleteConsumer`], unless `consumer` is the gateway's only
    /// consumer: with none left nothing holds retention, and the gateway reclaims records
    /// nobody has read when it needs room. The gateway checks and deletes in one step, so
    /// two clients deleting the last two consumers at once cannot both succeed (a check by
    /// listing first can). Answered by [`Response::Deleted`], or [`Response::Error`]
    /// (`LastConsumer`, nothing changed; `BadRequest` from a client that announced a
    /// version below 5; `StorageFailed`).
    DeleteConsumerIfNotLast {
        /// Client sequence number, echoed in the reply.
        seq: u32,
        /// Consumer name (UTF-8).
        consumer: &'a str,
    },
}

impl Request<'_> {
    /// The client sequence number, or `None` for [`Request::Hello`] (which has none).
    pub fn seq(&self) -> Option<u32> {
        match *self {
            Request::Hello { .. } => None,
            Request::Publish { seq, .. }
            | Request::Fetch { seq, .. }
            | Request::Commit { seq, .. }
            | Request::ListConsumers { seq }
            | Request::DeleteConsumer { seq, .. }
            | Request::Stats { seq }
            | Request::OpenSession { seq, .. }
            | Request::SessionPublish { seq, .. }
            | Request::FindOffset { seq, .. }
            | Request::DeleteConsumerIfNotLast { seq, .. } => Some(seq),
        }
    }
}

/// A response, sent by the gateway to a client.
///
/// Variant indexes on the wire: `Welcome` 0, `Ack` 1, `Error` 2, `Records` 3, `Dropped` 4,
/// `Committed` 5, `Consumers` 6, `Deleted` 7, `StatsReply` 8, `Session` 9 (version 3),
/// `FoundOffset` 10 (version 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response<'a> {
    /// Handshake accepted.
    Welcome {
        /// The protocol version the gateway will speak on this connection.
        protocol_version: u16,
        /// Identity of the gateway's log, random and fixed when the flash was formatted;
        /// changes when a gateway is reflashed or replaced (shown as 32 hex digits).
        log_id: u128,
        /// Configured gateway name (UTF-8).
        gateway_id: &'a str,
        /// Largest payload a [`Request::Publish`] may carry, in bytes.
        max_record_bytes: u32,
        /// Largest frame the gateway accepts or sends, in bytes on the wire (COBS-encoded,
        /// including the CRC and the 0x00 delimiter).
        max_frame_bytes: u32,
    },
    /// A publish was stored at the requested [`AckLevel`].
    Ack {
        /// Echo of the request's `seq`.
        seq: u32,
        /// Offset of the record in the log.
        offset: u64,
        /// True if this was a resend of an already stored `(producer id, seq)`; `offset` is
        /// then the original record's offset.
        duplicate: bool,
    },
    /// The request failed; nothing was changed unless `code` says otherwise.
    Error {
        /// Echo of the request's `seq` (0 if the request could not be decoded or was a
        /// `Hello`).
        seq: u32,
        /// What went wrong.
        code: ErrorCode,
        /// Human-readable detail (UTF-8, may be empty).
        message: &'a str,
    },
    /// Records read by a [`Request::Fetch`].
    Records {
        /// Echo of the request's `seq`.
        seq: u32,
        /// CRC of the record just before the first one returned (the record at offset
        /// `first - 1`), for the reader's log-matching check; 0 before offset 0.
        prev_crc: u32,
        /// Offset to fetch from next (one past the last record returned, or past a lost
        /// range, or `from_offset` if nothing was returned).
        next_offset: u64,
        /// Offsets at or after `from_offset`, before the first returned record, that are gone.
        lost: Option<LostRange>,
        /// The records, oldest first, decoded lazily by [`RecordList::iter`].
        #[serde(borrow)]
        records: RecordList<'a>,
    },
    /// Every offset from the requested `from_offset` up to `first_available` is gone (see
    /// [`LostReason`]); fetch again from `first_available`.
    Dropped {
        /// Echo of the request's `seq`.
        seq: u32,
        /// The oldest offset still in the log.
        first_available: u64,
    },
    /// A commit was recorded.
    Committed {
        /// Echo of the request's `seq`.
        seq: u32,
        /// The consumer (echo of the request).
        consumer: &'a str,
        /// The consumer's committed offset after this request (higher than the request's if
        /// the commit would have gone backwards).
        offset: u64,
    },
    /// Registered consumers.
    Consumers {
        /// Echo of the request's `seq`.
        seq: u32,
        /// `(name, committed offset)` pairs, decoded lazily by [`ConsumerList::iter`].
        #[serde(borrow)]
        list: ConsumerList<'a>,
    },
    /// Answer to [`Request::DeleteConsumer`].
    Deleted {
        /// Echo of the request's `seq`.
        seq: u32,
        /// False if no consumer had that name (nothing changed).
        existed: bool,
    },
    /// The gateway's counters.
    StatsReply {
        /// Echo of the request's `seq`.
        seq: u32,
        /// The counters (fields appended only, at the end of the message).
        stats: GatewayStats,
    },
    /// (Version 3) A producer session opened or resumed by [`Request::OpenSession`].
    Session {
        /// Echo of the request's `seq`.
        seq: u32,
        /// Producer id (echo).
        producer_id: u64,
        /// The session's epoch: the sequence number of the gateway's journal entry that
        /// opened it, above every epoch handed out before to any id (PROTOCOL.md §6.1).
        epoch: u32,
        /// The last sequence stored in the session (durably, for a resumed one); 0 if none.
        /// The next record takes `last_seq + 1` (wrapping).
        last_seq: u32,
        /// True: the id's current session was resumed; false: a new one was opened.
        resumed: bool,
    },
    /// (Version 4) Answer to [`Request::FindOffset`].
    FoundOffset {
        /// Echo of the request's `seq`.
        seq: u32,
        /// With `done`: the first offset at or after the search's start whose record
        /// timestamp is ≥ the one asked for, or the log's next offset if no record has
        /// one (a fetch from there returns only records published later). Without
        /// `done`: no record from the search's start up to this offset (exclusive) has
        /// such a timestamp; ask again from here.
        offset: u64,
        /// The search is over; `offset` is the answer.
        done: bool,
    },
}

impl Response<'_> {
    /// The echoed client sequence number, or `None` for [`Response::Welcome`].
    pub fn seq(&self) -> Option<u32> {
        match *self {
            Response::Welcome { .. } => None,
            Response::Ack { seq, .. }
            | Response::Error { seq, .. }
            | Response::Records { seq, .. }
            | Response::Dropped { seq, .. }
            | Response::Committed { seq, .. }
            | Response::Consumers { seq, .. }
            | Response::Deleted { seq, .. }
            | Response::StatsReply { seq, .. }
            | Response::Session { seq, .. }
            | Response::FoundOffset { seq, .. } => Some(seq),
        }
    }
}

/// Why a request failed. Encoded as a varint variant index (the number in brackets);
/// variants are only appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u16)]
pub enum ErrorCode {
    /// \[0\] A record (payload, topic) or a frame is larger than the gateway's
    /// `max_record_bytes` / `max_frame_bytes`. Not retryable as is.
    TooLarge = 0,
    /// \[1\] The log is full and its policy is `reject-new` (backpressure): nothing was
    /// stored; retry later, after a consumer has committed.
    Full = 1,
    /// \[2\] The frame failed COBS decoding, its CRC did not match, or the message did not
    /// decode. `seq` is 0. Resend.
    BadFrame = 2,
    /// \[3\] The `Hello` asked for a protocol version the gateway does not speak; the
    /// message names the versions it does.
    UnsupportedVersion = 3,
    /// \[4\] The named consumer does not exist (a fetch or delete never creates one).
    UnknownConsumer = 4,
    /// \[5\] The offset is beyond the log's next offset (offsets that were dropped get
    /// [`Response::Dropped`] instead).
    OffsetOutOfRange = 5,
    /// \[6\] A commit would create a consumer but the gateway's consumer table is full.
    TooManyConsumers = 6,
    /// \[7\] The request decoded but is invalid (empty topic, topic not allowed, zero
    /// `max_bytes`, …).
    BadRequest = 7,
    /// \[8\] A producer resend is older than the window of `(producer id, seq)` pairs the
    /// gateway remembers: it was probably stored, but its offset is no longer known.
    /// Do not resend it.
    DuplicateSequenceUnknownOffset = 8,
    /// \[9\] A failure inside the gateway (flash error, …); the message has detail. Also the
    /// connection-level refusal (seq 0, before any `Hello`) of a connection the Linux
    /// gateway has no room for (its message begins `gateway at --max-connections`).
    Internal = 9,
    /// \[10\] A request other than `Hello` arrived before the handshake.
    NotHandshaken = 10,
    /// \[11\] A producer resend older than the remembered window, from before a sequence
    /// the gateway skipped (refused, or never received): whether it was stored is not
    /// known. Treat the record as not acknowledged.
    SequenceUnknown = 11,
    /// \[12\] (protocol version 2) The gateway's storage failed (a flash write, erase or
    /// sync): nothing in this request was acknowledged as durable, and no record waiting
    /// for a durable acknowledgement got one. Resend after the gateway has remounted its
    /// storage or restarted (reconnect with backoff); with a producer id the resends of
    /// records that did reach flash are deduplicated. A client that announced version 1
    /// gets [`ErrorCode::Internal`] instead.
    StorageFailed = 12,
    /// \[13\] (protocol version 3) A session's record is neither the next sequence (the
    /// last stored + 1, named in the message) nor a stored one: nothing was stored. Resend
    /// in order from the first unacknowledged record.
    OutOfSequence = 13,
    /// \[14\] (protocol version 3) A newer session owns the producer id: the publish named
    /// an older epoch (or, from a version 1 or 2 client, none). Nothing was stored; stop
    /// publishing under this session. A version 1 or 2 client gets
    /// [`ErrorCode::BadRequest`] instead.
    Fenced = 14,
    /// \[15\] (protocol version 3) The gateway did not open this session (an epoch it never
    /// handed out for the id, or it forgot the id: it remembers the 32 most recently active
    /// producer ids). Nothing was stored; open a new session.
    UnknownSession = 15,
    /// \[16\] (protocol version 3) The `Hello` carried a credential the gateway does not
    /// accept (a wrong one, one where none are configured, or none on a listener that
    /// requires one). The connection is not handshaken.
    Unauthorized = 16,
    /// \[17\] (protocol version 3) The connection's roles do not allow this request (a
    /// `publish`-only sensor asking to commit, fetch or delete a consumer; a commit of a
    /// consumer the credential does not name). Nothing was read or changed; the message
    /// names the role needed. A version 1 or 2 client gets [`ErrorCode::BadRequest`].
    Forbidden = 17,
    /// \[18\] (protocol version 5) A [`Request::DeleteConsumerIfNotLast`] named the
    /// gateway's only consumer: nothing was deleted; the message gives its committed
    /// offset. Only a client of version 5 or later sends that request.
    LastConsumer = 18,
}

impl ErrorCode {
    /// The code's number on the wire.
    pub const fn code(self) -> u16 {
        self as u16
    }

    /// The first protocol version that has this code.
    pub const fn since_version(self) -> u16 {
        match self {
            ErrorCode::StorageFailed => 2,
            ErrorCode::OutOfSequence
            | ErrorCode::Fenced
            | ErrorCode::UnknownSession
            | ErrorCode::Unauthorized
            | ErrorCode::Forbidden => 3,
            ErrorCode::LastConsumer => 5,
            _ => 1,
        }
    }

    /// This code as a client speaking `protocol_version` knows it: a code newer than that
    /// version becomes [`ErrorCode::Internal`] (a storage failure, retryable) or, for the
    /// version 3 codes, [`ErrorCode::BadRequest`] (not retryable as is).
    pub const fn for_version(self, protocol_version: u16) -> ErrorCode {
        if protocol_version >= self.since_version() {
            self
        } else if self.since_version() >= 3 {
            ErrorCode::BadRequest
        } else {
            ErrorCode::Internal
        }
    }

    /// Whether resending the same request later can succeed (the failure was the
    /// gateway's state, not the request): `Full`, `BadFrame`, `Internal`, `StorageFailed`.
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Full | ErrorCode::BadFrame | ErrorCode::Internal | ErrorCode::StorageFailed
        )
    }
}

/// A range of offsets whose records are gone, `from..to` (`to` exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LostRange {
    /// First lost offset.
    pub from: u64,
    /// One past the last lost offset.
    pub to: u64,
    /// Why they are gone.
    pub reason: LostReason,
}

/// Why records are gone. Encoded as a varint variant index; variants are only appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LostReason {
    /// \[0\] The ring was full with the `drop-oldest` policy and the oldest segment was
    /// erased before this reader got to it.
    DroppedOldest,
    /// \[1\] The records were found corrupt in flash (CRC mismatch) and skipped.
    Corrupt,
    /// \[2\] The offsets were handed out but the records never reached flash (a power cut
    /// lost records acknowledged only as buffered, or the offsets were leased and unused).
    NotPersisted,
}

/// One record as carried by [`Response::Records`]. Encoded as its fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordView<'a> {
    /// The record's offset in the log.
    pub offset: u64,
    /// CRC-32 (IEEE) the log keeps for this record; the `prev_crc` of a fetch that starts
    /// right after it.
    pub record_crc: u32,
    /// Topic (UTF-8).
    pub topic: &'a str,
    /// Wall-clock time in µs since the Unix epoch (the publisher's, or the gateway's arrival
    /// time if the publisher gave none).
    pub timestamp_us: u64,
    /// The idempotent producer that published it, if any.
    pub producer: Option<Producer>,
    /// Payload bytes.
    #[serde(serialize_with = "as_bytes")]
    pub payload: &'a [u8],
}

impl<'a> From<crate::log::RecordRef<'a>> for RecordView<'a> {
    /// The wire form of a record read from the log.
    fn from(r: crate::log::RecordRef<'a>) -> Self {
        RecordView {
            offset: r.offset,
            record_crc: r.crc,
            topic: r.topic,
            timestamp_us: r.timestamp_us,
            producer: r.producer,
            payload: r.payload,
        }
    }
}

/// One consumer as carried by [`Response::Consumers`]. Encoded as its fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerEntry<'a> {
    /// Consumer name (UTF-8).
    pub name: &'a str,
    /// First offset the consumer has not yet handed on.
    pub committed_offset: u64,
}

/// The gateway's counters, carried by [`Response::StatsReply`]. Every field is a `u64`
/// varint, in this order; fields are only appended. Counters count since the log was
/// formatted unless marked "since start".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct GatewayStats {
    /// Oldest offset still readable.
    pub first_offset: u64,
    /// Offset the next appended record will get.
    pub next_offset: u64,
    /// Every offset below this one is in flash and synced.
    pub durable_offset: u64,
    /// Records appended.
    pub records_appended: u64,
    /// Payload bytes appended.
    pub bytes_appended: u64,
    /// Resends recognised as duplicates and not appended again.
    pub duplicates: u64,
    /// Publishes rejected because the log was full (`reject-new` policy).
    pub records_rejected_full: u64,
    /// Records reclaimed before every consumer committed them (`drop-oldest`, or any
    /// policy with no consumer left): `Stats::records_dropped` of the log.
    pub records_dropped: u64,
    /// Offsets reads found corrupt in flash and skipped, each counted once however often
    /// it is fetched (`Stats::corrupt_offsets` of the log).
    pub records_corrupt: u64,
    /// Records acknowledged from RAM, consumed and committed, never written to flash
    /// (`on-pressure` spill policy).
    pub records_spared: u64,
    /// Bytes programmed into flash (batches, segment headers, journal).
    pub flash_bytes_programmed: u64,
    /// Bytes read from flash.
    pub flash_bytes_read: u64,
    /// Erase-block erases.
    pub erases: u64,
    /// Batches written to flash.
    pub flushes: u64,
    /// Flash syncs.
    pub syncs: u64,
    /// Commit-journal entries written.
    pub journal_writes: u64,
    /// Records currently in the RAM buffer.
    pub buffered_records: u64,
    /// Bytes currently in the RAM buffer.
    pub buffered_bytes: u64,
    /// Size of the log's flash partition in bytes.
    pub capacity_bytes: u64,
    /// Bytes of the partition holding retained records.
    pub used_bytes: u64,
    /// Registered consumers.
    pub consumers: u64,
    /// Frames received since start.
    pub frames_received: u64,
    /// Frames rejected since start (COBS, CRC, decoding, oversize).
    pub frames_rejected: u64,
    /// Unclean shutdowns detected at mount.
    pub unclean_mounts: u64,
    /// Milliseconds since the gateway started.
    pub uptime_ms: u64,
}

/// Serializes a byte slice with `serialize_bytes` (postcard: varint length + bytes, the
/// same bytes as a sequence of `u8`, in one copy).
fn as_bytes<S: serde::Serializer>(bytes: &&[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_bytes(bytes)
}

//! What a [`Client`] hands back: its error type and the owned values of
//! the gateway's replies (the handshake's `Welcome`, a producer session, fetched records,
//! publish acknowledgements, consumer table entries).

use std::time::Duration;

use bytes::Bytes;
use spillway_core::wire::{self, ErrorCode, LostRange, Producer};

use super::Topic;

#[cfg(doc)]
use super::{Client, WELCOME_TIMEOUT};

/// Errors of a connection. Everything but [`ClientError::Gateway`] means the connection is
/// unusable and must be reopened; whether to retry is the caller's decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, reading or writing failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The serial port could not be opened.
    #[error("serial port: {0}")]
    Serial(#[from] serialport::Error),
    /// The gateway closed the connection.
    #[error("connection closed by the gateway")]
    Closed,
    /// TLS could not be set up with a `tls://` gateway (no `--tls-ca`, a certificate that
    /// does not verify or does not name the host, a plaintext port).
    #[error("TLS with {addr}: {why}")]
    Tls {
        /// The gateway's `HOST:PORT`.
        addr: String,
        /// What failed.
        why: String,
    },
    /// No reply within the timeout.
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// A message could not be encoded (too large for the gateway's frame limit).
    #[error("request does not fit a frame: {0}")]
    Encode(wire::FrameError),
    /// The gateway sent something that does not decode or does not fit the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The peer took the connection but answered the `Hello` with no `Welcome`: it closed
    /// the connection (an MQTT, metrics or `tls://` port) or stayed silent for
    /// [`WELCOME_TIMEOUT`] (a line-mode or metrics port, or a stalled gateway). Set only by
    /// [`Client::connect`] on TCP, TLS and Unix connections; the string says which and
    /// why.
    #[error("not a Spillway listener: {why}")]
    NotSpillway {
        /// The peer closed the connection (or reset it) before a `Welcome`; false: it
        /// stayed silent for [`WELCOME_TIMEOUT`].
        closed: bool,
        /// Which, and what the port may be.
        why: String,
    },
    /// The gateway speaks a protocol version older than the one a request needs.
    #[error(
        "{what} needs protocol version {needed}, and the gateway speaks version {spoken}: upgrade the gateway"
    )]
    Unsupported {
        /// What the request is for.
        what: &'static str,
        /// The first protocol version that has the request.
        needed: u16,
        /// The version agreed with the gateway.
        spoken: u16,
    },
    /// The gateway answered with an error.
    #[error("gateway error {code:?}: {message}")]
    Gateway {
        /// The protocol's error code.
        code: ErrorCode,
        /// The gateway's detail.
        message: String,
    },
}

impl ClientError {
    /// True if the connection is still usable after this error (a gateway error reply).
    pub fn connection_ok(&self) -> bool {
        matches!(self, ClientError::Gateway { .. })
    }
}

/// What the gateway said in its `Welcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// Protocol version used on this connection.
    pub protocol_version: u16,
    /// The log's identity (random at format time).
    pub log_id: u128,
    /// The configured gateway name.
    pub gateway_id: String,
    /// Largest publish payload, bytes.
    pub max_record_bytes: u32,
    /// Largest frame on the wire, bytes (COBS, CRC and delimiter included).
    pub max_frame_bytes: u32,
    /// `(sequence, offset)` pairs the gateway remembers per producer id (protocol version
    /// 3; `None` from an older gateway).
    pub producer_window: Option<u32>,
}

/// A producer session opened or resumed by [`Client::open_session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionInfo {
    /// Producer id.
    pub producer_id: u64,
    /// The session's epoch.
    pub epoch: u32,
    /// The last sequence the gateway stored in the session (durably, for a resumed one);
    /// 0 if none. The next record takes `last_seq + 1`.
    pub last_seq: u32,
    /// True: the id's current session was resumed; false: a new one was opened.
    pub resumed: bool,
}

/// A record read by a fetch, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRecord {
    /// Offset in the gateway's log.
    pub offset: u64,
    /// The log's record CRC.
    pub record_crc: u32,
    /// Topic (shared with the records of the same reply and topic).
    pub topic: Topic,
    /// Wall-clock time, µs since the Unix epoch.
    pub timestamp_us: u64,
    /// Idempotent producer, if any.
    pub producer: Option<Producer>,
    /// Payload bytes: a slice of the buffer shared with the other records of the same
    /// reply (cloning costs a reference count; the buffer lives while any of them does).
    pub payload: Bytes,
}

/// The answer to a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchReply {
    /// Records (possibly none, at the end of the log).
    Records {
        /// Record CRC of the record before the first one (before `from_offset` when empty).
        prev_crc: u32,
        /// Where to fetch next.
        next_offset: u64,
        /// Offsets before the first record that are gone.
        lost: Option<LostRange>,
        /// The records, oldest first.
        records: Vec<OwnedRecord>,
    },
    /// Everything from the requested offset up to `first_available` is gone.
    Dropped {
        /// Oldest offset still in the log.
        first_available: u64,
    },
}

/// The outcome of one pipelined publish: the acknowledgement (`None` for `AckLevel::None`)
/// or the gateway's error.
pub type PublishResult = Result<Option<PublishAck>, ClientError>;

/// One entry of the gateway's consumer table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConsumerInfo {
    /// Consumer name.
    pub name: String,
    /// Its committed offset.
    pub committed_offset: u64,
}

/// The answer to a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishAck {
    /// The record's offset.
    pub offset: u64,
    /// A resend of an already stored `(producer id, seq)`.
    pub duplicate: bool,
}

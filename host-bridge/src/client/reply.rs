//! Replies from the wire made owned and checked before the bridge computes with their
//! numbers.

use bytes::Bytes;
use spillway_core::log::format::MAX_OFFSET;
use spillway_core::wire::{self, Response};

use super::*;

/// A reply from the gateway, owned and checked (offsets below the log's offset limit,
/// increasing record offsets, well-formed lost ranges: see [`decode_reply`]). The
/// requests of [`Client`] hand back the values inside; [`Client::next_reply`] hands back
/// the whole reply, for callers that pipeline their own requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The handshake's answer (`Welcome`).
    Welcome(Welcome),
    /// A publish stored, or a resend of a stored `(producer id, seq)` (`Ack`).
    Ack(PublishAck),
    /// The gateway refused the request (`Error`); seq 0 answers a frame that named no
    /// request (one that did not decode, or was too large).
    Error {
        /// The protocol's error code.
        code: ErrorCode,
        /// The gateway's detail.
        message: String,
    },
    /// A fetch's answer (`Records` or `Dropped`).
    Fetch(FetchReply),
    /// A commit's answer: the consumer's committed offset after it (`Committed`).
    Committed(u64),
    /// The consumer table (`Consumers`).
    Consumers(Vec<ConsumerInfo>),
    /// A delete's answer: whether the consumer existed (`Deleted`).
    Deleted(bool),
    /// The counters (`StatsReply`).
    Stats {
        /// The counters.
        stats: GatewayStats,
        /// The `full` flag protocol version 3 appends; `None` from an older gateway.
        full: Option<bool>,
    },
    /// A producer session opened or resumed (`Session`).
    Session(SessionInfo),
    /// One step of a search by time (`FoundOffset`).
    FoundOffset {
        /// The answer when `done`, else where to search on from.
        offset: u64,
        /// The search is over.
        done: bool,
    },
}

/// Decodes one reply frame from a gateway (its COBS bytes up to and including the 0
/// delimiter, decoded in place) and checks it the way [`Client`] does before the bridge
/// computes with its numbers. Returns the reply's request `seq` (`None` for a reply to no
/// request).
///
/// Errors: [`ClientError::Protocol`] for a frame that does not decode, a malformed record
/// or consumer entry, an offset at or above the log's offset limit
/// ([`MAX_OFFSET`], so the bridge can add 1 to
/// any offset it was sent), record offsets that do not increase, bytes in a record block
/// after the records it announces, or a lost range that ends before it starts.
pub fn decode_reply(frame: &mut [u8]) -> Result<Option<u32>, ClientError> {
    let bad = |e: wire::FrameError| ClientError::Protocol(format!("bad frame: {e}"));
    let message = Bytes::copy_from_slice(wire::decode_frame(frame).map_err(bad)?);
    let resp: Response<'_> = postcard::from_bytes(&message).map_err(|e| bad(e.into()))?;
    let seq = resp.seq();
    own(resp, &message)?;
    Ok(seq)
}

/// Refuses an offset from the wire at or above the log's offset limit.
fn offset_in_range(what: &str, offset: u64) -> Result<u64, ClientError> {
    if offset < MAX_OFFSET {
        Ok(offset)
    } else {
        Err(ClientError::Protocol(format!(
            "{what} {offset} is past the offset limit {MAX_OFFSET}"
        )))
    }
}

/// `part` as a slice of `message` when it lies within it (a payload borrowed from the
/// message by its decoding), else a copy of it.
fn slice_of(message: &Bytes, part: &[u8]) -> Bytes {
    let start = (part.as_ptr() as usize).wrapping_sub(message.as_ptr() as usize);
    match start.checked_add(part.len()) {
        Some(end) if start <= message.len() && end <= message.len() => message.slice(start..end),
        _ => Bytes::copy_from_slice(part),
    }
}

/// `resp` owned and checked (see [`decode_reply`]). `message`: the message `resp` was
/// decoded from, whose bytes a `Records` reply's payloads become slices of.
pub(super) fn own(resp: Response<'_>, message: &Bytes) -> Result<Reply, ClientError> {
    let off = offset_in_range;
    Ok(match resp {
        Response::Welcome {
            protocol_version,
            log_id,
            gateway_id,
            max_record_bytes,
            max_frame_bytes,
        } => Reply::Welcome(Welcome {
            protocol_version,
            log_id,
            gateway_id: gateway_id.to_string(),
            max_record_bytes,
            max_frame_bytes,
            producer_window: None,
        }),
        Response::Ack {
            offset, duplicate, ..
        } => Reply::Ack(PublishAck {
            offset: off("acknowledged offset", offset)?,
            duplicate,
        }),
        Response::Error { code, message, .. } => Reply::Error {
            code,
            message: message.to_string(),
        },
        Response::Records {
            prev_crc,
            next_offset,
            lost,
            records,
            ..
        } => {
            off("next offset", next_offset)?;
            if let Some(l) = lost
                && (off("lost range end", l.to)? < l.from)
            {
                return Err(ClientError::Protocol(format!(
                    "lost range {}..{} ends before it starts",
                    l.from, l.to
                )));
            }
            // The payloads are slices of the message (no copy), the topic one string per
            // run of records of one topic: a few allocations per reply, not two per
            // record.
            // The vector is one the drain gave back, when it has one (see `pool`).
            let mut out = super::pool::record_vec(records.count().min(65_536) as usize);
            let mut items = records.iter();
            for r in &mut items {
                let r = r.map_err(|e| ClientError::Protocol(format!("bad record: {e}")))?;
                off("record offset", r.offset)?;
                if let Some(p) = out.last()
                    && p.offset >= r.offset
                {
                    return Err(ClientError::Protocol(format!(
                        "record offsets do not increase: {} after {}",
                        r.offset, p.offset
                    )));
                }
                let topic = match out.last() {
                    Some(p) if p.topic == *r.topic => p.topic.clone(),
                    _ => Topic::from(r.topic),
                };
                out.push(OwnedRecord {
                    offset: r.offset,
                    record_crc: r.record_crc,
                    topic,
                    timestamp_us: r.timestamp_us,
                    producer: r.producer,
                    payload: slice_of(message, r.payload),
                });
            }
            // The block is the announced records and nothing else: bytes after them (a
            // count too small) would otherwise be records skipped without a word.
            let left = items.remaining_bytes().len();
            if left > 0 {
                return Err(ClientError::Protocol(format!(
                    "{left} bytes after the {} records the reply announces",
                    records.count()
                )));
            }
            Reply::Fetch(FetchReply::Records {
                prev_crc,
                next_offset,
                lost,
                records: out,
            })
        }
        Response::Dropped {
            first_available, ..
        } => Reply::Fetch(FetchReply::Dropped {
            first_available: off("first available offset", first_available)?,
        }),
        Response::Committed { offset, .. } => Reply::Committed(off("committed offset", offset)?),
        Response::Consumers { list, .. } => {
            let mut out = Vec::new();
            for c in list.iter() {
                let c = c.map_err(|e| ClientError::Protocol(format!("bad consumer entry: {e}")))?;
                out.push(ConsumerInfo {
                    name: c.name.to_string(),
                    committed_offset: off("committed offset", c.committed_offset)?,
                });
            }
            Reply::Consumers(out)
        }
        Response::Deleted { existed, .. } => Reply::Deleted(existed),
        Response::Session {
            producer_id,
            epoch,
            last_seq,
            resumed,
            ..
        } => Reply::Session(SessionInfo {
            producer_id,
            epoch,
            last_seq,
            resumed,
        }),
        Response::FoundOffset { offset, done, .. } => Reply::FoundOffset {
            offset: off("found offset", offset)?,
            done,
        },
        Response::StatsReply { stats, .. } => {
            off("first offset", stats.first_offset)?;
            off("next offset", stats.next_offset)?;
            off("durable offset", stats.durable_offset)?;
            Reply::Stats { stats, full: None }
        }
    })
}

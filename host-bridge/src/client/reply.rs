//! Replies from the wire made owned and checked before the bridge computes with their
//! numbers.

use spillway_core::log::format::MAX_OFFSET;
use spillway_core::wire::{self, Response};

use super::*;

/// An owned copy of the responses the client understands.
pub(super) enum Owned {
    Welcome(Welcome),
    Ack(PublishAck),
    Error(ErrorCode, String),
    Fetch(FetchReply),
    Committed(u64),
    Consumers(Vec<ConsumerInfo>),
    Deleted(bool),
    /// The counters, and the `full` flag protocol version 3 appends (`None` from an older
    /// gateway).
    Stats(GatewayStats, Option<bool>),
    Session(SessionInfo),
    /// `FoundOffset`: the offset and whether the search is done.
    Found(u64, bool),
}

/// Decodes one reply frame from a gateway (its COBS bytes up to and including the 0
/// delimiter, decoded in place) and checks it the way [`Client`] does before the bridge
/// computes with its numbers. Returns the reply's request `seq` (`None` for a reply to no
/// request).
///
/// Errors: [`ClientError::Protocol`] for a frame that does not decode, a malformed record
/// or consumer entry, an offset at or above the log's offset limit
/// ([`MAX_OFFSET`], so the bridge can add 1 to
/// any offset it was sent), record offsets that do not increase, or a lost range that ends
/// before it starts.
pub fn decode_reply(frame: &mut [u8]) -> Result<Option<u32>, ClientError> {
    let resp: Response<'_> = wire::decode_message(frame)
        .map_err(|e| ClientError::Protocol(format!("bad frame: {e}")))?;
    let seq = resp.seq();
    own(resp)?;
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

pub(super) fn own(resp: Response<'_>) -> Result<Owned, ClientError> {
    let off = offset_in_range;
    Ok(match resp {
        Response::Welcome {
            protocol_version,
            log_id,
            gateway_id,
            max_record_bytes,
            max_frame_bytes,
        } => Owned::Welcome(Welcome {
            protocol_version,
            log_id,
            gateway_id: gateway_id.to_string(),
            max_record_bytes,
            max_frame_bytes,
            producer_window: None,
        }),
        Response::Ack {
            offset, duplicate, ..
        } => Owned::Ack(PublishAck {
            offset: off("acknowledged offset", offset)?,
            duplicate,
        }),
        Response::Error { code, message, .. } => Owned::Error(code, message.to_string()),
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
            let mut out: Vec<OwnedRecord> =
                Vec::with_capacity(records.count().min(65_536) as usize);
            for r in records.iter() {
                let r = r.map_err(|e| ClientError::Protocol(format!("bad record: {e}")))?;
                off("record offset", r.offset)?;
                if out.last().is_some_and(|p| p.offset >= r.offset) {
                    return Err(ClientError::Protocol(format!(
                        "record offsets do not increase: {} after {}",
                        r.offset,
                        out.last().map_or(0, |p| p.offset)
                    )));
                }
                out.push(OwnedRecord {
                    offset: r.offset,
                    record_crc: r.record_crc,
                    topic: r.topic.to_string(),
                    timestamp_us: r.timestamp_us,
                    producer: r.producer,
                    payload: r.payload.to_vec(),
                });
            }
            Owned::Fetch(FetchReply::Records {
                prev_crc,
                next_offset,
                lost,
                records: out,
            })
        }
        Response::Dropped {
            first_available, ..
        } => Owned::Fetch(FetchReply::Dropped {
            first_available: off("first available offset", first_available)?,
        }),
        Response::Committed { offset, .. } => Owned::Committed(off("committed offset", offset)?),
        Response::Consumers { list, .. } => {
            let mut out = Vec::new();
            for c in list.iter() {
                let c = c.map_err(|e| ClientError::Protocol(format!("bad consumer entry: {e}")))?;
                out.push(ConsumerInfo {
                    name: c.name.to_string(),
                    committed_offset: off("committed offset", c.committed_offset)?,
                });
            }
            Owned::Consumers(out)
        }
        Response::Deleted { existed, .. } => Owned::Deleted(existed),
        Response::Session {
            producer_id,
            epoch,
            last_seq,
            resumed,
            ..
        } => Owned::Session(SessionInfo {
            producer_id,
            epoch,
            last_seq,
            resumed,
        }),
        Response::FoundOffset { offset, done, .. } => {
            Owned::Found(off("found offset", offset)?, done)
        }
        Response::StatsReply { stats, .. } => {
            off("first offset", stats.first_offset)?;
            off("next offset", stats.next_offset)?;
            off("durable offset", stats.durable_offset)?;
            Owned::Stats(stats, None)
        }
    })
}

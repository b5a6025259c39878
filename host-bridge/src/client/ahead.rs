//! Fetching: [`Client::fetch`], and the fetch sent ahead ([`FetchAhead`]) by
//! [`Client::fetch_ahead`] and [`Client::fetch_reply`] so that the gateway reads the next
//! batch while the bridge hands this one on.

use std::time::Duration;

use super::{Client, ClientError, FetchReply, Reply, bad_frame, refuses_our_frame};
use spillway_core::wire::{self, Request, Response};

impl Client {
    /// Fetches records from `from_offset`, at most about `max_bytes` bytes, long-polling up
    /// to `wait` for a record if none exists yet.
    pub async fn fetch(
        &mut self,
        consumer: Option<&str>,
        from_offset: u64,
        max_bytes: u32,
        wait: Duration,
    ) -> Result<FetchReply, ClientError> {
        self.fetch_ahead(consumer, from_offset, max_bytes, wait, None)
            .await
            .map(|(f, _)| f)
    }

    /// [`Client::fetch`], pipelined: with `ahead`, the fetch that continues after the
    /// records of this one's reply is sent as soon as that reply is decoded (see
    /// [`FetchAhead`]); its `(seq, from_offset)` comes back with the reply, and its own
    /// reply is taken with [`Client::fetch_reply`]. Until then the connection must carry
    /// no other request whose reply is waited for: that wait would skip the fetch's reply.
    ///
    /// Errors: as [`Client::fetch`]; after an error no fetch was sent ahead, or it is lost
    /// with the connection.
    pub async fn fetch_ahead(
        &mut self,
        consumer: Option<&str>,
        from_offset: u64,
        max_bytes: u32,
        wait: Duration,
        ahead: Option<&FetchAhead<'_>>,
    ) -> Result<(FetchReply, Option<(u32, u64)>), ClientError> {
        let seq = self.next_seq();
        let req = Request::Fetch {
            seq,
            consumer,
            from_offset,
            max_bytes: max_bytes.max(1),
            wait_ms: wait_ms(wait),
        };
        self.send(&req).await?;
        self.fetch_reply(seq, from_offset, wait, ahead).await
    }

    /// The reply to the fetch `seq` from `from_offset`, sent by [`Client::fetch_ahead`] or
    /// ahead by an earlier call (`wait`: its long-poll wait), and with `ahead` the next
    /// fetch sent ahead, as [`Client::fetch_ahead`] does.
    ///
    /// Errors: as [`Client::fetch`].
    pub async fn fetch_reply(
        &mut self,
        seq: u32,
        from_offset: u64,
        wait: Duration,
        ahead: Option<&FetchAhead<'_>>,
    ) -> Result<(FetchReply, Option<(u32, u64)>), ClientError> {
        let timeout = self.reply_timeout + wait;
        let deadline = std::time::Instant::now() + timeout;
        let ahead = ahead.map(|a| FetchAhead {
            after: Some((seq, from_offset)),
            ..*a
        });
        loop {
            let (got, reply, sent) = self
                .recv_any_ahead(deadline, timeout, ahead.as_ref())
                .await?;
            if got == Some(seq) {
                return match reply {
                    Reply::Fetch(f) => Ok((f, sent)),
                    Reply::Error { code, message } => Err(ClientError::Gateway { code, message }),
                    _ => Err(ClientError::Protocol("expected Records or Dropped".into())),
                };
            }
            if refuses_our_frame(got, &reply) {
                return Err(bad_frame());
            }
            log::debug!("ignoring a reply to seq {got:?}");
        }
    }
}

/// A fetch's `wait_ms`: `wait` in ms, `None` for no wait.
fn wait_ms(wait: Duration) -> Option<u32> {
    let ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
    (ms > 0).then_some(ms)
}

/// The fetch [`Client::fetch_ahead`] and [`Client::fetch_reply`] send ahead: once the
/// reply they wait for is decoded, and it holds records and no lost range, a fetch from
/// the offset after them (the reply's `next_offset`) is sent at once, before the records
/// are copied out of the frame, so that the gateway reads the next batch while the bridge
/// hands this one on.
#[derive(Debug, Clone, Copy)]
pub struct FetchAhead<'a> {
    /// The consumer named in the fetch.
    pub consumer: Option<&'a str>,
    /// Its byte budget (`max_bytes`).
    pub max_bytes: u32,
    /// Its long-poll wait.
    pub wait: Duration,
    /// Sent only for a `from_offset` below this (the end of a `--once` drain).
    pub before: Option<u64>,
    /// The fetch whose reply it follows: `(seq, from_offset)`; set by the client.
    after: Option<(u32, u64)>,
}

impl<'a> FetchAhead<'a> {
    /// A fetch sent ahead with these parameters (see [`FetchAhead`]'s fields).
    pub fn new(
        consumer: Option<&'a str>,
        max_bytes: u32,
        wait: Duration,
        before: Option<u64>,
    ) -> Self {
        FetchAhead {
            consumer,
            max_bytes,
            wait,
            before,
            after: None,
        }
    }

    pub(super) fn wait_ms(&self) -> Option<u32> {
        wait_ms(self.wait)
    }

    /// Where the fetch ahead starts if `resp` is the reply it follows and calls for one
    /// (records and no lost range): its `next_offset`, which the protocol puts one past the
    /// last record, not before the fetch's own offset; `None` otherwise. The records are
    /// not decoded for it: a caller that finds another offset after them (a gateway that
    /// misreports `next_offset`) takes the reply to the fetch sent ahead and drops it.
    pub(super) fn next_after(&self, resp: &Response<'_>) -> Option<u64> {
        let Response::Records {
            seq,
            next_offset,
            lost: None,
            records,
            ..
        } = resp
        else {
            return None;
        };
        self.next_from(*seq, *next_offset, records.count())
    }

    /// [`FetchAhead::next_after`] for a reply of which only the start of its frame has
    /// arrived (`frame_start`, COBS-encoded): read from its header
    /// ([`wire::peek_records_header`]), `None` until the header is in.
    pub(super) fn next_after_start(&self, frame_start: &[u8]) -> Option<u64> {
        let h = wire::peek_records_header(frame_start)?;
        if h.lost.is_some() {
            return None;
        }
        self.next_from(h.seq, h.next_offset, h.count)
    }

    /// Where the fetch ahead starts after the lossless `Records` reply `seq` of `count`
    /// records that says `next_offset`, if it is the reply this one follows.
    fn next_from(&self, seq: u32, next_offset: u64, count: u32) -> Option<u64> {
        let (after, from) = self.after?;
        if seq != after || count == 0 {
            return None;
        }
        let next = next_offset.max(from);
        (next < spillway_core::log::format::MAX_OFFSET && self.before.is_none_or(|b| next < b))
            .then_some(next)
    }
}

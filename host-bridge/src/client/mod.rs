//! Async client of the Spillway wire protocol (`spillway_core::wire`, `core/PROTOCOL.md`)
//! over TCP, TLS over TCP, a Unix socket or a serial line. TLS and the token sent in the
//! `Hello` come from the process's [`security`](crate::security) settings.
//!
//! One [`Client`] is one connection: it sends a request, waits for the reply with the same
//! `seq`, and hands back owned values ([`FetchReply`], [`PublishAck`], …). Its requests are
//! not pipelined (the protocol allows it, but one request at a time keeps a serial line
//! simple and costs little: the drain loop overlaps fetching with the sink's work in
//! separate tasks instead), except [`Client::publish_batch`] and the fetch sent ahead by
//! [`Client::fetch_ahead`] (one, once the reply before it is decoded: the gateway reads
//! the next batch while the drain hands this one on). A caller that pipelines its
//! own requests sends them with [`Client::send_request`] and takes the replies, in the
//! order they come, from [`Client::next_reply`]; [`Client::send_raw`] sends bytes as they
//! are (tests of how a gateway takes bad input).
//!
//! Buffers are bounded: a frame larger than the gateway's `max_frame_bytes` (or
//! [`MAX_FRAME_BEFORE_WELCOME`] before the handshake) is dropped, never buffered.
//!
//! Serial lines are opened with the `serialport` crate (no libudev) and driven by one
//! blocking reader thread that hands chunks to the async side through a bounded channel;
//! writes go through `smol::unblock`.
//!
//! # Files of this module
//!
//! - `mod.rs`: [`Client`] (requests, frame reading with timeouts) and the types it hands
//!   back.
//! - `connect`: connecting and the handshake; [`FirstContact`].
//! - `ahead`: fetching, and the fetch sent ahead ([`FetchAhead`]).
//! - `io`: the byte stream (TCP, TLS, Unix socket, serial line with its reader thread).
//! - `types`: [`ClientError`] and the owned values the client hands back.
//! - `reply`: replies made owned and checked ([`decode_reply`]: offsets below the limit,
//!   increasing record offsets, well-formed lost ranges).
//! - `shared`: a fetched record's [`Topic`], shared by the records of one reply (their
//!   payloads are slices of one [`Bytes`](bytes::Bytes) per reply).

mod ahead;
mod connect;
mod io;
mod pool;
mod reply;
mod shared;
mod types;

use std::fmt;
use std::time::Duration;

pub use ahead::FetchAhead;
pub use connect::{FirstContact, NOT_SPILLWAY_TRIES, WELCOME_TIMEOUT};
use io::Io;
pub use pool::recycle_records;
use reply::own;
pub use reply::{Reply, decode_reply};
pub use shared::Topic;
pub use types::{
    ClientError, ConsumerInfo, FetchReply, OwnedRecord, PublishAck, PublishResult, SessionInfo,
    Welcome,
};

use spillway_core::wire::{self, AckLevel, ErrorCode, GatewayStats, Producer, Request, Response};

/// Largest frame accepted before the `Welcome` told the real limit, bytes.
pub const MAX_FRAME_BEFORE_WELCOME: usize = 64 * 1024;
/// Upper bound on any frame this client buffers, bytes, whatever the gateway announces.
pub const MAX_FRAME_ABSOLUTE: usize = 16 * 1024 * 1024;
/// Bytes one read from the connection takes at most: a fetch's reply (one frame of up to
/// 64 KiB unless the gateway's record limit is larger) in one or two reads.
pub const RX_BUFFER: usize = 64 * 1024;
/// Default time to wait for a reply before the connection is declared dead (a long-poll
/// fetch adds its `wait_ms`).
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default serial speed, baud.
pub const DEFAULT_BAUD: u32 = 115_200;

/// Where the gateway is (`tcp://HOST:PORT`, `unix:///PATH`, `serial:///dev/ttyX?baud=N`),
/// read by the URI parser the gateway uses too.
pub use spillway_core::cli::uri::{BadUri as BadAddr, GatewayAddr};

/// One connection to a gateway, handshaken.
pub struct Client {
    io: Io,
    /// The buffer reads go into ([`RX_BUFFER`] bytes); `rx[rx_pos..rx_len]` are bytes of
    /// the last read not yet fed to `frames`.
    rx: Box<[u8]>,
    rx_pos: usize,
    rx_len: usize,
    /// The frame splitter: each received byte is handled once, a frame larger than
    /// `max_frame` is skipped to its delimiter, never buffered.
    frames: wire::FrameDecoder<wire::GrowingFrameBuffer>,
    tx: Vec<u8>,
    seq: u32,
    welcome: Welcome,
    max_frame: usize,
    reply_timeout: Duration,
    /// The reply buffers given back by the records cut from them, for the next frames.
    pool: std::sync::Arc<pool::BufferPool>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("welcome", &self.welcome)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The gateway's `Welcome`.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    fn next_seq(&mut self) -> u32 {
        bump_seq(&mut self.seq)
    }

    async fn send<T: serde::Serialize + ?Sized>(&mut self, req: &T) -> Result<(), ClientError> {
        loop {
            match wire::encode_frame(req, &mut self.tx) {
                Ok(n) => return self.io.write_all(&self.tx[..n]).await,
                Err(e) => {
                    // Grow up to the frame limit, then give up.
                    let limit = self.max_frame.max(1024);
                    if self.tx.len() >= limit {
                        return Err(ClientError::Encode(e));
                    }
                    let new = (self.tx.len() * 2).min(limit);
                    self.tx.resize(new, 0);
                }
            }
        }
    }

    /// Receives the reply to `seq` (or the `Welcome` when `None`), skipping replies to other
    /// sequence numbers (late answers to requests given up on).
    async fn recv(&mut self, seq: Option<u32>, timeout: Duration) -> Result<Reply, ClientError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let (got, owned) = self.recv_any(deadline, timeout).await?;
            if got == seq {
                return Ok(owned);
            }
            // The handshake's refusal (`Unauthorized`, `UnsupportedVersion`) has seq 0.
            if seq.is_none() && got == Some(0) && matches!(owned, Reply::Error { .. }) {
                return Ok(owned);
            }
            if seq.is_some() && refuses_our_frame(got, &owned) {
                return Err(bad_frame());
            }
            log::debug!("ignoring a reply to seq {got:?}");
        }
    }

    /// Receives the next reply, whatever its `seq`, before `deadline` (`timeout` is for the
    /// error message).
    async fn recv_any(
        &mut self,
        deadline: std::time::Instant,
        timeout: Duration,
    ) -> Result<(Option<u32>, Reply), ClientError> {
        self.recv_any_ahead(deadline, timeout, None)
            .await
            .map(|(seq, reply, _)| (seq, reply))
    }

    /// Sends the fetch `ahead` describes from `from`; its `(seq, from)`, or `None` when the
    /// request does not fit the send buffer (1 KiB at least, far more than a fetch takes).
    async fn send_ahead(
        &mut self,
        a: &FetchAhead<'_>,
        from: u64,
    ) -> Result<Option<(u32, u64)>, ClientError> {
        let seq = bump_seq(&mut self.seq);
        let req = Request::Fetch {
            seq,
            consumer: a.consumer,
            from_offset: from,
            max_bytes: a.max_bytes.max(1),
            wait_ms: a.wait_ms(),
        };
        let Ok(n) = wire::encode_frame(&req, &mut self.tx) else {
            return Ok(None);
        };
        self.io.write_all(&self.tx[..n]).await?;
        Ok(Some((seq, from)))
    }

    /// [`Client::recv_any`], and with `ahead`, when the reply is the one `ahead` waits for
    /// and holds records, sends the fetch that continues after them (see
    /// [`FetchAhead`]) as soon as the frame's header has arrived (before the rest of the
    /// frame, and before its records are copied out of it); returns that fetch's
    /// `(seq, from_offset)` if one was sent.
    async fn recv_any_ahead(
        &mut self,
        deadline: std::time::Instant,
        timeout: Duration,
        ahead: Option<&FetchAhead<'_>>,
    ) -> Result<(Option<u32>, Reply, Option<(u32, u64)>), ClientError> {
        // The fetch sent ahead on the header of the frame still arriving: `(seq, from)`.
        let mut early: Option<(u32, u64)> = None;
        loop {
            while self.rx_pos < self.rx_len {
                // A frame starting in what was read: when it is the reply `ahead` follows,
                // the next fetch goes out on its header, before the frame is decoded.
                if early.is_none()
                    && self.frames.pending() == 0
                    && let Some(a) = ahead
                {
                    // Past any spare delimiters before the frame.
                    let input = &self.rx[self.rx_pos..self.rx_len];
                    let start = input.iter().position(|&b| b != 0).unwrap_or(input.len());
                    if let Some(from) = a.next_after_start(&input[start..]) {
                        early = self.send_ahead(a, from).await?;
                    }
                }
                let input = &self.rx[self.rx_pos..self.rx_len];
                match self.frames.feed(input) {
                    wire::FeedResult::Consumed => {
                        self.rx_pos = self.rx_len;
                        break;
                    }
                    wire::FeedResult::Frame { remaining, .. } => {
                        self.rx_pos = self.rx_len - remaining.len();
                    }
                    wire::FeedResult::Error { error, remaining } => {
                        self.rx_pos = self.rx_len - remaining.len();
                        log::debug!("dropping a bad frame from the gateway: {error}");
                        continue;
                    }
                }
                // The decoded message moves out of the splitter's buffer, and a reply's
                // payloads are handed on as slices of it, not copied.
                let pool = &self.pool;
                let Some(message) = self
                    .frames
                    .take_message_replacing(|| pool.take())
                    .map(|m| pool.wrap(m))
                else {
                    continue;
                };
                let (resp, rest): (Response<'_>, _) = match wire::take_message(&message) {
                    Ok(r) => r,
                    Err(e) => {
                        log::debug!("dropping a reply that does not decode: {e}");
                        continue;
                    }
                };
                // The fetch ahead went out when this reply's header came in, or goes out
                // now; the gateway reads its records while these are made owned and
                // handed on.
                let mut sent = early.take();
                if sent.is_none()
                    && let Some(a) = ahead
                    && let Some(from) = a.next_after(&resp)
                {
                    sent = self.send_ahead(a, from).await?;
                }
                let mut owned = own(resp, &message)?;
                if let Reply::Fetch(FetchReply::Records { records, .. }) = &owned
                    && records.is_empty()
                {
                    // Caught up with the log: what the pool keeps goes back.
                    self.pool.clear();
                }
                // Version 3 appends the producer window to the Welcome.
                if let Reply::Welcome(w) = &mut owned
                    && w.protocol_version >= 3
                {
                    let ext: wire::WelcomeV3 = postcard::from_bytes(rest).map_err(|e| {
                        ClientError::Protocol(format!("version 3 welcome fields: {e}"))
                    })?;
                    w.producer_window = Some(ext.producer_window);
                }
                // Version 3 appends the `full` flag to the StatsReply; a gateway from before
                // it sends nothing there.
                if let Reply::Stats { full, .. } = &mut owned
                    && !rest.is_empty()
                    && let Ok(ext) = postcard::from_bytes::<wire::StatsV3>(rest)
                {
                    *full = Some(ext.full);
                }
                return Ok((resp.seq(), owned, sent));
            }
            // A reply still arriving (its start came in a read too short for its header):
            // when it is the one `ahead` follows, its header says where the next fetch
            // starts, so that fetch goes out now and the gateway reads it while the rest of
            // this frame comes in and is decoded. Should this frame then fail its CRC, the
            // reply it announces never comes and the wait for it times out, as it would
            // without the early fetch.
            if early.is_none()
                && let Some(a) = ahead
                && let Some(from) = a.next_after_start(self.frames.partial())
            {
                early = self.send_ahead(a, from).await?;
            }
            self.rx_len = 0;
            self.rx_pos = 0;
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(ClientError::Timeout(timeout));
            }
            let n = with_timeout(deadline - now, self.io.read(&mut self.rx[..]))
                .await
                .map_err(|e| match e {
                    ClientError::Timeout(_) => ClientError::Timeout(timeout),
                    e => e,
                })?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            self.rx_len = n;
        }
    }

    /// Publishes `records` (producer, timestamp in µs since the Unix epoch or `None` for the
    /// gateway's clock, payload) to `topic` pipelined: every request is sent, then the
    /// replies are collected (any order). Each record carries its own producer (id and
    /// sequence),
    /// so a resend of some records of an earlier batch keeps their sequences. Returns one
    /// result per record, in order, with `Ok(None)` for `AckLevel::None`. A connection
    /// failure returns `Err` with the results gathered so far (the rest unknown).
    ///
    /// With `epoch` (a session from [`Client::open_session`]) the records that carry a
    /// producer are sent as session publishes (`SessionPublish`, protocol version 3).
    pub async fn publish_batch(
        &mut self,
        topic: &str,
        records: &[(Option<Producer>, Option<u64>, &[u8])],
        ack: AckLevel,
        epoch: Option<u32>,
    ) -> Result<Vec<PublishResult>, (Vec<Option<PublishResult>>, ClientError)> {
        let mut results: Vec<Option<PublishResult>> = (0..records.len()).map(|_| None).collect();
        let mut seqs = std::collections::HashMap::with_capacity(records.len());
        for (i, &(producer, timestamp_us, p)) in records.iter().enumerate() {
            let seq = self.next_seq();
            let req = match (producer, epoch) {
                (Some(pr), Some(epoch)) => Request::SessionPublish {
                    seq,
                    topic,
                    timestamp_us,
                    payload: p,
                    ack,
                    producer: wire::SessionProducer {
                        id: pr.id,
                        epoch,
                        seq: pr.seq,
                    },
                },
                _ => Request::Publish {
                    seq,
                    topic,
                    timestamp_us,
                    payload: p,
                    ack,
                    producer,
                },
            };
            if let Err(e) = self.send(&req).await {
                if e.connection_ok() || matches!(e, ClientError::Encode(_)) {
                    results[i] = Some(Err(e));
                    continue;
                }
                return Err((results, e));
            }
            if ack == AckLevel::None {
                results[i] = Some(Ok(None));
            } else {
                seqs.insert(seq, i);
            }
        }
        let deadline = std::time::Instant::now() + self.reply_timeout;
        while !seqs.is_empty() {
            let (seq, owned) = match self.recv_any(deadline, self.reply_timeout).await {
                Ok(x) => x,
                Err(e) => return Err((results, e)),
            };
            let Some(i) = seq.and_then(|s| seqs.remove(&s)) else {
                continue;
            };
            results[i] = Some(match owned {
                Reply::Ack(a) => Ok(Some(a)),
                Reply::Error { code, message } => Err(ClientError::Gateway { code, message }),
                _ => Err(ClientError::Protocol("expected Ack".into())),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ClientError::Protocol("no reply".into()))))
            .collect())
    }

    /// Sends the request `make` builds with the connection's next `seq`, without waiting
    /// for its reply; returns that `seq`. The replies come from [`Client::next_reply`].
    ///
    /// Errors: [`ClientError::Encode`] for a request larger than the gateway's frame limit
    /// (nothing sent; the connection stays usable), I/O.
    pub async fn send_request<'r>(
        &mut self,
        make: impl FnOnce(u32) -> Request<'r>,
    ) -> Result<u32, ClientError> {
        let seq = self.next_seq();
        self.send(&make(seq)).await?;
        Ok(seq)
    }

    /// Sends `bytes` as they are: noise, a damaged or hand-made frame (tests of how a
    /// gateway takes bad input). Errors: I/O.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.io.write_all(bytes).await
    }

    /// The next reply the gateway sends, whatever request it answers, with the `seq` it
    /// carries (`Some(0)` for an error about a frame that named no request), waiting at
    /// most `wait`: `Ok(None)` if none came by then, and the connection stays usable (no
    /// byte is lost to the wait). Frames that do not decode are skipped.
    ///
    /// Errors: [`ClientError::Closed`], [`ClientError::Protocol`] for a reply that fails
    /// the checks of [`decode_reply`], I/O.
    pub async fn next_reply(
        &mut self,
        wait: Duration,
    ) -> Result<Option<(Option<u32>, Reply)>, ClientError> {
        match self.recv_any(std::time::Instant::now() + wait, wait).await {
            Ok(r) => Ok(Some(r)),
            Err(ClientError::Timeout(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn call(&mut self, req: Request<'_>, extra: Duration) -> Result<Reply, ClientError> {
        let seq = req.seq();
        self.send(&req).await?;
        match self.recv(seq, self.reply_timeout + extra).await? {
            Reply::Error { code, message } => Err(ClientError::Gateway { code, message }),
            other => Ok(other),
        }
    }

    /// Publishes one record and waits for its acknowledgement; with `AckLevel::None` it
    /// only sends (the gateway answers nothing) and returns offset `u64::MAX`.
    pub async fn publish(
        &mut self,
        topic: &str,
        timestamp_us: Option<u64>,
        payload: &[u8],
        ack: AckLevel,
        producer: Option<Producer>,
    ) -> Result<PublishAck, ClientError> {
        let seq = self.next_seq();
        let req = Request::Publish {
            seq,
            topic,
            timestamp_us,
            payload,
            ack,
            producer,
        };
        if ack == AckLevel::None {
            self.send(&req).await?;
            return Ok(PublishAck {
                offset: u64::MAX,
                duplicate: false,
            });
        }
        match self.call(req, Duration::ZERO).await? {
            Reply::Ack(a) => Ok(a),
            _ => Err(ClientError::Protocol("expected Ack".into())),
        }
    }

    /// Opens a producer session for `producer_id` (`resume`: continues the id's current
    /// session). Errors: [`ClientError::Protocol`] if the gateway speaks a protocol version
    /// before 3 (no sessions), gateway errors (`Full`, `StorageFailed`, …), I/O.
    pub async fn open_session(
        &mut self,
        producer_id: u64,
        resume: bool,
    ) -> Result<SessionInfo, ClientError> {
        if self.welcome.protocol_version < 3 {
            return Err(ClientError::Protocol(format!(
                "the gateway speaks protocol version {}; producer sessions need version 3",
                self.welcome.protocol_version
            )));
        }
        let seq = self.next_seq();
        let req = Request::OpenSession {
            seq,
            producer_id,
            resume,
        };
        match self.call(req, Duration::ZERO).await? {
            Reply::Session(s) if s.producer_id == producer_id => Ok(s),
            _ => Err(ClientError::Protocol("expected Session".into())),
        }
    }

    /// The first offset whose record is stamped at or after `timestamp_us` (µs since the
    /// Unix epoch), in offset order from the log's first offset; the log's next offset if
    /// no record is (see `FindOffset` in `core/PROTOCOL.md`: stamps need not grow with the
    /// offset). The gateway searches in steps of a bounded number of bytes; this asks again
    /// until it is done.
    ///
    /// Errors: [`ClientError::Unsupported`] if the gateway speaks a protocol version before
    /// 4, [`ClientError::Protocol`] for a step that does not move forward, gateway errors,
    /// I/O.
    pub async fn find_offset(&mut self, timestamp_us: u64) -> Result<u64, ClientError> {
        let spoken = self.welcome.protocol_version;
        if spoken < wire::FIND_OFFSET_VERSION {
            return Err(ClientError::Unsupported {
                what: "finding an offset by time",
                needed: wire::FIND_OFFSET_VERSION,
                spoken,
            });
        }
        let mut from = 0u64;
        loop {
            let seq = self.next_seq();
            let req = Request::FindOffset {
                seq,
                timestamp_us,
                from_offset: from,
            };
            match self.call(req, Duration::ZERO).await? {
                Reply::FoundOffset { offset, done: true } => return Ok(offset),
                Reply::FoundOffset {
                    offset,
                    done: false,
                } if offset > from => from = offset,
                Reply::FoundOffset {
                    offset,
                    done: false,
                } => {
                    return Err(ClientError::Protocol(format!(
                        "FindOffset from {from} did not move forward (answered {offset}, not done)"
                    )));
                }
                _ => return Err(ClientError::Protocol("expected FoundOffset".into())),
            }
        }
    }

    /// Commits `offset` for `consumer`; returns the committed offset after the request.
    pub async fn commit(&mut self, consumer: &str, offset: u64) -> Result<u64, ClientError> {
        let seq = self.next_seq();
        match self
            .call(
                Request::Commit {
                    seq,
                    consumer,
                    offset,
                },
                Duration::ZERO,
            )
            .await?
        {
            Reply::Committed(o) => Ok(o),
            _ => Err(ClientError::Protocol("expected Committed".into())),
        }
    }

    /// The gateway's counters.
    pub async fn stats(&mut self) -> Result<GatewayStats, ClientError> {
        self.stats_and_full().await.map(|(s, _)| s)
    }

    /// The gateway's counters and whether its log is full (new records refused `Full`
    /// under `reject-new`); `None` for a gateway that does not say (before protocol
    /// version 3's `full` flag).
    pub async fn stats_and_full(&mut self) -> Result<(GatewayStats, Option<bool>), ClientError> {
        let seq = self.next_seq();
        match self.call(Request::Stats { seq }, Duration::ZERO).await? {
            Reply::Stats { stats, full } => Ok((stats, full)),
            _ => Err(ClientError::Protocol("expected StatsReply".into())),
        }
    }

    /// The gateway's consumers.
    pub async fn consumers(&mut self) -> Result<Vec<ConsumerInfo>, ClientError> {
        let seq = self.next_seq();
        match self
            .call(Request::ListConsumers { seq }, Duration::ZERO)
            .await?
        {
            Reply::Consumers(c) => Ok(c),
            _ => Err(ClientError::Protocol("expected Consumers".into())),
        }
    }

    /// Deletes a consumer; returns whether it existed.
    pub async fn delete_consumer(&mut self, consumer: &str) -> Result<bool, ClientError> {
        let seq = self.next_seq();
        match self
            .call(Request::DeleteConsumer { seq, consumer }, Duration::ZERO)
            .await?
        {
            Reply::Deleted(e) => Ok(e),
            _ => Err(ClientError::Protocol("expected Deleted".into())),
        }
    }

    /// Deletes a consumer unless it is the gateway's only one, checked and deleted by the
    /// gateway in one step; returns whether it existed.
    ///
    /// Errors: [`ClientError::Gateway`] with [`ErrorCode::LastConsumer`] (nothing deleted)
    /// for the only consumer, [`ClientError::Unsupported`] if the gateway speaks a protocol
    /// version before 5, other gateway errors, I/O.
    pub async fn delete_consumer_if_not_last(
        &mut self,
        consumer: &str,
    ) -> Result<bool, ClientError> {
        let spoken = self.welcome.protocol_version;
        if spoken < wire::GUARDED_DELETE_VERSION {
            return Err(ClientError::Unsupported {
                what: "deleting a consumer unless it is the last one",
                needed: wire::GUARDED_DELETE_VERSION,
                spoken,
            });
        }
        let seq = self.next_seq();
        match self
            .call(
                Request::DeleteConsumerIfNotLast { seq, consumer },
                Duration::ZERO,
            )
            .await?
        {
            Reply::Deleted(e) => Ok(e),
            _ => Err(ClientError::Protocol("expected Deleted".into())),
        }
    }
}

/// The next request `seq` after `seq` (never 0), stored back.
fn bump_seq(seq: &mut u32) -> u32 {
    *seq = seq.wrapping_add(1);
    if *seq == 0 {
        *seq = 1;
    }
    *seq
}

/// Whether `reply`, which carries `got`, is the gateway's `BadFrame` error about a frame
/// of ours it could not decode (seq 0: the frame named no request it could read).
fn refuses_our_frame(got: Option<u32>, reply: &Reply) -> bool {
    got == Some(0)
        && matches!(
            reply,
            Reply::Error {
                code: ErrorCode::BadFrame,
                ..
            }
        )
}

/// The error for a reply that [`refuses_our_frame`].
fn bad_frame() -> ClientError {
    ClientError::Protocol("gateway could not decode our frame".into())
}

async fn with_timeout<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    smol::future::or(f, async {
        smol::Timer::after(d).await;
        Err(ClientError::Timeout(d))
    })
    .await
}

/// Formats a log id as 32 lowercase hex digits.
pub fn log_id_hex(id: u128) -> String {
    format!("{id:032x}")
}

#[cfg(test)]
mod reply_tests;
#[cfg(test)]
mod tests;

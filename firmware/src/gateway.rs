//! The sans-IO gateway core: one request (or one text line) in, one reply out.
//!
//! [`Gateway`] holds the settings and counters shared by every connection; [`Conn`] holds
//! what one connection has negotiated (the handshake). The caller owns the transport and
//! the clocks and passes each decoded request with `&mut` [`Log`], the monotonic time
//! `now_us` (µs, used for linger and long-poll deadlines) and the wall clock `wall_us`
//! (µs since the Unix epoch, used to stamp records that carry no timestamp).
//!
//! ## Group commit
//! A publish with [`AckLevel::Durable`] does not flush the log itself. It returns
//! [`Outcome::ReplyWhenDurable`]: the acknowledgement is already encoded, and may be sent
//! once [`Log::durable_offset`] is above `offset`. A caller applies every request it has at
//! hand, calls [`Log::flush`] once, and then sends all the acknowledgements that became
//! releasable: one flash write and one sync for the whole group.
//!
//! ## Long polls
//! A fetch that finds nothing and asks to wait returns [`Outcome::Park`]. The caller keeps
//! the request and handles it again, with `wait_ms` cleared, once the log's next offset
//! passes `from_offset` or the deadline is reached. A caller that cannot park (a blocking
//! session) may handle it again at once.

use core::fmt::Write as _;

use crate::roles::Roles;
use spillway_core::error::{AppendError, CommitError, ReadError, SessionError};
use spillway_core::log::{self as clog, Log, Record};
use spillway_core::storage::Flash;
use spillway_core::wire::{
    self, AckLevel, ConsumerEntry, ConsumerList, ErrorCode, FrameError, GatewayStats, HelloV3,
    ListWriter, PROTOCOL_VERSION, RecordView, RecordsWriter, Request, Response, StatsV3, WelcomeV3,
    encode_frame,
};

/// Longest gateway id, bytes of UTF-8.
pub const MAX_GATEWAY_ID_LEN: usize = 64;

/// Smallest reply buffer [`Gateway`] works with, bytes (room for any error reply).
pub const MIN_REPLY_BUFFER: usize = 256;

/// Bytes of record encodings one [`Request::FindOffset`] looks at (plus the rest of the
/// last read buffer) before it answers "not done, ask again from here": the other
/// connections wait at most one step for the log. On a 1 GiB file image a step took
/// 1.6 ms on average and 25 ms at the longest on a shared 2-core machine
/// (`core/tests/find_cost.rs`).
pub const FIND_STEP_BYTES: usize = 64 * 1024;

/// Longest error message sent, bytes.
const MAX_ERROR_MESSAGE: usize = 160;

/// Settings of a gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Name announced in the `Welcome` (e.g. the host name), at most
    /// [`MAX_GATEWAY_ID_LEN`] bytes.
    pub gateway_id: heapless::String<MAX_GATEWAY_ID_LEN>,
    /// Largest payload a publish or a line may carry, bytes.
    pub max_record_bytes: u32,
    /// Largest frame accepted or sent, bytes on the wire (COBS, CRC and delimiter
    /// included). Reply buffers passed to the gateway should be this long.
    pub max_frame_bytes: u32,
    /// Acknowledgement level of line-mode records (lines get no reply; `Durable` makes the
    /// caller flush after them, see [`LineAccepted::durable`]) and of publishes that ask for
    /// [`AckLevel::GatewayDefault`].
    pub default_ack: AckLevel,
}

impl GatewayConfig {
    /// A configuration with the given id (cut to [`MAX_GATEWAY_ID_LEN`] bytes at a
    /// character boundary), record and frame limits in bytes, and `Buffered` lines.
    pub fn new(gateway_id: &str, max_record_bytes: u32, max_frame_bytes: u32) -> Self {
        let mut id = heapless::String::new();
        for ch in gateway_id.chars() {
            if id.push(ch).is_err() {
                break;
            }
        }
        GatewayConfig {
            gateway_id: id,
            max_record_bytes,
            max_frame_bytes,
            default_ack: AckLevel::Buffered,
        }
    }

    /// Frame size in bytes needed to carry a `Records` reply with one record of
    /// `max_record_bytes` payload, the longest topic and a producer: the least
    /// `max_frame_bytes` that lets every stored record be fetched.
    pub const fn min_frame_bytes(max_record_bytes: u32) -> u32 {
        // RecordView: offset (10) + crc (5) + topic (3 + 255) + timestamp (10) +
        // producer (1 + 10 + 5) + payload length (5) + payload.
        let record = max_record_bytes as usize + 304;
        wire::max_encoded_len(wire::RECORDS_HEADER_MAX + record) as u32
    }
}

/// Counters kept by the gateway since start (the log keeps its own in [`clog::Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GatewayCounters {
    /// Frames received (decoded or not).
    pub frames_received: u64,
    /// Frames rejected: COBS, CRC, message decoding, oversize.
    pub frames_rejected: u64,
    /// Publishes and lines rejected because the log was full (`reject-new`).
    pub rejected_full: u64,
    /// Publishes and lines rejected as too large.
    pub rejected_too_large: u64,
    /// Other rejected publishes and lines (bad topic, empty line, …).
    pub rejected_invalid: u64,
    /// Lines stored as records.
    pub lines_accepted: u64,
    /// Publishes whose append failed in the log (flash errors).
    pub internal_errors: u64,
    /// Resends older than the producer's remembered window, answered with
    /// `DuplicateSequenceUnknownOffset` (already stored; nothing appended).
    pub duplicates_unknown_offset: u64,
    /// Unclean shutdowns detected at mount (set by the caller).
    pub unclean_mounts: u64,
    /// Session publishes refused as out of sequence (neither the next sequence nor a
    /// stored one; the producer resends in order).
    pub out_of_sequence: u64,
    /// Publishes refused because a newer session owns the producer id, or under a session
    /// the gateway did not open.
    pub fenced: u64,
    /// Requests refused because the connection's [`Roles`] do not allow them
    /// ([`ErrorCode::Forbidden`]; nothing read or changed).
    pub forbidden: u64,
    /// Handshakes refused for their credential ([`ErrorCode::Unauthorized`]).
    pub unauthorized: u64,
}

/// What one connection negotiated, and what it may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Conn {
    /// The protocol version agreed in the handshake; `None` before it.
    pub protocol_version: Option<u16>,
    /// What the connection may ask, checked per request ([`Roles::ALL`] by default). The
    /// caller sets it from the listener and, once it has judged the `Hello`'s credential,
    /// from the credential.
    pub roles: Roles,
    /// How the `Hello`'s credential is judged.
    pub auth: Auth,
}

impl Conn {
    /// A connection that may do what `roles` allow, with credentials not configured.
    pub fn with_roles(roles: Roles) -> Self {
        Conn {
            roles,
            ..Conn::default()
        }
    }
}

/// The verdict on a connection's credential. Checking a credential (hashing a token,
/// verifying a certificate) is the caller's: it sets [`Conn::auth`] and [`Conn::roles`]
/// before handing the `Hello` to [`Gateway::handle_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Auth {
    /// No credentials are configured: a `Hello` with a non-empty credential is refused with
    /// [`ErrorCode::Unauthorized`], one without completes the handshake.
    #[default]
    NotConfigured,
    /// The caller accepted the credential (or the listener admits the peer without one):
    /// the handshake completes under [`Conn::roles`].
    Accepted,
    /// The caller refused the credential (wrong, or none on a listener that requires one):
    /// the `Hello` gets [`ErrorCode::Unauthorized`] with this message and the connection
    /// stays without a handshake.
    Refused(&'static str),
}

/// What to do with the reply the gateway put into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Send the first `len` bytes of the reply buffer now.
    Reply {
        /// Frame length, bytes.
        len: usize,
    },
    /// Nothing to send (a publish with acknowledgement level `none`).
    NoReply,
    /// Send the first `len` bytes once [`Log::durable_offset`] `> offset` (flush first).
    ReplyWhenDurable {
        /// Frame length, bytes.
        len: usize,
        /// Offset that must be durable.
        offset: u64,
    },
    /// A long-poll fetch found nothing at `from_offset`: handle the request again with
    /// `wait_ms` cleared when the log's next offset passes `from_offset` or at
    /// `deadline_us` (monotonic µs), whichever comes first. The buffer holds nothing.
    Park {
        /// The offset the fetch waits for.
        from_offset: u64,
        /// When to answer anyway, µs of the monotonic clock.
        deadline_us: u64,
    },
}

/// A line stored as a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineAccepted {
    /// The record's offset.
    pub offset: u64,
    /// The gateway's default acknowledgement level is `Durable`: flush soon.
    pub durable: bool,
}

/// Why a line was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineRejected {
    /// Empty, no topic, no payload, or a topic that is not UTF-8.
    Malformed(wire::LineError),
    /// The payload is above `max_record_bytes`.
    TooLarge {
        /// Payload length, bytes.
        len: usize,
        /// The limit, bytes.
        max: u32,
    },
    /// The topic is longer than the log allows.
    BadTopic,
    /// The log is full (`reject-new`).
    Full,
    /// A flash error.
    Internal,
}

impl LineRejected {
    /// A short reason, for logs and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            LineRejected::Malformed(_) => "malformed",
            LineRejected::TooLarge { .. } => "too_large",
            LineRejected::BadTopic => "bad_topic",
            LineRejected::Full => "full",
            LineRejected::Internal => "internal",
        }
    }
}

/// The gateway: settings and counters shared by all connections.
#[derive(Debug, Clone)]
pub struct Gateway {
    cfg: GatewayConfig,
    counters: GatewayCounters,
    started_us: u64,
    /// The log's `records_appended` when an append was last refused `Full`: the log is
    /// full while no record has been appended since.
    full_at: Option<u64>,
}

type Message = heapless::String<MAX_ERROR_MESSAGE>;

/// Why the log did not take a record.
struct Rejected {
    code: ErrorCode,
    message: Message,
    /// For a resend older than the producer's remembered window: the record is stored
    /// below this offset.
    stored_below: Option<u64>,
}

fn message(args: core::fmt::Arguments<'_>) -> Message {
    let mut m = Message::new();
    // A message longer than the buffer is cut; that is fine for a human-readable detail.
    let _ = m.write_fmt(args);
    m
}

impl Gateway {
    /// A gateway started at monotonic time `now_us`.
    pub fn new(cfg: GatewayConfig, now_us: u64) -> Self {
        Gateway {
            cfg,
            counters: GatewayCounters::default(),
            started_us: now_us,
            full_at: None,
        }
    }

    /// Whether the log is full: the last append was refused `Full` (policy `reject-new`)
    /// and no record has been appended since.
    pub fn is_full<F: Flash>(&self, log: &Log<'_, F>) -> bool {
        self.full_at == Some(log.stats().records_appended)
    }

    /// The settings.
    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// Counters since start.
    pub fn counters(&self) -> GatewayCounters {
        self.counters
    }

    /// Mutable counters, for the transport-level counts a caller keeps (unclean mounts,
    /// frames it rejected itself).
    pub fn counters_mut(&mut self) -> &mut GatewayCounters {
        &mut self.counters
    }

    /// Handles one received frame's message bytes (postcard, CRC already checked and
    /// stripped, as [`wire::FeedResult::Frame`] gives them). A message that does not decode
    /// gets a `BadFrame` error with `seq` 0.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_message<F: Flash>(
        &mut self,
        conn: &mut Conn,
        msg: &[u8],
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        self.counters.frames_received += 1;
        match wire::take_message::<Request<'_>>(msg) {
            Ok((req, rest)) => {
                if let Request::Hello {
                    protocol_version, ..
                } = req
                {
                    // Version 3 appends a credential to the Hello.
                    let mut presented = false;
                    if protocol_version >= 3 && !rest.is_empty() {
                        match postcard::from_bytes::<HelloV3<'_>>(rest) {
                            Ok(h) => presented = h.credential.is_some_and(|c| !c.is_empty()),
                            Err(e) => {
                                self.counters.frames_rejected += 1;
                                let m = message(format_args!("hello fields do not decode: {e}"));
                                return error_reply(out, 0, ErrorCode::BadFrame, &m);
                            }
                        }
                    }
                    let refused = match conn.auth {
                        // Never ignored: a client that sends one expects it to count.
                        Auth::NotConfigured if presented => {
                            Some("credentials are not configured on this gateway")
                        }
                        Auth::Refused(why) => Some(why),
                        Auth::NotConfigured | Auth::Accepted => None,
                    };
                    if let Some(why) = refused {
                        self.counters.unauthorized += 1;
                        warn!("handshake refused: {}", why);
                        let code = ErrorCode::Unauthorized.for_version(protocol_version);
                        return error_reply(out, 0, code, why);
                    }
                }
                self.handle_request(conn, &req, log, now_us, wall_us, scratch, out)
            }
            Err(e) => {
                self.counters.frames_rejected += 1;
                debug!("undecodable message of {} bytes", msg.len());
                let m = message(format_args!("message does not decode: {e}"));
                error_reply(out, 0, ErrorCode::BadFrame, &m)
            }
        }
    }

    /// Replies to a frame that failed before decoding (oversize, COBS, CRC): `TooLarge`
    /// for an oversize frame (its message names the frame's length and `max_frame_bytes`,
    /// both counted on the wire with the delimiter), `BadFrame` otherwise, with `seq` 0.
    /// Counts it as received and rejected.
    pub fn frame_error(&mut self, err: &FrameError, out: &mut [u8]) -> Outcome {
        self.counters.frames_received += 1;
        self.counters.frames_rejected += 1;
        let (code, m) = match *err {
            // The decoder counts a frame without its delimiter; the limit a client knows is
            // the Welcome's `max_frame_bytes`, delimiter included: name that one.
            FrameError::Oversize { len, .. } => (
                ErrorCode::TooLarge,
                message(format_args!(
                    "frame of {} bytes on the wire exceeds max_frame_bytes {} (delimiter included)",
                    len.saturating_add(1),
                    self.cfg.max_frame_bytes
                )),
            ),
            _ => (ErrorCode::BadFrame, message(format_args!("{err}"))),
        };
        error_reply(out, 0, code, &m)
    }

    /// Handles one decoded request. `scratch` is the read buffer of a fetch (at least
    /// [`Log::max_record_len`] bytes, best as long as `out`); `out` receives the reply
    /// frame (at least [`MIN_REPLY_BUFFER`] bytes; `max_frame_bytes` long to use the whole
    /// frame budget).
    #[allow(clippy::too_many_arguments)]
    pub fn handle_request<F: Flash>(
        &mut self,
        conn: &mut Conn,
        req: &Request<'_>,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        if let Request::Hello {
            protocol_version, ..
        } = *req
        {
            if protocol_version == 0 {
                let m = message(format_args!(
                    "protocol version {protocol_version} unsupported; this gateway speaks 1..={PROTOCOL_VERSION}"
                ));
                return error_reply(out, 0, ErrorCode::UnsupportedVersion, &m);
            }
            let v = protocol_version.min(PROTOCOL_VERSION);
            conn.protocol_version = Some(v);
            let welcome = Response::Welcome {
                protocol_version: v,
                log_id: log.log_id(),
                gateway_id: &self.cfg.gateway_id,
                max_record_bytes: self.cfg.max_record_bytes,
                max_frame_bytes: self.cfg.max_frame_bytes,
            };
            if v >= 3 {
                let ext = WelcomeV3 {
                    producer_window: clog::PRODUCER_WINDOW as u32,
                };
                return match encode_frame(&(welcome, ext), out) {
                    Ok(len) => Outcome::Reply { len },
                    Err(_) => Outcome::NoReply,
                };
            }
            return reply(out, &welcome);
        }
        if conn.protocol_version.is_none() {
            let ack_none = matches!(
                req,
                Request::Publish {
                    ack: AckLevel::None,
                    ..
                }
            );
            if ack_none {
                return Outcome::NoReply;
            }
            return error_reply(out, 0, ErrorCode::NotHandshaken, "send Hello first");
        }
        let version = conn.protocol_version.unwrap_or(1);
        if let Err(role) = conn.roles.check(req) {
            self.counters.forbidden += 1;
            let ack_none = matches!(
                req,
                Request::Publish {
                    ack: AckLevel::None,
                    ..
                } | Request::SessionPublish {
                    ack: AckLevel::None,
                    ..
                }
            );
            if ack_none {
                return Outcome::NoReply;
            }
            let m = message(format_args!(
                "this connection lacks the {} role for this request",
                role.name()
            ));
            let code = ErrorCode::Forbidden.for_version(version);
            return error_reply(out, req.seq().unwrap_or(0), code, &m);
        }
        match *req {
            Request::Hello { .. } => Outcome::NoReply, // handled above
            Request::Publish {
                seq,
                topic,
                timestamp_us,
                payload,
                ack,
                producer,
            } => {
                let rec = Record {
                    topic,
                    timestamp_us: timestamp_us.unwrap_or(wall_us),
                    producer,
                    payload,
                };
                self.publish(seq, &rec, 0, ack, version, log, now_us, out)
            }
            Request::SessionPublish {
                seq,
                topic,
                timestamp_us,
                payload,
                ack,
                producer,
            } => {
                let rec = Record {
                    topic,
                    timestamp_us: timestamp_us.unwrap_or(wall_us),
                    producer: Some(clog::Producer {
                        id: producer.id,
                        seq: producer.seq,
                    }),
                    payload,
                };
                // Epoch 0 is the legacy rule; a session never has it.
                if producer.epoch == 0 {
                    if ack == AckLevel::None {
                        return Outcome::NoReply;
                    }
                    return error_reply(out, seq, ErrorCode::BadRequest, "session epoch 0");
                }
                self.publish(seq, &rec, producer.epoch, ack, version, log, now_us, out)
            }
            Request::OpenSession {
                seq,
                producer_id,
                resume,
            } => match log.open_session(now_us, producer_id, resume) {
                Ok(s) => {
                    info!(
                        "producer {}: session {} (resumed: {}, last sequence {})",
                        producer_id, s.epoch, s.resumed, s.last_seq
                    );
                    reply(
                        out,
                        &Response::Session {
                            seq,
                            producer_id,
                            epoch: s.epoch,
                            last_seq: s.last_seq,
                            resumed: s.resumed,
                        },
                    )
                }
                Err(e) => {
                    let m = message(format_args!("{e}"));
                    let code = match e {
                        SessionError::Full => ErrorCode::Full,
                        SessionError::EpochsExhausted { .. } => ErrorCode::BadRequest,
                        _ => ErrorCode::StorageFailed.for_version(version),
                    };
                    error_reply(out, seq, code, &m)
                }
            },
            Request::Fetch {
                seq,
                consumer,
                from_offset,
                max_bytes,
                wait_ms,
            } => self.fetch(
                seq,
                consumer,
                from_offset,
                max_bytes,
                wait_ms,
                log,
                now_us,
                scratch,
                out,
            ),
            Request::Commit {
                seq,
                consumer,
                offset,
            } => match log.commit(consumer, offset) {
                Ok(offset) => reply(
                    out,
                    &Response::Committed {
                        seq,
                        consumer,
                        offset,
                    },
                ),
                Err(e) => {
                    let code = match e {
                        CommitError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
                        CommitError::TooManyConsumers { .. } => ErrorCode::TooManyConsumers,
                        CommitError::BadName { .. } => ErrorCode::BadRequest,
                        // Flash errors, bad blocks, a poisoned log.
                        _ => ErrorCode::StorageFailed.for_version(version),
                    };
                    let m = message(format_args!("{e}"));
                    error_reply(out, seq, code, &m)
                }
            },
            Request::ListConsumers { seq } => {
                let mut w = ListWriter::<ConsumerEntry<'_>>::new(scratch);
                for (name, committed_offset) in log.consumers() {
                    if w.push(&ConsumerEntry {
                        name,
                        committed_offset,
                    })
                    .is_err()
                    {
                        break;
                    }
                }
                let list: ConsumerList<'_> = w.finish();
                reply(out, &Response::Consumers { seq, list })
            }
            Request::DeleteConsumer { seq, consumer } => match log.delete_consumer(consumer) {
                Ok(existed) => reply(out, &Response::Deleted { seq, existed }),
                Err(e) => {
                    let m = message(format_args!("{e}"));
                    let code = match e {
                        CommitError::BadName { .. } => ErrorCode::BadRequest,
                        _ => ErrorCode::StorageFailed.for_version(version),
                    };
                    error_reply(out, seq, code, &m)
                }
            },
            Request::FindOffset {
                seq,
                timestamp_us,
                from_offset,
            } => self.find_offset(seq, timestamp_us, from_offset, version, log, scratch, out),
            Request::Stats { seq } => {
                let stats = self.stats(log, now_us);
                let resp = Response::StatsReply { seq, stats };
                if version >= 3 {
                    let ext = StatsV3 {
                        full: self.is_full(log),
                    };
                    return match encode_frame(&(resp, ext), out) {
                        Ok(len) => Outcome::Reply { len },
                        Err(_) => Outcome::NoReply,
                    };
                }
                reply(out, &resp)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn publish<F: Flash>(
        &mut self,
        seq: u32,
        rec: &Record<'_>,
        epoch: u32,
        ack: AckLevel,
        version: u16,
        log: &mut Log<'_, F>,
        now_us: u64,
        out: &mut [u8],
    ) -> Outcome {
        let ack = match ack {
            AckLevel::GatewayDefault => self.cfg.default_ack,
            named => named,
        };
        let result = self.append(rec, epoch, log, now_us);
        let rejected = match result {
            Ok(a) => {
                return match ack {
                    AckLevel::None => Outcome::NoReply,
                    AckLevel::Buffered | AckLevel::GatewayDefault => reply(
                        out,
                        &Response::Ack {
                            seq,
                            offset: a.offset,
                            duplicate: a.duplicate,
                        },
                    ),
                    AckLevel::Durable => {
                        let r = reply(
                            out,
                            &Response::Ack {
                                seq,
                                offset: a.offset,
                                duplicate: a.duplicate,
                            },
                        );
                        match r {
                            Outcome::Reply { len } if log.durable_offset() <= a.offset => {
                                Outcome::ReplyWhenDurable {
                                    len,
                                    offset: a.offset,
                                }
                            }
                            other => other,
                        }
                    }
                };
            }
            Err(e) => e,
        };
        if ack == AckLevel::None {
            return Outcome::NoReply;
        }
        let r = error_reply(
            out,
            seq,
            rejected.code.for_version(version),
            &rejected.message,
        );
        // A resend older than the producer's remembered window is already stored below the
        // window's oldest record: a durable publish learns that only once that is durable.
        if let (AckLevel::Durable, Some(below)) = (ack, rejected.stored_below)
            && let Outcome::Reply { len } = r
            && log.durable_offset() < below
        {
            return Outcome::ReplyWhenDurable {
                len,
                offset: below - 1,
            };
        }
        r
    }

    /// Checks and appends one record, counting rejections.
    // No allocation here: the error message travels by value.
    #[allow(clippy::result_large_err)]
    fn append<F: Flash>(
        &mut self,
        rec: &Record<'_>,
        epoch: u32,
        log: &mut Log<'_, F>,
        now_us: u64,
    ) -> Result<clog::Appended, Rejected> {
        let max = self.cfg.max_record_bytes;
        if rec.payload.len() > max as usize {
            self.counters.rejected_too_large += 1;
            return Err(Rejected {
                code: ErrorCode::TooLarge,
                message: message(format_args!(
                    "payload of {} bytes exceeds max_record_bytes {max}",
                    rec.payload.len()
                )),
                stored_below: None,
            });
        }
        log.append_in_session(now_us, rec, epoch).map_err(|e| {
            let m = message(format_args!("{e}"));
            let mut below = None;
            let code = match e {
                AppendError::TooLarge { .. } => {
                    self.counters.rejected_too_large += 1;
                    ErrorCode::TooLarge
                }
                AppendError::BadTopic { .. } => {
                    self.counters.rejected_invalid += 1;
                    ErrorCode::BadRequest
                }
                AppendError::Full => {
                    self.counters.rejected_full += 1;
                    self.full_at = Some(log.stats().records_appended);
                    ErrorCode::Full
                }
                AppendError::SequenceUnknown { .. } => {
                    self.counters.rejected_invalid += 1;
                    ErrorCode::SequenceUnknown
                }
                AppendError::SequenceTooOld { stored_below, .. } => {
                    self.counters.duplicates_unknown_offset += 1;
                    below = Some(stored_below);
                    ErrorCode::DuplicateSequenceUnknownOffset
                }
                AppendError::OutOfSequence { .. } => {
                    self.counters.out_of_sequence += 1;
                    ErrorCode::OutOfSequence
                }
                AppendError::Fenced { .. } => {
                    self.counters.fenced += 1;
                    ErrorCode::Fenced
                }
                AppendError::UnknownSession { .. } => {
                    self.counters.fenced += 1;
                    ErrorCode::UnknownSession
                }
                // Flash errors, bad blocks, a log poisoned by an earlier failure: the
                // record is not stored; the client resends after a remount.
                _ => {
                    self.counters.internal_errors += 1;
                    error!("append failed: {}", m.as_str());
                    ErrorCode::StorageFailed
                }
            };
            Rejected {
                code,
                message: m,
                stored_below: below,
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch<F: Flash>(
        &mut self,
        seq: u32,
        consumer: Option<&str>,
        from_offset: u64,
        max_bytes: u32,
        wait_ms: Option<u32>,
        log: &mut Log<'_, F>,
        now_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        if let Some(c) = consumer
            && log.committed(c).is_none()
        {
            // Quoted by hand: `{c:?}` would link `str`'s escaping and its Unicode tables
            // (about 2.5 KiB of a microcontroller's flash) for this one message.
            let m = message(format_args!("no consumer named \"{c}\""));
            return error_reply(out, seq, ErrorCode::UnknownConsumer, &m);
        }
        if max_bytes == 0 {
            return error_reply(out, seq, ErrorCode::BadRequest, "max_bytes is 0");
        }
        let mut r = match self.read(seq, from_offset, log, scratch, out) {
            Ok(r) => r,
            Err(o) => return o,
        };
        let mut lost = None;
        if let Some(l) = r.lost {
            lost = Some(wire::LostRange {
                from: l.from,
                to: l.to,
                reason: match l.reason {
                    clog::LostReason::Corrupt => wire::LostReason::Corrupt,
                    clog::LostReason::Skipped => wire::LostReason::NotPersisted,
                },
            });
            if r.next_offset < log.next_offset() {
                match log.read(r.next_offset, scratch) {
                    Ok(r2) if r2.lost.is_none() => r = r2,
                    _ => {}
                }
            }
        }
        let wait = u64::from(wait_ms.unwrap_or(0));
        if r.count == 0 && lost.is_none() && wait > 0 {
            return Outcome::Park {
                from_offset,
                deadline_us: now_us.saturating_add(wait.saturating_mul(1000)),
            };
        }
        let mut next = if r.count > 0 {
            r.first_offset
        } else {
            r.next_offset
        };
        let first_count = r.count;
        let mut w = RecordsWriter::new(out, seq, r.prev_crc, max_bytes);
        'fill: loop {
            if r.count == 0 || r.lost.is_some() {
                break;
            }
            for rec in r.records(scratch) {
                let view = RecordView::from(rec);
                if w.push(&view).is_err() {
                    break 'fill;
                }
                next = rec.offset + 1;
            }
            if next >= log.next_offset() {
                break;
            }
            match log.read(next, scratch) {
                Ok(r2) => r = r2,
                Err(_) => break,
            }
        }
        if w.count() == 0 && first_count > 0 {
            let m = message(format_args!(
                "record at offset {next} does not fit a {} byte frame",
                out.len()
            ));
            return error_reply(out, seq, ErrorCode::TooLarge, &m);
        }
        match w.finish(next, lost) {
            Ok(len) => Outcome::Reply { len },
            Err(e) => {
                let m = message(format_args!("cannot encode records: {e}"));
                error_reply(out, seq, ErrorCode::Internal, &m)
            }
        }
    }

    /// One step of the search for the first offset stamped at or after `timestamp_us`
    /// (see [`Log::find_offset`]), at most [`FIND_STEP_BYTES`] of records read.
    #[allow(clippy::too_many_arguments)]
    fn find_offset<F: Flash>(
        &mut self,
        seq: u32,
        timestamp_us: u64,
        from_offset: u64,
        version: u16,
        log: &mut Log<'_, F>,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        if version < wire::FIND_OFFSET_VERSION {
            let m = message(format_args!(
                "FindOffset needs protocol version {}; this connection announced {version}",
                wire::FIND_OFFSET_VERSION
            ));
            return error_reply(out, seq, ErrorCode::BadRequest, &m);
        }
        let (offset, done) = match log.find_offset(
            timestamp_us,
            from_offset,
            scratch,
            FIND_STEP_BYTES,
        ) {
            Ok(clog::FindStep::Found(o)) => (o, true),
            Ok(clog::FindStep::Continue(o)) => (o, false),
            Err(e) => {
                let (code, m) = match e {
                    ReadError::OffsetOutOfRange { .. } => {
                        (ErrorCode::OffsetOutOfRange, message(format_args!("{e}")))
                    }
                    ReadError::BufferTooSmall { needed } => (
                        ErrorCode::TooLarge,
                        message(format_args!(
                            "a record needs {needed} bytes, more than this gateway's {} byte read buffer",
                            scratch.len()
                        )),
                    ),
                    _ => {
                        let m = message(format_args!("{e}"));
                        error!("find offset failed: {}", m.as_str());
                        (ErrorCode::Internal, m)
                    }
                };
                return error_reply(out, seq, code, &m);
            }
        };
        reply(out, &Response::FoundOffset { seq, offset, done })
    }

    /// The first read of a fetch, with its errors turned into replies.
    fn read<F: Flash>(
        &mut self,
        seq: u32,
        from: u64,
        log: &mut Log<'_, F>,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Result<clog::ReadOutcome, Outcome> {
        log.read(from, scratch).map_err(|e| match e {
            ReadError::Dropped {
                first_available, ..
            } => reply(
                out,
                &Response::Dropped {
                    seq,
                    first_available,
                },
            ),
            ReadError::OffsetOutOfRange { .. } => {
                let m = message(format_args!("{e}"));
                error_reply(out, seq, ErrorCode::OffsetOutOfRange, &m)
            }
            // A record stored with a larger RAM buffer than this gateway's: it cannot be
            // sent, now or on a retry.
            ReadError::BufferTooSmall { needed } => {
                let m = message(format_args!(
                    "record at offset {from} needs {needed} bytes, more than this gateway's {} byte read buffer",
                    scratch.len()
                ));
                error_reply(out, seq, ErrorCode::TooLarge, &m)
            }
            _ => {
                let m = message(format_args!("{e}"));
                error!("read failed: {}", m.as_str());
                error_reply(out, seq, ErrorCode::Internal, &m)
            }
        })
    }

    /// Stores one text line (`\n` already split off or not) as a record: the topic is
    /// `fixed_topic` or the line's first word (see [`wire::parse_line`]), the timestamp is
    /// `wall_us`, no producer.
    pub fn handle_line<F: Flash>(
        &mut self,
        line: &[u8],
        fixed_topic: Option<&str>,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
    ) -> Result<LineAccepted, LineRejected> {
        let (topic, payload) = wire::parse_line(line, fixed_topic).map_err(|e| {
            self.counters.rejected_invalid += 1;
            LineRejected::Malformed(e)
        })?;
        let rec = Record {
            topic,
            timestamp_us: wall_us,
            producer: None,
            payload,
        };
        match self.append(&rec, 0, log, now_us) {
            Ok(a) => {
                self.counters.lines_accepted += 1;
                Ok(LineAccepted {
                    offset: a.offset,
                    durable: self.cfg.default_ack == AckLevel::Durable,
                })
            }
            Err(rejected) => Err(match rejected.code {
                ErrorCode::TooLarge => LineRejected::TooLarge {
                    len: payload.len(),
                    max: self.cfg.max_record_bytes,
                },
                ErrorCode::BadRequest => LineRejected::BadTopic,
                ErrorCode::Full => LineRejected::Full,
                _ => LineRejected::Internal,
            }),
        }
    }

    /// Appends one record that came in through another ingest protocol (the Linux
    /// gateway's MQTT listener), with a publish's checks and counters: a payload above
    /// `max_record_bytes` is [`ErrorCode::TooLarge`], a topic of 0 or more than 255 bytes
    /// [`ErrorCode::BadRequest`], a full log under `reject-new` [`ErrorCode::Full`], a
    /// flash failure [`ErrorCode::StorageFailed`]. Durability is the caller's: the record
    /// is durable once [`Log::durable_offset`] is above the returned offset.
    pub fn append_record<F: Flash>(
        &mut self,
        rec: &Record<'_>,
        log: &mut Log<'_, F>,
        now_us: u64,
    ) -> Result<clog::Appended, ErrorCode> {
        self.append(rec, 0, log, now_us).map_err(|r| r.code)
    }

    /// The counters of a `StatsReply`.
    pub fn stats<F: Flash>(&self, log: &Log<'_, F>, now_us: u64) -> GatewayStats {
        let s = log.stats();
        let geo = log.geometry();
        let seg_bytes = u64::from(log.blocks_per_segment()) * u64::from(geo.erase_size);
        GatewayStats {
            first_offset: log.first_offset(),
            next_offset: log.next_offset(),
            durable_offset: log.durable_offset(),
            records_appended: s.records_appended,
            bytes_appended: s.payload_bytes_appended,
            duplicates: s.duplicates,
            records_rejected_full: self.counters.rejected_full,
            records_dropped: s.records_dropped,
            records_corrupt: s.corrupt_offsets,
            records_spared: s.records_discarded,
            flash_bytes_programmed: s.flash_bytes_programmed,
            flash_bytes_read: s.flash_bytes_read,
            erases: s.erases,
            flushes: s.batches_written,
            syncs: s.syncs,
            journal_writes: s.journal_writes,
            buffered_records: u64::from(log.buffered_records()),
            buffered_bytes: log.buffered_bytes() as u64,
            capacity_bytes: u64::from(geo.capacity),
            used_bytes: log.segments().count() as u64 * seg_bytes,
            consumers: log.consumers().count() as u64,
            frames_received: self.counters.frames_received,
            frames_rejected: self.counters.frames_rejected,
            unclean_mounts: self.counters.unclean_mounts,
            uptime_ms: now_us.saturating_sub(self.started_us) / 1000,
        }
    }
}

/// Encodes `resp` into `out`.
pub fn reply(out: &mut [u8], resp: &Response<'_>) -> Outcome {
    match encode_frame(resp, out) {
        Ok(len) => Outcome::Reply { len },
        Err(e) => {
            let m = message(format_args!("{e}"));
            error!(
                "reply does not fit the {} byte buffer: {}",
                out.len(),
                m.as_str()
            );
            if resp.seq().is_some() {
                let seq = resp.seq().unwrap_or(0);
                if let Ok(len) = encode_frame(
                    &Response::Error {
                        seq,
                        code: ErrorCode::Internal,
                        message: "reply too large for the frame buffer",
                    },
                    out,
                ) {
                    return Outcome::Reply { len };
                }
            }
            Outcome::NoReply
        }
    }
}

/// Encodes an `Error` reply into `out`.
pub fn error_reply(out: &mut [u8], seq: u32, code: ErrorCode, message: &str) -> Outcome {
    reply(out, &Response::Error { seq, code, message })
}

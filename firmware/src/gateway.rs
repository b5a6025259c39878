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
//!
//! ## Source files
//! This file holds the types, the dispatch of a request and the reply encoders; the write
//! path (publish, text lines, appends) is in `gateway/publish.rs`, the read path (fetch,
//! find offset) in `gateway/fetch.rs`.

mod fetch;
mod message;
mod publish;

use crate::roles::Roles;
use message::{Message, message};
use spillway_core::error::{CommitError, SessionError};
use spillway_core::log::{self as clog, Log, Record};
use spillway_core::storage::Flash;
use spillway_core::wire::{
    self, AckLevel, ConsumerEntry, ConsumerList, ErrorCode, FrameError, GatewayStats, HelloV3,
    ListWriter, PROTOCOL_VERSION, Request, Response, StatsV3, WelcomeV3, encode_frame,
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
            return self.hello(conn, protocol_version, log, out);
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
        if version < wire::SESSION_VERSION
            && let Request::OpenSession { seq, .. } | Request::SessionPublish { seq, .. } = *req
        {
            // PROTOCOL.md section 2: a client gets only variants of the version it
            // announced; `Session` is not one before version 3.
            if matches!(
                req,
                Request::SessionPublish {
                    ack: AckLevel::None,
                    ..
                }
            ) {
                return Outcome::NoReply;
            }
            let m = message(format_args!(
                "producer sessions need protocol version {}; this connection announced {version}",
                wire::SESSION_VERSION
            ));
            return error_reply(out, seq, ErrorCode::BadRequest, &m);
        }
        // Producer ids from 2^63 up are the gateway's own (its MQTT sessions'): a client's
        // records under one would be read back as a session's at the next start.
        let claimed = match *req {
            Request::Publish {
                producer: Some(p),
                ack,
                ..
            } => Some((p.id, ack)),
            Request::SessionPublish { producer, ack, .. } => Some((producer.id, ack)),
            Request::OpenSession { producer_id, .. } => Some((producer_id, AckLevel::Buffered)),
            _ => None,
        };
        if let Some((id, ack)) = claimed
            && id & wire::GATEWAY_PRODUCER_BIT != 0
        {
            if ack == AckLevel::None {
                return Outcome::NoReply;
            }
            return error_reply(
                out,
                req.seq().unwrap_or(0),
                ErrorCode::BadRequest,
                "producer ids from 2^63 up are the gateway's own",
            );
        }
        match *req {
            Request::Hello { .. } => Outcome::NoReply, // handled above
            Request::Publish {
                seq,
                topic,
                timestamp_us,
                payload,
                ack,
                ..
            }
            | Request::SessionPublish {
                seq,
                topic,
                timestamp_us,
                payload,
                ack,
                ..
            } => {
                // A session publish carries its session's epoch; a plain one the legacy
                // rule's 0.
                let (producer, epoch) = match *req {
                    Request::SessionPublish { producer: p, .. } => {
                        // Epoch 0 is the legacy rule; a session never has it.
                        if p.epoch == 0 {
                            if ack == AckLevel::None {
                                return Outcome::NoReply;
                            }
                            return error_reply(out, seq, ErrorCode::BadRequest, "session epoch 0");
                        }
                        let id = clog::Producer {
                            id: p.id,
                            seq: p.seq,
                        };
                        (Some(id), p.epoch)
                    }
                    Request::Publish { producer, .. } => (producer, 0),
                    _ => (None, 0), // not reached: this arm takes the two publishes only
                };
                let rec = Record {
                    topic,
                    timestamp_us: timestamp_us.unwrap_or(wall_us),
                    producer,
                    payload,
                };
                self.publish(seq, &rec, epoch, ack, version, log, now_us, out)
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
            Request::DeleteConsumer { seq, consumer } => {
                delete_consumer(seq, consumer, version, log, out)
            }
            Request::DeleteConsumerIfNotLast { seq, consumer } => {
                if version < wire::GUARDED_DELETE_VERSION {
                    let m = message(format_args!(
                        "DeleteConsumerIfNotLast needs protocol version {}; this connection announced {version}",
                        wire::GUARDED_DELETE_VERSION
                    ));
                    return error_reply(out, seq, ErrorCode::BadRequest, &m);
                }
                // The committed offset of `consumer` if it is the only consumer.
                let last = {
                    let mut all = log.consumers();
                    match (all.next(), all.next()) {
                        (Some((name, committed)), None) if name == consumer => Some(committed),
                        _ => None,
                    }
                };
                if let Some(committed) = last {
                    let m = message(format_args!(
                        "consumer {consumer:?} is the gateway's last consumer (committed offset {committed})"
                    ));
                    return error_reply(out, seq, ErrorCode::LastConsumer, &m);
                }
                delete_consumer(seq, consumer, version, log, out)
            }
            Request::FindOffset {
                seq,
                timestamp_us,
                from_offset,
            } => self.find_offset(seq, timestamp_us, from_offset, version, log, scratch, out),
            Request::Stats { seq } => self.stats_reply(seq, version, log, now_us, out),
        }
    }

    /// Answers a `Hello` (and records the connection's protocol version). Out of line, as
    /// is [`Self::stats_reply`]: the replies of these rare requests are large values, kept
    /// off the stack of every other request.
    #[inline(never)]
    fn hello<F: Flash>(
        &self,
        conn: &mut Conn,
        protocol_version: u16,
        log: &Log<'_, F>,
        out: &mut [u8],
    ) -> Outcome {
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
        reply(out, &welcome)
    }

    /// Answers a `Stats` request.
    #[inline(never)]
    fn stats_reply<F: Flash>(
        &self,
        seq: u32,
        version: u16,
        log: &Log<'_, F>,
        now_us: u64,
        out: &mut [u8],
    ) -> Outcome {
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

/// Deletes `consumer` and encodes the `Deleted` reply (whether it existed), or the `Error`
/// reply: `BadRequest` for a name the log refuses, else `StorageFailed` (as `version`
/// knows it).
fn delete_consumer<F: Flash>(
    seq: u32,
    consumer: &str,
    version: u16,
    log: &mut Log<'_, F>,
    out: &mut [u8],
) -> Outcome {
    match log.delete_consumer(consumer) {
        Ok(existed) => reply(out, &Response::Deleted { seq, existed }),
        Err(e) => {
            let m = message(format_args!("{e}"));
            let code = match e {
                CommitError::BadName { .. } => ErrorCode::BadRequest,
                _ => ErrorCode::StorageFailed.for_version(version),
            };
            error_reply(out, seq, code, &m)
        }
    }
}

/// Encodes an `Error` reply into `out`.
pub fn error_reply(out: &mut [u8], seq: u32, code: ErrorCode, message: &str) -> Outcome {
    reply(out, &Response::Error { seq, code, message })
}

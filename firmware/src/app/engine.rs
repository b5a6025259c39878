//! The log thread: the only owner of the log. Flash writes, fdatasync and group commit
//! happen here, never on the async executor.
//!
//! Connections send [`Cmd`]s through one bounded channel. The thread takes one command
//! (waiting at most until the log's next deadline or the earliest long-poll deadline),
//! then every command already queued (up to [`GROUP_MAX`]), applies them all, flushes the
//! log once if any durable publish is waiting (group commit), and only then hands the
//! durable acknowledgements to the connections. Replies go through each connection's own
//! queue without ever blocking this thread: the queue is bounded in bytes by the
//! connection's [`Budget`], which its reader takes from before it forwards a request (a
//! client that does not read its replies stops being read). Long polls wait here, at most
//! [`MAX_PARKED_PER_CONN`] per connection; a further one is answered at once. A long poll
//! waits at most `--idle-timeout-ms` (when set), whatever its `wait_ms` says: a waiting
//! poll keeps its connection from being closed as idle, so without the cap one fetch with
//! `wait_ms` = 2^32 - 1 (49 days) would hold a `--max-connections` slot for that long.
//!
//! A storage failure (a failed write, erase or sync of the image) poisons the log: every
//! durable acknowledgement still waiting is answered `StorageFailed`, and the thread ends
//! with a run-time error, so the process exits with code 1 and its supervisor (systemd with
//! `packaging/spillway.service`) starts it again; the new process opens and remounts the
//! image, and publishers resend. Under systemd's watchdog this thread also sends
//! `WATCHDOG=1` from its loop: a sync that hangs stops the pings and ends in a restart too.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_channel::{Receiver, Sender, TryRecvError};
use spillway_core::log::{Config, Log, Memory, SegmentSlot, segments_for};
use spillway_core::wire::{ErrorCode, FrameError, Request};

use super::AppError;
use super::config::Settings;
use super::lines::{DropWarnings, ReaderDrop};
use super::metrics::{FullChange, Metrics};
use super::net::Budget;
use spillway_firmware::Roles;
use spillway_firmware::gateway::{Auth, Conn, Gateway, GatewayConfig, Outcome, error_reply};

/// Most commands applied before a group flush.
pub const GROUP_MAX: usize = 1024;

/// Long-poll fetches one connection may have waiting; a further one is answered at once
/// with what there is (possibly no records), as if its `wait_ms` had passed.
pub const MAX_PARKED_PER_CONN: usize = 4;

/// Offsets reserved by one offset-lease journal entry on the Linux gateway.
pub const GATEWAY_LEASE_STEP: u64 = 16_384;

/// A connection id, unique for the process's life.
pub type ConnId = u64;

/// A message to the log thread.
pub enum Cmd {
    /// A connection opened: replies go to `replies`; dropping `kill` tells the
    /// connection's task to close.
    Open {
        /// Connection id.
        conn: ConnId,
        /// The connection's reply queue (encoded frames).
        replies: Sender<Vec<u8>>,
        /// Held while the connection may live.
        kill: Sender<()>,
        /// The connection's bytes in flight; each reply is settled against it.
        budget: Arc<Budget>,
        /// What the connection may do until its `Hello` is judged.
        roles: Roles,
    },
    /// The connection's verdict on its next `Hello` (sent just before that `Hello`): how
    /// the gateway answers it and the roles the connection gets.
    Authorize {
        /// Connection id.
        conn: ConnId,
        /// Accepted, refused (and why), or no credentials configured.
        auth: Auth,
        /// The roles from then on.
        roles: Roles,
    },
    /// One received frame's message bytes (COBS and CRC already checked).
    Frame {
        /// Connection id.
        conn: ConnId,
        /// Postcard bytes.
        msg: Vec<u8>,
        /// Bytes the reader took from the connection's budget for this request.
        reserved: usize,
    },
    /// A frame that failed before decoding.
    FrameError {
        /// Connection id.
        conn: ConnId,
        /// Why.
        error: FrameError,
        /// Bytes the reader took from the connection's budget for the error reply.
        reserved: usize,
    },
    /// One text line of a line-mode connection.
    Line {
        /// The line, without `\n`.
        line: Vec<u8>,
        /// Fixed topic of the listener.
        topic: Option<Arc<str>>,
        /// The peer or serial URI, for warnings.
        peer: Arc<str>,
    },
    /// A line-mode connection dropped a line (too long, or partial and followed by
    /// silence).
    LineDropped {
        /// The peer or serial URI, for warnings.
        peer: Arc<str>,
        /// Why.
        why: ReaderDrop,
    },
    /// The connection closed.
    Close {
        /// Connection id.
        conn: ConnId,
    },
    /// A request of an MQTT connection.
    Mqtt(super::mqtt::MqttCmd),
    /// Flush, persist and stop.
    Shutdown,
}

impl Cmd {
    /// Bytes this command holds of its connection's budget (0 for those without one).
    pub fn reserved(&self) -> usize {
        match self {
            Cmd::Frame { reserved, .. } | Cmd::FrameError { reserved, .. } => *reserved,
            _ => 0,
        }
    }
}

/// Facts reported once the log is mounted.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    /// Log id.
    pub log_id: u128,
    /// The image was created by this run.
    pub created: bool,
    /// The last shutdown was clean.
    pub clean: bool,
    /// Next offset after mount.
    pub next_offset: u64,
    /// Largest frame, bytes.
    pub max_frame_bytes: u32,
}

struct ConnState {
    replies: Sender<Vec<u8>>,
    _kill: Sender<()>,
    conn: Conn,
    budget: Arc<Budget>,
}

struct Pending {
    conn: ConnId,
    seq: u32,
    offset: u64,
    frame: Vec<u8>,
    reserved: usize,
}

struct Parked {
    conn: ConnId,
    msg: Vec<u8>,
    from: u64,
    deadline_us: u64,
    reserved: usize,
}

/// Monotonic and wall clocks in µs.
struct Clock {
    start: Instant,
}

impl Clock {
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
    fn wall_us() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }
    fn instant(&self, us: u64) -> Instant {
        let cap = self.now_us().saturating_add(3_600_000_000);
        self.start + Duration::from_micros(us.min(cap))
    }
}

/// Frame size for the settings, bytes: `--max-frame-bytes` (at least 64 KiB, so that
/// fetches carry many small records), raised to carry one record of `max_record_bytes`.
/// The gateway raises it further to carry any record the mounted log can hold (its RAM
/// buffer's record limit), whatever `max_record_bytes` is now.
pub fn max_frame_bytes(s: &Settings) -> u32 {
    GatewayConfig::min_frame_bytes(s.max_record_bytes).max(s.max_frame_bytes)
}

/// Runs the log thread: opens and mounts the image, reports on `started`, serves commands
/// until [`Cmd::Shutdown`] (or until every sender is gone), then closes the log cleanly.
pub fn run(
    s: Settings,
    rx: Receiver<Cmd>,
    started: SyncSender<Result<Started, AppError>>,
    metrics: Arc<Metrics>,
    cancel: &AtomicBool,
) -> Result<(), AppError> {
    let clock = Clock {
        start: Instant::now(),
    };
    let (flash, created, bps) = match super::image::open_or_create(&s, cancel) {
        Ok(x) => x,
        Err(e) => {
            let _ = started.send(Err(e.clone()));
            return Err(e);
        }
    };
    let geo = spillway_core::storage::Flash::geometry(&flash);
    let mut buffer = vec![0u8; s.buffer_bytes];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geo, bps.max(1)) as usize];
    // Always there, whatever --compression says: an image may hold compressed batches
    // from an earlier run, and reading them needs it. A batch decodes to at most the RAM
    // buffer it was written with, which is at most a segment: sized for the larger of the
    // two, a restart with a lower --buffer-bytes still reads every batch.
    let segment_bytes = geo.erase_size as usize * bps.max(1) as usize;
    let mut scratch = vec![0u8; spillway_core::log::scratch_len(s.buffer_bytes.max(segment_bytes))];
    let cfg = Config {
        compression: s.compression,
        spill: s.spill,
        full: s.full,
        linger_us: s.linger_ms.saturating_mul(1000),
        // One lease entry (a journal write and a sync) per 16,384 offsets instead of the
        // core's microcontroller default of 1,024: at high ingest the lease entries were a
        // fifth of all fdatasyncs. Offsets are u64; a crash skips at most this many.
        lease_step: GATEWAY_LEASE_STEP,
        ..Config::default()
    };
    let mounted = Log::mount_with_scratch(
        flash,
        cfg,
        Memory {
            buffer: &mut buffer,
            segments: &mut slots,
        },
        &mut scratch,
        clock.now_us(),
    );
    let (mut log, report) = match mounted {
        Ok(x) => x,
        Err(e) => {
            // A storage failure while mounting is a run-time failure (exit 1: a supervisor
            // restarts and the next open reads the disk); anything else means the image
            // cannot be used as it is (exit 3).
            let msg = format!(
                "cannot mount {}: {}",
                s.image.display(),
                super::image::with_reasons(&e)
            );
            let err = match e {
                spillway_core::error::MountError::Flash(_)
                | spillway_core::error::MountError::JournalUnreadable { .. } => {
                    AppError::Runtime(msg)
                }
                _ => AppError::Image(msg),
            };
            let _ = started.send(Err(err.clone()));
            return Err(err);
        }
    };
    // The fetch limit is not the ingest limit: a frame carries any record the log can hold
    // with this RAM buffer, so records stored under a higher --max-record-bytes stay
    // fetchable after a restart with a lower one.
    let stored_max = u32::try_from(log.max_record_len()).unwrap_or(u32::MAX);
    let frame_bytes = max_frame_bytes(&s).max(GatewayConfig::min_frame_bytes(stored_max));
    let max_record = log
        .max_record_len()
        .saturating_sub(255 + 12 + 14)
        .min(s.max_record_bytes as usize) as u32;
    let mut gcfg = GatewayConfig::new(&s.gateway_id, max_record, frame_bytes);
    gcfg.default_ack = s.ack;
    let mut gw = Gateway::new(gcfg, clock.now_us());
    if !report.clean && !created {
        gw.counters_mut().unclean_mounts += 1;
        let durable = report
            .not_durable
            .map_or(report.next_offset, |(from, _)| from);
        log::warn!(
            "last shutdown was not clean: offsets {}..{} recovered, torn tail {} bytes",
            report.first_offset,
            durable,
            report.torn_tail_bytes
        );
        if let Some((from, to)) = report.not_durable {
            log::warn!(
                "offsets {from}..{to} were reserved before the crash but never persisted: no record acknowledged as durable had them; they are never reused"
            );
        }
    }
    for w in super::inspect::journal_warnings(&report) {
        log::warn!("{w}");
    }
    log::info!(
        "log {:032x} mounted: offsets {}..{}, {} segments",
        log.log_id(),
        report.first_offset,
        report.next_offset,
        report.segments
    );
    // The metrics show the mounted log before anyone hears that the gateway started: the
    // metrics socket is bound already, and a scrape that the kernel queued on it is served
    // as soon as the runtime starts, which may be before this thread's first loop turn.
    metrics.update(&log, &gw);
    let _ = started.send(Ok(Started {
        log_id: log.log_id(),
        created,
        clean: report.clean,
        next_offset: report.next_offset,
        max_frame_bytes: frame_bytes,
    }));

    let mut conns: HashMap<ConnId, ConnState> = HashMap::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut parked: Vec<Parked> = Vec::new();
    // The longest a long poll waits, µs (see the module doc).
    let max_wait_us = s
        .idle_timeout
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut mqtt_pending: Vec<super::mqtt::sessions::MqttPending> = Vec::new();
    let mut scratch = vec![0u8; frame_bytes as usize];
    let mut mqtt_sessions = super::mqtt::sessions::MqttSessions::new(log.log_id());
    let records_end = report
        .not_durable
        .map_or(report.next_offset, |(from, _)| from);
    let found = mqtt_sessions.recover(&mut log, &mut scratch, records_end);
    if found > 0 {
        log::info!("mqtt: {found} stored QoS 1/2 messages of persistent sessions read back");
    }
    let mut out = vec![0u8; frame_bytes as usize];
    // The next reply of the connection that fetches in sequence, read while its client
    // takes in the last one (see `ReadAhead`).
    let mut ahead = ReadAhead::default();
    let mut tick_at = u64::MAX;
    let mut stop = false;
    let mut line_warnings = DropWarnings::default();
    let mut watchdog = Watchdog::from_env(clock.now_us());
    let housekeeping_warnings = super::throttle::Throttled::default();

    while !stop {
        let wake_at = parked
            .iter()
            .map(|p| p.deadline_us)
            .min()
            .unwrap_or(u64::MAX)
            .min(tick_at)
            .min(watchdog.due_us());
        let first = if wake_at == u64::MAX {
            Some(rx.recv_blocking())
        } else {
            let when = clock.instant(wake_at);
            smol::block_on(futures_or(rx.recv(), when))
        };
        let mut batch = Vec::new();
        match first {
            Some(Ok(c)) => batch.push(c),
            Some(Err(_)) => stop = true, // every sender gone
            None => {}                   // deadline
        }
        while batch.len() < GROUP_MAX {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Closed) => {
                    stop = true;
                    break;
                }
            }
        }
        let next_before = log.next_offset();
        let mut flush_lines = false;
        for cmd in batch {
            let now = clock.now_us();
            match cmd {
                Cmd::Open {
                    conn,
                    replies,
                    kill,
                    budget,
                    roles,
                } => {
                    conns.insert(
                        conn,
                        ConnState {
                            replies,
                            _kill: kill,
                            conn: Conn::with_roles(roles),
                            budget,
                        },
                    );
                }
                Cmd::Authorize { conn, auth, roles } => {
                    ahead.forget(conn);
                    if let Some(st) = conns.get_mut(&conn) {
                        st.conn.auth = auth;
                        st.conn.roles = roles;
                    }
                }
                Cmd::Close { conn } => {
                    ahead.forget(conn);
                    conns.remove(&conn);
                    parked.retain(|p| p.conn != conn);
                    pending.retain(|p| p.conn != conn);
                }
                Cmd::Shutdown => stop = true,
                Cmd::Mqtt(m) => mqtt_sessions.handle(
                    m,
                    super::mqtt::sessions::LogSide {
                        gw: &mut gw,
                        log: &mut log,
                        now_us: now,
                        wall_us: Clock::wall_us(),
                        metrics: &metrics,
                        pending: &mut mqtt_pending,
                    },
                ),
                Cmd::Line { line, topic, peer } => {
                    match gw.handle_line(&line, topic.as_deref(), &mut log, now, Clock::wall_us()) {
                        Ok(a) => flush_lines |= a.durable,
                        Err(e) => {
                            line_warnings.rejected(&peer, &e, Instant::now());
                        }
                    }
                }
                Cmd::LineDropped { peer, why } => {
                    match why {
                        ReaderDrop::TooLong { .. } => gw.counters_mut().rejected_too_large += 1,
                        ReaderDrop::Partial { .. } => gw.counters_mut().rejected_invalid += 1,
                    }
                    line_warnings.reader_drop(&peer, why, s.max_record_bytes, Instant::now());
                }
                Cmd::FrameError {
                    conn,
                    error,
                    reserved,
                } => {
                    log::debug!("connection {conn}: bad frame: {error}");
                    let o = gw.frame_error(&error, &mut out);
                    deliver(&mut conns, conn, o, &out, reserved);
                }
                Cmd::Frame {
                    conn,
                    msg,
                    reserved,
                } => {
                    let Some(st) = conns.get_mut(&conn) else {
                        continue;
                    };
                    // Decoded once here for the read-ahead and the pending reply's `seq`
                    // (the gateway decodes and checks it on its own).
                    let req = postcard::from_bytes::<Request<'_>>(&msg).ok();
                    if let Some(frame) = ahead.take(conn, req.as_ref(), &log) {
                        // The same request, answered by the same read, done earlier.
                        gw.counters_mut().frames_received += 1;
                        metrics.read_ahead("used");
                        ahead.follow(conn, req.as_ref(), &frame, &log);
                        send_frame(&mut conns, conn, frame, reserved);
                        continue;
                    }
                    let o = gw.handle_message(
                        &mut st.conn,
                        &msg,
                        &mut log,
                        now,
                        Clock::wall_us(),
                        &mut scratch,
                        &mut out,
                    );
                    if let Outcome::Reply { len } = o {
                        ahead.follow(conn, req.as_ref(), &out[..len], &log);
                    }
                    match o {
                        Outcome::ReplyWhenDurable { len, offset } => {
                            let seq = req.as_ref().and_then(Request::seq).unwrap_or(0);
                            // The request is handled and its reply exists: from now on
                            // the connection's budget holds only the reply, so a
                            // pipelining publisher's next requests are read while this
                            // one waits for the group flush.
                            st.budget.settle(reserved, len);
                            pending.push(Pending {
                                conn,
                                seq,
                                offset,
                                frame: out[..len].to_vec(),
                                reserved: len,
                            });
                        }
                        Outcome::Park {
                            from_offset,
                            deadline_us,
                        } => {
                            let waiting = parked.iter().filter(|p| p.conn == conn).count();
                            if waiting < MAX_PARKED_PER_CONN {
                                let deadline_us = max_wait_us.map_or(deadline_us, |w| {
                                    deadline_us.min(now.saturating_add(w))
                                });
                                parked.push(Parked {
                                    conn,
                                    msg,
                                    from: from_offset,
                                    deadline_us,
                                    reserved,
                                });
                            } else {
                                // The cap: answered now with what there is.
                                let o = fetch_now(
                                    &mut gw,
                                    &mut st.conn,
                                    &msg,
                                    &mut log,
                                    now,
                                    &mut scratch,
                                    &mut out,
                                );
                                deliver(&mut conns, conn, o, &out, reserved);
                            }
                        }
                        other => deliver(&mut conns, conn, other, &out, reserved),
                    }
                }
            }
        }
        let now = clock.now_us();
        if !pending.is_empty() || !mqtt_pending.is_empty() || flush_lines || stop {
            let flushed = log.flush(now);
            if let Err(e) = &flushed {
                log::error!("group flush failed: {e}");
            }
            let durable = log.durable_offset();
            for p in pending.drain(..) {
                if p.offset < durable {
                    send_frame(&mut conns, p.conn, p.frame, p.reserved);
                } else {
                    let version = conns
                        .get(&p.conn)
                        .and_then(|c| c.conn.protocol_version)
                        .unwrap_or(1);
                    let code = match flushed {
                        Err(spillway_core::error::FlushError::Full) => ErrorCode::Full,
                        // A flash error, or a log poisoned by one.
                        _ => ErrorCode::StorageFailed.for_version(version),
                    };
                    let o = error_reply(&mut out, p.seq, code, "record not durable: flush failed");
                    deliver(&mut conns, p.conn, o, &out, p.reserved);
                }
            }
            for p in mqtt_pending.drain(..) {
                let reply = if p.offset < durable {
                    p.reply
                } else {
                    let (qos, pid) = match p.reply {
                        super::mqtt::MqttReply::Stored { qos, pid } => (qos, pid),
                        _ => (0, 0),
                    };
                    let why = match flushed {
                        Err(spillway_core::error::FlushError::Full) => super::mqtt::Refusal::Full,
                        _ => super::mqtt::Refusal::Storage,
                    };
                    super::mqtt::MqttReply::Refused {
                        qos,
                        pid,
                        why,
                        back: None,
                    }
                };
                let _ = p.replies.try_send(reply);
            }
        }
        // Long polls: answer those with data or past their deadline.
        if !parked.is_empty() {
            let next = log.next_offset();
            let grew = next != next_before;
            let mut i = 0;
            while i < parked.len() {
                let ready = (grew && next > parked[i].from) || now >= parked[i].deadline_us || stop;
                if !ready {
                    i += 1;
                    continue;
                }
                let p = parked.swap_remove(i);
                let Some(st) = conns.get_mut(&p.conn) else {
                    continue;
                };
                let o = fetch_now(
                    &mut gw,
                    &mut st.conn,
                    &p.msg,
                    &mut log,
                    now,
                    &mut scratch,
                    &mut out,
                );
                deliver(&mut conns, p.conn, o, &out, p.reserved);
            }
        }
        match log.tick(clock.now_us()) {
            Ok(t) => tick_at = t,
            Err(e) => {
                // Retried every 100 ms (a read-only or failed log fails every time): the
                // warning goes out at most once per `WARN_EVERY`, with a count.
                housekeeping_warnings.warn(|| format!("log housekeeping failed: {e}"));
                tick_at = clock.now_us() + 100_000;
            }
        }
        match metrics.update(&log, &gw) {
            Some(FullChange::BecameFull) => warn_full(&log),
            Some(FullChange::AcceptsAgain) => {
                log::warn!(
                    "the log accepts records again (offset {})",
                    log.next_offset()
                );
            }
            None => {}
        }
        if let Some(op) = log.poisoned_by() {
            // Nothing more is written: the waiting acknowledgements were answered
            // StorageFailed by the flush above; a restart remounts the image.
            let why = format!(
                "flash {op} of {} failed: the log is poisoned; exiting so that the supervisor restarts the gateway and remounts the image",
                s.image.display()
            );
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&why)]);
            // Give the connections a moment to write those answers before they are closed.
            let until = Instant::now() + Duration::from_millis(500);
            while Instant::now() < until && conns.values().any(|c| !c.replies.is_empty()) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(20));
            return Err(AppError::Runtime(why));
        }
        if rx.is_empty()
            && let Some((conn, req)) = ahead.wanted()
            && let Some(st) = conns.get(&conn)
        {
            // Nothing waits: read the reply the connection fetching in sequence asks for
            // next, on a copy of its state, while it takes in the last one.
            let mut c = st.conn;
            let o = gw.handle_request(
                &mut c,
                &req.request(),
                &mut log,
                clock.now_us(),
                Clock::wall_us(),
                &mut scratch,
                &mut out,
            );
            if let Outcome::Reply { len } = o
                && ahead.prepared(&out[..len], &log)
            {
                metrics.read_ahead("read");
            }
        }
        watchdog.feed(clock.now_us());
    }
    log::info!("shutting down: flushing and persisting committed offsets");
    let next = log.next_offset();
    drop(conns);
    log.close(clock.now_us())
        .map_err(|e| AppError::Runtime(format!("clean shutdown failed: {e}")))?;
    log::info!("log closed cleanly at offset {next}");
    Ok(())
}

/// The fetch a connection that fetches in sequence will send next: the one it sent last,
/// from that reply's `next_offset`, with the next `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NextFetch {
    seq: u32,
    consumer: Option<String>,
    from_offset: u64,
    max_bytes: u32,
    wait_ms: Option<u32>,
}

impl NextFetch {
    fn request(&self) -> Request<'_> {
        Request::Fetch {
            seq: self.seq,
            consumer: self.consumer.as_deref(),
            from_offset: self.from_offset,
            max_bytes: self.max_bytes,
            wait_ms: self.wait_ms,
        }
    }
}

/// One fetch reply read ahead, for the connection that fetched last while more records
/// follow (a drain): the log thread reads it when no command waits, and answers the fetch
/// with it when that fetch comes exactly as expected, instead of waiting for the fetch to
/// start the read. A drain's client sends its next fetch when the last reply's header
/// arrives, so without this the log thread idles for the round trip between two replies.
///
/// The reply is the one the fetch would get when it comes: it holds durable records only,
/// which never change at their offsets, and the read is thrown away when anything it
/// depends on may have moved (the log's first offset, a storage failure, the consumer,
/// the connection's roles or its end). A reply read while the log ended short of the budget stays a valid
/// answer (a fetch may return less than `max_bytes`). At most one reply, one frame of
/// memory, is kept: for one connection at a time, the one that fetched last unless
/// another's reply is read and less than [`READ_AHEAD_KEPT`] old (two drains at once
/// would otherwise throw away each other's reads).
#[derive(Debug, Default)]
struct ReadAhead {
    /// The connection and the fetch it is expected to send next.
    next: Option<(ConnId, NextFetch)>,
    /// The reply read for `next`: its frame, the log's first offset then, and when.
    ready: Option<(Vec<u8>, u64, Instant)>,
}

/// How long a reply read ahead is kept from another connection's claim: a client that
/// fetches in sequence sends its next fetch within a round trip.
const READ_AHEAD_KEPT: Duration = Duration::from_millis(100);

impl ReadAhead {
    /// Connection `conn` sent `req` (`None`: a message that does not decode) and got
    /// `reply`: if that was a fetch answered with records, no lost range, while the log
    /// holds more durable records, its next fetch is the one to read ahead. Another request
    /// of the connection read ahead for ends that; other connections' requests other than
    /// fetches leave it.
    fn follow<F: spillway_core::storage::Flash>(
        &mut self,
        conn: ConnId,
        req: Option<&Request<'_>>,
        reply: &[u8],
        log: &Log<'_, F>,
    ) {
        let owner = self.next.as_ref().map(|(c, _)| *c);
        let Some(&Request::Fetch {
            seq,
            consumer,
            max_bytes,
            wait_ms,
            ..
        }) = req
        else {
            if owner == Some(conn) {
                self.next = None;
                self.ready = None;
            }
            return;
        };
        let held_for_another = owner.is_some_and(|c| c != conn)
            && self
                .ready
                .as_ref()
                .is_some_and(|r| r.2.elapsed() < READ_AHEAD_KEPT);
        if held_for_another {
            return;
        }
        self.next = None;
        self.ready = None;
        let Some(h) = spillway_core::wire::peek_records_header(reply) else {
            return;
        };
        // Only where the next read starts in durable records: one that starts in the RAM
        // buffer (a client following live records) would be read and then thrown away by
        // `prepared`, which keeps durable replies only.
        if h.seq != seq || h.count == 0 || h.lost.is_some() || h.next_offset >= log.durable_offset()
        {
            return;
        }
        let seq = match seq.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        self.next = Some((
            conn,
            NextFetch {
                seq,
                consumer: consumer.map(str::to_owned),
                from_offset: h.next_offset,
                max_bytes,
                wait_ms,
            },
        ));
    }

    /// The fetch to read ahead now, if there is one and it is not read yet.
    fn wanted(&self) -> Option<(ConnId, NextFetch)> {
        match (&self.next, &self.ready) {
            (Some(n), None) => Some(n.clone()),
            _ => None,
        }
    }

    /// The reply to [`ReadAhead::wanted`]'s fetch, read: kept (true) if it holds records,
    /// all of them durable. A record still in the RAM buffer may yet be dropped from it
    /// unwritten (`--spill on-pressure` once every consumer has committed it, a failed
    /// flush): a fetch then gets it as lost, without the log's first offset moving.
    fn prepared<F: spillway_core::storage::Flash>(
        &mut self,
        reply: &[u8],
        log: &Log<'_, F>,
    ) -> bool {
        let records = spillway_core::wire::peek_records_header(reply)
            .is_some_and(|h| h.count > 0 && h.next_offset <= log.durable_offset());
        if records && self.next.is_some() && !log.poisoned() {
            self.ready = Some((reply.to_vec(), log.first_offset(), Instant::now()));
            true
        } else {
            self.next = None;
            false
        }
    }

    /// The reply read ahead, if `req` from `conn` is exactly the fetch it answers and
    /// nothing it depends on has moved since. Any message from `conn` ends what was kept
    /// for it (used or not); other connections' messages leave it.
    fn take<F: spillway_core::storage::Flash>(
        &mut self,
        conn: ConnId,
        req: Option<&Request<'_>>,
        log: &Log<'_, F>,
    ) -> Option<Vec<u8>> {
        if self.next.as_ref().is_none_or(|(c, _)| *c != conn) {
            return None;
        }
        let (_, next) = self.next.take()?;
        let (frame, first, _) = self.ready.take()?;
        let same = req.is_some_and(|r| *r == next.request());
        let unchanged = log.first_offset() == first
            && !log.poisoned()
            && next
                .consumer
                .as_deref()
                .is_none_or(|name| log.committed(name).is_some());
        (same && unchanged).then_some(frame)
    }

    /// Connection `conn` closed or changed roles: nothing read for it is used.
    fn forget(&mut self, conn: ConnId) {
        if self.next.as_ref().is_some_and(|(c, _)| *c == conn) {
            self.next = None;
            self.ready = None;
        }
    }
}

/// systemd's watchdog, fed from the log thread's loop: `WATCHDOG=1` at least every half
/// `WATCHDOG_USEC`. Without `WATCHDOG_USEC` (or `NOTIFY_SOCKET`) it does nothing.
struct Watchdog {
    /// Interval between pings, µs; `None` when no watchdog is asked for.
    every_us: Option<u64>,
    /// Monotonic time of the last ping, µs.
    last_us: u64,
}

impl Watchdog {
    fn from_env(now_us: u64) -> Self {
        let every_us = sd_notify::watchdog_enabled()
            .map(|d| (d.as_micros() / 2).clamp(1_000, u128::from(u64::MAX)) as u64);
        let mut w = Watchdog {
            every_us,
            last_us: 0,
        };
        w.ping(now_us);
        w
    }

    /// When the loop must wake up to ping next, µs (`u64::MAX` without a watchdog).
    fn due_us(&self) -> u64 {
        self.every_us
            .map_or(u64::MAX, |e| self.last_us.saturating_add(e))
    }

    /// Pings if the interval has passed.
    fn feed(&mut self, now_us: u64) {
        if now_us >= self.due_us() {
            self.ping(now_us);
        }
    }

    fn ping(&mut self, now_us: u64) {
        if self.every_us.is_some() {
            self.last_us = now_us;
            if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]) {
                log::warn!("cannot notify the service manager: {e}");
            }
        }
    }
}

/// The warning when the log becomes full: what is refused, and the consumer whose
/// committed offset holds the oldest segment.
fn warn_full<F: spillway_core::storage::Flash>(log: &Log<'_, F>) {
    let slowest = log.consumers().min_by_key(|(_, off)| *off);
    let holder = match slowest {
        Some((name, off)) => format!(
            "; consumer {name:?} (committed offset {off}, the lowest) holds the oldest records: they are reclaimed once it commits past them or is deleted (a fresh image's \"bridge\" consumer holds them until a spillway-bridge drain commits)"
        ),
        None => String::new(),
    };
    log::warn!(
        "the log is full: new records are refused (--full reject-new) at offset {}{holder}",
        log.next_offset()
    );
}

/// Waits for a command or until `when`; `None` at the deadline.
async fn futures_or<T>(
    recv: impl std::future::Future<Output = Result<T, async_channel::RecvError>>,
    when: Instant,
) -> Option<Result<T, async_channel::RecvError>> {
    smol::future::or(async { Some(recv.await) }, async {
        smol::Timer::at(when).await;
        None
    })
    .await
}

/// Answers the long-poll fetch in `msg` now, with what the log holds (its `wait_ms` is
/// over, or the connection has too many waiting).
#[allow(clippy::too_many_arguments)]
fn fetch_now<F: spillway_core::storage::Flash>(
    gw: &mut Gateway,
    conn: &mut Conn,
    msg: &[u8],
    log: &mut Log<'_, F>,
    now: u64,
    scratch: &mut [u8],
    out: &mut [u8],
) -> Outcome {
    match postcard::from_bytes::<Request<'_>>(msg) {
        Ok(Request::Fetch {
            seq,
            consumer,
            from_offset,
            max_bytes,
            ..
        }) => gw.handle_request(
            conn,
            &Request::Fetch {
                seq,
                consumer,
                from_offset,
                max_bytes,
                wait_ms: None,
            },
            log,
            now,
            Clock::wall_us(),
            scratch,
            out,
        ),
        _ => Outcome::NoReply,
    }
}

/// Queues `frame` for `conn`, in exchange for the `reserved` bytes its request took from
/// the connection's budget. Never blocks: the budget bounds what a queue can hold.
fn send_frame(
    conns: &mut HashMap<ConnId, ConnState>,
    conn: ConnId,
    frame: Vec<u8>,
    reserved: usize,
) {
    let Some(st) = conns.get(&conn) else {
        return;
    };
    st.budget.settle(reserved, frame.len());
    if st.replies.try_send(frame).is_err() {
        // The connection's task has ended.
        conns.remove(&conn);
    }
}

fn deliver(
    conns: &mut HashMap<ConnId, ConnState>,
    conn: ConnId,
    o: Outcome,
    out: &[u8],
    reserved: usize,
) {
    match o {
        Outcome::Reply { len } | Outcome::ReplyWhenDurable { len, .. } => {
            send_frame(conns, conn, out[..len].to_vec(), reserved);
        }
        Outcome::NoReply | Outcome::Park { .. } => {
            if let Some(st) = conns.get(&conn) {
                st.budget.settle(reserved, 0);
            }
        }
    }
}

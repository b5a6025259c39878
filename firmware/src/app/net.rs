//! Connections: TCP and Unix listeners (serial ports are opened in `serial`). Each
//! connection is one task that splits its byte stream into frames (or lines) with bounded
//! buffers, sends them to the log thread, and writes back the replies the log thread
//! queued for it.
//!
//! Every connection has a [`Budget`] in bytes: the requests it sent that the log thread has
//! not answered yet, plus the replies not yet written to its socket. A request is read
//! only when its bytes and the largest reply it can get fit in the budget; a client that
//! does not read its replies therefore stops being read (backpressure: its socket fills
//! and its sends block) instead of making the gateway queue more.
//!
//! The stream of an accepted TCP connection (plaintext or TLS) is in `stream`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_channel::Sender;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use spillway_core::wire::{
    FeedResult, FrameDecoder, GrowingFrameBuffer, RECORDS_HEADER_MAX, Request, max_encoded_len,
};

use super::auth::Access;
use super::auth::Credentials;
use super::config::Mode;
use super::engine::{Cmd, ConnId};
use super::lines::{self, ReaderDrop};
use super::metrics::Metrics;
use super::tls::Tls;
use spillway_firmware::Roles;

mod stream;

use stream::looks_like_tls;
pub use stream::{Accepted, Stream};

/// Bytes a connection's budget holds beyond one largest frame: room for many small
/// requests and their replies in flight next to a full-size fetch.
pub const BUDGET_EXTRA: usize = 32 * 1024;

/// Bytes reserved for the reply of a request that is neither a fetch nor a consumer list
/// (an `Ack` is at most 23 bytes; a longer `Error` is counted at its real length).
pub const SMALL_REPLY: usize = 64;

/// Consecutive bad frames after which a connection is closed.
pub const MAX_BAD_FRAMES: u32 = 16;

/// The least send buffer asked of the kernel for an accepted connection, bytes
/// (`SO_SNDBUF`; Linux doubles it for its own bookkeeping); see [`send_buffer_bytes`].
pub const SOCKET_SEND_BUFFER: usize = 64 * 1024;

/// The most send buffer asked of the kernel for an accepted connection, bytes: with
/// larger frames a reply takes more than one write, but a client that does not read holds
/// at most twice this in the kernel (a 16 MiB frame limit would otherwise let each
/// connection hold 32 MiB there, the kernel's own cap permitting).
pub const MAX_SOCKET_SEND_BUFFER: usize = 1024 * 1024;

/// The send buffer asked of the kernel for each accepted connection of a gateway whose
/// frames are at most `max_frame` bytes: `max_frame`, within [`SOCKET_SEND_BUFFER`] and
/// [`MAX_SOCKET_SEND_BUFFER`] (the kernel may cap it lower: `net.core.wmem_max`).
///
/// A fixed size, not the kernel's automatic sizing, which would let a client that does not
/// read hold megabytes of replies in the gateway's socket before the connection's
/// [`Budget`] stops reading it. As large as the largest frame (the kernel then has twice
/// that), so that a fetch reply goes to the kernel in one write: with a buffer of a
/// quarter of a 256 KiB reply, each reply took four writes, each after a wake-up by the
/// client's read, and a 300,000-record drain about 15% more gateway CPU.
pub fn send_buffer_bytes(max_frame: usize) -> usize {
    max_frame.clamp(SOCKET_SEND_BUFFER, MAX_SOCKET_SEND_BUFFER)
}

/// Time a framed connection has to send its first complete frame (the `Hello`) after it is
/// accepted; a connection that sends none in time is closed, so idle sockets cannot hold
/// every `--max-connections` slot.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Refused connections answered at once (each for at most [`REFUSAL_LINGER`]); a
/// connection refused while this many are being answered is closed without a word.
pub const MAX_REFUSALS_ANSWERED: usize = 16;

/// How long a connection refused for `--max-connections` is kept half-open after its
/// `Error`: what the client sends meanwhile (its `Hello`) is read and dropped, so that
/// closing does not reset the connection and discard the `Error` before the client reads
/// it (RFC 1122 4.2.2.13).
pub const REFUSAL_LINGER: Duration = Duration::from_secs(2);

/// The frame that tells a framed connection refused for `--max-connections` why: an
/// `Error` under seq 0 (a connection-level answer, PROTOCOL.md §2) with code `Internal`,
/// which every protocol version has, and a message that names the flag.
pub fn refusal_frame(max_connections: usize) -> Vec<u8> {
    let message = format!(
        "gateway at --max-connections: it serves {max_connections} connections already; try again later"
    );
    let reply = spillway_core::wire::Response::Error {
        seq: 0,
        code: spillway_core::wire::ErrorCode::Internal,
        message: &message,
    };
    let mut buf = vec![0u8; max_encoded_len(message.len() + 16)];
    match spillway_core::wire::encode_frame(&reply, &mut buf) {
        Ok(n) => buf.truncate(n),
        Err(_) => buf.clear(),
    }
    buf
}

/// Tells a framed connection refused for `--max-connections` why ([`refusal_frame`]), then
/// ends its sending side and reads (and drops) what it sends for at most
/// [`REFUSAL_LINGER`] before closing it.
pub async fn answer_refusal<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, max_connections: usize) {
    let frame = refusal_frame(max_connections);
    let linger = async {
        if s.write_all(&frame).await.is_err() || s.close().await.is_err() {
            return;
        }
        let mut buf = [0u8; 512];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    smol::future::or(linger, async {
        smol::Timer::after(REFUSAL_LINGER).await;
    })
    .await;
}

/// Sets the send buffer of [`send_buffer_bytes`] for frames of `max_frame` bytes on an
/// accepted socket; a failure is logged and the connection served with the kernel's
/// default.
pub fn bound_send_buffer(socket: impl std::os::fd::AsFd, peer: &str, max_frame: usize) {
    let bytes = send_buffer_bytes(max_frame);
    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(socket, bytes) {
        log::debug!("{peer}: cannot set the socket send buffer: {e}");
    }
}

/// Bytes read from a socket at a time.
const READ_BUF: usize = 16 * 1024;

/// Bytes of replies gathered into one write.
const WRITE_BATCH: usize = 16 * 1024;

/// One connection's bytes in flight: requests sent to the log thread and not yet answered,
/// and replies not yet written to the socket, against a limit of `max_frame_bytes +`
/// [`BUDGET_EXTRA`]. The connection's reader takes from it before it forwards a request;
/// the log thread trades a request's reservation for its reply's real length; the writer
/// gives the reply's bytes back once they are written.
pub struct Budget {
    used: AtomicUsize,
    limit: usize,
    freed_tx: Sender<()>,
    freed_rx: async_channel::Receiver<()>,
}

impl Budget {
    /// A budget of `limit` bytes, none in use.
    pub fn new(limit: usize) -> Self {
        let (freed_tx, freed_rx) = async_channel::bounded(1);
        Budget {
            used: AtomicUsize::new(0),
            limit,
            freed_tx,
            freed_rx,
        }
    }

    /// Bytes in use now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Waits until `n` more bytes fit (or nothing is in use: one request larger than the
    /// whole budget still goes through, alone), then takes them. Only the connection's
    /// reader takes, so the check and the addition cannot race with another taker.
    async fn take(&self, n: usize) {
        loop {
            let used = self.used();
            if used == 0 || used.saturating_add(n) <= self.limit {
                self.used.fetch_add(n, Ordering::AcqRel);
                return;
            }
            // Woken by any release; a missed wake-up is impossible (the permit stays).
            let _ = self.freed_rx.recv().await;
        }
    }

    /// Gives `n` bytes back and wakes the reader if it waits.
    fn give(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
        let _ = self.freed_tx.try_send(());
    }

    /// Trades a request's reservation of `reserved` bytes for its reply of `reply` bytes
    /// (0: no reply); called by the log thread when it answers the request.
    pub fn settle(&self, reserved: usize, reply: usize) {
        if reply >= reserved {
            self.used.fetch_add(reply - reserved, Ordering::AcqRel);
        } else {
            self.give(reserved - reply);
        }
    }
}

/// Bytes a request of postcard bytes `msg` reserves: itself plus the largest reply it can
/// get. A fetch's reply holds at most `max_bytes` of records, or one record if that is
/// larger (`record_frame`), and never more than `max_frame`; a consumer list may fill a
/// frame; anything else gets at most [`SMALL_REPLY`] bytes.
fn reservation(msg: &[u8], max_frame: usize, record_frame: usize) -> usize {
    let reply = match postcard::from_bytes::<Request<'_>>(msg) {
        Ok(Request::Fetch { max_bytes, .. }) => {
            let block = usize::try_from(max_bytes).unwrap_or(usize::MAX);
            max_encoded_len(RECORDS_HEADER_MAX.saturating_add(block))
                .max(record_frame)
                .min(max_frame)
        }
        Ok(Request::ListConsumers { .. }) => max_frame,
        _ => SMALL_REPLY,
    };
    msg.len().saturating_add(reply)
}

/// What every connection task needs.
#[derive(Clone)]
pub struct Ctx {
    /// The log thread's command queue.
    pub cmds: Sender<Cmd>,
    /// Next connection id.
    pub next_id: Arc<AtomicU64>,
    /// Largest frame, bytes on the wire including the delimiter.
    pub max_frame: usize,
    /// Largest record payload, bytes (`--max-record-bytes`); a line-mode connection's line
    /// limit follows from it ([`lines::max_line`]).
    pub max_record: usize,
    /// Largest reply frame that carries one record, bytes: a fetch gets at least one record
    /// whatever its `max_bytes`.
    pub record_frame: usize,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Client connections being served now.
    pub active: Arc<AtomicUsize>,
    /// Most client connections served at once.
    pub max_connections: usize,
    /// How long a handshaken framed socket connection may be silent with nothing in flight
    /// (`--idle-timeout-ms`; `None`: for ever).
    pub idle_timeout: Option<Duration>,
    /// Refused connections being answered now (at most [`MAX_REFUSALS_ANSWERED`]).
    pub refusals: Arc<AtomicUsize>,
    /// The warning about refused connections, at most one per [`WARN_EVERY`](super::throttle::WARN_EVERY).
    pub refusal_warnings: Arc<super::throttle::Throttled>,
    /// The configured client credentials.
    pub credentials: Arc<Credentials>,
}

/// A slot among the `max_connections`: taken when a connection is accepted, given back
/// when its task ends.
pub struct ConnSlot(Arc<AtomicUsize>);

impl Ctx {
    /// Takes a connection slot, or `None` (and a warning) when all are in use.
    pub fn admit(&self, peer: &str) -> Option<ConnSlot> {
        let taken = self.active.fetch_add(1, Ordering::AcqRel);
        if taken >= self.max_connections {
            self.active.fetch_sub(1, Ordering::AcqRel);
            self.metrics.refused_max_connections();
            self.refusal_warnings.warn(|| {
                format!(
                    "{peer}: refused: {} connections already served (--max-connections)",
                    self.max_connections
                )
            });
            return None;
        }
        Some(ConnSlot(self.active.clone()))
    }
}

/// A place among the [`MAX_REFUSALS_ANSWERED`] refusals being answered, given back when
/// dropped.
pub struct RefusalSlot(Arc<AtomicUsize>);

impl Ctx {
    /// Takes a place to answer a refused connection, or `None` when
    /// [`MAX_REFUSALS_ANSWERED`] are being answered (the connection is then closed without
    /// a word).
    pub fn answer_refusals(&self) -> Option<RefusalSlot> {
        let taken = self.refusals.fetch_add(1, Ordering::AcqRel);
        if taken >= MAX_REFUSALS_ANSWERED {
            self.refusals.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(RefusalSlot(self.refusals.clone()))
    }
}

impl Drop for RefusalSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves one connection until the peer closes, an I/O error, too many bad frames, the log
/// thread drops it (a client that does not read its replies), or, with `hello_timeout`
/// (sockets: [`HELLO_TIMEOUT`]; serial ports wait for ever), a framed connection sends no
/// complete frame that long after it was accepted, or, after that, sends nothing for
/// [`Ctx::idle_timeout`] while nothing of it is in flight. `access` decides what the connection
/// may do: each `Hello` is judged (its token hashed and looked up) here, and the verdict
/// reaches the log thread just before the `Hello`.
#[allow(clippy::too_many_arguments)]
pub async fn serve<R, W>(
    mut r: R,
    mut w: W,
    mode: Mode,
    ctx: Ctx,
    peer: String,
    hello_timeout: Option<Duration>,
    access: Access,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let conn: ConnId = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.metrics.connections.inc();
    log::debug!("connection {conn} from {peer} ({mode:?})");
    if access.token_required && access.client_cert.is_none() && !matches!(mode, Mode::Frames) {
        // Lines carry no token: on a listener that requires credentials, only a client
        // certificate admits them.
        log::warn!(
            "connection {conn} from {peer}: a line-mode connection here needs a client certificate; closing"
        );
        ctx.metrics.refused_unauthorized();
        return;
    }
    // Unbounded as a channel, bounded in bytes by the budget.
    let (tx, rx) = async_channel::unbounded::<Vec<u8>>();
    let budget = Arc::new(Budget::new(ctx.max_frame.saturating_add(BUDGET_EXTRA)));
    let (kill_tx, kill_rx) = async_channel::bounded::<()>(1);
    // Line mode gets no replies: the connection keeps its own ends of both queues.
    let mut _keep = None;
    if matches!(mode, Mode::Frames) {
        let open = Cmd::Open {
            conn,
            replies: tx,
            kill: kill_tx,
            budget: budget.clone(),
            roles: if access.token_required {
                Roles::NONE
            } else {
                access.roles
            },
        };
        if ctx.cmds.send(open).await.is_err() {
            return;
        }
    } else {
        _keep = Some((tx, kill_tx));
    }
    let cmds = ctx.cmds.clone();
    let reader = async {
        let mut buf = vec![0u8; READ_BUF];
        match &mode {
            Mode::Frames => {
                // The one frame splitter (linear, bounded by the frame limit): its buffer
                // grows only as large as the largest frame this client sent.
                let limit = ctx.max_frame.saturating_sub(1);
                let mut frames = FrameDecoder::new(GrowingFrameBuffer::new(limit));
                let mut bad_in_a_row = 0u32;
                let hello_deadline = hello_timeout.map(|t| (std::time::Instant::now() + t, t));
                let mut greeted = hello_deadline.is_none();
                let mut first_read = true;
                // Sockets only (a serial port has no slot to give back).
                let idle = ctx.idle_timeout.filter(|_| hello_timeout.is_some());
                let mut heard = std::time::Instant::now();
                // One timer, set for the deadline or earlier: every read moves the idle
                // deadline later, and setting a timer wakes the reactor's thread, so it
                // is set again only when the deadline comes earlier than it is set for,
                // or after it went off before the deadline (then the wait goes on).
                let mut timer = smol::Timer::never();
                let mut armed: Option<std::time::Instant> = None;
                loop {
                    let deadline = match (hello_deadline, idle) {
                        (Some((at, _)), _) if !greeted => Some(at),
                        (_, Some(t)) if greeted => Some(heard + t),
                        _ => None,
                    };
                    let read = match deadline {
                        Some(at) => {
                            if armed.is_none_or(|set| at < set) {
                                timer.set_at(at);
                                armed = Some(at);
                            }
                            smol::future::or(async { Some(r.read(&mut buf).await) }, async {
                                (&mut timer).await;
                                None
                            })
                            .await
                        }
                        None => Some(r.read(&mut buf).await),
                    };
                    if read.is_none() {
                        // The timer went off: it is set again for the next wait.
                        armed = None;
                        if deadline.is_some_and(|at| std::time::Instant::now() < at) {
                            continue;
                        }
                    }
                    let n = match read {
                        Some(Ok(0) | Err(_)) => return,
                        Some(Ok(n)) if first_read && looks_like_tls(&buf[..n]) => {
                            log::warn!(
                                "connection {conn} from {peer}: a TLS client on a plaintext listener (connect with tcp://, or serve it tls://); closing"
                            );
                            ctx.metrics.tls_handshake_failed();
                            return;
                        }
                        Some(Ok(n)) => {
                            first_read = false;
                            heard = std::time::Instant::now();
                            n
                        }
                        // Idle: closed only when nothing of it is in flight (a long poll
                        // waiting holds its reservation, so does an unanswered request or
                        // an unwritten reply); otherwise the wait starts again.
                        None if greeted => {
                            if budget.used() > 0 {
                                heard = std::time::Instant::now();
                                continue;
                            }
                            log::info!(
                                "connection {conn} from {peer}: nothing received for {:?} and nothing in flight; closing (--idle-timeout-ms)",
                                idle.unwrap_or_default()
                            );
                            return;
                        }
                        None => {
                            log::warn!(
                                "connection {conn} from {peer}: no complete frame within {:?} of connecting; closing",
                                hello_deadline.map_or(Duration::ZERO, |d| d.1)
                            );
                            return;
                        }
                    };
                    let mut input = &buf[..n];
                    loop {
                        let cmd = match frames.feed(input) {
                            FeedResult::Consumed => break,
                            FeedResult::Frame { message, remaining } => {
                                input = remaining;
                                bad_in_a_row = 0;
                                greeted = true;
                                if let Some((auth, roles)) = access.judge(message, &peer) {
                                    let verdict = Cmd::Authorize { conn, auth, roles };
                                    if cmds.send(verdict).await.is_err() {
                                        return;
                                    }
                                }
                                Cmd::Frame {
                                    conn,
                                    reserved: reservation(message, ctx.max_frame, ctx.record_frame),
                                    msg: message.to_vec(),
                                }
                            }
                            FeedResult::Error { error, remaining } => {
                                input = remaining;
                                bad_in_a_row += 1;
                                Cmd::FrameError {
                                    conn,
                                    error,
                                    reserved: SMALL_REPLY,
                                }
                            }
                        };
                        // Backpressure: the next request waits (and the socket is not
                        // read) until the earlier replies have gone out.
                        budget.take(cmd.reserved()).await;
                        if cmds.send(cmd).await.is_err() {
                            return;
                        }
                        if bad_in_a_row > MAX_BAD_FRAMES {
                            log::warn!(
                                "connection {conn} from {peer}: repeated bad frames; closing"
                            );
                            // Let the error replies go out before closing.
                            smol::Timer::after(Duration::from_millis(50)).await;
                            return;
                        }
                    }
                }
            }
            // Served by `super::mqtt::serve`, never here.
            Mode::Mqtt { .. } => {}
            Mode::Lines { topic, timeout_ms } => {
                let limit = lines::max_line(ctx.max_record, topic.is_some());
                let timeout = Duration::from_millis(*timeout_ms);
                let topic: Option<Arc<str>> = topic.as_deref().map(Arc::from);
                let peer: Arc<str> = Arc::from(peer.as_str());
                let mut line = Vec::new();
                // Bytes of the current line so far, kept or not (an overlong line is not).
                let mut pending = 0usize;
                let mut overflow = false;
                loop {
                    // A partial line waits at most `timeout` for the rest: a sensor that
                    // stops mid-line loses that line, never glues it to the next one.
                    let read = if pending > 0 {
                        smol::future::or(async { Some(r.read(&mut buf).await) }, async {
                            smol::Timer::after(timeout).await;
                            None
                        })
                        .await
                    } else {
                        Some(r.read(&mut buf).await)
                    };
                    let n = match read {
                        None => {
                            let why = if overflow {
                                ReaderDrop::TooLong {
                                    limit,
                                    fixed_topic: topic.is_some(),
                                }
                            } else {
                                ReaderDrop::Partial {
                                    len: pending,
                                    timeout_ms: *timeout_ms,
                                }
                            };
                            line.clear();
                            pending = 0;
                            overflow = false;
                            let dropped = Cmd::LineDropped {
                                peer: peer.clone(),
                                why,
                            };
                            if cmds.send(dropped).await.is_err() {
                                return;
                            }
                            continue;
                        }
                        Some(Ok(0)) => {
                            // A last line without its newline at end of stream is still a
                            // line (what `nc`, `printf` and log shippers send).
                            if !line.is_empty() && !overflow {
                                let last = Cmd::Line {
                                    line: std::mem::take(&mut line),
                                    topic: topic.clone(),
                                    peer: peer.clone(),
                                };
                                let _ = cmds.send(last).await;
                            }
                            return;
                        }
                        Some(Err(_)) => return,
                        Some(Ok(n)) => n,
                    };
                    let mut input = &buf[..n];
                    while !input.is_empty() {
                        let (chunk, rest, complete) = match input.iter().position(|&b| b == b'\n') {
                            Some(p) => (&input[..p], &input[p + 1..], true),
                            None => (input, &input[..0], false),
                        };
                        input = rest;
                        pending = pending.saturating_add(chunk.len());
                        if !overflow {
                            if line.len() + chunk.len() > limit {
                                overflow = true;
                                line.clear();
                            } else {
                                line.extend_from_slice(chunk);
                            }
                        }
                        if !complete {
                            continue;
                        }
                        let cmd = if overflow {
                            Cmd::LineDropped {
                                peer: peer.clone(),
                                why: ReaderDrop::TooLong {
                                    limit,
                                    fixed_topic: topic.is_some(),
                                },
                            }
                        } else {
                            Cmd::Line {
                                line: std::mem::take(&mut line),
                                topic: topic.clone(),
                                peer: peer.clone(),
                            }
                        };
                        overflow = false;
                        pending = 0;
                        line.clear();
                        if cmds.send(cmd).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    };
    let writer = async {
        let mut batch = Vec::new();
        while let Ok(f) = rx.recv().await {
            if f.len() >= WRITE_BATCH {
                // A large reply (a fetch's records) goes out as it is, without a copy: the
                // small replies queued behind it follow in the next write, as they would.
                if w.write_all(&f).await.is_err() || w.flush().await.is_err() {
                    return;
                }
                budget.give(f.len());
                continue;
            }
            batch.clear();
            batch.extend_from_slice(&f);
            drop(f);
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(f) => batch.extend_from_slice(&f),
                    Err(_) => break,
                }
            }
            if w.write_all(&batch).await.is_err() || w.flush().await.is_err() {
                return;
            }
            budget.give(batch.len());
            if batch.capacity() > WRITE_BATCH {
                // One large reply went out: do not keep its memory for the small ones.
                batch = Vec::new();
            }
        }
    };
    let killed = async {
        let _ = kill_rx.recv().await;
    };
    smol::future::or(reader, smol::future::or(writer, killed)).await;
    if matches!(mode, Mode::Frames) {
        let _ = ctx.cmds.send(Cmd::Close { conn }).await;
    }
    log::debug!("connection {conn} from {peer} closed");
}

/// Accepts on `listener` until the task is cancelled. Each connection takes a slot among
/// `--max-connections`, gets `TCP_NODELAY` and a bounded send buffer, then, on its own
/// task, the TLS handshake when `tls` is given (a failed or slow one is logged with the
/// reason, counted as `spillway_refused_total{reason="tls_handshake"}`, and closed), and
/// then `handle`. The slot is given back when `handle` ends. Any listener kind that speaks
/// over TCP (frames, lines, other protocols) gets its TLS twin from this loop. A connection
/// with no slot left is closed; with `frames` (the listener speaks the framed protocol) it is
/// first told why ([`answer_refusal`], after the TLS handshake on a TLS listener), as long as
/// fewer than [`MAX_REFUSALS_ANSWERED`] refusals are being answered.
pub async fn accept_loop<F, Fut>(
    listener: smol::net::TcpListener,
    uri: String,
    tls: Option<Tls>,
    frames: bool,
    ctx: Ctx,
    handle: F,
) where
    F: Fn(Accepted) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let handle = Arc::new(handle);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log::warn!("{uri}: accept failed: {e}");
                smol::Timer::after(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = peer.to_string();
        let Some(slot) = ctx.admit(&peer) else {
            if frames && let Some(answering) = ctx.answer_refusals() {
                let (tls, max) = (tls.clone(), ctx.max_connections);
                smol::spawn(async move {
                    match tls {
                        None => answer_refusal(stream, max).await,
                        Some(tls) => {
                            let handshake =
                                smol::future::or(async { tls.accept(stream).await.ok() }, async {
                                    smol::Timer::after(REFUSAL_LINGER).await;
                                    None
                                });
                            if let Some((s, _)) = handshake.await {
                                answer_refusal(s, max).await;
                            }
                        }
                    }
                    drop(answering);
                })
                .detach();
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        bound_send_buffer(&stream, &peer, ctx.max_frame);
        let (handle, tls, metrics, uri) = (
            handle.clone(),
            tls.clone(),
            ctx.metrics.clone(),
            uri.clone(),
        );
        smol::spawn(async move {
            let accepted = match tls {
                None => Accepted {
                    stream: Stream::Tcp(stream),
                    peer,
                    client_cert: None,
                },
                Some(tls) => match tls.accept(stream).await {
                    Ok((s, client_cert)) => Accepted {
                        stream: Stream::Tls(Box::new(s)),
                        peer,
                        client_cert,
                    },
                    Err(why) => {
                        log::warn!("{peer}: TLS handshake on {uri} failed: {why}");
                        metrics.tls_handshake_failed();
                        return;
                    }
                },
            };
            handle(accepted).await;
            drop(slot);
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send buffer is the frame limit, within its floor and its cap.
    #[test]
    fn send_buffer_follows_the_frame_limit_within_bounds() {
        assert_eq!(send_buffer_bytes(4096), SOCKET_SEND_BUFFER);
        assert_eq!(send_buffer_bytes(64 * 1024), 64 * 1024);
        assert_eq!(send_buffer_bytes(256 * 1024), 256 * 1024);
        assert_eq!(send_buffer_bytes(16 << 20), MAX_SOCKET_SEND_BUFFER);
    }
}

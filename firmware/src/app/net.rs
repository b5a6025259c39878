//! Connections: TCP and Unix listeners, serial ports. Each connection is one task that
//! splits its byte stream into frames (or lines) with bounded buffers, sends them to the
//! log thread, and writes back the replies the log thread queued for it.
//!
//! Every connection has a [`Budget`] in bytes: the requests it sent that the log thread has
//! not answered yet, plus the replies not yet written to its socket. A request is read
//! only when its bytes and the largest reply it can get fit in the budget; a client that
//! does not read its replies therefore stops being read (backpressure: its socket fills
//! and its sends block) instead of making the gateway queue more.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_channel::Sender;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use spillway_core::wire::{
    FeedResult, FrameDecoder, GrowingFrameBuffer, RECORDS_HEADER_MAX, Request, max_encoded_len,
};

use super::config::Mode;
use super::engine::{Cmd, ConnId};
use super::metrics::Metrics;

/// Bytes a connection's budget holds beyond one largest frame: room for many small
/// requests and their replies in flight next to a full-size fetch.
pub const BUDGET_EXTRA: usize = 32 * 1024;

/// Bytes reserved for the reply of a request that is neither a fetch nor a consumer list
/// (an `Ack` is at most 23 bytes; a longer `Error` is counted at its real length).
pub const SMALL_REPLY: usize = 64;

/// Consecutive bad frames after which a connection is closed.
pub const MAX_BAD_FRAMES: u32 = 16;

/// Send buffer asked of the kernel for each accepted connection, bytes (`SO_SNDBUF`;
/// Linux doubles it for its own bookkeeping). The kernel's automatic sizing would let a
/// client that does not read hold megabytes of replies in the gateway's socket before the
/// connection's [`Budget`] stops reading it.
pub const SOCKET_SEND_BUFFER: usize = 64 * 1024;

/// Time a framed connection has to send its first complete frame (the `Hello`) after it is
/// accepted; a connection that sends none in time is closed, so idle sockets cannot hold
/// every `--max-connections` slot.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Sets [`SOCKET_SEND_BUFFER`] on an accepted socket; a failure is logged and the
/// connection served with the kernel's default.
pub fn bound_send_buffer(socket: impl std::os::fd::AsFd, peer: &str) {
    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(socket, SOCKET_SEND_BUFFER) {
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
    /// Largest line, bytes without `\n`.
    pub max_line: usize,
    /// Largest reply frame that carries one record, bytes: a fetch gets at least one record
    /// whatever its `max_bytes`.
    pub record_frame: usize,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Client connections being served now.
    pub active: Arc<AtomicUsize>,
    /// Most client connections served at once.
    pub max_connections: usize,
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
            log::warn!(
                "{peer}: refused: {} connections already served (--max-connections)",
                self.max_connections
            );
            return None;
        }
        Some(ConnSlot(self.active.clone()))
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
/// complete frame that long after it was accepted.
pub async fn serve<R, W>(
    mut r: R,
    mut w: W,
    mode: Mode,
    ctx: Ctx,
    peer: String,
    hello_timeout: Option<Duration>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let conn: ConnId = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.metrics.connections.inc();
    log::debug!("connection {conn} from {peer} ({mode:?})");
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
                loop {
                    let read = match hello_deadline {
                        Some((at, _)) if !greeted => {
                            smol::future::or(async { Some(r.read(&mut buf).await) }, async {
                                smol::Timer::at(at).await;
                                None
                            })
                            .await
                        }
                        _ => Some(r.read(&mut buf).await),
                    };
                    let n = match read {
                        Some(Ok(0) | Err(_)) => return,
                        Some(Ok(n)) => n,
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
            Mode::Lines { topic } => {
                let topic: Option<Arc<str>> = topic.as_deref().map(Arc::from);
                let mut line = Vec::new();
                let mut overflow = false;
                loop {
                    let n = match r.read(&mut buf).await {
                        Ok(0) => {
                            // A last line without its newline at end of stream is still a
                            // line (what `nc`, `printf` and log shippers send).
                            if !line.is_empty() && !overflow {
                                let last = Cmd::Line {
                                    line: std::mem::take(&mut line),
                                    topic: topic.clone(),
                                };
                                let _ = cmds.send(last).await;
                            }
                            return;
                        }
                        Err(_) => return,
                        Ok(n) => n,
                    };
                    let mut input = &buf[..n];
                    while !input.is_empty() {
                        let (chunk, rest, complete) = match input.iter().position(|&b| b == b'\n') {
                            Some(p) => (&input[..p], &input[p + 1..], true),
                            None => (input, &input[..0], false),
                        };
                        input = rest;
                        if !overflow {
                            if line.len() + chunk.len() > ctx.max_line {
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
                            log::warn!("{peer}: line longer than {} bytes dropped", ctx.max_line);
                            Cmd::LineTooLong
                        } else {
                            Cmd::Line {
                                line: std::mem::take(&mut line),
                                topic: topic.clone(),
                            }
                        };
                        overflow = false;
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

/// A serial port read with a timeout, retried: reads block until data arrives.
struct SerialReader(Box<dyn serialport::SerialPort>);

impl io::Read for SerialReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// Opens a serial port in raw mode (8N1, no flow control).
pub fn open_serial(path: &str, baud: u32) -> Result<Box<dyn serialport::SerialPort>, String> {
    serialport::new(path, baud)
        .timeout(Duration::from_millis(500))
        .data_bits(serialport::DataBits::Eight)
        .parity(serialport::Parity::None)
        .stop_bits(serialport::StopBits::One)
        .flow_control(serialport::FlowControl::None)
        .open()
        .map_err(|e| format!("cannot open serial port {path}: {e}"))
}

/// Serves a serial port: one connection per open; reopened after an error.
pub async fn serve_serial(
    first: Box<dyn serialport::SerialPort>,
    spec: super::config::Serial,
    ctx: Ctx,
) {
    let mut port = Some(first);
    loop {
        let p = match port.take() {
            Some(p) => p,
            None => {
                smol::Timer::after(Duration::from_secs(1)).await;
                let (path, baud) = (spec.path.clone(), spec.baud);
                match smol::unblock(move || open_serial(&path, baud)).await {
                    Ok(p) => p,
                    Err(e) => {
                        log::debug!("{e}");
                        continue;
                    }
                }
            }
        };
        let writer = match p.try_clone() {
            Ok(w) => w,
            Err(e) => {
                log::error!("cannot clone serial port {}: {e}", spec.path);
                continue;
            }
        };
        let r = smol::Unblock::new(SerialReader(p));
        let w = smol::Unblock::new(writer);
        serve(r, w, spec.mode.clone(), ctx.clone(), spec.uri.clone(), None).await;
        log::warn!("serial port {} closed; reopening", spec.path);
    }
}

//! Connections: TCP and Unix listeners, serial ports. Each connection is one task that
//! splits its byte stream into frames (or lines) with bounded buffers, sends them to the
//! log thread, and writes back the replies from its own bounded queue.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_channel::Sender;
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use spillway_core::wire::{FeedResult, FrameDecoder, GrowingFrameBuffer};

use super::config::Mode;
use super::engine::{Cmd, ConnId};
use super::metrics::Metrics;

/// Replies queued per connection before the client counts as not reading.
pub const REPLY_QUEUE: usize = 1024;

/// Consecutive bad frames after which a connection is closed.
pub const MAX_BAD_FRAMES: u32 = 16;

/// Bytes read from a socket at a time.
const READ_BUF: usize = 16 * 1024;

/// Bytes of replies gathered into one write.
const WRITE_BATCH: usize = 64 * 1024;

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

/// Serves one connection until the peer closes, an I/O error, too many bad frames, or the
/// log thread drops it (a client that does not read its replies).
pub async fn serve<R, W>(mut r: R, mut w: W, mode: Mode, ctx: Ctx, peer: String)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let conn: ConnId = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.metrics.connections.inc();
    log::debug!("connection {conn} from {peer} ({mode:?})");
    let (tx, rx) = async_channel::bounded::<Vec<u8>>(REPLY_QUEUE);
    let (kill_tx, kill_rx) = async_channel::bounded::<()>(1);
    // Line mode gets no replies: the connection keeps its own ends of both queues.
    let mut _keep = None;
    if matches!(mode, Mode::Frames) {
        let open = Cmd::Open {
            conn,
            replies: tx,
            kill: kill_tx,
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
                loop {
                    let n = match r.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let mut input = &buf[..n];
                    loop {
                        let cmd = match frames.feed(input) {
                            FeedResult::Consumed => break,
                            FeedResult::Frame { message, remaining } => {
                                input = remaining;
                                bad_in_a_row = 0;
                                Cmd::Frame {
                                    conn,
                                    msg: message.to_vec(),
                                }
                            }
                            FeedResult::Error { error, remaining } => {
                                input = remaining;
                                bad_in_a_row += 1;
                                Cmd::FrameError { conn, error }
                            }
                        };
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
        let mut batch = Vec::with_capacity(WRITE_BATCH);
        while let Ok(f) = rx.recv().await {
            batch.clear();
            batch.extend_from_slice(&f);
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(f) => batch.extend_from_slice(&f),
                    Err(_) => break,
                }
            }
            if w.write_all(&batch).await.is_err() || w.flush().await.is_err() {
                return;
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
        serve(r, w, spec.mode.clone(), ctx.clone(), spec.uri.clone()).await;
        log::warn!("serial port {} closed; reopening", spec.path);
    }
}

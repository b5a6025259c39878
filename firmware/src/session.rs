//! A blocking session for microcontrollers: one `embedded_io` transport (a UART, a USB CDC
//! port), one [`Gateway`], one log.
//!
//! [`Session::poll`] does one blocking read, handles every frame (or line) completed by it,
//! flushes the log once if a durable publish is waiting (group commit over everything that
//! read brought in) and then writes the replies. Everything is bounded: frames by the
//! accumulator's `N`, lines by `N` too, waiting acknowledgements by [`MAX_PENDING_ACKS`]
//! (when full, the session flushes early).
//!
//! A session cannot park a long-poll fetch (it blocks in `read`): such a fetch is
//! answered at once, empty if nothing is there.

use embedded_io::{Read, Write};
use spillway_core::log::Log;
use spillway_core::storage::Flash;
use spillway_core::wire::{ErrorCode, FeedResult, FrameAccumulator, Request};

use crate::gateway::{Conn, Gateway, Outcome, error_reply};

/// Durable acknowledgements a session holds before it flushes anyway.
pub const MAX_PENDING_ACKS: usize = 16;

/// Bytes read from the transport per call of `read`.
const READ_CHUNK: usize = 256;

/// Largest encoded `Ack` or `Error` frame kept while waiting for durability, bytes.
const PENDING_FRAME: usize = 200;

/// What the session expects on its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode<'t> {
    /// Framed requests (the protocol).
    Frames,
    /// One record per `\n`-terminated line; no replies.
    Lines {
        /// Topic of every line; `None` takes each line's first word.
        topic: Option<&'t str>,
    },
}

/// The transport failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError<E: core::fmt::Debug> {
    /// Reading or writing the transport failed.
    #[error("transport error: {0:?}")]
    Io(E),
}

/// What one [`Session::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollReport {
    /// Bytes read; 0 means the transport reached its end (the peer closed).
    pub bytes_read: usize,
    /// Frames or lines handled.
    pub handled: u32,
    /// Replies written.
    pub replies: u32,
    /// The log was flushed for durable acknowledgements.
    pub flushed: bool,
    /// The log is poisoned: a flash write, erase or sync failed (waiting durable
    /// acknowledgements were answered `StorageFailed`). Mount the log again
    /// ([`serve_remounting`](crate::serve_remounting) does) before the next poll.
    pub storage_failed: bool,
}

/// One transport served by a gateway. `N` bounds a frame (bytes on the wire without the
/// delimiter) and, in line mode, a line.
pub struct Session<'t, T, const N: usize> {
    io: T,
    mode: Mode<'t>,
    acc: FrameAccumulator<N>,
    line: heapless::Vec<u8, N>,
    line_overflow: bool,
    conn: Conn,
    pending: heapless::Vec<(u64, heapless::Vec<u8, PENDING_FRAME>), MAX_PENDING_ACKS>,
    flush_lines: bool,
}

impl<'t, T: Read + Write, const N: usize> Session<'t, T, N> {
    /// A session over `io`.
    pub fn new(io: T, mode: Mode<'t>) -> Self {
        Session {
            io,
            mode,
            acc: FrameAccumulator::new_inline(),
            line: heapless::Vec::new(),
            line_overflow: false,
            conn: Conn::default(),
            pending: heapless::Vec::new(),
            flush_lines: false,
        }
    }

    /// The transport.
    pub fn transport(&mut self) -> &mut T {
        &mut self.io
    }

    /// Gives the transport back.
    pub fn into_transport(self) -> T {
        self.io
    }

    /// The connection state (handshake).
    pub fn conn(&self) -> Conn {
        self.conn
    }

    /// Reads once (blocking), handles what arrived, flushes for durable publishes, writes
    /// the replies. `now_us` is the monotonic clock, `wall_us` the wall clock (µs since the
    /// Unix epoch). `scratch` is the fetch read buffer (at least the log's largest record);
    /// `out` the reply frame buffer (its length is the frame limit; give it the gateway's
    /// `max_frame_bytes`). Call [`Log::tick`] between polls (e.g. with a read timeout on the
    /// transport) so lingering records reach flash.
    #[allow(clippy::too_many_arguments)]
    pub fn poll<F: Flash>(
        &mut self,
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Result<PollReport, SessionError<T::Error>> {
        let mut rx = [0u8; READ_CHUNK];
        let n = self.io.read(&mut rx).map_err(SessionError::Io)?;
        let mut report = PollReport {
            bytes_read: n,
            ..PollReport::default()
        };
        match self.mode {
            Mode::Frames => self.frames(
                &rx[..n],
                gw,
                log,
                now_us,
                wall_us,
                scratch,
                out,
                &mut report,
            )?,
            Mode::Lines { topic } => {
                self.lines(&rx[..n], topic, gw, log, now_us, wall_us, &mut report)
            }
        }
        if !self.pending.is_empty() || self.flush_lines {
            self.release(gw, log, now_us, out, &mut report)?;
        }
        report.storage_failed = log.poisoned();
        Ok(report)
    }

    #[allow(clippy::too_many_arguments)]
    fn frames<F: Flash>(
        &mut self,
        mut input: &[u8],
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
        report: &mut PollReport,
    ) -> Result<(), SessionError<T::Error>> {
        while !input.is_empty() {
            let outcome = match self.acc.feed(input) {
                FeedResult::Consumed => break,
                FeedResult::Frame { message, remaining } => {
                    input = remaining;
                    gw.counters_mut().frames_received += 1;
                    match postcard::from_bytes::<Request<'_>>(message) {
                        Ok(req) => {
                            // A blocking session cannot park: answer long polls at once.
                            let req = match req {
                                Request::Fetch {
                                    seq,
                                    consumer,
                                    from_offset,
                                    max_bytes,
                                    ..
                                } => Request::Fetch {
                                    seq,
                                    consumer,
                                    from_offset,
                                    max_bytes,
                                    wait_ms: None,
                                },
                                other => other,
                            };
                            gw.handle_request(
                                &mut self.conn,
                                &req,
                                log,
                                now_us,
                                wall_us,
                                scratch,
                                out,
                            )
                        }
                        Err(_) => {
                            gw.counters_mut().frames_rejected += 1;
                            error_reply(out, 0, ErrorCode::BadFrame, "message does not decode")
                        }
                    }
                }
                FeedResult::Error { error, remaining } => {
                    input = remaining;
                    gw.frame_error(&error, out)
                }
            };
            report.handled += 1;
            match outcome {
                Outcome::Reply { len } => {
                    self.io.write_all(&out[..len]).map_err(SessionError::Io)?;
                    report.replies += 1;
                }
                Outcome::ReplyWhenDurable { len, offset } => {
                    let mut frame = heapless::Vec::new();
                    if frame.extend_from_slice(&out[..len]).is_err() {
                        // Cannot happen for an Ack; send it after a flush at once instead.
                        self.release(gw, log, now_us, scratch, report)?;
                        self.io.write_all(&out[..len]).map_err(SessionError::Io)?;
                        continue;
                    }
                    if self.pending.is_full() {
                        self.release(gw, log, now_us, scratch, report)?;
                    }
                    let _ = self.pending.push((offset, frame));
                }
                Outcome::NoReply | Outcome::Park { .. } => {}
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn lines<F: Flash>(
        &mut self,
        mut input: &[u8],
        topic: Option<&str>,
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        report: &mut PollReport,
    ) {
        while !input.is_empty() {
            let (chunk, rest, complete) = match input.iter().position(|&b| b == b'\n') {
                Some(p) => (&input[..p], &input[p + 1..], true),
                None => (input, &input[..0], false),
            };
            input = rest;
            if !self.line_overflow && self.line.extend_from_slice(chunk).is_err() {
                self.line_overflow = true;
            }
            if !complete {
                continue;
            }
            report.handled += 1;
            if self.line_overflow {
                gw.counters_mut().rejected_too_large += 1;
                warn!("line longer than {} bytes dropped", N);
            } else {
                match gw.handle_line(&self.line, topic, log, now_us, wall_us) {
                    Ok(a) => self.flush_lines |= a.durable,
                    Err(e) => warn!("line rejected: {}", e.reason()),
                }
            }
            self.line.clear();
            self.line_overflow = false;
        }
    }

    /// Flushes the log and writes every waiting acknowledgement whose offset is durable
    /// (all of them after a successful flush); on a failed flush they get an error.
    fn release<F: Flash>(
        &mut self,
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        out: &mut [u8],
        report: &mut PollReport,
    ) -> Result<(), SessionError<T::Error>> {
        let _ = gw;
        self.flush_lines = false;
        let flushed = log.flush(now_us);
        report.flushed = true;
        let durable = log.durable_offset();
        while let Some((offset, frame)) = self.pending.first() {
            if *offset < durable {
                self.io.write_all(frame).map_err(SessionError::Io)?;
            } else {
                // The flush failed: tell the publisher its record is not durable.
                let seq = ack_seq(frame).unwrap_or(0);
                let code = match flushed {
                    Err(spillway_core::error::FlushError::Full) => ErrorCode::Full,
                    // A flash error, or a log poisoned by one: remount, then resend.
                    _ => ErrorCode::StorageFailed
                        .for_version(self.conn.protocol_version.unwrap_or(1)),
                };
                if let Outcome::Reply { len } =
                    error_reply(out, seq, code, "record not durable: flush failed")
                {
                    self.io.write_all(&out[..len]).map_err(SessionError::Io)?;
                }
            }
            report.replies += 1;
            self.pending.remove(0);
        }
        self.io.flush().map_err(SessionError::Io)?;
        Ok(())
    }
}

/// The `seq` of an encoded `Ack` frame.
fn ack_seq(frame: &[u8]) -> Option<u32> {
    let mut copy = [0u8; PENDING_FRAME];
    let buf = copy.get_mut(..frame.len())?;
    buf.copy_from_slice(frame);
    let r: spillway_core::wire::Response<'_> = spillway_core::wire::decode_message(buf).ok()?;
    r.seq()
}

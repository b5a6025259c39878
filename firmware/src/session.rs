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
use spillway_core::wire::{ErrorCode, FeedResult, FrameAccumulator, Request, max_encoded_len};

use crate::gateway::{Conn, Gateway, Outcome, error_reply};

/// Durable acknowledgements a session holds before it flushes anyway.
pub const MAX_PENDING_ACKS: usize = 16;

/// Bytes read from the transport per call of `read`.
const READ_CHUNK: usize = 256;

/// Longest postcard encoding of a [`Response::Ack`](spillway_core::wire::Response::Ack),
/// bytes: variant index (1), `seq` as a varint (at most 5), `offset` as a varint (at most
/// 10), `duplicate` (1).
const ACK_MAX_LEN: usize = 1 + 5 + 10 + 1;

/// Largest encoded frame kept while waiting for durability, bytes: any `Ack` fits. A
/// longer one (an `Error` with a message, for a resend stored below the producer's window)
/// is sent right after a flush instead of being held ([`Session::poll`]).
const PENDING_FRAME: usize = max_encoded_len(ACK_MAX_LEN);

/// An acknowledgement waiting for its record to be durable.
struct Pending {
    /// The offset that must be durable.
    offset: u64,
    /// The request's `seq`, for the error reply if the flush fails.
    seq: u32,
    /// The encoded reply frame.
    frame: heapless::Vec<u8, PENDING_FRAME>,
}

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
    input: Input<'t, N>,
    conn: Conn,
    pending: heapless::Vec<Pending, MAX_PENDING_ACKS>,
    flush_lines: bool,
}

/// The input state of a session: the mode never changes, so one `N`-byte buffer serves
/// either mode (both in one value would double a session's largest field).
enum Input<'t, const N: usize> {
    /// [`Mode::Frames`]: the frame being received.
    Frames(FrameAccumulator<N>),
    /// [`Mode::Lines`].
    Lines {
        /// Topic of every line; `None` takes each line's first word.
        topic: Option<&'t str>,
        /// The line being received.
        line: heapless::Vec<u8, N>,
        /// The line being received is longer than `N`: dropped at its end.
        overflow: bool,
    },
}

impl<'t, T: Read + Write, const N: usize> Session<'t, T, N> {
    /// A session over `io`.
    pub fn new(io: T, mode: Mode<'t>) -> Self {
        Session {
            io,
            input: match mode {
                Mode::Frames => Input::Frames(FrameAccumulator::new_inline()),
                Mode::Lines { topic } => Input::Lines {
                    topic,
                    line: heapless::Vec::new(),
                    overflow: false,
                },
            },
            conn: Conn::default(),
            pending: heapless::Vec::new(),
            flush_lines: false,
        }
    }

    /// A session over `io` whose requests are checked against `roles` (a UART a sensor
    /// shares: [`Roles::PUBLISH`](crate::Roles::PUBLISH)). [`Session::new`] allows every
    /// request.
    pub fn with_roles(io: T, mode: Mode<'t>, roles: crate::Roles) -> Self {
        Session {
            conn: Conn::with_roles(roles),
            ..Session::new(io, mode)
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
    ///
    /// Never inlined: its read chunk and the request handling stay off the stack of the
    /// caller's other work (a mount, on a microcontroller).
    #[inline(never)]
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
        match self.input {
            Input::Frames(_) => self.frames(
                &rx[..n],
                gw,
                log,
                now_us,
                wall_us,
                scratch,
                out,
                &mut report,
            )?,
            Input::Lines { .. } => self.lines(&rx[..n], gw, log, now_us, wall_us, &mut report),
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
            let mut seq = 0;
            let Input::Frames(acc) = &mut self.input else {
                break;
            };
            let outcome = match acc.feed(input) {
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
                            seq = req.seq().unwrap_or(0);
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
                        // Longer than any Ack: flush now (releasing what waits), then send
                        // it if its record became durable, else the flush's error.
                        let flushed = self.release(gw, log, now_us, scratch, report)?;
                        if offset < log.durable_offset() {
                            self.io.write_all(&out[..len]).map_err(SessionError::Io)?;
                        } else {
                            self.not_durable(flushed, seq, out)?;
                        }
                        report.replies += 1;
                        continue;
                    }
                    if self.pending.is_full() {
                        self.release(gw, log, now_us, scratch, report)?;
                    }
                    let _ = self.pending.push(Pending { offset, seq, frame });
                }
                Outcome::NoReply | Outcome::Park { .. } => {}
            }
        }
        Ok(())
    }

    /// Out of line: a frames session does not carry its locals on its stack.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn lines<F: Flash>(
        &mut self,
        mut input: &[u8],
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
        report: &mut PollReport,
    ) {
        let Input::Lines {
            topic,
            line,
            overflow,
        } = &mut self.input
        else {
            return;
        };
        while !input.is_empty() {
            let (chunk, rest, complete) = match input.iter().position(|&b| b == b'\n') {
                Some(p) => (&input[..p], &input[p + 1..], true),
                None => (input, &input[..0], false),
            };
            input = rest;
            if !*overflow && line.extend_from_slice(chunk).is_err() {
                *overflow = true;
            }
            if !complete {
                continue;
            }
            report.handled += 1;
            if *overflow {
                gw.counters_mut().rejected_too_large += 1;
                warn!("line longer than {} bytes dropped", N);
            } else {
                match gw.handle_line(line, *topic, log, now_us, wall_us) {
                    Ok(a) => self.flush_lines |= a.durable,
                    Err(e) => warn!("line rejected: {}", e.reason()),
                }
            }
            line.clear();
            *overflow = false;
        }
    }

    /// Flushes the log and writes every waiting acknowledgement whose offset is durable
    /// (all of them after a successful flush); on a failed flush they get an error.
    /// Returns whether the flush failed for a full log (`Some(true)`), for another reason
    /// (`Some(false)`), or succeeded (`None`).
    fn release<F: Flash>(
        &mut self,
        gw: &mut Gateway,
        log: &mut Log<'_, F>,
        now_us: u64,
        out: &mut [u8],
        report: &mut PollReport,
    ) -> Result<Option<bool>, SessionError<T::Error>> {
        let _ = gw;
        self.flush_lines = false;
        let flushed = match log.flush(now_us) {
            Ok(_) => None,
            Err(spillway_core::error::FlushError::Full) => Some(true),
            Err(_) => Some(false),
        };
        report.flushed = true;
        let durable = log.durable_offset();
        while let Some(p) = self.pending.first() {
            if p.offset < durable {
                self.io.write_all(&p.frame).map_err(SessionError::Io)?;
            } else {
                let seq = p.seq;
                self.not_durable(flushed, seq, out)?;
            }
            report.replies += 1;
            self.pending.remove(0);
        }
        self.io.flush().map_err(SessionError::Io)?;
        Ok(flushed)
    }

    /// Tells the publisher of request `seq` that its record is not durable: the flush
    /// failed for a full log (`Some(true)`) or a flash error, or a log poisoned by one
    /// (remount, then resend).
    fn not_durable(
        &mut self,
        flushed: Option<bool>,
        seq: u32,
        out: &mut [u8],
    ) -> Result<(), SessionError<T::Error>> {
        let code = if flushed == Some(true) {
            ErrorCode::Full
        } else {
            ErrorCode::StorageFailed.for_version(self.conn.protocol_version.unwrap_or(1))
        };
        if let Outcome::Reply { len } =
            error_reply(out, seq, code, "record not durable: flush failed")
        {
            self.io.write_all(&out[..len]).map_err(SessionError::Io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::wire::{Response, encode_frame};

    /// Every `Ack` fits a held frame: the largest numbers encode to the longest varints.
    #[test]
    fn the_longest_ack_fits_a_pending_frame() {
        let mut buf = [0u8; 64];
        let ack = Response::Ack {
            seq: u32::MAX,
            offset: u64::MAX,
            duplicate: true,
        };
        let len = encode_frame(&ack, &mut buf).expect("encodes");
        assert!(len <= PENDING_FRAME, "{len} > {PENDING_FRAME}");
        let body = postcard::to_slice(&ack, &mut buf).expect("encodes").len();
        assert_eq!(body, ACK_MAX_LEN);
    }
}

//! What the gateway's integration tests share: the in-memory transport they drive a
//! `Session` over, a log on a simulated flash, request frames, and one request or message
//! handed to a `Gateway` with its reply.
#![allow(dead_code)]

use std::convert::Infallible;

use spillway_core::log::{Config, Log, Memory, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, Geometry, SimFlash};
use spillway_core::wire::{Request, Response, decode_frame, decode_message, encode_frame};
use spillway_firmware::{Conn, Gateway, Outcome};

/// A NOR-like geometry of `blocks` erase blocks of 4 KiB, 4-byte writes, erased to `0xFF`.
pub fn geometry(blocks: u32) -> Geometry {
    Geometry {
        erase_size: 4096,
        write_size: 4,
        capacity: 4096 * blocks,
        erased: 0xFF,
    }
}

/// `reqs` as the bytes a framed connection carries: a leading frame delimiter, then each
/// request's frame.
pub fn frames(reqs: &[Request<'_>]) -> Vec<u8> {
    let mut out = vec![0u8];
    let mut buf = [0u8; 1024];
    for r in reqs {
        let n = encode_frame(r, &mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// The message bytes of `msg` as a frame carries them (postcard, before the frame's CRC
/// and encoding).
pub fn message<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    let mut buf = [0u8; 1024];
    let n = encode_frame(msg, &mut buf).unwrap();
    decode_frame(&mut buf[..n]).unwrap().to_vec()
}

/// Hands the decoded request `req` to `gw` on `conn` (at time 0, with 64 KiB read and reply
/// buffers) and decodes its reply; panics if there is none. The reply borrows memory
/// leaked for it (a test's few replies).
pub fn reply_to<F: Flash>(
    gw: &mut Gateway,
    conn: &mut Conn,
    log: &mut Log<'_, F>,
    req: &Request<'_>,
) -> Response<'static> {
    let (mut scratch, mut out) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let Outcome::Reply { len } = gw.handle_request(conn, req, log, 0, 0, &mut scratch, &mut out)
    else {
        panic!("no reply to {req:?}");
    };
    let frame: &'static mut [u8] = Box::leak(out[..len - 1].to_vec().into_boxed_slice());
    decode_message::<Response<'_>>(frame).unwrap()
}

/// Hands the message bytes `msg` (a frame's, see [`message`]) to `gw` on `conn` (at time 0,
/// wall clock 1 ms, with 4 KiB read and reply buffers): the reply's message bytes, `None`
/// if the gateway answers nothing. Panics on any other outcome (a parked long poll).
pub fn reply_to_message<F: Flash>(
    gw: &mut Gateway,
    conn: &mut Conn,
    log: &mut Log<'_, F>,
    msg: &[u8],
) -> Option<Vec<u8>> {
    let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    match gw.handle_message(conn, msg, log, 0, 1_000, &mut scratch, &mut out) {
        Outcome::Reply { len } | Outcome::ReplyWhenDurable { len, .. } => {
            let mut frame = out[..len].to_vec();
            Some(decode_frame(&mut frame).unwrap().to_vec())
        }
        Outcome::NoReply => None,
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// A simulated flash of geometry `geo` formatted for a log, and the RAM a log mounted on it
/// works in: a 4 KiB buffer and one slot per segment.
pub struct SimLog {
    pub flash: SimFlash<Vec<u8>>,
    pub buf: Vec<u8>,
    pub slots: Vec<SegmentSlot>,
}

impl SimLog {
    /// Formats the log `log_id` with segments of `blocks_per_segment` erase blocks.
    pub fn new(geo: Geometry, log_id: u128, blocks_per_segment: u32) -> Self {
        let mut flash = SimFlash::new_vec(geo).unwrap();
        Log::format(&mut flash, log_id, blocks_per_segment).unwrap();
        SimLog {
            flash,
            buf: vec![0u8; 4096],
            slots: vec![SegmentSlot::EMPTY; segments_for(&geo, blocks_per_segment) as usize],
        }
    }

    /// Mounts the log (default config, at time 0).
    pub fn mount(&mut self) -> Log<'_, &mut SimFlash<Vec<u8>>> {
        let mem = Memory {
            buffer: &mut self.buf,
            segments: &mut self.slots,
        };
        Log::mount(&mut self.flash, Config::default(), mem, 0)
            .unwrap()
            .0
    }
}

/// Input delivered at most `chunk` bytes per read; every reply written is collected in
/// `output`.
pub struct MemIo {
    /// Bytes the session reads.
    pub input: Vec<u8>,
    /// How far the session has read.
    pub pos: usize,
    /// Most bytes one read returns.
    pub chunk: usize,
    /// Bytes the session wrote.
    pub output: Vec<u8>,
}

impl Default for MemIo {
    /// Empty, with reads as large as the caller's buffer.
    fn default() -> Self {
        MemIo {
            input: Vec::new(),
            pos: 0,
            chunk: usize::MAX,
            output: Vec::new(),
        }
    }
}

impl MemIo {
    /// `input` to be read at most `chunk` bytes per read, nothing written yet.
    pub fn chunked(input: Vec<u8>, chunk: usize) -> MemIo {
        MemIo {
            input,
            chunk,
            ..MemIo::default()
        }
    }
}

impl embedded_io::ErrorType for MemIo {
    type Error = Infallible;
}

impl embedded_io::Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = (self.input.len() - self.pos).min(buf.len()).min(self.chunk);
        buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl embedded_io::Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

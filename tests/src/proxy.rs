//! A TCP proxy in front of a real gateway that rewrites, or holds back, the gateway's reply
//! frames one by one, so that end-to-end tests can make a reachable gateway misbehave
//! (answer every fetch with an error, with no records, with a damaged frame, or never).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

use spillway_core::wire::{self, ErrorCode, Response};

/// What a [`reply_proxy`] does with one frame from the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrite {
    /// Passed on as it came.
    Pass,
    /// Replaced by these bytes (a whole frame, its delimiter included).
    With(Vec<u8>),
    /// Never passed on: the client waits for a reply that does not come.
    Hold,
}

/// Most bytes of the gateway's a proxied connection holds while it waits for a frame's
/// delimiter: a peer that sends more without one is cut off.
const MAX_PENDING: usize = 4 << 20;

/// A proxy on a free port of 127.0.0.1 in front of the gateway at `gateway` (`host:port`):
/// the client's bytes go through unchanged; each frame from the gateway (its bytes up to
/// and including the `0x00` delimiter) is passed to `rewrite`. Its URI, `tcp://HOST:PORT`.
/// Its threads live as long as the test process.
pub fn reply_proxy(gateway: String, rewrite: fn(&[u8]) -> Rewrite) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let (Ok(client), Ok(gw)) = (client, TcpStream::connect(&gateway)) else {
                continue;
            };
            let (Ok(mut from_client), Ok(mut to_gw)) = (client.try_clone(), gw.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_client, &mut to_gw);
                let _ = to_gw.shutdown(Shutdown::Both);
            });
            let (mut from_gw, mut to_client) = (gw, client);
            std::thread::spawn(move || {
                let (mut pending, mut buf) = (Vec::new(), vec![0u8; 1 << 16]);
                while let Ok(n @ 1..) = from_gw.read(&mut buf) {
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.iter().position(|&b| b == 0) {
                        let frame: Vec<u8> = pending.drain(..=end).collect();
                        let out = match rewrite(&frame) {
                            Rewrite::Pass => frame,
                            Rewrite::With(f) => f,
                            Rewrite::Hold => continue,
                        };
                        if to_client.write_all(&out).is_err() {
                            return;
                        }
                    }
                    if pending.len() > MAX_PENDING {
                        break;
                    }
                }
                let _ = to_client.shutdown(Shutdown::Both);
            });
        }
    });
    format!("tcp://{addr}")
}

/// The gateway's reply in `frame` (its delimiter included), if it decodes.
pub fn decode_reply(frame: &[u8], f: impl FnOnce(Response<'_>) -> Rewrite) -> Rewrite {
    let Some(body) = frame.len().checked_sub(1).map(|n| &frame[..n]) else {
        return Rewrite::Pass;
    };
    let mut body = body.to_vec();
    match wire::decode_message::<Response>(&mut body) {
        Ok(r) => f(r),
        Err(_) => Rewrite::Pass,
    }
}

/// `resp` as one frame, its delimiter included.
pub fn frame_of(resp: &Response<'_>, len_hint: usize) -> Vec<u8> {
    let mut out = vec![0u8; len_hint + 256];
    let n = wire::encode_frame(resp, &mut out).expect("encode a frame");
    out.truncate(n);
    out
}

/// A [`reply_proxy`] rewrite: every reply to a fetch (`Records` or `Dropped`) becomes an
/// `Error` reply with code `Internal` and the message "flash read failed (proxy)"; the
/// rest passes.
pub fn fetch_fails(frame: &[u8]) -> Rewrite {
    decode_reply(frame, |r| match r {
        Response::Records { seq, .. } | Response::Dropped { seq, .. } => Rewrite::With(frame_of(
            &Response::Error {
                seq,
                code: ErrorCode::Internal,
                message: "flash read failed (proxy)",
            },
            0,
        )),
        _ => Rewrite::Pass,
    })
}

/// A [`reply_proxy`] rewrite: every reply to a fetch (`Records` or `Dropped`) is held
/// back, never answered; the rest (the handshake, the counters) passes.
pub fn fetch_unanswered(frame: &[u8]) -> Rewrite {
    decode_reply(frame, |r| match r {
        Response::Records { .. } | Response::Dropped { .. } => Rewrite::Hold,
        _ => Rewrite::Pass,
    })
}

/// A [`reply_proxy`] rewrite: every `Records` reply holding records becomes a valid empty
/// one (no records, no lost range, its `next_offset` the fetch's own offset, taken as
/// the first record's: the reply's `next_offset` less its count, for consecutive records).
pub fn fetch_empty(frame: &[u8]) -> Rewrite {
    decode_reply(frame, |r| match r {
        Response::Records {
            seq,
            prev_crc,
            next_offset,
            lost: None,
            records,
        } if !records.is_empty() => Rewrite::With(frame_of(
            &Response::Records {
                seq,
                prev_crc,
                next_offset: next_offset.saturating_sub(u64::from(records.count())),
                lost: None,
                records: wire::EncodedList::from_raw(0, &[]),
            },
            0,
        )),
        _ => Rewrite::Pass,
    })
}

/// A [`reply_proxy`] rewrite: every `Records` reply holding records announces one record
/// more than it holds (the bridge finds the block short: "Hit the end of buffer", a
/// protocol error that closes the connection); the rest passes.
pub fn fetch_damaged(frame: &[u8]) -> Rewrite {
    decode_reply(frame, |r| match r {
        Response::Records {
            seq,
            prev_crc,
            next_offset,
            lost,
            records,
        } if !records.is_empty() => Rewrite::With(frame_of(
            &Response::Records {
                seq,
                prev_crc,
                next_offset,
                lost,
                records: wire::EncodedList::from_raw(records.count() + 1, records.as_bytes()),
            },
            frame.len(),
        )),
        _ => Rewrite::Pass,
    })
}

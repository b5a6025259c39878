//! The tests' way to the protocol client: the bridge's [`Client`] (`spillway_bridge::client`,
//! the one client of the wire protocol) called from blocking test code ([`Wait`]), plus
//! what many tests do with it: connect ([`connect`]), read the whole log ([`read_log`]),
//! wait until the log holds what was sent with no acknowledgement to wait on
//! ([`wait_for_records`]), pipeline publishes and take the replies ([`send_publish`],
//! [`next_reply`]), and look at an acknowledgement or a refusal ([`acked_offset`],
//! [`refusal`]).

use std::time::Duration;

use spillway_core::wire::{AckLevel, ErrorCode, Request};

pub use spillway_bridge::client::{
    Client, ClientError, DEFAULT_REPLY_TIMEOUT, FetchReply, GatewayAddr, OwnedRecord, PublishAck,
    Reply,
};

/// Runs an async client call to completion on the calling thread:
/// `c.stats().wait()`.
pub trait Wait: std::future::Future + Sized {
    /// Blocks until the future is done and returns its output.
    fn wait(self) -> Self::Output {
        smol::block_on(self)
    }
}

impl<F: std::future::Future> Wait for F {}

/// Connects to a gateway (`HOST:PORT` of a TCP listener, or any gateway URI such as
/// `tcp://…`, `tls://…`, `unix://…`) as `test-client`, with the bridge's default reply
/// timeout (10 s), and completes the handshake.
///
/// # Errors
/// A bad address ([`ClientError::Protocol`] naming it), or what [`Client::connect`] returns.
pub fn connect(addr: &str) -> Result<Client, ClientError> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("tcp://{addr}")
    };
    let addr: GatewayAddr = uri
        .parse()
        .map_err(|e| ClientError::Protocol(format!("{uri}: {e}")))?;
    Client::connect(&addr, "test-client", DEFAULT_REPLY_TIMEOUT).wait()
}

/// Every record from offset `from` up to the log's end at the time of the last fetch,
/// oldest first, fetched without a consumer in steps of 256 KiB; a `Dropped` answer moves
/// on to the first offset still there.
///
/// # Errors
/// What [`Client::fetch`] returns.
pub fn read_log(c: &mut Client, from: u64) -> Result<Vec<OwnedRecord>, ClientError> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        match c.fetch(None, at, 256 * 1024, Duration::ZERO).wait()? {
            FetchReply::Records {
                next_offset,
                records,
                ..
            } => {
                if next_offset == at && records.is_empty() {
                    return Ok(out);
                }
                out.extend(records);
                at = next_offset;
            }
            FetchReply::Dropped { first_available } => at = first_available,
        }
    }
}

/// The whole log ([`read_log`] from offset 0) once it holds at least `n` records: for what
/// is stored with no acknowledgement to wait on (lines, QoS 0 messages).
///
/// # Panics
/// If a read fails, or the log still holds fewer than `n` records after 10 s (the records
/// it held are in the message).
pub fn wait_for_records(c: &mut Client, n: usize) -> Vec<OwnedRecord> {
    let held = std::cell::RefCell::new(Vec::new());
    crate::wait::wait_until(
        Duration::from_secs(10),
        || {
            let recs = read_log(c, 0).expect("read the log");
            if recs.len() >= n {
                return Some(recs);
            }
            *held.borrow_mut() = recs;
            None
        },
        || format!("{n} records in the log, which holds {:?}", held.borrow()),
    )
}

/// Sends a publish of `payload` to `topic` (stamped by the gateway's clock, no producer)
/// without waiting for its reply; returns its `seq`. Take the replies with [`next_reply`].
///
/// # Errors
/// What [`Client::send_request`] returns.
pub fn send_publish(
    c: &mut Client,
    topic: &str,
    payload: &[u8],
    ack: AckLevel,
) -> Result<u32, ClientError> {
    c.send_request(|seq| Request::Publish {
        seq,
        topic,
        timestamp_us: None,
        payload,
        ack,
        producer: None,
    })
    .wait()
}

/// The next reply on `c`, whatever request it answers, with its `seq`, waiting up to
/// [`DEFAULT_REPLY_TIMEOUT`].
///
/// # Errors
/// [`ClientError::Timeout`] if none came by then, or what [`Client::next_reply`] returns.
pub fn next_reply(c: &mut Client) -> Result<(Option<u32>, Reply), ClientError> {
    c.next_reply(DEFAULT_REPLY_TIMEOUT)
        .wait()?
        .ok_or(ClientError::Timeout(DEFAULT_REPLY_TIMEOUT))
}

/// The code of the gateway's refusal.
///
/// # Panics
/// If `r` is anything but [`ClientError::Gateway`] (the value is in the message).
pub fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Gateway { code, .. }) => code,
        other => panic!("expected the gateway to refuse, got {other:?}"),
    }
}

/// The offset of a publish's acknowledgement.
///
/// # Panics
/// If the publish failed (the error is in the message).
pub fn acked_offset(r: Result<PublishAck, ClientError>) -> u64 {
    match r {
        Ok(a) => a.offset,
        Err(e) => panic!("publish not acknowledged: {e}"),
    }
}

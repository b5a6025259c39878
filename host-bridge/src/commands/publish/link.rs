//! `publish`'s connection to the gateway: connecting (and telling a port that is not a
//! Spillway listener from one that is down), the retry with backoff, and the wait that a
//! stop cuts short.

use std::time::Duration;

use super::PublishArgs;
use crate::client::{Client, ClientError, FirstContact};
use crate::commands::CLIENT_NAME;
use crate::drain::{Backoff, Shutdown};

/// `publish`'s connection: the open one, or a new one to `args.gateway`.
/// [`Connection::Retry`] after a failed connect, once the backoff's next delay has passed
/// (or `stop` was triggered); [`Connection::NotSpillway`] when `contact` says the address
/// is not a Spillway listener ([`FirstContact::not_spillway`]: no `Welcome` ever came from
/// it, and its peer stayed silent, or closed before a `Welcome` on
/// [`NOT_SPILLWAY_TRIES`](crate::client::NOT_SPILLWAY_TRIES) connects in a row): that is
/// not retried further.
pub(super) async fn connection<'a>(
    conn: &'a mut Option<Client>,
    contact: &mut FirstContact,
    args: &PublishArgs,
    backoff: &mut Backoff,
    stop: &Shutdown,
) -> Connection<'a> {
    if conn.is_none() {
        let r = Client::connect(&args.gateway, CLIENT_NAME, args.reply_timeout).await;
        let give_up = contact.not_spillway(&r);
        match r {
            Ok(c) => *conn = Some(c),
            Err(e @ ClientError::NotSpillway { .. }) if give_up => {
                log::error!(
                    "gateway {}: {e}; not retried: point --gateway at the gateway's Spillway listener (its tcp://, tls:// or unix:// --listen without ?mode=lines), not a line-mode, MQTT or metrics port",
                    args.gateway
                );
                return Connection::NotSpillway;
            }
            Err(e) => {
                let d = backoff.next_delay();
                log::warn!("gateway {}: {e}; retrying in {d:.1?}", args.gateway);
                sleep_or_stop(d, stop).await;
                return Connection::Retry;
            }
        }
    }
    match conn.as_mut() {
        Some(c) => Connection::Ready(c),
        None => Connection::Retry,
    }
}

/// What [`connection`] found.
pub(super) enum Connection<'a> {
    /// Connected.
    Ready(&'a mut Client),
    /// Not connected this time; try again (the retry budget permitting).
    Retry,
    /// The address is not a Spillway listener (logged): stop. Nothing was stored (no
    /// Welcome ever came), and the same command would meet the same port, so the summary
    /// gives no "run it again" hint.
    NotSpillway,
}

/// Sleeps `d` or until `stop` is triggered.
pub(super) async fn sleep_or_stop(d: Duration, stop: &Shutdown) {
    smol::future::or(
        async {
            smol::Timer::after(d).await;
        },
        stop.wait(),
    )
    .await
}

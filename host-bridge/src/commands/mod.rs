//! `publish`, `tail`, `status` and `consumers`: the kcat / mosquitto_pub habits, one file
//! per subcommand.

mod consumers;
mod publish;
mod status;
mod tail;

pub use consumers::{Delete, consumers};
pub use publish::{PUBLISH_INPUT_QUEUE, PUBLISH_WINDOW, PublishArgs, PublishSummary, publish};
pub use status::status;
pub use tail::{TailArgs, TailFormat, Token, tail, topic_matches};

const CLIENT_NAME: &str = concat!("spillway-bridge/", env!("CARGO_PKG_VERSION"));

use std::time::Duration;

use crate::client::{Client, ConsumerInfo, GatewayAddr};
use spillway_core::log::BRIDGE_CONSUMER;

/// The line `consumers` and `status` print under a list that holds the pre-registered
/// consumer ([`BRIDGE_CONSUMER`], created with every fresh image at offset 0).
pub const BRIDGE_CONSUMER_NOTE: &str = "\"bridge\" is registered with every fresh image, so the gateway keeps every record until `spillway-bridge drain` (consumer bridge by default) takes it; delete it only if nothing drains this gateway";

/// Connects to `gateway` for a one-shot command (`status`, `consumers`); `None` after
/// logging why it failed (the command then exits 1).
async fn connect_or_log(gateway: &GatewayAddr, reply_timeout: Duration) -> Option<Client> {
    match Client::connect(gateway, CLIENT_NAME, reply_timeout).await {
        Ok(c) => Some(c),
        Err(e) => {
            log::error!("gateway {gateway}: {e}");
            None
        }
    }
}

/// The consumer that holds a full gateway's space: the one with the lowest committed
/// offset (`None` without consumers).
pub fn retention_holder(consumers: &[ConsumerInfo]) -> Option<&ConsumerInfo> {
    consumers.iter().min_by_key(|c| c.committed_offset)
}

/// `consumer "NAME" (committed offset N, the lowest)`, with what the pre-registered
/// consumer is when it is the one, inside the same parentheses: how `status` and `publish`
/// name the consumer that holds a full gateway's space.
pub fn holder_text(c: &ConsumerInfo) -> String {
    format!(
        "consumer {:?} (committed offset {}, the lowest{})",
        c.name,
        c.committed_offset,
        if c.name == BRIDGE_CONSUMER {
            "; the pre-registered consumer of a fresh image: run spillway-bridge drain"
        } else {
            ""
        }
    )
}

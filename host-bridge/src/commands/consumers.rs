//! `consumers`: lists a gateway's consumers with their committed offset and lag, or
//! deletes one (refusing the last one unless forced).

use std::io::Write;
use std::time::Duration;

use crate::client::{Client, ClientError, GatewayAddr};
use crate::exit;
use spillway_core::wire::{ErrorCode, GUARDED_DELETE_VERSION};

/// A `consumers delete`: the consumer's name, and whether the gateway's last consumer
/// may go.
#[derive(Debug, Clone, Copy)]
pub struct Delete<'a> {
    /// The consumer's name.
    pub name: &'a str,
    /// Delete it even if it is the gateway's last consumer.
    pub force: bool,
}

/// Runs `consumers`: lists the gateway's consumers with their committed offset and lag
/// (the gateway's next offset minus the committed offset), or, with `delete`, deletes that
/// consumer on the gateway and prints whether it existed. A deleted consumer no longer
/// holds back retention; a drain using that name commits it again on its next commit. The
/// gateway's last consumer is refused unless [`Delete::force`]: with no consumer, the
/// gateway reclaims records nobody read (and counts them as dropped).
/// Returns the exit code (1 if the gateway cannot be reached or refuses, or the consumer
/// is the last one and `force` is not set).
pub async fn consumers(
    gateway: &GatewayAddr,
    delete: Option<Delete<'_>>,
    reply_timeout: Duration,
    json: bool,
    out: &mut dyn Write,
) -> i32 {
    let Some(mut c) = super::connect_or_log(gateway, reply_timeout).await else {
        return exit::FAILURE;
    };
    let r = match delete {
        Some(Delete { name, force }) => {
            let existed = match delete_one(&mut c, name, force).await {
                Ok(e) => e,
                Err(Refused::Last(why)) => {
                    log::error!(
                        "{why}: without a consumer nothing holds retention, and the gateway reclaims records nobody has read when it needs room (counted as dropped, under either --full policy); pass --force to delete it anyway"
                    );
                    return exit::FAILURE;
                }
                Err(Refused::Failed(e)) => {
                    log::error!("gateway {gateway}: deleting consumer {name:?}: {e}");
                    return exit::FAILURE;
                }
            };
            if json {
                let v = serde_json::json!({ "deleted": name, "existed": existed });
                writeln!(out, "{v}")
            } else if existed {
                writeln!(out, "deleted consumer {name:?}")
            } else {
                writeln!(out, "consumer {name:?} did not exist")
            }
        }
        None => {
            let (stats, list) = match async {
                Ok::<_, ClientError>((c.stats().await?, c.consumers().await?))
            }
            .await
            {
                Ok(x) => x,
                Err(e) => {
                    log::error!("gateway {gateway}: {e}");
                    return exit::FAILURE;
                }
            };
            let lag = |o: u64| stats.next_offset.saturating_sub(o);
            if json {
                let v = serde_json::json!({
                    "next_offset": stats.next_offset,
                    "consumers": list.iter().map(|c| serde_json::json!({
                        "name": c.name,
                        "committed_offset": c.committed_offset,
                        "lag_offsets": lag(c.committed_offset),
                    })).collect::<Vec<_>>(),
                });
                writeln!(out, "{v}")
            } else {
                (|| -> std::io::Result<()> {
                    writeln!(
                        out,
                        "{:<24} {:>20} {:>20}",
                        "consumer", "committed", "lag (offsets)"
                    )?;
                    for c in &list {
                        writeln!(
                            out,
                            "{:<24} {:>20} {:>20}",
                            c.name,
                            c.committed_offset,
                            lag(c.committed_offset)
                        )?;
                    }
                    if list
                        .iter()
                        .any(|c| c.name == spillway_core::log::BRIDGE_CONSUMER)
                    {
                        writeln!(out, "({})", super::BRIDGE_CONSUMER_NOTE)?;
                    }
                    Ok(())
                })()
            }
        }
    };
    if let Err(e) = r {
        log::error!("output: {e}");
        return exit::FAILURE;
    }
    exit::OK
}

/// Why [`delete_one`] deleted nothing.
enum Refused {
    /// The consumer is the gateway's last one: the gateway's words (`consumer "NAME" is
    /// the gateway's last consumer (committed offset N)`).
    Last(String),
    /// The gateway or the connection failed.
    Failed(ClientError),
}

/// Deletes `name`; without `force`, not if it is the gateway's last consumer. A gateway of
/// protocol version 5 or later checks and deletes in one step; with an older one the check
/// is a listing first, which a concurrent delete can race.
async fn delete_one(c: &mut Client, name: &str, force: bool) -> Result<bool, Refused> {
    if force {
        return c.delete_consumer(name).await.map_err(Refused::Failed);
    }
    if c.welcome().protocol_version >= GUARDED_DELETE_VERSION {
        return match c.delete_consumer_if_not_last(name).await {
            Err(ClientError::Gateway {
                code: ErrorCode::LastConsumer,
                message,
            }) => Err(Refused::Last(message)),
            r => r.map_err(Refused::Failed),
        };
    }
    let list = c.consumers().await.map_err(Refused::Failed)?;
    if let [only] = list.as_slice()
        && only.name == name
    {
        return Err(Refused::Last(format!(
            "consumer {name:?} is the gateway's last consumer (committed offset {})",
            only.committed_offset
        )));
    }
    c.delete_consumer(name).await.map_err(Refused::Failed)
}

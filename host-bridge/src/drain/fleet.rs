//! One bridge, many gateways: a [`Fleet`] runs one [`Drain`] per gateway, concurrently in
//! one process, sharing the state file (a checkpoint per gateway id and consumer, as with
//! one gateway) and the sink: one Kafka producer for all, or a file sink per gateway under
//! `DIR/<gateway id>/` with one lock on `DIR`. A gateway that is down, slow or reflashed
//! only holds up its own drain. Two gateways announcing the same id are refused: at start
//! ([`identify`]) and whenever one comes back under an id another one holds.

use std::sync::Arc;
use std::time::Duration;

use super::fetcher::CLIENT_NAME;
use super::state::{GatewayIds, SharedStore};
use super::{Drain, DrainConfig, DrainError, DrainSummary, Shutdown};
use crate::client::{Client, GatewayAddr};
use crate::exit;
use crate::metrics::Metrics;
use crate::progress::Mode;
use crate::sink::file::DirLock;
use crate::sink::{Sink, SinkSpec};

/// How one gateway's drain ended.
#[derive(Debug)]
pub struct GatewayOutcome {
    /// The gateway's URI.
    pub gateway: String,
    /// What its drain did, or why it stopped.
    pub result: Result<DrainSummary, DrainError>,
}

/// The exit code of a fleet drain: 2 for a configuration error (two gateways with one id),
/// else 3 if any resume check failed, else 4 if the state file failed, else 1 if any
/// gateway could not be drained (unreachable past `--retry-for`, a refused consumer, ...),
/// else 0.
pub fn fleet_exit_code(outcomes: &[GatewayOutcome]) -> i32 {
    let codes: Vec<i32> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err().map(DrainError::exit_code))
        .collect();
    [exit::USAGE, exit::RESUME, exit::STATE, exit::FAILURE]
        .into_iter()
        .find(|c| codes.contains(c))
        .unwrap_or(exit::OK)
}

/// Connects to every gateway at once (one attempt each, at most `timeout`) and refuses two
/// that announce the same gateway id. A gateway that cannot be reached now is not checked
/// here; its drain checks it when it connects.
///
/// # Errors
/// [`DrainError::DuplicateGatewayId`] naming both URIs.
pub async fn identify(gateways: &[GatewayAddr], timeout: Duration) -> Result<(), DrainError> {
    let ex = smol::LocalExecutor::new();
    let tasks: Vec<_> = gateways
        .iter()
        .map(|g| {
            let g = g.clone();
            ex.spawn(async move {
                let hello = async {
                    Client::connect(&g, CLIENT_NAME, timeout)
                        .await
                        .ok()
                        .map(|c| c.welcome().gateway_id.clone())
                };
                let id = smol::future::or(hello, async {
                    smol::Timer::after(timeout).await;
                    None
                })
                .await;
                (g.to_string(), id)
            })
        })
        .collect();
    let found = ex
        .run(async {
            let mut v = Vec::new();
            for t in tasks {
                v.push(t.await);
            }
            v
        })
        .await;
    let ids = GatewayIds::default();
    for (uri, id) in found {
        match id {
            Some(id) => {
                if let Some(other) = ids.claim(&id, &uri) {
                    return Err(DrainError::DuplicateGatewayId { id, uri, other });
                }
            }
            None => log::warn!(
                "gateway {uri}: not reachable at start; its id is checked when it connects"
            ),
        }
    }
    Ok(())
}

/// The drains of several gateways in one process.
pub struct Fleet {
    drains: Vec<(String, Drain)>,
    /// The lock on the file sink's directory, for the fleet's lifetime.
    _sink_lock: Option<DirLock>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("gateways", &self.drains.len())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Opens the state file and the sink once for `gateways`, each drained with `cfg`
    /// (whose `gateway` is replaced) and its own metrics (`metrics[i]` for `gateways[i]`).
    /// Progress is shown per gateway only in the metrics and the final summaries.
    ///
    /// # Errors
    /// The state file cannot be opened ([`DrainError::StateOpen`]), the sink directory is
    /// locked or the sink cannot be opened ([`DrainError::Sink`]).
    pub async fn open(
        cfg: DrainConfig,
        gateways: Vec<GatewayAddr>,
        metrics: Vec<Metrics>,
        stop: Shutdown,
    ) -> Result<Fleet, DrainError> {
        let store = SharedStore::open_for_drain(&cfg.state).await?;
        let (sink_lock, shared_sink) = match &cfg.sink {
            SinkSpec::File(dir) => (
                Some(DirLock::acquire(dir).await.map_err(DrainError::Sink)?),
                None,
            ),
            SinkSpec::Kafka { .. } => (
                None,
                Some(
                    Sink::open(&cfg.sink, &cfg.sink_options)
                        .await
                        .map_err(DrainError::Sink)?,
                ),
            ),
        };
        let ids = Arc::new(GatewayIds::default());
        let drains = gateways
            .into_iter()
            .zip(metrics)
            .map(|(g, m)| {
                let mut c = cfg.clone();
                c.gateway = g.clone();
                c.progress = Mode::Off;
                let sink = shared_sink.as_ref().and_then(Sink::share);
                let d =
                    Drain::with_shared(c, m, stop.clone(), store.clone(), sink, Some(ids.clone()));
                (g.to_string(), d)
            })
            .collect();
        Ok(Fleet {
            drains,
            _sink_lock: sink_lock,
        })
    }

    /// Runs every drain to its end (with `--once`, each gateway's target; otherwise the
    /// shutdown signal) and returns each gateway's outcome, in the order given.
    pub async fn run(self) -> Vec<GatewayOutcome> {
        let ex = smol::LocalExecutor::new();
        let tasks: Vec<_> = self
            .drains
            .into_iter()
            .map(|(uri, d)| {
                ex.spawn(async move {
                    let result = d.run().await;
                    match &result {
                        Ok(s) => log::info!(
                            "gateway {uri} ({:?}): forwarded {} records ({} bytes), {} gaps; checkpoint at offset {}",
                            s.gateway_id,
                            s.records,
                            s.bytes,
                            s.gaps,
                            s.offset
                        ),
                        Err(e) if e.names_gateway() => log::error!("{e}"),
                        Err(e) => log::error!("gateway {uri}: {e}"),
                    }
                    GatewayOutcome {
                        gateway: uri,
                        result,
                    }
                })
            })
            .collect();
        ex.run(async {
            let mut v = Vec::with_capacity(tasks.len());
            for t in tasks {
                v.push(t.await);
            }
            v
        })
        .await
    }
}

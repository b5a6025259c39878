//! The drain: gateway → sink, with redb checkpoints and an exact resume.
//!
//! This module owns what a caller sees of a drain: its settings ([`DrainConfig`],
//! [`StartFrom`]), its errors ([`DrainError`]) and result ([`DrainSummary`]), and
//! [`Drain`] itself with its outer loop: open the state file and the sink, connect, resume,
//! run a session, and reopen the state file after a failed transaction. How a drain works
//! (one session step by step, the resume check, pipelining, gaps, sink files, stopping, the
//! delivery guarantee and the effectively-once resume) is described in `docs/drain.md`.
//!
//! The parts, one file each:
//! - `control`: [`Backoff`], the [`NoProgress`] clock of `--retry-for` and the
//!   [`Shutdown`] signal.
//! - `fetcher`: the task that owns the gateway connection, fetches ahead, commits and
//!   reconnects.
//! - `resume`: loading the checkpoint and the resume check against the gateway.
//! - `kafka_tail`: the effectively-once resume from the Kafka topic's partition tails.
//! - `session`: one session, the fetcher task and the main loop over its batches.
//! - `window`: the in-flight window at the sink, acknowledgements, checkpoint advance and
//!   resends.
//! - `gaps`: gap and never-persisted range bookkeeping.
//! - `state`: what the drains of one process share: the state file and the gateway ids.
//! - `fleet`: one process draining several gateways at once ([`Fleet`]).
//! - `uplink`: the uplink cap, payload bytes per second over every gateway ([`Uplink`]).

mod control;
mod fetcher;
mod fleet;
mod gaps;
#[cfg(feature = "kafka")]
mod kafka_tail;
mod resume;
mod session;
mod state;
mod uplink;
mod window;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_core::wire::ErrorCode;

use crate::checkpoint::{ResumeMismatch, Store, StoreError};
use crate::client::{ClientError, GatewayAddr};
use crate::metrics::Metrics;
use crate::progress::{Mode, Progress};
use crate::sink::{ProducerFailure, Sink, SinkError, SinkOptions, SinkSpec};

use control::sleep_or_stop;
pub use control::{Backoff, NoProgress, Shutdown, ShutdownTrigger};
pub(crate) use fetcher::holds_more;
pub use fetcher::{CORRUPT_REFETCH_DELAY, CORRUPT_REFETCH_FOR, CORRUPT_REFETCHES};
use fetcher::{NoConnection, connect_retry};
pub use fleet::{Fleet, GatewayOutcome, fleet_exit_code, identify};
pub use state::{GatewayIds, SharedStore};
pub use uplink::Uplink;

/// Where to start when the state file has no checkpoint for the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The gateway's oldest retained offset.
    Earliest,
    /// The gateway's next offset (only records published from now on).
    Latest,
    /// This offset.
    Offset(u64),
    /// This many offsets before the gateway's next offset (`--from -10`: the last 10), not
    /// before its first retained one.
    BeforeEnd(u64),
    /// The first offset, in offset order, whose record is stamped at or after this time
    /// (µs since the Unix epoch), found by the gateway (protocol version 4, see
    /// `Client::find_offset`); the next offset if no record is.
    Time(u64),
}

impl std::str::FromStr for StartFrom {
    type Err = String;
    /// `earliest`, `latest`, an offset (decimal digits), `-N` (N offsets before the end)
    /// or an RFC 3339 time (`2026-11-30T12:00:00Z`, `2026-11-30T13:00:00.5+01:00`); the
    /// one parser of `--from` for `tail` and `drain`.
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        let too_big = || format!("--from {s:?}: the offset does not fit in 64 bits");
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            n if digits(n) => n.parse().map(StartFrom::Offset).map_err(|_| too_big()),
            n if n.strip_prefix('-').is_some_and(digits) => n[1..]
                .parse()
                .map(StartFrom::BeforeEnd)
                .map_err(|_| too_big()),
            t => parse_rfc3339_us(t).map(StartFrom::Time).map_err(|why| {
                format!(
                    "--from {s:?}: expected earliest, latest, an offset, -N (the last N offsets) or an RFC 3339 time such as 2026-11-30T12:00:00Z ({why})"
                )
            }),
        }
    }
}

impl std::fmt::Display for StartFrom {
    /// The form [`StartFrom::from_str`](std::str::FromStr) reads (a time in UTC).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            StartFrom::Earliest => f.write_str("earliest"),
            StartFrom::Latest => f.write_str("latest"),
            StartFrom::Offset(o) => write!(f, "{o}"),
            StartFrom::BeforeEnd(n) => write!(f, "-{n}"),
            StartFrom::Time(us) => f.write_str(&format_rfc3339_us(us)),
        }
    }
}

/// Parses an RFC 3339 date and time with its offset (`Z` or `±HH:MM`, fractions of a
/// second allowed) into µs since the Unix epoch. Errors: not RFC 3339, or before the
/// epoch.
pub fn parse_rfc3339_us(s: &str) -> Result<u64, String> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| e.to_string())?;
    u64::try_from(t.unix_timestamp_nanos() / 1000)
        .map_err(|_| "the time is before 1970-01-01T00:00:00Z".to_string())
}

/// `us` (µs since the Unix epoch) as an RFC 3339 time in UTC.
pub fn format_rfc3339_us(us: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{us} µs after the Unix epoch"))
}

/// Settings of a drain.
#[derive(Debug, Clone)]
pub struct DrainConfig {
    /// The gateway.
    pub gateway: GatewayAddr,
    /// The sink.
    pub sink: SinkSpec,
    /// Sink settings.
    pub sink_options: SinkOptions,
    /// The redb state file.
    pub state: PathBuf,
    /// Consumer name (the checkpoint's key, and the name committed on the gateway).
    pub consumer: String,
    /// Start position when there is no checkpoint (`--from`). `None`: the gateway's
    /// committed offset for [`DrainConfig::consumer`] when it is above the log's first
    /// offset, else the first offset.
    pub from: Option<StartFrom>,
    /// Drain up to the gateway's next offset as read at start, then stop.
    pub once: bool,
    /// `--retry-for`: how long to keep retrying a gateway that cannot be reached (or whose
    /// requests keep failing) without progress before giving up with
    /// [`DrainError::GatewayUnreachable`] (a Kafka broker whose partition tails cannot be read
    /// at start, and with [`DrainConfig::once`] a sink that keeps failing:
    /// [`DrainError::SinkUnreachable`]). `None`: [`DEFAULT_ONCE_RETRY_FOR`] with
    /// [`DrainConfig::once`], for ever without it (see [`DrainConfig::retry_budget`]). In
    /// a fleet it applies to each gateway.
    pub retry_for: Option<Duration>,
    /// On a failed resume check, start over from the new log's first offset.
    pub accept_new_log: bool,
    /// Byte budget of one fetch (`max_bytes`), bytes.
    pub max_batch_bytes: u32,
    /// Batches fetched ahead of the sink, at most.
    pub prefetch: usize,
    /// Batches handed to a pipelined sink (Kafka) whose acknowledgements are outstanding,
    /// at most (docs/drain.md, "Pipelining"); at least 1. The file sink always has 1.
    pub max_in_flight_batches: usize,
    /// File sink: the longest a batch written waits for the group checkpoint (fsync of the
    /// files, redb save with their synced lengths, then the gateway's commit;
    /// `--checkpoint-interval`); zero: a checkpoint after every batch.
    pub checkpoint_interval: Duration,
    /// File sink: record payload bytes written that make the group checkpoint due at once
    /// (`--checkpoint-bytes`); with [`DrainConfig::checkpoint_interval`] it bounds what a
    /// crash sends again and what the drain holds in memory for a resend.
    pub checkpoint_bytes: u64,
    /// Long-poll wait of a fetch at the end of the log.
    pub poll_wait: Duration,
    /// First retry delay.
    pub backoff_initial: Duration,
    /// Largest retry delay.
    pub backoff_max: Duration,
    /// Time to wait for a gateway reply.
    pub reply_timeout: Duration,
    /// After a shutdown signal, how long the batch being delivered may still be retried.
    pub shutdown_grace: Duration,
    /// Progress display.
    pub progress: Mode,
    /// Kafka: messages read from the end of each partition at start to find records
    /// delivered but not checkpointed (effectively-once resume); 0 turns the scan off.
    pub kafka_resume_window: u64,
    /// Kafka: how long one scan of the partition tails may take before it is retried.
    pub kafka_resume_timeout: Duration,
    /// The uplink cap (`--max-bytes-per-sec`): record payload bytes per second handed to
    /// the sink, shared by every gateway of the drain (clones of this config share it).
    /// `None`: no cap.
    pub uplink: Option<Uplink>,
}

/// How long the Kafka producer's metadata warm-up may hold up the start of the drain.
#[cfg(feature = "kafka")]
pub const WARM_UP_TIMEOUT: Duration = Duration::from_secs(2);

/// Default of [`DrainConfig::retry_for`] with `--once` (5 minutes).
pub const DEFAULT_ONCE_RETRY_FOR: Duration = Duration::from_secs(300);

/// Default of [`DrainConfig::max_in_flight_batches`]. A fetch's reply is one gateway frame
/// (64 KiB unless the gateway's record limit is larger), so a batch of 100-byte records
/// holds about 470 of them whatever `max_batch_bytes` allows: with 4 batches in flight the
/// Kafka producer ran dry between delivery reports (300,000 records into a local broker: a
/// median of 1.98 s for the whole drain, against 1.37 s with 8; 16 and 32 were no faster).
/// A crash leaves at most about twice this many batches delivered and not saved, well
/// inside the resume scan's first window of 10,000 messages at that size.
pub const DEFAULT_MAX_IN_FLIGHT_BATCHES: usize = 8;

/// Default of [`DrainConfig::checkpoint_interval`] (1 s, as a log shipper's flush
/// interval): a checkpoint per fetch reply (one gateway frame, about 470 records of 100 B)
/// cost an fsync of the files, a redb commit and a gateway commit each, and held the file
/// sink to a twelfth of a plain writer's rate.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Default of [`DrainConfig::checkpoint_bytes`] (16 MiB of record payload): a crash sends
/// again at most this much, plus one batch, or what one interval brought if that is less.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 16 << 20;

/// Kafka: how long batches in flight may wait with no delivery report before the drain
/// warns (librdkafka retries a broker that is down on its own until its delivery timeout,
/// 5 min by default, and says nothing meanwhile). Reports that come again after it are
/// logged too, with how long they stopped.
pub const SINK_STALL_WARNING: Duration = Duration::from_secs(15);

/// File sink: batches written and waiting for one group checkpoint, at most (each at most
/// one gateway frame).
pub(super) const MAX_UNSYNCED_BATCHES: usize = 1024;

/// The largest window the effectively-once resume grows to, messages per partition.
pub const MAX_RESUME_WINDOW: u64 = 1 << 20;

impl DrainConfig {
    /// How long the drain retries without progress before it gives up: `--retry-for`
    /// when given; else [`DEFAULT_ONCE_RETRY_FOR`] with `--once`, and for ever (`None`)
    /// without it.
    pub fn retry_budget(&self) -> Option<Duration> {
        match (self.retry_for, self.once) {
            (Some(d), _) => Some(d),
            (None, true) => Some(DEFAULT_ONCE_RETRY_FOR),
            (None, false) => None,
        }
    }

    /// Defaults for everything but the gateway, sink and state file.
    pub fn new(gateway: GatewayAddr, sink: SinkSpec, state: PathBuf) -> Self {
        DrainConfig {
            gateway,
            sink,
            sink_options: SinkOptions::default(),
            state,
            consumer: spillway_core::log::BRIDGE_CONSUMER.to_string(),
            from: None,
            once: false,
            retry_for: None,
            accept_new_log: false,
            max_batch_bytes: 256 * 1024,
            prefetch: 4,
            max_in_flight_batches: DEFAULT_MAX_IN_FLIGHT_BATCHES,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            poll_wait: Duration::from_millis(500),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            reply_timeout: crate::client::DEFAULT_REPLY_TIMEOUT,
            shutdown_grace: Duration::from_secs(30),
            progress: Mode::Auto,
            kafka_resume_window: 10_000,
            kafka_resume_timeout: Duration::from_secs(10),
            uplink: None,
        }
    }
}

/// Why a drain ended with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// The resume check failed (exit code 3; not retried).
    #[error(
        "resume check failed: {0}; rerun with --accept-new-log to start over from the gateway's first offset"
    )]
    Resume(#[from] ResumeMismatch),
    /// The state file failed (exit code 4): with `--once`, any failed transaction;
    /// without it, one that reopening cannot cure (a value that does not parse).
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The state file could not be opened at start (exit code 4).
    #[error(
        "cannot open the state file {}: {source} (if another drain holds it, stop that one; if the reason is an I/O error, fix the disk first and keep the file; only a file that is damaged should be moved aside: without a checkpoint the next drain starts at the gateway's committed offset for its consumer)",
        path.display()
    )]
    StateOpen {
        /// The state file.
        path: PathBuf,
        /// Why.
        source: StoreError,
    },
    /// The sink could not be opened (exit code 1).
    #[error("sink: {0}")]
    Sink(SinkError),
    /// A setting does not fit the gateway (exit code 2).
    #[error("{0}")]
    Config(String),
    /// The gateway refused to create the consumer: its consumer table is full (exit code
    /// 1). The consumer would never hold retention, so the drain stops instead of going on.
    #[error(
        "the gateway refused to commit offset {offset} for consumer {consumer:?}: {message}; its consumer table is full (at most {max} consumers), so this consumer would never hold back retention. Free a slot with `spillway-bridge consumers delete NAME` (`spillway-bridge consumers` lists them with their lag), or drain as an existing consumer with --consumer"
    )]
    TooManyConsumers {
        /// The consumer name.
        consumer: String,
        /// The offset whose commit was refused.
        offset: u64,
        /// Consumers a gateway keeps, at most.
        max: usize,
        /// The gateway's message.
        message: String,
    },
    /// The gateway cannot send the record at `offset`: it is larger than the frames the
    /// gateway now sends (it was stored with a larger RAM buffer), exit code 1. Fetching it
    /// again would fail for ever.
    #[error(
        "the gateway cannot send the record at offset {offset}: {message}; it was stored while the gateway ran with a larger --buffer-bytes: restart the gateway with that buffer size to drain it"
    )]
    RecordTooLarge {
        /// The record's offset.
        offset: u64,
        /// The gateway's message.
        message: String,
    },
    /// The gateway made no progress for the whole retry budget
    /// ([`DrainConfig::retry_budget`]): it could not be reached, or it took the connections
    /// and failed every fetch (an error reply, a bad or missing reply, an empty reply while
    /// its log holds records past the fetch offset); exit code 1. The message holds for
    /// both: the gateway's URI, how long, and the last error.
    #[error(
        "gateway {gateway} made no progress for {waited:.1?} (--retry-for): {last_error}; the checkpoint stays where it was, and the next drain resumes there"
    )]
    GatewayUnreachable {
        /// The gateway.
        gateway: String,
        /// How long the drain retried.
        waited: Duration,
        /// The last failure.
        last_error: String,
    },
    /// The gateway's address is not a Spillway listener: at the drain's first connection
    /// the peer closed it or sent no `Welcome` within [`crate::client::WELCOME_TIMEOUT`]
    /// ([`ClientError::NotSpillway`]); exit code 1, not retried, with or without `--once`.
    /// A gateway that answered once in this run and later does not is taken for a stalled
    /// or restarting gateway and retried.
    #[error(
        "gateway {gateway}: {source}; giving up at once: point --gateway at the gateway's Spillway listener (its tcp://, tls:// or unix:// --listen without ?mode=lines), not a line-mode, MQTT or metrics port"
    )]
    NotSpillway {
        /// The gateway.
        gateway: String,
        /// What the connection did.
        source: ClientError,
    },
    /// With `--once`: the sink could not be reached (e.g. a Kafka broker whose TLS
    /// certificate does not verify) or kept failing (a file sink directory it cannot write)
    /// for the whole retry budget without progress (exit code 1). Nothing was committed
    /// past what the sink holds durably: the checkpoint stays at the last record it
    /// acknowledged.
    #[error(
        "sink {sink}: no progress for {waited:.1?} (the --once retry budget, --retry-for): {last_error}; the checkpoint stays after the last record the sink holds durably, and the next drain resumes there"
    )]
    SinkUnreachable {
        /// The sink.
        sink: String,
        /// How long the drain retried.
        waited: Duration,
        /// The last failure.
        last_error: String,
    },
    /// Two gateways of one drain announce the same gateway id (cloned SD cards share a
    /// host name): their checkpoints would be one (exit code 2).
    #[error(
        "gateways {uri} and {other} both announce the gateway id {id:?}: their checkpoints would be one; give each gateway its own id (--gateway-id) before draining them together"
    )]
    DuplicateGatewayId {
        /// The gateway id.
        id: String,
        /// The gateway that announced it second.
        uri: String,
        /// The gateway that announced it first.
        other: String,
    },
}

impl DrainError {
    /// Whether the message begins by naming the gateway (`gateway URI …`), so that a line
    /// reporting it for one gateway of a fleet does not name it twice.
    pub fn names_gateway(&self) -> bool {
        matches!(
            self,
            DrainError::GatewayUnreachable { .. } | DrainError::NotSpillway { .. }
        )
    }

    /// The exit code of `spillway-bridge drain` for this error (see the crate doc).
    pub fn exit_code(&self) -> i32 {
        use crate::exit;
        match self {
            DrainError::Resume(_) => exit::RESUME,
            DrainError::Store(_) | DrainError::StateOpen { .. } => exit::STATE,
            DrainError::Config(_)
            | DrainError::DuplicateGatewayId { .. }
            | DrainError::Sink(SinkError::Config(_)) => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}

/// A commit the gateway refuses because its consumer table is full, as a drain error.
fn refused_commit(e: &ClientError, consumer: &str, offset: u64) -> Option<DrainError> {
    match e {
        ClientError::Gateway {
            code: ErrorCode::TooManyConsumers,
            message,
        } => Some(DrainError::TooManyConsumers {
            consumer: consumer.to_string(),
            offset,
            max: spillway_core::log::MAX_CONSUMERS,
            message: message.clone(),
        }),
        _ => None,
    }
}

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainSummary {
    /// Records forwarded by this run.
    pub records: u64,
    /// Payload bytes forwarded by this run.
    pub bytes: u64,
    /// Gaps met by this run.
    pub gaps: u64,
    /// Offsets skipped by this run that the gateway never persisted (`NotPersisted`: the
    /// rest of an offset lease after a crash); not gaps, no record is missing.
    pub skipped_offsets: u64,
    /// Checkpoint offset at the end.
    pub offset: u64,
    /// Log id drained (0 if the gateway was never reached).
    pub log_id: u128,
    /// Gateway id.
    pub gateway_id: String,
}

/// The drain.
pub struct Drain {
    cfg: DrainConfig,
    /// The state file, shared with the other drains of the process.
    state: Arc<SharedStore>,
    /// The generation of the state file handle of the last transaction.
    state_gen: u64,
    /// The sink; `None` for a file sink not opened yet (it is per gateway, see
    /// [`Drain::with_shared`]).
    sink: Option<Sink>,
    /// The gateway id the per-gateway file sink was opened for.
    sink_gateway: Option<String>,
    /// The lock on the file sink's directory (held while the drain lives).
    sink_lock: Option<Arc<crate::sink::file::DirLock>>,
    /// The gateway ids claimed by the gateways of the process (fleet).
    ids: Option<Arc<GatewayIds>>,
    metrics: Metrics,
    stop: Shutdown,
    summary: DrainSummary,
    progress: Progress,
    /// The sink's tail was scanned (once per run).
    sink_scanned: bool,
    /// When the shutdown grace ends (set when the shutdown signal is first seen).
    stop_deadline: Option<Instant>,
    /// Delay before reopening a failed state file; reset by a checkpoint saved.
    state_backoff: Backoff,
    /// When the sink began failing with no checkpoint saved since (the `--once` sink retry
    /// budget counts from it, see [`Drain::sink_retry`]); `None` while it works.
    sink_failing_since: Option<Instant>,
    /// The Kafka producer failed for good (librdkafka's fatal error, or the broker fencing
    /// its producer id: [`SinkError::ProducerFailed`]) with the checkpoint at this offset,
    /// for this reason: the session ends, and the run loop puts a new producer
    /// in its place before it resumes ([`Drain::renew_producer`]).
    producer_failed: Option<(u64, ProducerFailure)>,
    /// Delay before the next new producer; reset by a checkpoint saved.
    producer_backoff: Backoff,
    /// File sink: a write or fsync failed, and the session ended; the next one fetches
    /// again from the checkpoint, not before this time (the window keeps no records for a
    /// resend, see docs/drain.md, "Group checkpoints").
    refetch_at: Option<Instant>,
    /// Delay before that fetch; reset by a checkpoint saved.
    refetch_backoff: Backoff,
    /// File sink, after a failure: batches below this offset (everything written before
    /// it) are checkpointed one at a time (see `Window::one_by_one`).
    one_by_one_until: Option<u64>,
    /// File sink, after a failure: the files the checkpoint covers are closed before the
    /// next session writes (`Drain::close_covered_files`).
    close_covered: bool,
}

/// Result of a session.
enum SessionEnd {
    /// Finished (`--once` target reached, or shutdown).
    Done,
    /// Reconnect and run the resume check again.
    Again,
}

impl Drain {
    /// Opens the state file and the sink.
    pub async fn open(
        cfg: DrainConfig,
        metrics: Metrics,
        stop: Shutdown,
    ) -> Result<Drain, DrainError> {
        let store = SharedStore::open_for_drain(&cfg.state).await?;
        let sink_lock = match &cfg.sink {
            SinkSpec::File(dir) => Some(
                crate::sink::file::DirLock::acquire(dir)
                    .await
                    .map_err(DrainError::Sink)?,
            ),
            SinkSpec::Kafka { .. } => None,
        };
        // A file sink is opened in `DIR/<gateway id>/` once the gateway's id is known.
        let sink = match &cfg.sink {
            SinkSpec::File(_) => None,
            SinkSpec::Kafka { .. } => Some(
                Sink::open(&cfg.sink, &cfg.sink_options)
                    .await
                    .map_err(DrainError::Sink)?,
            ),
        };
        let mut d = Drain::with_shared(cfg, metrics, stop, store, sink, None);
        d.sink_lock = sink_lock.map(Arc::new);
        Ok(d)
    }

    /// A drain of `cfg.gateway` that shares the state file `store` with other drains of
    /// the process. `sink`: the sink to deliver to (a Kafka producer, maybe shared), or
    /// `None` for a file sink, opened at `DIR/<gateway id>/` once the gateway's id is
    /// known. `ids`: the ids claimed by the other gateways of the process.
    pub(crate) fn with_shared(
        cfg: DrainConfig,
        metrics: Metrics,
        stop: Shutdown,
        store: Arc<SharedStore>,
        sink: Option<Sink>,
        ids: Option<Arc<GatewayIds>>,
    ) -> Drain {
        let progress =
            Progress::new(cfg.progress).with_cap(cfg.uplink.as_ref().map(Uplink::bytes_per_sec));
        metrics.backlog_eta.set(-1);
        let cfg_backoff = (cfg.backoff_initial, cfg.backoff_max);
        Drain {
            cfg,
            state: store,
            state_gen: 0,
            sink,
            sink_gateway: None,
            sink_lock: None,
            ids,
            metrics,
            stop,
            summary: DrainSummary::default(),
            progress,
            sink_scanned: false,
            stop_deadline: None,
            state_backoff: Backoff::new(cfg_backoff.0, cfg_backoff.1),
            sink_failing_since: None,
            producer_failed: None,
            producer_backoff: Backoff::new(cfg_backoff.0, cfg_backoff.1),
            refetch_at: None,
            refetch_backoff: Backoff::new(cfg_backoff.0, cfg_backoff.1),
            one_by_one_until: None,
            close_covered: false,
        }
    }

    /// The sink failed with `e` and is to be tried again after `delay`. With `--once` the
    /// retries are bounded by the retry budget ([`DrainConfig::retry_budget`],
    /// `--retry-for`), counted from the first failure since the checkpoint last moved:
    /// returns the delay, cut to what the budget has left (one more try right at its end),
    /// or, once the budget has run out, [`DrainError::SinkUnreachable`] to give up with.
    /// Without `--once` the sink is retried for ever: always the delay.
    fn sink_retry(&mut self, e: &SinkError, delay: Duration) -> Result<Duration, DrainError> {
        let Some(budget) = self.cfg.retry_budget().filter(|_| self.cfg.once) else {
            return Ok(delay);
        };
        let since = *self.sink_failing_since.get_or_insert_with(Instant::now);
        let waited = since.elapsed();
        if waited >= budget {
            return Err(DrainError::SinkUnreachable {
                sink: self.sink_name(),
                waited,
                last_error: e.to_string(),
            });
        }
        Ok(delay.min(budget - waited))
    }

    /// The sink failed with `e` while `what` (for the log line): counts it, logs it and
    /// waits out the next backoff delay. `Ok(false)` if the shutdown signal came first.
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the retry budget is spent
    /// ([`Drain::sink_retry`]).
    async fn wait_to_retry_sink(
        &mut self,
        e: &SinkError,
        backoff: &mut Backoff,
        what: &str,
    ) -> Result<bool, DrainError> {
        self.metrics.sink_error(e.kind());
        self.metrics.retries.inc();
        let d = self.sink_retry(e, backoff.next_delay())?;
        log::warn!("{e} while {what}; retrying in {d:.1?}");
        if !sleep_or_stop(d, &self.stop).await {
            return Ok(false);
        }
        // A Kafka producer failed for good fails every retry: a new one takes its place
        // (what is retried here, a gap record, carries no offset: at worst it is sent
        // twice).
        if let Some(reason) = self.producer_fatal(e) {
            log::warn!("{}", producer_failed_line(None, &reason, Duration::ZERO));
            return self.recreate_producer(backoff).await;
        }
        Ok(true)
    }

    /// The checkpoint moved: the sink works again, a later failure starts the `--once`
    /// retry budget afresh.
    fn sink_progressed(&mut self) {
        self.sink_failing_since = None;
        self.producer_backoff.reset();
        self.refetch_backoff.reset();
    }

    /// Why the Kafka sink's producer can send nothing more after the failure `e`, if it
    /// cannot: `e` says so ([`SinkError::ProducerFailed`]), or librdkafka raised a fatal
    /// error ([`KafkaSink::fatal_error`](crate::sink::kafka::KafkaSink::fatal_error)).
    /// `None` for any other failure or sink.
    fn producer_fatal(&self, e: &SinkError) -> Option<ProducerFailure> {
        match (self.sink.as_ref(), e) {
            #[cfg(feature = "kafka")]
            (Some(Sink::Kafka(k)), e) => k.fatal_error().or_else(|| match e {
                SinkError::ProducerFailed(m) => Some(m.clone()),
                _ => None,
            }),
            _ => None,
        }
    }

    /// The Kafka producer failed for good ([`Drain::producer_failed`], the session has
    /// ended): unless the shutdown signal has come (`Ok(false)`: what it did not
    /// acknowledge is resent by the next run), waits out the next backoff delay, puts a new
    /// producer in its place and has the next resume scan the partition tails again, so
    /// that what the old one delivered past the checkpoint is not sent twice (`Ok(true)`).
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the retry budget is spent
    /// ([`Drain::sink_retry`]).
    async fn renew_producer(
        &mut self,
        at: u64,
        reason: ProducerFailure,
    ) -> Result<bool, DrainError> {
        if self.stop.is_set() {
            log::warn!(
                "kafka producer failed for good ({reason}); shutting down with offsets from {at} not acknowledged by the sink (resent next time)"
            );
            return Ok(false);
        }
        // The failure and its retry were counted where it was met (`Drain::fail`).
        let e = SinkError::ProducerFailed(reason.clone());
        let delay = self.producer_backoff.next_delay();
        let d = self.sink_retry(&e, delay)?;
        log::warn!("{}", producer_failed_line(Some(at), &reason, d));
        if !sleep_or_stop(d, &self.stop).await {
            return Ok(false);
        }
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        self.recreate_producer(&mut backoff).await
    }

    /// Puts a new Kafka producer in place of the sink's failed one, retrying with
    /// `backoff` while librdkafka refuses to create it; the next resume scans the
    /// partition tails again. `Ok(false)` if the shutdown signal came first.
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the retry budget is spent.
    async fn recreate_producer(&mut self, backoff: &mut Backoff) -> Result<bool, DrainError> {
        #[cfg(not(feature = "kafka"))]
        {
            let _ = backoff;
            Ok(true)
        }
        #[cfg(feature = "kafka")]
        loop {
            let Some(Sink::Kafka(k)) = self.sink.as_mut() else {
                return Ok(true);
            };
            match k.recreate().await {
                Ok(created) => {
                    if created {
                        self.metrics.producers_recreated.inc();
                    }
                    log::info!(
                        "kafka: a new producer took over (resuming from the checkpoint; records the partition tails already hold are not sent again)"
                    );
                    self.sink_scanned = false;
                    return Ok(true);
                }
                Err(e) => {
                    let what = "creating a new kafka producer";
                    self.metrics.sink_error(e.kind());
                    self.metrics.retries.inc();
                    let d = self.sink_retry(&e, backoff.next_delay())?;
                    log::warn!("{e} while {what}; retrying in {d:.1?}");
                    if !sleep_or_stop(d, &self.stop).await {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// The sink as an error names it: `file:DIR/<gateway id>` (the gateway's directory,
    /// once known) or `kafka://BROKERS/TOPIC`.
    fn sink_name(&self) -> String {
        match &self.cfg.sink {
            SinkSpec::File(root) => {
                let dir = match &self.sink_gateway {
                    Some(id) => root.join(crate::sink::file::topic_stem(id)),
                    None => root.clone(),
                };
                format!("file:{}", dir.display())
            }
            SinkSpec::Kafka { brokers, topic } => format!("kafka://{brokers}/{topic}"),
        }
    }

    /// The state file's current handle (remembering its generation for a reopen).
    fn store(&mut self) -> Store {
        let (generation, store) = self.state.current();
        self.state_gen = generation;
        store
    }

    /// Runs until done (see docs/drain.md).
    pub async fn run(mut self) -> Result<DrainSummary, DrainError> {
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        let mut once_target: Option<u64> = None;
        // `--once`: when the drain last made progress (connected and resumed).
        let mut progress_at = Instant::now();
        let budget = self.cfg.retry_budget();
        // A Welcome came from the gateway in this run: from then on, a peer that does not
        // answer the handshake is a stalled or restarting gateway, retried.
        let mut welcomed = false;
        let res = loop {
            let mut conn = match connect_retry(
                &self.cfg.gateway,
                self.cfg.reply_timeout,
                &mut backoff,
                &self.stop,
                &self.metrics,
                budget.map(|b| (progress_at, b)),
                !welcomed,
            )
            .await
            {
                Ok(c) => {
                    welcomed = true;
                    backoff.reset();
                    c
                }
                Err(NoConnection::Stopped) => break Ok(()),
                Err(NoConnection::GaveUp(e)) => break Err(e),
            };
            let cp = match self.resume(&mut conn).await {
                Ok(cp) => cp,
                Err(Resumed::Stopped) => break Ok(()),
                Err(Resumed::Fatal(DrainError::Store(e))) if e.is_storage() => {
                    match self.state_failed(e).await {
                        Ok(true) => continue,
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
                Err(Resumed::Fatal(e)) => break Err(e),
                Err(Resumed::Retry(e)) => {
                    match self.gateway_retry(&e, &mut backoff, progress_at).await {
                        Ok(true) => continue,
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            };
            if self.cfg.once && once_target.is_none() {
                match conn.stats().await {
                    Ok(s) => {
                        log::info!("--once: draining up to offset {}", s.next_offset);
                        once_target = Some(s.next_offset);
                    }
                    // No progress yet: a gateway that passes the resume check and fails
                    // this request every time is given up like one that fails the check.
                    Err(e) => match self.gateway_retry(&e, &mut backoff, progress_at).await {
                        Ok(true) => continue,
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    },
                }
            }
            match self.session(conn, cp, once_target).await {
                Ok(SessionEnd::Done) => break Ok(()),
                Ok(SessionEnd::Again) => {
                    if let Some(at) = self.refetch_at.take()
                        && !sleep_or_stop(at.saturating_duration_since(Instant::now()), &self.stop)
                            .await
                    {
                        break Ok(());
                    }
                    if let Some((at, reason)) = self.producer_failed.take() {
                        match self.renew_producer(at, reason).await {
                            Ok(true) => {}
                            Ok(false) => break Ok(()),
                            Err(e) => break Err(e),
                        }
                    }
                    // The session ended on the sink's side, not the gateway's: the retry
                    // budget counts from here, not from the session's start (else a failure
                    // to reconnect after a long session would give up at once).
                    progress_at = Instant::now();
                    continue;
                }
                Err(DrainError::Store(e)) if e.is_storage() => match self.state_failed(e).await {
                    Ok(true) => {
                        progress_at = Instant::now();
                        continue;
                    }
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        };
        self.progress.finish();
        if let Some(sink) = self.sink.take() {
            sink.close(Duration::from_secs(5)).await;
        }
        res.map(|()| self.summary)
    }

    /// A request to the gateway failed with `e` before a session could start (the resume
    /// check, the `--once` target), with no progress since `progress_at`: counts it, and
    /// unless the retry budget is spent, waits out the next `backoff` delay, cut to what
    /// the budget has left (`Ok(true)`: connect again; `Ok(false)`: the shutdown signal
    /// came first).
    ///
    /// # Errors
    /// [`DrainError::GatewayUnreachable`] once the budget is spent.
    async fn gateway_retry(
        &self,
        e: &ClientError,
        backoff: &mut Backoff,
        progress_at: Instant,
    ) -> Result<bool, DrainError> {
        self.metrics.gateway_errors.inc();
        let mut clock = NoProgress::new(self.cfg.retry_budget());
        let d = clock
            .failed(progress_at, backoff.next_delay(), Instant::now())
            .map_err(|waited| DrainError::GatewayUnreachable {
                gateway: self.cfg.gateway.to_string(),
                waited,
                last_error: e.to_string(),
            })?;
        self.metrics.retries.inc();
        log::warn!("gateway {}: {e}; retrying in {d:.1?}", self.cfg.gateway);
        Ok(sleep_or_stop(d, &self.stop).await)
    }

    /// A state file transaction failed (docs/drain.md, "State file failures"). With `--once`
    /// returns the error (exit code 4). Otherwise reopens the state file after a backoff,
    /// retrying until it opens (`Ok(true)`: resume from its last durable checkpoint) or the
    /// shutdown signal comes (`Ok(false)`).
    async fn state_failed(&mut self, e: StoreError) -> Result<bool, DrainError> {
        self.metrics.state_errors.inc();
        let path = self.cfg.state.display().to_string();
        if self.cfg.once {
            log::error!(
                "state file {path}: {e}; --once: giving up (exit code 4); without --once the drain reopens the state file and resumes from its last durable checkpoint"
            );
            return Err(DrainError::Store(e));
        }
        log::warn!(
            "state file {path}: {e}; reopening it and resuming from its last durable checkpoint"
        );
        loop {
            self.metrics.retries.inc();
            let d = self.state_backoff.next_delay();
            if !sleep_or_stop(d, &self.stop).await {
                return Ok(false);
            }
            match self.state.reopen(self.state_gen).await {
                Ok(()) => {
                    log::info!("state file {path}: reopened");
                    // What the sink holds past the durable checkpoint is looked at again.
                    self.sink_scanned = false;
                    return Ok(true);
                }
                Err(e) => {
                    self.metrics.state_errors.inc();
                    log::warn!("state file {path}: reopening failed: {e}");
                }
            }
        }
    }
}

/// What a fencing means for the bridge's producer, added to librdkafka's reason, which
/// speaks of a "newer producer with the same transactionalId".
const FENCED_NOTE: &str = " (the broker fenced the idempotent producer, e.g. after a stall \
     past message.timeout.ms; no transactional id is in use)";

/// The WARN line of a Kafka producer failed for good: at checkpoint offset `at` (if
/// records were waiting), for `reason` (with [`FENCED_NOTE`] after a fencing), replaced
/// after `delay` (at once if zero).
fn producer_failed_line(at: Option<u64>, reason: &ProducerFailure, delay: Duration) -> String {
    let from = at.map_or(String::new(), |o| format!(" at offset {o}"));
    let note = if reason.fenced { FENCED_NOTE } else { "" };
    let when = if delay.is_zero() {
        String::new()
    } else {
        format!(" in {delay:.1?}")
    };
    format!(
        "kafka producer failed for good{from}: {reason}{note}; librdkafka sends nothing more with it: creating a new producer{when} and resuming from the checkpoint (what the partition tails already hold is not sent again)"
    )
}

enum Resumed {
    Fatal(DrainError),
    Retry(ClientError),
    /// The shutdown signal came first.
    Stopped,
}

#[cfg(test)]
mod tests;

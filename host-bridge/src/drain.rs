//! The drain loop: gateway → sink, with redb checkpoints and an exact resume.
//!
//! # One session
//!
//! 1. Connect and handshake (learn the gateway id and log id), retrying with backoff.
//! 2. Load the checkpoint of (gateway id, consumer) from redb (through `smol::unblock`).
//!    - None: start at `--from` when it was given (`earliest` = the gateway's first
//!      offset, `latest` = its next offset, or a number). Without `--from`, start at the
//!      gateway's committed offset for this consumer when it has one other than the log's
//!      first offset: above it (a deleted state file, a renamed gateway id: what a Kafka
//!      consumer group would do), logged at `warn` because the CRC of the record before it
//!      cannot be checked (nothing local says what was forwarded); below it (records the
//!      consumer never took were dropped, e.g. by `--full drop-oldest` before any drain),
//!      so that the main loop records those offsets as a gap. Else (no such consumer on
//!      the gateway) at the first offset. Save that checkpoint.
//!    - Some: the **resume check**. The log id must be the checkpoint's, and a probe fetch
//!      from the checkpoint offset must report, as the CRC of the record before it, the CRC
//!      of the last record this bridge forwarded (Raft's log matching). An offset beyond the
//!      log's end fails too. A failure ends the drain with [`DrainError::Resume`] (exit code
//!      3, never retried) unless `--accept-new-log`: then the checkpoint restarts at the
//!      gateway's first offset and the reset is recorded in redb.
//! 3. A fetcher task owns the connection: it fetches ahead of the sink, at most `prefetch`
//!    batches of at most `max_batch_bytes`, long-polling at the end of the log, sends the
//!    gateway the latest checkpoint offset as a commit between fetches, and reconnects with
//!    backoff after a failure (a changed log id ends the session: back to 2).
//! 4. The main loop takes batches in offset order, checks each batch's `prev_crc` against
//!    the last record it saw, and hands the records to the sink, keeping up to
//!    `max_in_flight_batches` batches in flight (see "Pipelining"). As the oldest batch is
//!    acknowledged it saves the checkpoint in redb (durable), and only then lets the
//!    fetcher commit the offset on the gateway. A sink failure is retried with backoff,
//!    forever, resending from the first unacknowledged record (the checkpoint never passes
//!    an unacknowledged record).
//!
//! # Pipelining
//!
//! Waiting for every delivery report of a batch before handing over the next leaves the
//! Kafka producer idle for a round trip per batch (linger, broker, acks). So a pipelined
//! sink ([`Sink::pipelined`]: Kafka) gets up to `max_in_flight_batches` (default
//! [`DEFAULT_MAX_IN_FLIGHT_BATCHES`], `--max-in-flight-batches`) batches at once, at most
//! `max_in_flight_batches × max_batch_bytes` of records, which the drain keeps (for a
//! resend) until they are acknowledged. The file sink writes and fsyncs each batch before
//! taking the next, as before (one in flight).
//!
//! - The checkpoint advances strictly in offset order: only over the oldest batches whose
//!   every record has its acknowledgement (Kafka: a successful delivery report). A later
//!   batch acknowledged first (another partition, a faster broker) waits for the ones
//!   before it; the acknowledged run at the head of the window is saved in one redb
//!   transaction.
//! - A failed delivery report (or enqueue) at offset `f`: the records before `f` are
//!   checkpointed; every later batch in flight is waited for until all its reports are in
//!   (whatever their outcome), so that nothing sent in the first attempt is still queued
//!   in the producer when the resend starts; then, after the backoff, everything from `f`
//!   on is handed over again, in order, in the same batches, before any new batch.
//!   Records of later batches that were delivered are sent again (duplicates, same log id
//!   and offset), never skipped. Per partition the order of the last copy of each record
//!   is the offset order (with the idempotent producer, `max.in.flight` ≤ 5).
//! - Gaps, a changed log, and the end of the fetcher are handled once nothing is in
//!   flight: the window is finished first, so the checkpoint is exactly where the gap
//!   starts.
//!
//! # Gaps
//!
//! When the gateway says offsets are gone (`lost` in a `Records` reply with reason
//! `DroppedOldest` or `Corrupt`, or `Dropped`), the range is logged at `warn`, counted in
//! the metrics (`gaps`, `lost_records`) and the checkpoint, recorded in redb's `gaps`
//! table, and the drain continues after it.
//!
//! Every offset between where the consumer stood (its checkpoint, or, for a new state file,
//! its committed offset on the gateway) and what the gateway can still deliver is a gap,
//! met and recorded by whichever run gets there first: records dropped by drop-oldest
//! before a bridge ever drained count as lost. A consumer the gateway did not know when
//! they were dropped, or a drain started with `--from`, has no gap for them.
//!
//! A range reported `Corrupt` may be a flash cell that reads wrong only sometimes: the
//! fetcher fetches it again, [`CORRUPT_REFETCH_DELAY`] apart, up to [`CORRUPT_REFETCHES`]
//! times or until [`CORRUPT_REFETCH_FOR`] has passed since the first such reply, and
//! records the gap only if every fetch said corrupt (counted in
//! `spillway_bridge_corrupt_refetches_total`). A range corrupt on every read becomes a gap
//! in about 1.2 s.
//!
//! A `lost` range with reason `NotPersisted` is not a gap: those offsets were handed out
//! in the gateway's RAM and never written before a crash (mostly the rest of its offset
//! lease, which it skips on restart), so no durably acknowledged record had them. The range
//! is logged at `info`, counted in `spillway_bridge_skipped_offsets_total`, and the
//! checkpoint moves past it; it is not counted as lost and not recorded in `gaps`, so a
//! power cut does not look like data loss.
//!
//! # Sink files
//!
//! With the file sink, every checkpoint saved after a batch also records what the sink had
//! synced ([`Checkpoint::sink_files`]: per topic, the newest file and its synced length),
//! in the same redb transaction. Each time a session resumes, the checkpoint loaded from
//! redb is handed to the sink, which cuts off whatever was written after it (synced or
//! not, see `sink::file`, "Synced lengths") before it writes again; the drain then resends
//! from that checkpoint. A failed write or fsync cuts back the same way inside the sink.
//!
//! # State file failures
//!
//! A failed redb transaction (a commit whose fsync failed, an I/O error; not a value that
//! does not parse) ends the session, with nothing committed on the gateway past the last
//! saved checkpoint. Without `--once` the drain releases the redb handle, waits a backoff
//! (from `backoff_initial` doubling to `backoff_max`, reset by the next checkpoint saved),
//! opens the state file again, retrying the same way until it opens, and resumes from its
//! last durable checkpoint: the records after it are sent again (the file sink cuts its
//! files back to that checkpoint first). Counted in `spillway_bridge_state_errors_total`.
//! With `--once` the drain ends with [`DrainError::Store`] (exit code 4) instead.
//!
//! # Stopping
//!
//! `--once`: the gateway's next offset is read at the start; the drain ends (exit 0) when
//! the checkpoint reaches it. Otherwise it runs until the [`Shutdown`] signal (SIGTERM or
//! SIGINT): no new batch is handed to the sink, the batches in flight are finished
//! (waiting for their acknowledgements and retrying failures for at most
//! `shutdown_grace` in all), their checkpoint saved and committed on the gateway, then it
//! exits 0. Batches fetched ahead but not handed to the sink are dropped (fetched again
//! next time), and so is anything still unacknowledged when the grace runs out.
//!
//! # Delivery guarantee
//!
//! At-least-once and in order: a crash (kill -9) after the sink acknowledged records and
//! before redb saved the checkpoint resends them on restart, so duplicates are at most one
//! window (file sink: one batch, ≤ `max_batch_bytes` of records, which the restart cuts
//! off the files before resending it, see "Sink files", or, without synced lengths in the
//! checkpoint, its duplicate check drops; Kafka: ≤ `max_in_flight_batches ×
//! max_batch_bytes`), each carrying the same
//! log id and offset. With a Kafka sink the effectively-once resume below removes those
//! duplicates.
//!
//! # Effectively-once resume (Kafka)
//!
//! Once per run, after the resume check of step 2 passed at checkpoint offset `c`, the
//! bridge reads the tail of every partition of the target topic
//! (`sink::kafka::KafkaSink::scan_tail`: watermarks, then
//! `assign` at `high − kafka_resume_window`, no consumer group) and collects the messages
//! whose `spillway-log-id` header is this gateway's log id and whose `spillway-offset` is at
//! least `c`. Those are records delivered before a crash whose checkpoint never reached
//! redb.
//!
//! - Resume point: the end `r` of the run of consecutive offsets `c, c+1, …` found. With
//!   one partition (or one key) that is the highest `spillway-offset` + 1, because a
//!   partition holds a prefix of what the idempotent producer sent to it. With several
//!   partitions a crash can leave offset `c+5` delivered and `c+4` not (other key, other
//!   partition), so the highest offset alone could lose `c+4`: everything from the first
//!   hole is sent again (duplicates, never loss).
//! - Log matching: the checkpoint's CRC has already been checked against the gateway's
//!   record before `c` (step 2). The bridge then fetches `c..r` from the gateway and
//!   compares every record with the Kafka message at the same offset (topic, timestamp,
//!   payload): a mismatch means the messages are not this log's records, and the resume
//!   falls back to `c` (with a warning). Records the gateway no longer has cannot be
//!   compared; the resume stops before them (the main loop then records the gap). The new
//!   checkpoint takes the gateway's CRC of record `r − 1`, so the next resume check
//!   continues the chain.
//! - The move is saved in one redb transaction with a
//!   [`checkpoint::SinkResume`](crate::checkpoint::SinkResume) entry (table `sink_resumes`), logged at
//!   `info`, counted in `spillway_bridge_sink_resumed_records_total`, and committed on the
//!   gateway.
//! - With several batches in flight at a crash (see "Pipelining"), the records after `c`
//!   in the topic can be a whole window's worth. If the scan finds records of the log but
//!   none at `c`, and the window did not reach back past `c`, the window grows (×8, up to [`MAX_RESUME_WINDOW`]). A broker that cannot
//!   be read is retried with backoff like any sink outage.
//! - Assumption: only this consumer writes this log to the topic. A second bridge
//!   draining the same gateway into the same topic under another consumer name would make
//!   this one skip records it never sent.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smol::channel::{Receiver, Sender};
use spillway_core::wire::{ErrorCode, LostReason};

#[cfg(feature = "kafka")]
use crate::checkpoint::SinkResume;
use crate::checkpoint::{
    Checkpoint, Gap, Reset, ResumeMismatch, Store, StoreError, check_log_id, check_prev_crc, now_ms,
};
use crate::client::{Client, ClientError, FetchReply, GatewayAddr, OwnedRecord, log_id_hex};
use crate::metrics::Metrics;
use crate::progress::{Mode, Progress};
use crate::sink::{DeliverError, Pending, Sink, SinkError, SinkOptions, SinkSpec, Source};

/// Where to start when the state file has no checkpoint for the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The gateway's oldest retained offset.
    Earliest,
    /// The gateway's next offset (only records published from now on).
    Latest,
    /// This offset.
    Offset(u64),
}

impl std::str::FromStr for StartFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            n => n.parse().map(StartFrom::Offset).map_err(|_| {
                format!("bad start position {s:?}: expected earliest, latest or an offset")
            }),
        }
    }
}

/// Capped exponential backoff with jitter: each delay is drawn uniformly from
/// `[d/2, d]`, where `d` doubles from `initial` up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff from `initial` to at most `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            rand::random_range(0..=jitter_ns)
        };
        half + Duration::from_nanos(extra)
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// A shutdown signal; clones wait on the same signal.
#[derive(Debug, Clone)]
pub struct Shutdown(Receiver<()>);

/// Triggers a [`Shutdown`].
#[derive(Debug, Clone)]
pub struct ShutdownTrigger(Sender<()>);

impl ShutdownTrigger {
    /// Signals every clone of the paired [`Shutdown`].
    pub fn trigger(&self) {
        self.0.close();
    }
}

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = smol::channel::bounded(1);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// True once triggered.
    pub fn is_set(&self) -> bool {
        self.0.is_closed()
    }

    /// Resolves once triggered.
    pub async fn wait(&self) {
        while self.0.recv().await.is_ok() {}
    }
}

/// Sleeps `d` or until `stop` is triggered; returns false if stopped.
async fn sleep_or_stop(d: Duration, stop: &Shutdown) -> bool {
    smol::future::or(
        async {
            smol::Timer::after(d).await;
            true
        },
        async {
            stop.wait().await;
            false
        },
    )
    .await
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
    /// With [`DrainConfig::once`]: how long to keep retrying a gateway that cannot be
    /// reached (or whose requests keep failing) without progress before giving up with
    /// [`DrainError::GatewayUnreachable`]. Without `once` the drain retries for ever.
    pub once_retry_for: Duration,
    /// On a failed resume check, start over from the new log's first offset.
    pub accept_new_log: bool,
    /// Byte budget of one fetch (`max_bytes`), bytes.
    pub max_batch_bytes: u32,
    /// Batches fetched ahead of the sink, at most.
    pub prefetch: usize,
    /// Batches handed to a pipelined sink (Kafka) whose acknowledgements are outstanding,
    /// at most (module doc, "Pipelining"); at least 1. The file sink always has 1.
    pub max_in_flight_batches: usize,
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
}

/// How long the Kafka producer's metadata warm-up may hold up the start of the drain.
#[cfg(feature = "kafka")]
pub const WARM_UP_TIMEOUT: Duration = Duration::from_secs(2);

/// Default of [`DrainConfig::once_retry_for`].
pub const DEFAULT_ONCE_RETRY_FOR: Duration = Duration::from_secs(30);

/// Default of [`DrainConfig::max_in_flight_batches`].
pub const DEFAULT_MAX_IN_FLIGHT_BATCHES: usize = 4;

/// The largest window the effectively-once resume grows to, messages per partition.
pub const MAX_RESUME_WINDOW: u64 = 1 << 20;

impl DrainConfig {
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
            once_retry_for: DEFAULT_ONCE_RETRY_FOR,
            accept_new_log: false,
            max_batch_bytes: 256 * 1024,
            prefetch: 4,
            max_in_flight_batches: DEFAULT_MAX_IN_FLIGHT_BATCHES,
            poll_wait: Duration::from_millis(500),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            reply_timeout: crate::client::DEFAULT_REPLY_TIMEOUT,
            shutdown_grace: Duration::from_secs(30),
            progress: Mode::Auto,
            kafka_resume_window: 10_000,
            kafka_resume_timeout: Duration::from_secs(10),
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
    /// With `--once`: the gateway could not be reached, or its requests kept failing, for
    /// the whole retry budget without progress (exit code 1).
    #[error(
        "gateway {gateway}: no progress for {waited:.1?} (the --once retry budget, --retry-for): {last_error}; the checkpoint stays where it was, and the next drain resumes there"
    )]
    GatewayUnreachable {
        /// The gateway.
        gateway: String,
        /// How long the drain retried.
        waited: Duration,
        /// The last failure.
        last_error: String,
    },
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

/// What the fetcher hands the main loop.
enum Item {
    /// A reply to a fetch from `from`.
    Batch { from: u64, reply: FetchReply },
    /// After a reconnect the gateway has another log id: end the session.
    LogChanged,
    /// The gateway says the fetch offset is beyond its log.
    BeyondEnd { offset: u64, next: u64 },
}

/// The offset the main loop wants committed on the gateway, and why the fetcher stopped
/// for good, if it did (a refused commit, a gateway unreachable for the `--once` budget).
#[derive(Default)]
struct CommitCell {
    want: Mutex<u64>,
    fatal: Mutex<Option<DrainError>>,
}

impl CommitCell {
    fn fail(&self, e: DrainError) {
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(e);
        }
    }
    fn take_fatal(&self) -> Option<DrainError> {
        self.fatal.lock().ok().and_then(|mut f| f.take())
    }
    fn set(&self, o: u64) {
        if let Ok(mut w) = self.want.lock() {
            *w = (*w).max(o);
        }
    }
    fn get(&self) -> u64 {
        self.want.lock().map(|w| *w).unwrap_or(0)
    }
}

struct FetcherCtx {
    addr: GatewayAddr,
    log_id: u128,
    consumer: String,
    max_bytes: u32,
    poll_wait: Duration,
    reply_timeout: Duration,
    target: Option<u64>,
    tx: Sender<Item>,
    commit: Arc<CommitCell>,
    stop: Shutdown,
    metrics: Metrics,
    backoff: Backoff,
    /// `--once`: give up reconnecting after this long without a connection.
    give_up_after: Option<Duration>,
}

/// Fetches repeated, at most, after the gateway reported a range corrupt, before the range
/// is recorded as a gap (module doc, "Gaps").
pub const CORRUPT_REFETCHES: u32 = 24;
/// Pause between those fetches.
pub const CORRUPT_REFETCH_DELAY: Duration = Duration::from_millis(50);
/// No fetch is repeated once this much time has passed since the first corrupt reply for
/// the offset, so a range that is corrupt on every read becomes a gap within about this
/// time plus one fetch (over a slow serial line, after fewer than [`CORRUPT_REFETCHES`]).
pub const CORRUPT_REFETCH_FOR: Duration = Duration::from_millis(1200);

const CLIENT_NAME: &str = concat!("spillway-bridge/", env!("CARGO_PKG_VERSION"));
const STATS_EVERY: Duration = Duration::from_secs(2);
const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why [`connect_retry`] returned without a connection.
enum NoConnection {
    /// The shutdown signal.
    Stopped,
    /// The retry budget ran out.
    GaveUp(DrainError),
}

/// Connects, retrying with backoff until connected, `stop`, or (with `give_up` set) once
/// that long has passed since `since` without a connection.
async fn connect_retry(
    addr: &GatewayAddr,
    reply_timeout: Duration,
    backoff: &mut Backoff,
    stop: &Shutdown,
    metrics: &Metrics,
    give_up: Option<(Instant, Duration)>,
) -> Result<Client, NoConnection> {
    loop {
        if stop.is_set() {
            return Err(NoConnection::Stopped);
        }
        match Client::connect(addr, CLIENT_NAME, reply_timeout).await {
            Ok(c) => {
                backoff.reset();
                return Ok(c);
            }
            Err(e) => {
                metrics.gateway_errors.inc();
                if let Some((since, budget)) = give_up
                    && since.elapsed() >= budget
                {
                    return Err(NoConnection::GaveUp(DrainError::GatewayUnreachable {
                        gateway: addr.to_string(),
                        waited: since.elapsed(),
                        last_error: e.to_string(),
                    }));
                }
                metrics.retries.inc();
                let mut d = backoff.next_delay();
                if let Some((since, budget)) = give_up {
                    // Try once more right at the end of the budget, not after it.
                    d = d.min(budget.saturating_sub(since.elapsed()));
                }
                log::warn!("gateway {addr}: {e}; retrying in {d:.1?}");
                if !sleep_or_stop(d, stop).await {
                    return Err(NoConnection::Stopped);
                }
            }
        }
    }
}

async fn fetcher(mut conn: Client, mut cursor: u64, mut ctx: FetcherCtx) -> Client {
    let mut committed_sent = 0u64;
    let mut last_stats = Instant::now() - STATS_EVERY;
    let mut send_consumer = true;
    // A fetch answered "corrupt": (its offset, when first, fetches again so far).
    let mut corrupt_at: Option<(u64, Instant, u32)> = None;
    loop {
        // Commit what the main loop has made durable.
        let want = ctx.commit.get();
        if want > committed_sent {
            match conn.commit(&ctx.consumer, want).await {
                Ok(_) => committed_sent = want,
                Err(e) if refused_commit(&e, &ctx.consumer, want).is_some() => {
                    // The consumer would never hold retention: stop, and let the main loop
                    // end the drain with the error.
                    if let Some(f) = refused_commit(&e, &ctx.consumer, want) {
                        ctx.commit.fail(f);
                    }
                    return conn;
                }
                Err(e) if e.connection_ok() => {
                    log::warn!("gateway refused commit of {want}: {e}");
                    committed_sent = want;
                }
                Err(e) => {
                    conn = match reconnect(&mut ctx, e).await {
                        Some(c) => c,
                        None => return conn,
                    };
                    continue;
                }
            }
        }
        if ctx.stop.is_set() {
            return conn;
        }
        if last_stats.elapsed() >= STATS_EVERY {
            last_stats = Instant::now();
            match conn.stats().await {
                Ok(s) => ctx.metrics.set_next(s.next_offset),
                Err(e) if e.connection_ok() => {}
                Err(e) => {
                    conn = match reconnect(&mut ctx, e).await {
                        Some(c) => c,
                        None => return conn,
                    };
                    continue;
                }
            }
        }
        if ctx.target.is_some_and(|t| cursor >= t) {
            // Nothing more to fetch: wait for commits or the end.
            sleep_or_stop(Duration::from_millis(50), &ctx.stop).await;
            continue;
        }
        let consumer = send_consumer.then_some(ctx.consumer.as_str());
        match conn
            .fetch(consumer, cursor, ctx.max_bytes, ctx.poll_wait)
            .await
        {
            Ok(reply) => {
                ctx.backoff.reset();
                let corrupt = matches!(&reply, FetchReply::Records { lost: Some(l), .. }
                    if l.reason == LostReason::Corrupt);
                if corrupt {
                    let (since, tries) = corrupt_at
                        .filter(|c| c.0 == cursor)
                        .map_or((Instant::now(), 0), |c| (c.1, c.2));
                    if tries < CORRUPT_REFETCHES && since.elapsed() < CORRUPT_REFETCH_FOR {
                        corrupt_at = Some((cursor, since, tries + 1));
                        ctx.metrics.corrupt_refetches.inc();
                        log::debug!(
                            "gateway reports offsets from {cursor} corrupt; fetching again ({} of {CORRUPT_REFETCHES})",
                            tries + 1
                        );
                        sleep_or_stop(CORRUPT_REFETCH_DELAY, &ctx.stop).await;
                        continue;
                    }
                    log::warn!(
                        "gateway still reports offsets from {cursor} corrupt after {tries} fetches again over {:.1?}",
                        since.elapsed()
                    );
                } else if corrupt_at.is_some_and(|c| c.0 == cursor) {
                    log::info!(
                        "offsets from {cursor} read back whole after {} fetches again (the gateway first reported them corrupt)",
                        corrupt_at.map_or(0, |c| c.2)
                    );
                }
                corrupt_at = None;
                let next = match &reply {
                    FetchReply::Records {
                        next_offset,
                        records,
                        ..
                    } => {
                        let after_last = records.last().map_or(cursor, |r| r.offset + 1);
                        (*next_offset).max(after_last).max(cursor)
                    }
                    FetchReply::Dropped { first_available } => (*first_available).max(cursor),
                };
                let empty = matches!(&reply, FetchReply::Records { records, lost: None, .. }
                    if records.is_empty())
                    && next == cursor;
                if empty {
                    continue;
                }
                let item = Item::Batch {
                    from: cursor,
                    reply,
                };
                let sent = smol::future::or(async { ctx.tx.send(item).await.is_ok() }, async {
                    ctx.stop.wait().await;
                    false
                })
                .await;
                if !sent {
                    continue;
                }
                cursor = next;
            }
            Err(ClientError::Gateway {
                code: ErrorCode::UnknownConsumer,
                ..
            }) if send_consumer => {
                // The consumer does not exist until its first commit: fetch anonymously.
                send_consumer = false;
            }
            Err(ClientError::Gateway {
                code: ErrorCode::OffsetOutOfRange,
                ..
            }) => {
                let next = conn.stats().await.map(|s| s.next_offset).unwrap_or(0);
                let _ = ctx
                    .tx
                    .send(Item::BeyondEnd {
                        offset: cursor,
                        next,
                    })
                    .await;
                return conn;
            }
            Err(ClientError::Gateway {
                code: ErrorCode::TooLarge,
                message,
            }) => {
                // The gateway cannot send this record at all: fetching it again would fail
                // for ever.
                ctx.metrics.gateway_errors.inc();
                ctx.commit.fail(DrainError::RecordTooLarge {
                    offset: cursor,
                    message,
                });
                return conn;
            }
            Err(e) if e.connection_ok() => {
                ctx.metrics.gateway_errors.inc();
                ctx.metrics.retries.inc();
                let d = ctx.backoff.next_delay();
                log::warn!("gateway refused fetch from {cursor}: {e}; retrying in {d:.1?}");
                sleep_or_stop(d, &ctx.stop).await;
            }
            Err(e) => {
                conn = match reconnect(&mut ctx, e).await {
                    Some(c) => c,
                    None => return conn,
                };
            }
        }
    }
}

/// Reconnects after `e`; `None` on stop or when the log id changed (reported to the main
/// loop).
async fn reconnect(ctx: &mut FetcherCtx, e: ClientError) -> Option<Client> {
    ctx.metrics.gateway_errors.inc();
    log::warn!("gateway {}: {e}; reconnecting", ctx.addr);
    let d = ctx.backoff.next_delay();
    if !sleep_or_stop(d, &ctx.stop).await {
        return None;
    }
    let since = Instant::now();
    let c = match connect_retry(
        &ctx.addr,
        ctx.reply_timeout,
        &mut ctx.backoff,
        &ctx.stop,
        &ctx.metrics,
        ctx.give_up_after.map(|b| (since, b)),
    )
    .await
    {
        Ok(c) => c,
        Err(NoConnection::Stopped) => return None,
        Err(NoConnection::GaveUp(e)) => {
            ctx.commit.fail(e);
            return None;
        }
    };
    ctx.metrics.retries.inc();
    if c.welcome().log_id != ctx.log_id {
        log::warn!(
            "gateway {} came back with log id {} (was {})",
            ctx.addr,
            log_id_hex(c.welcome().log_id),
            log_id_hex(ctx.log_id)
        );
        let _ = ctx.tx.send(Item::LogChanged).await;
        return None;
    }
    log::info!("gateway {}: reconnected", ctx.addr);
    Some(c)
}

fn reason_name(r: LostReason) -> &'static str {
    match r {
        LostReason::DroppedOldest => "dropped-oldest",
        LostReason::Corrupt => "corrupt",
        LostReason::NotPersisted => "not-persisted",
    }
}

/// The drain.
pub struct Drain {
    cfg: DrainConfig,
    store: Store,
    sink: Option<Sink>,
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
        let store =
            Store::open_async(&cfg.state)
                .await
                .map_err(|source| DrainError::StateOpen {
                    path: cfg.state.clone(),
                    source,
                })?;
        let sink = Sink::open(&cfg.sink, &cfg.sink_options)
            .await
            .map_err(DrainError::Sink)?;
        let progress = Progress::new(cfg.progress);
        let cfg_backoff = (cfg.backoff_initial, cfg.backoff_max);
        Ok(Drain {
            cfg,
            store,
            sink: Some(sink),
            metrics,
            stop,
            summary: DrainSummary::default(),
            progress,
            sink_scanned: false,
            stop_deadline: None,
            state_backoff: Backoff::new(cfg_backoff.0, cfg_backoff.1),
        })
    }

    /// Runs until done (see the module doc).
    pub async fn run(mut self) -> Result<DrainSummary, DrainError> {
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        let mut once_target: Option<u64> = None;
        // `--once`: when the drain last made progress (connected and resumed).
        let mut progress_at = Instant::now();
        let budget = self.cfg.once.then_some(self.cfg.once_retry_for);
        let res = loop {
            let mut conn = match connect_retry(
                &self.cfg.gateway,
                self.cfg.reply_timeout,
                &mut backoff,
                &self.stop,
                &self.metrics,
                budget.map(|b| (progress_at, b)),
            )
            .await
            {
                Ok(c) => c,
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
                    self.metrics.gateway_errors.inc();
                    if let Some(b) = budget
                        && progress_at.elapsed() >= b
                    {
                        break Err(DrainError::GatewayUnreachable {
                            gateway: self.cfg.gateway.to_string(),
                            waited: progress_at.elapsed(),
                            last_error: e.to_string(),
                        });
                    }
                    self.metrics.retries.inc();
                    let d = backoff.next_delay();
                    log::warn!("gateway {}: {e}; retrying in {d:.1?}", self.cfg.gateway);
                    if !sleep_or_stop(d, &self.stop).await {
                        break Ok(());
                    }
                    continue;
                }
            };
            progress_at = Instant::now();
            if self.cfg.once && once_target.is_none() {
                match conn.stats().await {
                    Ok(s) => {
                        log::info!("--once: draining up to offset {}", s.next_offset);
                        once_target = Some(s.next_offset);
                    }
                    Err(e) => {
                        log::warn!("gateway {}: {e}; retrying", self.cfg.gateway);
                        sleep_or_stop(backoff.next_delay(), &self.stop).await;
                        continue;
                    }
                }
            }
            match self.session(conn, cp, once_target).await {
                Ok(SessionEnd::Done) => break Ok(()),
                Ok(SessionEnd::Again) => continue,
                Err(DrainError::Store(e)) if e.is_storage() => match self.state_failed(e).await {
                    Ok(true) => continue,
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

    /// A state file transaction failed (module doc, "State file failures"). With `--once`
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
            match self.store.reopen_async(&self.cfg.state).await {
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

    /// Loads the checkpoint, checks it against the gateway (module doc, step 2), then, once
    /// per run, moves it past records the sink already holds (effectively-once resume).
    ///
    /// The first time, a Kafka sink's producer also loads the topic's metadata meanwhile
    /// ([`KafkaSink::warm_up`](crate::sink::kafka::KafkaSink::warm_up)), waited for at most
    /// [`WARM_UP_TIMEOUT`] after the checks.
    async fn resume(&mut self, conn: &mut Client) -> Result<Checkpoint, Resumed> {
        #[cfg(feature = "kafka")]
        let warm_up = match self.sink.as_ref() {
            Some(Sink::Kafka(k)) if !self.sink_scanned => Some(k.warm_up(WARM_UP_TIMEOUT)),
            _ => None,
        };
        let cp = self.resume_check(conn).await?;
        self.restore_sink(&cp).await?;
        if self.sink_scanned {
            return Ok(cp);
        }
        #[cfg(feature = "kafka")]
        let cp = self.resume_from_sink(conn, cp).await?;
        self.sink_scanned = true;
        #[cfg(feature = "kafka")]
        if let Some(w) = warm_up
            && let Err(e) = w.await
        {
            log::debug!("kafka producer warm-up: {e}");
        }
        Ok(cp)
    }

    /// File sink: cuts the files back to what `cp` recorded as synced, before anything is
    /// written (module doc, "Sink files"); retried with backoff while the file system
    /// fails, until the shutdown signal.
    async fn restore_sink(&mut self, cp: &Checkpoint) -> Result<(), Resumed> {
        let Some(files) = cp.sink_files.as_ref() else {
            return Ok(());
        };
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        loop {
            let Some(Sink::File(f)) = self.sink.as_mut() else {
                return Ok(());
            };
            match f.restore(files).await {
                Ok(Some(cut)) if cut.files > 0 => {
                    log::warn!(
                        "file sink: cut {} bytes off {} files written after the checkpoint at offset {} (sent again from there)",
                        cut.bytes,
                        cut.files,
                        cp.offset
                    );
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(e) => {
                    let e = SinkError::Io(e);
                    self.metrics.sink_error(e.kind());
                    self.metrics.retries.inc();
                    let d = backoff.next_delay();
                    log::warn!(
                        "{e} while cutting the files back to the checkpoint; retrying in {d:.1?}"
                    );
                    if !sleep_or_stop(d, &self.stop).await {
                        return Err(Resumed::Stopped);
                    }
                }
            }
        }
    }

    /// The effectively-once resume (module doc): scans the Kafka topic's partition tails
    /// for records of this log at or after `cp.offset`, checks them against the gateway's,
    /// and returns the checkpoint moved past them (saved and committed), or `cp`.
    #[cfg(feature = "kafka")]
    async fn resume_from_sink(
        &mut self,
        conn: &mut Client,
        cp: Checkpoint,
    ) -> Result<Checkpoint, Resumed> {
        let window = self.cfg.kafka_resume_window;
        let Some(Sink::Kafka(kafka)) = self.sink.as_ref() else {
            return Ok(cp);
        };
        if window == 0 {
            return Ok(cp);
        }
        let w = conn.welcome().clone();
        let c = cp.offset;
        let mut window = window;
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        let t0 = Instant::now();
        let scan = loop {
            match kafka
                .scan_tail(w.log_id, c, window, self.cfg.kafka_resume_timeout)
                .await
            {
                Ok(s) => {
                    let short = !s.found.is_empty()
                        && !s.found.contains_key(&c)
                        && s.lowest.is_some_and(|l| l >= c)
                        && !s.whole_topic
                        && window < MAX_RESUME_WINDOW;
                    if short {
                        window = (window * 8).min(MAX_RESUME_WINDOW);
                        log::info!(
                            "partition tails hold records of log {} after offset {c} but not {c}: widening the scan to {window} messages",
                            cp.log_id
                        );
                        continue;
                    }
                    break s;
                }
                Err(e) => {
                    self.metrics.sink_error(e.kind());
                    self.metrics.retries.inc();
                    let d = backoff.next_delay();
                    log::warn!("{e}; retrying in {d:.1?}");
                    if !sleep_or_stop(d, &self.stop).await {
                        return Ok(cp);
                    }
                }
            }
        };
        let end = scan.contiguous_end(c);
        log::info!(
            "kafka topic {:?}: read {} messages from the tails of {} partitions in {:.1?}; records of log {} from offset {c}: {}",
            kafka.topic(),
            scan.messages_read,
            scan.partitions,
            t0.elapsed(),
            cp.log_id,
            if end > c {
                format!("{c}..{end}")
            } else {
                "none".to_string()
            }
        );
        if end == c {
            return Ok(cp);
        }
        // Log matching: the gateway's records c..end must be the ones in Kafka.
        let mut at = c;
        let mut last_crc = cp.last_crc;
        let mut bytes = 0u64;
        'verify: while at < end {
            let reply = conn
                .fetch(None, at, self.cfg.max_batch_bytes, Duration::ZERO)
                .await
                .map_err(Resumed::Retry)?;
            let FetchReply::Records {
                lost: None,
                records,
                ..
            } = reply
            else {
                log::warn!(
                    "the gateway no longer has offset {at}: the records from it are not compared with Kafka's, and are resent"
                );
                break;
            };
            if records.is_empty() {
                break;
            }
            for r in records {
                if r.offset != at || at >= end {
                    break 'verify;
                }
                let k = &scan.found[&at];
                if k.topic != r.topic || k.timestamp_us != r.timestamp_us || k.payload != r.payload
                {
                    log::warn!(
                        "kafka topic {:?} partition {} offset {} claims log {} offset {at} but differs from the gateway's record (topic {:?}/{:?}, timestamp {}/{}, {}/{} payload bytes): ignoring the partition tails, resuming at the checkpoint {c}",
                        kafka.topic(),
                        k.partition,
                        k.kafka_offset,
                        cp.log_id,
                        k.topic,
                        r.topic,
                        k.timestamp_us,
                        r.timestamp_us,
                        k.payload.len(),
                        r.payload.len()
                    );
                    return Ok(cp);
                }
                last_crc = Some(r.record_crc);
                bytes += r.payload.len() as u64;
                at += 1;
            }
        }
        if at == c {
            return Ok(cp);
        }
        let mut new = cp.clone();
        new.offset = at;
        new.last_crc = last_crc;
        new.records += at - c;
        new.bytes += bytes;
        new.updated_unix_ms = now_ms();
        let r = SinkResume {
            gateway_id: w.gateway_id.clone(),
            consumer: self.cfg.consumer.clone(),
            log_id: cp.log_id.clone(),
            from: c,
            to: at,
            highest_in_sink: scan.highest.unwrap_or(at - 1),
            verified: at - c,
            sink: format!(
                "kafka topic {:?} ({} partitions)",
                kafka.topic(),
                scan.partitions
            ),
            at_unix_ms: new.updated_unix_ms,
        };
        self.store
            .save_with_sink_resume_async(&r, &new)
            .await
            .map_err(|e| Resumed::Fatal(e.into()))?;
        log::info!(
            "kafka topic {:?} already holds offsets {c}..{at} of log {} (delivered before a restart, not checkpointed): checked against the gateway, resuming at {at}",
            kafka.topic(),
            cp.log_id
        );
        if let Some(h) = scan.highest.filter(|&h| h >= at) {
            log::warn!(
                "kafka topic {:?} also holds offsets up to {h} after a hole at {at}: those are sent again (duplicates)",
                kafka.topic()
            );
        }
        self.metrics.sink_resumed.inc_by(at - c);
        self.metrics.set_committed(at);
        self.summary.offset = at;
        conn.commit(&self.cfg.consumer, at).await.map_err(|e| {
            match refused_commit(&e, &self.cfg.consumer, at) {
                Some(f) => Resumed::Fatal(f),
                None => Resumed::Retry(e),
            }
        })?;
        Ok(new)
    }

    /// Loads the checkpoint and checks it against the gateway (module doc, step 2).
    async fn resume_check(&mut self, conn: &mut Client) -> Result<Checkpoint, Resumed> {
        let w = conn.welcome().clone();
        self.summary.log_id = w.log_id;
        self.summary.gateway_id = w.gateway_id.clone();
        let consumer = self.cfg.consumer.clone();
        let stored = self
            .store
            .load_async(&w.gateway_id, &consumer)
            .await
            .map_err(|e| Resumed::Fatal(e.into()))?;
        let Some(cp) = stored else {
            let stats = conn.stats().await.map_err(Resumed::Retry)?;
            let start = match self.cfg.from {
                None => {
                    let consumers = conn.consumers().await.map_err(Resumed::Retry)?;
                    let committed = consumers
                        .iter()
                        .find(|c| c.name == consumer)
                        .map(|c| c.committed_offset)
                        .filter(|&o| o != stats.first_offset && o <= stats.next_offset);
                    match committed {
                        Some(o) if o < stats.first_offset => {
                            // Records the consumer had not taken were dropped before this
                            // state file's first run: start at its committed offset, so that
                            // the main loop meets them as a gap with the gateway's reason.
                            log::warn!(
                                "gateway {:?} log {}: consumer {consumer:?} committed offset {o} on the gateway, but the log now starts at {}: offsets {o}..{} were dropped before this bridge drained them (recorded as a gap)",
                                w.gateway_id,
                                log_id_hex(w.log_id),
                                stats.first_offset,
                                stats.first_offset
                            );
                            o
                        }
                        Some(o) => {
                            log::warn!(
                                "gateway {:?} log {}: the state file {} has no checkpoint for consumer {consumer:?}; starting at the gateway's committed offset {o} for it (the CRC of the record before it cannot be checked without the local checkpoint; pass --from to choose another start)",
                                w.gateway_id,
                                log_id_hex(w.log_id),
                                self.cfg.state.display()
                            );
                            o
                        }
                        None => stats.first_offset,
                    }
                }
                Some(StartFrom::Earliest) => stats.first_offset,
                Some(StartFrom::Latest) => stats.next_offset,
                Some(StartFrom::Offset(o)) if o > stats.next_offset => {
                    return Err(Resumed::Fatal(DrainError::Config(format!(
                        "--from {o} is beyond the gateway's next offset {}",
                        stats.next_offset
                    ))));
                }
                Some(StartFrom::Offset(o)) => o,
            };
            let cp = Checkpoint::new(w.log_id, start);
            self.store
                .save_async(&w.gateway_id, &consumer, &cp)
                .await
                .map_err(|e| Resumed::Fatal(e.into()))?;
            log::info!(
                "gateway {:?} log {}: no checkpoint for consumer {consumer:?}, starting at offset {start}",
                w.gateway_id,
                cp.log_id
            );
            self.metrics.set_committed(cp.offset);
            return Ok(cp);
        };
        let check = match check_log_id(&cp, &w.gateway_id, w.log_id) {
            Err(m) => Err(m),
            Ok(()) => match conn.fetch(None, cp.offset, 1, Duration::ZERO).await {
                Ok(FetchReply::Records {
                    prev_crc,
                    lost: None,
                    ..
                }) => check_prev_crc(&cp, &w.gateway_id, w.log_id, prev_crc),
                // The records before the resume point are gone: the gap is handled by the
                // main loop; nothing to compare.
                Ok(_) => Ok(()),
                Err(ClientError::Gateway {
                    code: ErrorCode::OffsetOutOfRange,
                    ..
                }) => {
                    let next = conn.stats().await.map_err(Resumed::Retry)?.next_offset;
                    Err(ResumeMismatch::BeyondEnd {
                        gateway_id: w.gateway_id.clone(),
                        stored_log_id: cp.log_id.clone(),
                        gateway_log_id: log_id_hex(w.log_id),
                        offset: cp.offset,
                        next_offset: next,
                    })
                }
                Err(e) => return Err(Resumed::Retry(e)),
            },
        };
        match check {
            Ok(()) => {
                log::info!(
                    "gateway {:?} log {}: resuming consumer {consumer:?} at offset {}",
                    w.gateway_id,
                    cp.log_id,
                    cp.offset
                );
                self.metrics.set_committed(cp.offset);
                Ok(cp)
            }
            Err(m) if self.cfg.accept_new_log => {
                let stats = conn.stats().await.map_err(Resumed::Retry)?;
                let mut new = Checkpoint::new(w.log_id, stats.first_offset);
                new.resets = cp.resets + 1;
                new.sink_files = cp.sink_files.clone();
                let reset = Reset {
                    old_log_id: cp.log_id.clone(),
                    old_offset: cp.offset,
                    new_log_id: new.log_id.clone(),
                    new_offset: new.offset,
                    reason: m.to_string(),
                    at_unix_ms: now_ms(),
                };
                self.store
                    .save_with_reset_async(&w.gateway_id, &consumer, &reset, &new)
                    .await
                    .map_err(|e| Resumed::Fatal(e.into()))?;
                log::warn!(
                    "resume check failed: {m}; --accept-new-log is set: starting over at the gateway's first offset {} of log {} (the reset is recorded in the state file)",
                    new.offset,
                    new.log_id
                );
                self.metrics.set_committed(new.offset);
                Ok(new)
            }
            Err(m) => Err(Resumed::Fatal(DrainError::Resume(m))),
        }
    }

    /// Runs the fetcher and the main loop until done, a changed log, or an error.
    async fn session(
        &mut self,
        conn: Client,
        mut cp: Checkpoint,
        target: Option<u64>,
    ) -> Result<SessionEnd, DrainError> {
        let w = conn.welcome().clone();
        let src = Source {
            gateway_id: w.gateway_id.clone(),
            log_id: w.log_id,
        };
        // The checkpoint this session starts from (a stored one, or the gateway's committed
        // offset): what the summary reports if nothing moves it.
        self.summary.offset = cp.offset;
        if target.is_some_and(|t| cp.offset >= t) {
            // Nothing new to forward, but the gateway may have lost its copy of the last
            // commit (it crashed, or its journal write failed, before persisting it): commit
            // the checkpoint again, or retention stays held back. A commit never moves a
            // committed offset backwards, so this is always safe.
            let mut conn = conn;
            if let Err(e) = conn.commit(&self.cfg.consumer, cp.offset).await {
                if let Some(f) = refused_commit(&e, &self.cfg.consumer, cp.offset) {
                    return Err(f);
                }
                log::warn!(
                    "gateway {:?}: could not commit {} for consumer {:?}: {e}",
                    w.gateway_id,
                    cp.offset,
                    self.cfg.consumer
                );
            }
            return Ok(SessionEnd::Done);
        }
        let (tx, rx) = smol::channel::bounded(self.cfg.prefetch.max(1));
        let commit = Arc::new(CommitCell::default());
        commit.set(cp.offset);
        // The fetcher stops on our own signal, so that a global shutdown still lets the
        // final commit through.
        let (fetch_stop_trigger, fetch_stop) = Shutdown::new();
        let ctx = FetcherCtx {
            addr: self.cfg.gateway.clone(),
            log_id: w.log_id,
            consumer: self.cfg.consumer.clone(),
            max_bytes: self.cfg.max_batch_bytes,
            poll_wait: self.cfg.poll_wait,
            reply_timeout: self.cfg.reply_timeout,
            target,
            tx,
            commit: commit.clone(),
            stop: fetch_stop,
            metrics: self.metrics.clone(),
            backoff: Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max),
            give_up_after: self.cfg.once.then_some(self.cfg.once_retry_for),
        };
        let fetch_task = smol::spawn(fetcher(conn, cp.offset, ctx));
        let mut expect_crc = cp.last_crc;
        let end = self
            .main_loop(&rx, &src, &mut cp, &mut expect_crc, target, &commit)
            .await;
        // Let the fetcher commit the final checkpoint on the gateway, then stop it.
        fetch_stop_trigger.trigger();
        drop(rx);
        let _ = smol::future::or(
            async {
                fetch_task.await;
            },
            async {
                smol::Timer::after(
                    FINAL_COMMIT_TIMEOUT + self.cfg.poll_wait + self.cfg.reply_timeout,
                )
                .await;
                log::warn!("gateway did not take the final commit in time");
            },
        )
        .await;
        // A refused commit or an unreachable gateway ends the drain with that error, even
        // when everything fetched was delivered (the records are checkpointed locally).
        if let Some(f) = commit.take_fatal() {
            return Err(f);
        }
        end
    }

    /// Takes batches from the fetcher and keeps up to `win.max` of them in flight at the
    /// sink (module doc, step 4 and "Pipelining").
    async fn main_loop(
        &mut self,
        rx: &Receiver<Item>,
        src: &Source,
        cp: &mut Checkpoint,
        expect_crc: &mut Option<u32>,
        target: Option<u64>,
        commit: &CommitCell,
    ) -> Result<SessionEnd, DrainError> {
        let pipelined = self.sink.as_ref().is_some_and(Sink::pipelined);
        let mut win = Window {
            in_flight: VecDeque::new(),
            resend: VecDeque::new(),
            resend_at: Instant::now(),
            max: if pipelined {
                self.cfg.max_in_flight_batches.max(1)
            } else {
                1
            },
            next: cp.offset,
            backoff: Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max),
        };
        let mut ctx = SinkCtx {
            win: &mut win,
            src,
            cp,
            commit,
        };
        let s = &mut ctx;
        loop {
            if s.win.is_idle() && target.is_some_and(|t| s.cp.offset >= t) {
                return Ok(SessionEnd::Done);
            }
            if self.stop.is_set() && s.win.is_idle() {
                return Ok(SessionEnd::Done);
            }
            let item = match self.advance(s, Some(rx)).await? {
                Step::GaveUp => return Ok(SessionEnd::Done),
                Step::Progress | Step::Idle => continue,
                Step::Item(None) => {
                    // The fetcher ended: finish what is in flight.
                    self.flush(s).await?;
                    return Ok(SessionEnd::Done);
                }
                Step::Item(Some(item)) => item,
            };
            match item {
                Item::LogChanged => {
                    self.flush(s).await?;
                    return Ok(SessionEnd::Again);
                }
                Item::BeyondEnd { offset, next } => {
                    self.flush(s).await?;
                    return Err(DrainError::Resume(ResumeMismatch::BeyondEnd {
                        gateway_id: src.gateway_id.clone(),
                        stored_log_id: s.cp.log_id.clone(),
                        gateway_log_id: log_id_hex(src.log_id),
                        offset,
                        next_offset: next,
                    }));
                }
                Item::Batch { from, reply } => {
                    if from != s.win.next {
                        // Cannot happen: batches are consecutive. Start the session over.
                        log::warn!(
                            "batch from {from} but the sink has everything up to {}; resyncing",
                            s.win.next
                        );
                        self.flush(s).await?;
                        return Ok(SessionEnd::Again);
                    }
                    match reply {
                        FetchReply::Dropped { first_available } => {
                            if !self.flush(s).await? {
                                return Ok(SessionEnd::Done);
                            }
                            self.gap(src, s.cp, from, first_available, "dropped")
                                .await?;
                            s.win.next = s.cp.offset;
                            *expect_crc = None;
                        }
                        FetchReply::Records {
                            prev_crc,
                            next_offset,
                            lost,
                            records,
                        } => {
                            if let Some(l) = lost {
                                if !self.flush(s).await? {
                                    return Ok(SessionEnd::Done);
                                }
                                let to = l.to.max(from);
                                if l.reason == LostReason::NotPersisted {
                                    self.skip(src, s.cp, l.from.max(from), to).await?;
                                } else {
                                    self.gap(
                                        src,
                                        s.cp,
                                        l.from.max(from),
                                        to,
                                        reason_name(l.reason),
                                    )
                                    .await?;
                                }
                                s.win.next = s.cp.offset;
                                *expect_crc = None;
                            } else if !records.is_empty() {
                                let check = Checkpoint {
                                    offset: s.win.next,
                                    last_crc: *expect_crc,
                                    ..s.cp.clone()
                                };
                                if let Err(m) =
                                    check_prev_crc(&check, &src.gateway_id, src.log_id, prev_crc)
                                {
                                    self.flush(s).await?;
                                    return Err(m.into());
                                }
                            }
                            // Records below the next offset (never expected) are skipped.
                            let next = s.win.next;
                            let records: Vec<OwnedRecord> =
                                records.into_iter().filter(|r| r.offset >= next).collect();
                            if let Some(first) = records.first()
                                && first.offset > s.win.next
                            {
                                if !self.flush(s).await? {
                                    return Ok(SessionEnd::Done);
                                }
                                self.gap(src, s.cp, s.cp.offset, first.offset, "unreported")
                                    .await?;
                            }
                            if let Some(last) = records.last() {
                                *expect_crc = Some(last.record_crc);
                                s.win.next = last.offset + 1;
                                self.submit(s, records).await;
                            }
                            if next_offset > s.win.next {
                                if !self.flush(s).await? {
                                    return Ok(SessionEnd::Done);
                                }
                                self.gap(src, s.cp, s.cp.offset, next_offset, "unreported")
                                    .await?;
                                s.win.next = s.cp.offset;
                                *expect_crc = None;
                            }
                        }
                    }
                    s.commit.set(s.cp.offset);
                }
            }
        }
    }

    /// Records a gap `from..to` and moves the checkpoint past it.
    async fn gap(
        &mut self,
        src: &Source,
        cp: &mut Checkpoint,
        from: u64,
        to: u64,
        reason: &str,
    ) -> Result<(), DrainError> {
        if to <= from || to <= cp.offset {
            return Ok(());
        }
        let n = to - from;
        log::warn!(
            "gateway {:?} log {}: offsets {from}..{to} ({n} records) are gone ({reason}); continuing at {to}",
            src.gateway_id,
            cp.log_id
        );
        cp.offset = to;
        cp.last_crc = None;
        cp.gaps += 1;
        cp.lost += n;
        cp.updated_unix_ms = now_ms();
        let gap = Gap {
            gateway_id: src.gateway_id.clone(),
            from,
            to,
            reason: reason.to_string(),
            at_unix_ms: cp.updated_unix_ms,
        };
        self.store
            .save_with_gap_async(&self.cfg.consumer, src.log_id, &gap, cp)
            .await?;
        self.metrics.gaps.inc();
        self.metrics.lost.inc_by(n);
        self.metrics.set_committed(cp.offset);
        self.summary.gaps += 1;
        self.summary.offset = cp.offset;
        Ok(())
    }

    /// Moves the checkpoint past `from..to`, a range the gateway never persisted
    /// (`NotPersisted`: offsets handed out from RAM and not durable at a crash, mostly the
    /// rest of its offset lease). No durably acknowledged record had those offsets, so this
    /// is not a gap: logged at `info`, counted in `spillway_bridge_skipped_offsets_total`,
    /// and neither counted as lost nor recorded in redb's `gaps` table.
    async fn skip(
        &mut self,
        src: &Source,
        cp: &mut Checkpoint,
        from: u64,
        to: u64,
    ) -> Result<(), DrainError> {
        if to <= from || to <= cp.offset {
            return Ok(());
        }
        let n = to - from;
        log::info!(
            "gateway {:?} log {}: offsets {from}..{to} were never persisted by the gateway (skipped after a crash); no durably acknowledged record had them; continuing at {to}",
            src.gateway_id,
            cp.log_id
        );
        cp.offset = to;
        cp.last_crc = None;
        cp.updated_unix_ms = now_ms();
        self.store
            .save_async(&src.gateway_id, &self.cfg.consumer, cp)
            .await?;
        self.metrics.skipped_offsets.inc_by(n);
        self.metrics.set_committed(cp.offset);
        self.summary.skipped_offsets += n;
        self.summary.offset = cp.offset;
        Ok(())
    }

    /// Sets the shutdown deadline when the signal has come.
    fn note_stop(&mut self) {
        if self.stop.is_set() && self.stop_deadline.is_none() {
            self.stop_deadline = Some(Instant::now() + self.cfg.shutdown_grace);
        }
    }

    /// True once the shutdown grace has run out.
    fn gave_up(&self) -> bool {
        self.stop.is_set() && self.stop_deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Runs `fut` to its end, or returns `None` when the shutdown signal arrives (the first
    /// time) or the shutdown grace runs out, so the caller can look again.
    async fn until_halt<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        self.note_stop();
        let deadline = self.stop_deadline;
        smol::future::or(async { Some(fut.await) }, async {
            match deadline {
                None => self.stop.wait().await,
                Some(d) => {
                    smol::Timer::at(d).await;
                }
            }
            None
        })
        .await
    }

    /// One step of the sink side: resends after a failure (once its backoff has passed),
    /// takes the acknowledgements of the oldest batch in flight, or, with `rx` and room in
    /// the window, takes the next item from the fetcher.
    async fn advance(
        &mut self,
        s: &mut SinkCtx<'_>,
        rx: Option<&Receiver<Item>>,
    ) -> Result<Step, DrainError> {
        self.note_stop();
        if self.gave_up() && !s.win.is_idle() {
            log::warn!(
                "shutting down with offsets from {} not acknowledged by the sink (resent next time)",
                s.cp.offset
            );
            return Ok(Step::GaveUp);
        }
        if !s.win.resend.is_empty() && s.win.in_flight.len() < s.win.max {
            let at = s.win.resend_at;
            if Instant::now() < at {
                self.until_halt(smol::Timer::at(at)).await;
                return Ok(Step::Progress);
            }
            while s.win.in_flight.len() < s.win.max
                && let Some(records) = s.win.resend.pop_front()
            {
                self.submit(s, records).await;
            }
            return Ok(Step::Progress);
        }
        let room =
            !self.stop.is_set() && s.win.resend.is_empty() && s.win.in_flight.len() < s.win.max;
        let rx = rx.filter(|_| room);
        if s.win.in_flight.is_empty() && rx.is_none() {
            return Ok(Step::Idle);
        }
        let event = {
            let front = s.win.in_flight.front_mut();
            let settled = async {
                match front {
                    Some(b) => {
                        b.pending.settle().await;
                        None
                    }
                    None => std::future::pending().await,
                }
            };
            let received = async {
                match rx {
                    Some(rx) => Some(rx.recv().await.ok()),
                    None => std::future::pending().await,
                }
            };
            self.until_halt(smol::future::or(settled, received)).await
        };
        match event {
            None => Ok(Step::Progress),
            Some(None) => {
                self.complete(s).await?;
                Ok(Step::Progress)
            }
            Some(Some(item)) => Ok(Step::Item(item)),
        }
    }

    /// Finishes every batch in flight and every resend, retrying as usual; false if the
    /// shutdown grace ran out first. Afterwards the checkpoint is at `win.next`.
    async fn flush(&mut self, s: &mut SinkCtx<'_>) -> Result<bool, DrainError> {
        while !s.win.is_idle() {
            if let Step::GaveUp = self.advance(s, None).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Hands `records` to the sink as the newest batch in flight.
    async fn submit(&mut self, s: &mut SinkCtx<'_>, records: Vec<OwnedRecord>) {
        let pending = match self.sink.as_mut() {
            Some(sink) => sink.submit(s.src, &records).await,
            None => Pending::Done(Some(Err(DeliverError {
                delivered: 0,
                error: SinkError::Kafka("sink closed".into()),
            }))),
        };
        s.win.in_flight.push_back(InFlight { records, pending });
    }

    /// Called once the oldest batch in flight has settled: moves the checkpoint over it and
    /// over every following batch that has settled too, up to the first unacknowledged
    /// record, and saves it once (redb, then the gateway's commit). On a failure, see
    /// [`Drain::fail`].
    async fn complete(&mut self, s: &mut SinkCtx<'_>) -> Result<(), DrainError> {
        let mut records = 0u64;
        let mut bytes = 0u64;
        let mut failure = None;
        while let Some(front) = s.win.in_flight.front_mut() {
            if smol::future::poll_once(front.pending.settle())
                .await
                .is_none()
            {
                break;
            }
            let Some(mut b) = s.win.in_flight.pop_front() else {
                break;
            };
            let done = match b.pending.result() {
                Ok(()) => {
                    s.win.backoff.reset();
                    b.records.len()
                }
                Err(e) => {
                    let done = e.delivered.min(b.records.len());
                    failure = Some((b.records.split_off(done), e.error));
                    done
                }
            };
            if let Some(last) = b.records[..done].last() {
                s.cp.offset = last.offset + 1;
                s.cp.last_crc = Some(last.record_crc);
            }
            records += done as u64;
            bytes += b.records[..done]
                .iter()
                .map(|r| r.payload.len() as u64)
                .sum::<u64>();
            if failure.is_some() {
                break;
            }
        }
        if records > 0 {
            s.cp.records += records;
            s.cp.bytes += bytes;
            s.cp.updated_unix_ms = now_ms();
            if let Some(Sink::File(f)) = self.sink.as_ref() {
                // The file sink delivers one batch at a time: what it has synced now is
                // exactly the records below the new checkpoint offset.
                s.cp.sink_files = f.synced_files();
            }
            self.store
                .save_async(&s.src.gateway_id, &self.cfg.consumer, s.cp)
                .await?;
            self.state_backoff.reset();
            s.commit.set(s.cp.offset);
            self.metrics.forwarded_records.inc_by(records);
            self.metrics.forwarded_bytes.inc_by(bytes);
            self.metrics.set_committed(s.cp.offset);
            self.summary.records += records;
            self.summary.bytes += bytes;
            self.summary.offset = s.cp.offset;
            let next = u64::try_from(self.metrics.next_offset.get()).unwrap_or(0);
            self.progress.update(
                s.cp.offset,
                next.max(s.cp.offset),
                self.summary.records,
                self.summary.bytes,
            );
        }
        if let Some((rest, err)) = failure {
            self.fail(s, rest, err).await;
        }
        Ok(())
    }

    /// A delivery failed at `s.cp.offset` (the first unacknowledged record; `rest` is what
    /// is left of its batch). Waits until every later batch in flight has settled too, so
    /// that no resend overtakes a message still queued from the first attempt, then queues
    /// everything from `s.cp.offset` on for resending, in order, after a backoff. Whatever
    /// later batches got acknowledged is sent again (duplicates, never a skipped record).
    async fn fail(&mut self, s: &mut SinkCtx<'_>, rest: Vec<OwnedRecord>, err: SinkError) {
        self.metrics.sink_error(err.kind());
        self.metrics.retries.inc();
        let mut later = std::mem::take(&mut s.win.in_flight);
        for b in later.iter_mut() {
            while self.until_halt(b.pending.settle()).await.is_none() {
                if self.gave_up() {
                    break;
                }
            }
        }
        let mut resend: VecDeque<Vec<OwnedRecord>> = VecDeque::new();
        resend.extend(Some(rest).filter(|r| !r.is_empty()));
        resend.extend(later.into_iter().map(|b| b.records));
        resend.append(&mut s.win.resend);
        s.win.resend = resend;
        let n: usize = s.win.resend.iter().map(Vec::len).sum();
        let d = s.win.backoff.next_delay();
        s.win.resend_at = Instant::now() + d;
        log::warn!(
            "sink failed at offset {} ({err}); resending {n} records from there in {d:.1?}",
            s.cp.offset
        );
    }
}

/// A batch handed to the sink, waiting for its acknowledgements.
struct InFlight {
    /// The batch, kept for a resend.
    records: Vec<OwnedRecord>,
    /// Its acknowledgements.
    pending: Pending,
}

/// The sink side of a session (module doc, "Pipelining").
struct Window {
    /// Batches handed to the sink and not yet checkpointed, oldest first.
    in_flight: VecDeque<InFlight>,
    /// After a failure: the unacknowledged records, as batches, to hand over again (in
    /// order, before anything new).
    resend: VecDeque<Vec<OwnedRecord>>,
    /// When the resend may start (backoff).
    resend_at: Instant,
    /// Batches in flight at most.
    max: usize,
    /// The offset after the last record handed to the sink: where the next batch starts.
    next: u64,
    /// Backoff between resends; reset by a batch acknowledged whole.
    backoff: Backoff,
}

impl Window {
    /// Nothing in flight and nothing to resend: the checkpoint is at `next`.
    fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.resend.is_empty()
    }
}

/// What the sink side of a session works on.
struct SinkCtx<'a> {
    win: &'a mut Window,
    src: &'a Source,
    cp: &'a mut Checkpoint,
    commit: &'a CommitCell,
}

/// What [`Drain::advance`] did.
enum Step {
    /// Something (or nothing, after a signal): look again.
    Progress,
    /// Nothing in flight and nothing to take.
    Idle,
    /// The shutdown grace ran out with records unacknowledged.
    GaveUp,
    /// The next item from the fetcher (`None`: the fetcher ended).
    Item(Option<Item>),
}

enum Resumed {
    Fatal(DrainError),
    Retry(ClientError),
    /// The shutdown signal came first.
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut prev_cap = Duration::from_millis(100);
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(d <= prev_cap && d >= prev_cap / 2, "{d:?} vs {prev_cap:?}");
            prev_cap = (prev_cap * 2).min(Duration::from_secs(1));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn start_from_parses() {
        assert_eq!("earliest".parse::<StartFrom>(), Ok(StartFrom::Earliest));
        assert_eq!("latest".parse::<StartFrom>(), Ok(StartFrom::Latest));
        assert_eq!("42".parse::<StartFrom>(), Ok(StartFrom::Offset(42)));
        assert!("-1".parse::<StartFrom>().is_err());
    }

    #[test]
    fn shutdown_signal() {
        let (t, s) = Shutdown::new();
        assert!(!s.is_set());
        let s2 = s.clone();
        t.trigger();
        assert!(s2.is_set());
        smol::block_on(s.wait());
    }
}

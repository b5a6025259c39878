//! The fetcher: the task that owns the gateway connection during a session. It fetches
//! ahead of the sink (at most `prefetch` batches of at most `max_batch_bytes`), long-polls
//! at the end of the log, fetches a range reported corrupt again before it becomes a gap,
//! commits the latest checkpoint offset on the gateway between fetches, and reconnects
//! with backoff (a changed log id ends the session). A fetch refused with an error reply,
//! or answered empty while the gateway's log holds records past it, is fetched again after
//! a backoff; with a retry budget (`--retry-for`) the fetcher gives up once no fetch has
//! made progress for that long. See `docs/drain.md`, step 3 and "Gaps".

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smol::channel::Sender;
use spillway_core::wire::{ErrorCode, LostReason};

use super::{Backoff, DrainError, NoProgress, Shutdown, refused_commit, sleep_or_stop};
use crate::client::{
    Client, ClientError, FetchAhead, FetchReply, FirstContact, GatewayAddr, log_id_hex,
};
use crate::metrics::Metrics;

/// What the fetcher hands the main loop.
pub(super) enum Item {
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
pub(super) struct CommitCell {
    want: Mutex<u64>,
    fatal: Mutex<Option<DrainError>>,
}

impl CommitCell {
    pub(super) fn fail(&self, e: DrainError) {
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(e);
        }
    }
    pub(super) fn take_fatal(&self) -> Option<DrainError> {
        self.fatal.lock().ok().and_then(|mut f| f.take())
    }
    pub(super) fn set(&self, o: u64) {
        if let Ok(mut w) = self.want.lock() {
            *w = (*w).max(o);
        }
    }
    pub(super) fn get(&self) -> u64 {
        self.want.lock().map(|w| *w).unwrap_or(0)
    }
}

pub(super) struct FetcherCtx {
    pub(super) addr: GatewayAddr,
    pub(super) log_id: u128,
    pub(super) consumer: String,
    pub(super) max_bytes: u32,
    pub(super) poll_wait: Duration,
    pub(super) reply_timeout: Duration,
    pub(super) target: Option<u64>,
    pub(super) tx: Sender<Item>,
    pub(super) commit: Arc<CommitCell>,
    pub(super) stop: Shutdown,
    pub(super) metrics: Metrics,
    pub(super) backoff: Backoff,
    /// The retry budget (`--retry-for`, [`super::DrainConfig::retry_budget`]) and how long
    /// the requests have failed without progress: a gateway that takes every reconnect and
    /// fails every fetch (error replies, bad or missing replies, empty replies while its log
    /// holds more) is given up like one that cannot be reached.
    pub(super) clock: NoProgress,
}

impl FetcherCtx {
    /// A request begun at `began` failed with `e`, or was answered without progress:
    /// counts it on the retry clock. The delay before the next attempt (the next backoff
    /// delay, cut to what the budget has left), or `None` once the budget is spent, with
    /// [`DrainError::GatewayUnreachable`] left for the main loop.
    fn no_progress(&mut self, began: Instant, e: &dyn std::fmt::Display) -> Option<Duration> {
        let delay = self.backoff.next_delay();
        match self.clock.failed(began, delay, Instant::now()) {
            Ok(d) => Some(d),
            Err(waited) => {
                self.commit.fail(DrainError::GatewayUnreachable {
                    gateway: self.addr.to_string(),
                    waited,
                    last_error: e.to_string(),
                });
                None
            }
        }
    }

    /// A fetch made progress: the retry clock and the backoff start over.
    fn progressed(&mut self) {
        self.clock.progressed();
        self.backoff.reset();
    }
}

/// Where the gateway's log is known to hold records at or past `cursor`, though a fetch
/// from `cursor` was answered with no records and no lost range: the `--once` `target`
/// (the next offset the gateway announced at start) or `log_end` (the next offset its
/// counters last gave), whichever is past `cursor`. `None`: the reply was valid, `cursor`
/// is the end of the log as far as is known.
pub(crate) fn holds_more(cursor: u64, target: Option<u64>, log_end: Option<u64>) -> Option<u64> {
    [target, log_end]
        .into_iter()
        .flatten()
        .filter(|&e| e > cursor)
        .max()
}

/// Fetches repeated, at most, after the gateway reported a range corrupt, before the range
/// is recorded as a gap (docs/drain.md, "Gaps").
pub const CORRUPT_REFETCHES: u32 = 24;
/// Pause between those fetches.
pub const CORRUPT_REFETCH_DELAY: Duration = Duration::from_millis(50);
/// No fetch is repeated once this much time has passed since the first corrupt reply for
/// the offset, so a range that is corrupt on every read becomes a gap within about this
/// time plus one fetch (over a slow serial line, after fewer than [`CORRUPT_REFETCHES`]).
pub const CORRUPT_REFETCH_FOR: Duration = Duration::from_millis(1200);

pub(super) const CLIENT_NAME: &str = concat!("spillway-bridge/", env!("CARGO_PKG_VERSION"));
const STATS_EVERY: Duration = Duration::from_secs(2);
pub(super) const FINAL_COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Hands `item` to the main loop, waiting while its queue is full (the sink is behind or
/// down). Meanwhile, with no fetch outstanding on `conn` (`idle`), the gateway's counters
/// are read every [`STATS_EVERY`], so that the next-offset and lag gauges follow the log
/// through a sink outage, the time they matter most; after a failed read, no more until
/// the next fetch (which reconnects). False when the stop signal came first.
async fn hand_over(
    ctx: &FetcherCtx,
    conn: &mut Client,
    item: Item,
    mut idle: bool,
    last_stats: &mut Instant,
) -> bool {
    enum Event {
        Sent(bool),
        Stop,
        Stats,
    }
    // One send for the whole wait: dropping it would drop the item.
    let mut send = std::pin::pin!(ctx.tx.send(item));
    loop {
        let due = STATS_EVERY.saturating_sub(last_stats.elapsed());
        let stats = async {
            if idle {
                smol::Timer::after(due).await;
            } else {
                std::future::pending::<()>().await;
            }
            Event::Stats
        };
        let stop = async {
            ctx.stop.wait().await;
            Event::Stop
        };
        let sent = async { Event::Sent(send.as_mut().await.is_ok()) };
        match smol::future::or(sent, smol::future::or(stop, stats)).await {
            Event::Sent(ok) => return ok,
            Event::Stop => return false,
            Event::Stats => {
                *last_stats = Instant::now();
                match conn.stats().await {
                    Ok(s) => ctx.metrics.set_next(s.next_offset),
                    Err(e) => {
                        log::debug!("reading the gateway's counters while the sink is behind: {e}");
                        idle = e.connection_ok();
                    }
                }
            }
        }
    }
}

/// Why [`connect_retry`] returned without a connection.
pub(super) enum NoConnection {
    /// The shutdown signal.
    Stopped,
    /// The retry budget ran out.
    GaveUp(DrainError),
}

/// Connects, retrying with backoff until connected, `stop`, or (with `give_up` set) once
/// that long has passed since `since` without a connection. With `first` (no `Welcome`
/// from this gateway yet in this run), a peer that is not a Spillway listener
/// ([`ClientError::NotSpillway`]: silent, or closing before a `Welcome` on
/// [`NOT_SPILLWAY_TRIES`](crate::client::NOT_SPILLWAY_TRIES) connects in a row) ends the
/// drain ([`DrainError::NotSpillway`]); fewer closes may be a gateway that went down as it
/// accepted, and are retried.
pub(super) async fn connect_retry(
    addr: &GatewayAddr,
    reply_timeout: Duration,
    backoff: &mut Backoff,
    stop: &Shutdown,
    metrics: &Metrics,
    give_up: Option<(Instant, Duration)>,
    first: bool,
) -> Result<Client, NoConnection> {
    let mut contact = if first {
        FirstContact::default()
    } else {
        FirstContact::welcomed()
    };
    loop {
        if stop.is_set() {
            return Err(NoConnection::Stopped);
        }
        let r = Client::connect(addr, CLIENT_NAME, reply_timeout).await;
        let not_spillway = contact.not_spillway(&r);
        match r {
            // The caller resets the backoff once the connection made progress: a gateway
            // that takes each connection and fails each request is retried ever more slowly.
            Ok(c) => return Ok(c),
            Err(e @ ClientError::NotSpillway { .. }) if not_spillway => {
                metrics.gateway_errors.inc();
                return Err(NoConnection::GaveUp(DrainError::NotSpillway {
                    gateway: addr.to_string(),
                    source: e,
                }));
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

pub(super) async fn fetcher(mut conn: Client, mut cursor: u64, mut ctx: FetcherCtx) -> Client {
    let mut committed_sent = 0u64;
    let mut last_stats = Instant::now() - STATS_EVERY;
    let mut send_consumer = true;
    // A fetch answered "corrupt": (its offset, when first, fetches again so far).
    let mut corrupt_at: Option<(u64, Instant, u32)> = None;
    // A fetch sent ahead (see `FetchAhead`), whose reply is still to come: `(seq, from)`.
    // While there is one, the connection carries no other request.
    let mut ahead: Option<(u32, u64)> = None;
    // The gateway's next offset as its counters last gave it.
    let mut log_end: Option<u64> = None;
    loop {
        // When the request about to go out was sent (for a fetch sent ahead, when the wait
        // for its reply began): a request never answered counts on the retry clock from
        // here, not from its reply timeout.
        let began = Instant::now();
        if let Some((seq, from)) = ahead.filter(|a| a.1 != cursor) {
            // Sent for an offset the loop did not move to (cannot happen: both compute it
            // alike): take its reply, unused, before anything else goes out.
            ahead = None;
            log::debug!("dropping the fetch from {from} sent ahead; the cursor is at {cursor}");
            if let Err(e) = conn.fetch_reply(seq, from, ctx.poll_wait, None).await
                && !e.connection_ok()
            {
                conn = match reconnect(&mut ctx, e, began).await {
                    Some(c) => c,
                    None => return conn,
                };
            }
            continue;
        }
        let want = ctx.commit.get();
        if ahead.is_none() && want > committed_sent {
            // Commit what the main loop has made durable.
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
                    log::warn!("gateway {} refused the commit of {want}: {e}", ctx.addr);
                    committed_sent = want;
                }
                Err(e) => {
                    conn = match reconnect(&mut ctx, e, began).await {
                        Some(c) => c,
                        None => return conn,
                    };
                    continue;
                }
            }
        }
        if ahead.is_none() && ctx.stop.is_set() {
            // The main loop may have moved the checkpoint while the commit above waited
            // for its reply: the final checkpoint goes out before the fetcher stops.
            if ctx.commit.get() > committed_sent {
                continue;
            }
            return conn;
        }
        if ahead.is_none() && last_stats.elapsed() >= STATS_EVERY {
            last_stats = Instant::now();
            match conn.stats().await {
                Ok(s) => {
                    ctx.metrics.set_next(s.next_offset);
                    log_end = Some(s.next_offset);
                }
                Err(e) if e.connection_ok() => {}
                Err(e) => {
                    conn = match reconnect(&mut ctx, e, last_stats).await {
                        Some(c) => c,
                        None => return conn,
                    };
                    continue;
                }
            }
        }
        if ahead.is_none() && ctx.target.is_some_and(|t| cursor >= t) {
            // Nothing more to fetch: wait for commits or the end.
            sleep_or_stop(Duration::from_millis(50), &ctx.stop).await;
            continue;
        }
        let consumer = send_consumer.then_some(ctx.consumer.as_str());
        // The next fetch goes out ahead, as soon as this one's reply is decoded, unless a
        // commit or the counters are due first, the fetcher is stopping, or the main loop
        // has no room for this batch anyway.
        let pipeline = !ctx.stop.is_set()
            && ctx.commit.get() <= committed_sent
            && last_stats.elapsed() < STATS_EVERY
            && ctx.tx.capacity().is_some_and(|c| ctx.tx.len() + 1 < c);
        let next_ahead =
            pipeline.then(|| FetchAhead::new(consumer, ctx.max_bytes, ctx.poll_wait, ctx.target));
        let began = Instant::now();
        let res = match ahead.take() {
            Some((seq, from)) => {
                conn.fetch_reply(seq, from, ctx.poll_wait, next_ahead.as_ref())
                    .await
            }
            None => {
                conn.fetch_ahead(
                    consumer,
                    cursor,
                    ctx.max_bytes,
                    ctx.poll_wait,
                    next_ahead.as_ref(),
                )
                .await
            }
        };
        match res {
            Ok((reply, sent)) => {
                ahead = sent;
                let corrupt = matches!(&reply, FetchReply::Records { lost: Some(l), .. }
                    if l.reason == LostReason::Corrupt);
                if corrupt {
                    let (since, tries) = corrupt_at
                        .filter(|c| c.0 == cursor)
                        .map_or((Instant::now(), 0), |c| (c.1, c.2));
                    if tries < CORRUPT_REFETCHES && since.elapsed() < CORRUPT_REFETCH_FOR {
                        // Bounded: within CORRUPT_REFETCH_FOR the range becomes a gap.
                        ctx.progressed();
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
                    if let Some(end) = holds_more(cursor, ctx.target, log_end) {
                        // Nothing, though the log holds records from here: no progress.
                        // Fetched again after a backoff, and within the retry budget, not
                        // thousands of times a second.
                        ctx.metrics.gateway_errors.inc();
                        let e = format!(
                            "answered the fetch from offset {cursor} with no records, though the log's next offset is {end}"
                        );
                        let Some(d) = ctx.no_progress(began, &e) else {
                            return conn;
                        };
                        ctx.metrics.retries.inc();
                        log::warn!("gateway {}: {e}; fetching again in {d:.1?}", ctx.addr);
                        // Its counters are read again before that fetch: the end they gave
                        // may be stale.
                        last_stats = Instant::now() - STATS_EVERY;
                        sleep_or_stop(d, &ctx.stop).await;
                    } else {
                        // The end of the log: a valid reply.
                        ctx.progressed();
                    }
                    continue;
                }
                ctx.progressed();
                let item = Item::Batch {
                    from: cursor,
                    reply,
                };
                // The log reaches at least past this batch (the counters say where exactly).
                ctx.metrics.raise_next(next);
                let handed =
                    hand_over(&ctx, &mut conn, item, ahead.is_none(), &mut last_stats).await;
                if !handed {
                    // Stopping: a fetch sent ahead is not waited for; its reply is skipped
                    // by the wait for the final commit's.
                    ahead = None;
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
                // An error reply (Internal, StorageFailed, ...): a failed fetch, on the retry
                // clock like a gateway that cannot be reached.
                ctx.metrics.gateway_errors.inc();
                let Some(d) = ctx.no_progress(began, &e) else {
                    return conn;
                };
                ctx.metrics.retries.inc();
                log::warn!(
                    "gateway {} refused the fetch from offset {cursor}: {e}; fetching again in {d:.1?}",
                    ctx.addr
                );
                sleep_or_stop(d, &ctx.stop).await;
            }
            Err(e) => {
                conn = match reconnect(&mut ctx, e, began).await {
                    Some(c) => c,
                    None => return conn,
                };
            }
        }
    }
}

/// Reconnects after `e`, which ended the request begun at `began` (the retry clock starts
/// there if it does not run yet); `None` on stop, when the retry budget is spent (reported
/// to the main loop) or when the log id changed (likewise).
async fn reconnect(ctx: &mut FetcherCtx, e: ClientError, began: Instant) -> Option<Client> {
    ctx.metrics.gateway_errors.inc();
    let d = ctx.no_progress(began, &e)?;
    let since = ctx.clock.since().unwrap_or(began);
    log::warn!("gateway {}: {e}; reconnecting in {d:.1?}", ctx.addr);
    if !sleep_or_stop(d, &ctx.stop).await {
        return None;
    }
    let c = match connect_retry(
        &ctx.addr,
        ctx.reply_timeout,
        &mut ctx.backoff,
        &ctx.stop,
        &ctx.metrics,
        ctx.clock.budget().map(|b| (since, b)),
        false,
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

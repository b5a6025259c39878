//! The in-flight window at the sink: batches handed over and not yet acknowledged, the
//! checkpoint advanced strictly in offset order over the acknowledged ones (saved in redb,
//! then committed on the gateway), resends after a failed delivery, and the shutdown
//! grace. With a pipelined sink (Kafka) the redb save runs behind the window: one save at a
//! time, while later batches are handed over and acknowledged; the gateway commit follows
//! each finished save. See `docs/drain.md`, "Pipelining" and "Stopping".

use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

use smol::channel::Receiver;

use super::fetcher::{CommitCell, Item};
use super::{Backoff, Drain, DrainError, SINK_STALL_WARNING};
use crate::checkpoint::{Checkpoint, StoreError, now_ms};
use crate::client::OwnedRecord;
use crate::sink::{DeliverError, Pending, Sink, SinkError, Source};

impl Drain {
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

    /// How often an idle drain lets a file sink with `--rotate-interval` close the files
    /// that are due: half the interval, between 50 ms and 5 s; `None` for other sinks.
    pub(super) fn idle_tick(&self) -> Option<Duration> {
        match self.sink.as_ref() {
            Some(Sink::File(f)) => f
                .rotation()
                .interval
                .map(|i| (i / 2).clamp(Duration::from_millis(50), Duration::from_secs(5))),
            _ => None,
        }
    }

    /// One step of the sink side: resends after a failure (once its backoff has passed),
    /// takes the acknowledgements of the oldest batch in flight, or, with `rx` and room in
    /// the window, takes the next item from the fetcher.
    pub(super) async fn advance(
        &mut self,
        s: &mut SinkCtx<'_>,
        rx: Option<&Receiver<Item>>,
    ) -> Result<Step, DrainError> {
        self.note_stop();
        if self.producer_failed.is_some() {
            // The Kafka producer failed for good: nothing more goes to it. What was
            // acknowledged is saved; the session ends and the run loop replaces the
            // producer (see `Drain::renew_producer`).
            self.finish_save(s).await?;
            return Ok(Step::GaveUp);
        }
        if s.win.failed {
            // File sink: a write or fsync failed. Nothing written since the checkpoint is
            // kept in memory: the session ends, and the next one fetches it again from the
            // checkpoint after a backoff (see `Drain::refetch_at`).
            return Ok(Step::GaveUp);
        }
        if self.gave_up() && !s.win.is_idle() {
            // What was acknowledged is saved before giving up on the rest.
            self.finish_save(s).await?;
            if s.win.is_idle() {
                return Ok(Step::Progress);
            }
            log::warn!(
                "shutting down with offsets from {} not acknowledged by the sink (resent next time)",
                s.cp.offset
            );
            return Ok(Step::GaveUp);
        }
        // Kafka, after a failed delivery: the resend.
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
        // File sink: the group checkpoint is due (or nothing more can be taken now, or
        // nothing more will come).
        if let Some(since) = s.win.unsynced_since
            && (rx.is_none()
                || s.win.one_by_one
                || s.win.target.is_some_and(|t| s.win.next >= t)
                || s.win.unsynced_bytes >= self.cfg.checkpoint_bytes
                || since.elapsed() >= self.cfg.checkpoint_interval)
        {
            self.sync_files(s).await;
            self.complete(s).await?;
            return Ok(Step::Progress);
        }
        if s.win.in_flight.is_empty() && rx.is_none() && s.win.saving.is_none() {
            if s.win.dirty {
                self.start_save(s);
                return Ok(Step::Progress);
            }
            return Ok(Step::Idle);
        }
        // With nothing in flight, a file sink with --rotate-interval wakes up now and then
        // to close the files that are due (the fetcher sends nothing while the log is quiet).
        let tick = self.idle_tick().filter(|_| s.win.is_idle());
        let stall_at = s.win.stall_warning_at();
        let event = {
            let front = s.win.in_flight.front_mut();
            let settled = async {
                or_never(front.map(|b| b.pending.settle())).await;
                Event::Settled
            };
            let saving = s.win.saving.as_mut();
            let saved = async { Event::Saved(or_never(saving.map(|save| &mut save.task)).await) };
            let received = async { Event::Received(or_never(rx.map(|rx| rx.recv())).await.ok()) };
            let sync_at = s
                .win
                .unsynced_since
                .map(|t| t + self.cfg.checkpoint_interval);
            let sync_due = async {
                or_never(sync_at.map(smol::Timer::at)).await;
                Event::SyncDue
            };
            let ticked = async {
                or_never(tick.map(smol::Timer::after)).await;
                Event::Tick
            };
            let stalled = async {
                or_never(stall_at.map(smol::Timer::at)).await;
                Event::Stalled
            };
            self.until_halt(smol::future::or(
                saved,
                smol::future::or(
                    settled,
                    smol::future::or(
                        sync_due,
                        smol::future::or(received, smol::future::or(ticked, stalled)),
                    ),
                ),
            ))
            .await
        };
        match event {
            None => Ok(Step::Progress),
            Some(Event::Saved(r)) => {
                self.saved(s, r)?;
                Ok(Step::Progress)
            }
            Some(Event::Settled) => {
                self.complete(s).await?;
                Ok(Step::Progress)
            }
            Some(Event::SyncDue) => {
                self.sync_files(s).await;
                self.complete(s).await?;
                Ok(Step::Progress)
            }
            Some(Event::Received(item)) => Ok(Step::Item(item)),
            Some(Event::Tick) => Ok(Step::Quiet),
            Some(Event::Stalled) => {
                self.warn_stalled(s);
                Ok(Step::Progress)
            }
        }
    }

    /// Kafka: no delivery report for [`SINK_STALL_WARNING`] while batches wait for one
    /// (the broker down or unreachable; librdkafka retries on its own until its delivery
    /// timeout, silent meanwhile): says so once, with what waits; [`Drain::complete`] logs
    /// when reports come again.
    fn warn_stalled(&mut self, s: &mut SinkCtx<'_>) {
        let Some(since) = s.win.stall_warning_at().map(|at| at - SINK_STALL_WARNING) else {
            return;
        };
        s.win.stalled_since = Some(since);
        let records: u64 = s.win.in_flight.iter().map(|b| b.span.count).sum();
        log::warn!(
            "sink {}: no delivery report for offsets from {} in {:.0?} ({records} records in {} batches waiting); the producer retries until its delivery timeout, then the drain resends them",
            self.sink_name(),
            s.cp.offset,
            since.elapsed(),
            s.win.in_flight.len()
        );
    }

    /// Finishes every batch in flight and every resend, retrying as usual, and the redb save
    /// of the checkpoint; false if the shutdown grace ran out first. Afterwards the
    /// checkpoint is at `win.next`, saved.
    pub(super) async fn flush(&mut self, s: &mut SinkCtx<'_>) -> Result<bool, DrainError> {
        while !s.win.is_idle() {
            if let Step::GaveUp = self.advance(s, None).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Hands `records` to the sink as the newest batch in flight. A file sink's batch
    /// waits there, written, for the group checkpoint's fsync ([`Drain::sync_files`]), as
    /// its [`Span`] alone: the records are not kept (after a failure they are fetched
    /// again). A failed write fails every batch written since the last fsync too (the sink
    /// cuts them off its files before it writes again). A Kafka batch keeps its records
    /// for a resend.
    pub(super) async fn submit(&mut self, s: &mut SinkCtx<'_>, records: Vec<OwnedRecord>) {
        let mut span = Span::of(&records);
        let skipped_before = self.file_skipped();
        let pending = match self.sink.as_mut() {
            Some(sink) => sink.submit(s.src, &records).await,
            None => Pending::Done(Some(Err(DeliverError {
                delivered: 0,
                error: SinkError::Kafka("sink closed".into()),
            }))),
        };
        let file_sink = matches!(self.sink, Some(Sink::File(_)));
        if let (Some(before), Some(after)) = (skipped_before, self.file_skipped()) {
            span.skipped = (after.0 - before.0, after.1 - before.1);
        }
        if pending.is_unsynced() {
            s.win.unsynced_since.get_or_insert_with(Instant::now);
            s.win.unsynced_bytes += span.bytes;
        } else if let Pending::Done(Some(Err(e))) = &pending
            && let SinkError::Io(io) = &e.error
        {
            fail_unsynced(s.win, io);
        }
        if s.win.in_flight.is_empty() {
            s.win.reported_at = Instant::now();
        }
        let records = if file_sink {
            // Written: the records go (their reply buffers back to the connection's
            // pool) and their vector to the next reply.
            crate::client::recycle_records(records);
            Vec::new()
        } else {
            records
        };
        s.win.in_flight.push_back(InFlight {
            records,
            span,
            pending,
            handed: Instant::now(),
        });
    }

    /// File sink: the records and payload bytes it has skipped so far as already in its
    /// files (see `sink::file`, "Exactly once"); `None` for other sinks.
    fn file_skipped(&self) -> Option<(u64, u64)> {
        match self.sink.as_ref() {
            Some(Sink::File(f)) => Some((f.skipped_duplicates(), f.skipped_bytes())),
            _ => None,
        }
    }

    /// File sink, the group checkpoint's first step: fsyncs every file written since the
    /// last one, which settles every batch in flight (all acknowledged, or all failed),
    /// so that [`Drain::complete`] then saves the checkpoint after them in redb with the
    /// synced lengths, closes the full files and lets the gateway commit, in that order.
    async fn sync_files(&mut self, s: &mut SinkCtx<'_>) {
        let r = match self.sink.as_mut() {
            Some(Sink::File(f)) => f.sync().await,
            _ => Err(std::io::Error::other("sink closed")),
        };
        match r {
            Ok(()) => {
                s.win.unsynced_since = None;
                s.win.unsynced_bytes = 0;
                for b in s.win.in_flight.iter_mut() {
                    b.pending.synced(Ok(()));
                }
            }
            Err(e) => fail_unsynced(s.win, &e),
        }
    }

    /// Called once the oldest batch in flight has settled: moves the checkpoint over it and
    /// over every following batch that has settled too, up to the first unacknowledged
    /// record, and saves it once (redb, then the gateway's commit). On a failure, see
    /// [`Drain::fail`].
    async fn complete(&mut self, s: &mut SinkCtx<'_>) -> Result<(), DrainError> {
        let mut records = 0u64;
        let mut bytes = 0u64;
        // Of those, not sent (Kafka held them already): delivered, not forwarded.
        let mut skipped = (0u64, 0u64);
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
            s.win.reported_at = Instant::now();
            if let Some(since) = s.win.stalled_since.take() {
                log::info!(
                    "sink {}: delivery reports came again after {:.1?}",
                    self.sink_name(),
                    since.elapsed()
                );
            }
            let acked = match b.pending.result() {
                Ok(()) => {
                    s.win.backoff.reset();
                    let (n, by) = b.pending.skipped();
                    skipped = (
                        skipped.0 + n + b.span.skipped.0,
                        skipped.1 + by + b.span.skipped.1,
                    );
                    b.span
                }
                Err(e) => {
                    // A file batch fails whole (and keeps no records); a Kafka batch may
                    // have a leading part acknowledged.
                    let done = e.delivered.min(b.records.len());
                    let rest = b.records.split_off(done);
                    failure = Some((rest, e.error));
                    Span::of(&b.records)
                }
            };
            if let Some((offset, crc)) = acked.last {
                s.cp.offset = offset + 1;
                s.cp.last_crc = Some(crc);
            }
            records += acked.count;
            bytes += acked.bytes;
            if failure.is_some() {
                break;
            }
        }
        if records > 0 {
            s.cp.records += records;
            s.cp.bytes += bytes;
            s.cp.updated_unix_ms = now_ms();
            if let Some(Sink::File(f)) = self.sink.as_ref() {
                // Only a group checkpoint's fsync settles file batches, and it settles
                // every batch written: what the sink has synced now is exactly the records
                // below the new checkpoint offset.
                s.cp.sink_files = f.synced_files();
                self.store()
                    .save_async(&s.src.gateway_id, &self.cfg.consumer, s.cp)
                    .await?;
                self.state_backoff.reset();
                self.close_full_files(s.src.log_id, s.cp.offset).await;
                s.commit.set(s.cp.offset);
                self.metrics.set_committed(s.cp.offset);
            } else {
                self.save_behind(s).await?;
            }
            let (sent, sent_bytes) = (records - skipped.0, bytes - skipped.1);
            self.metrics.forwarded_records.inc_by(sent);
            self.metrics.forwarded_bytes.inc_by(sent_bytes);
            self.summary.records += sent;
            self.summary.bytes += sent_bytes;
            self.summary.offset = s.cp.offset;
            let next = u64::try_from(self.metrics.next_offset.get())
                .unwrap_or(0)
                .max(s.cp.offset);
            self.progress.skipped(skipped.0);
            let eta =
                self.progress
                    .update(s.cp.offset, next, self.summary.records, self.summary.bytes);
            self.metrics.set_eta(eta, next - s.cp.offset);
        }
        if records > 0 {
            self.sink_progressed();
        }
        if let Some((rest, err)) = failure {
            self.fail(s, rest, err).await?;
        } else if s.win.one_by_one && self.one_by_one_until.is_none_or(|u| s.cp.offset >= u) {
            // Everything written before the failure is checkpointed: whole groups again.
            s.win.one_by_one = false;
            self.one_by_one_until = None;
        }
        Ok(())
    }

    /// Pipelined sink: saves the checkpoint `s.cp` behind the window. With no save running,
    /// starts one; with one running, the checkpoint is saved when it ends (the newest one
    /// then), and the window goes on meanwhile, but at most `win.max` batches get
    /// acknowledged past the save running: then this waits for it. So at most twice the
    /// window is delivered and not saved when the bridge dies, which the effectively-once
    /// resume reads back (docs/drain.md).
    async fn save_behind(&mut self, s: &mut SinkCtx<'_>) -> Result<(), DrainError> {
        if s.win.saving.is_none() {
            self.start_save(s);
            return Ok(());
        }
        s.win.dirty = true;
        s.win.dirty_batches += 1;
        if s.win.dirty_batches >= s.win.max {
            self.finish_save(s).await?;
        }
        Ok(())
    }

    /// Starts saving `s.cp` on the blocking pool.
    fn start_save(&mut self, s: &mut SinkCtx<'_>) {
        let store = self.store();
        let (gateway, consumer, cp) = (
            s.src.gateway_id.clone(),
            self.cfg.consumer.clone(),
            s.cp.clone(),
        );
        s.win.saving = Some(Saving {
            offset: cp.offset,
            task: smol::spawn(async move { store.save_async(&gateway, &consumer, &cp).await }),
        });
        s.win.dirty = false;
        s.win.dirty_batches = 0;
    }

    /// A save ended: on success the gateway may commit its offset, and a newer checkpoint,
    /// if there is one, is saved next.
    ///
    /// # Errors
    /// The save's failure (the state file failed).
    fn saved(&mut self, s: &mut SinkCtx<'_>, r: Result<(), StoreError>) -> Result<(), DrainError> {
        let Some(done) = s.win.saving.take() else {
            return Ok(());
        };
        r?;
        self.state_backoff.reset();
        s.commit.set(done.offset);
        self.metrics.set_committed(done.offset);
        if s.win.dirty {
            self.start_save(s);
        }
        Ok(())
    }

    /// Waits until the checkpoint is saved: the save running, and the newer one it leaves.
    async fn finish_save(&mut self, s: &mut SinkCtx<'_>) -> Result<(), DrainError> {
        while let Some(save) = s.win.saving.as_mut() {
            let r = (&mut save.task).await;
            self.saved(s, r)?;
        }
        Ok(())
    }

    /// A delivery failed at `s.cp.offset` (the first unacknowledged record; `rest` is what
    /// is left of its batch). Waits until every later batch in flight has settled too, so
    /// that no resend overtakes a message still queued from the first attempt, then queues
    /// everything from `s.cp.offset` on for resending, in order, after a backoff. Whatever
    /// later batches got acknowledged is sent again (duplicates, never a skipped record).
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the sink has failed for the
    /// retry budget with no checkpoint saved ([`Drain::sink_retry`]): the checkpoint stays
    /// at the last record the sink acknowledged.
    async fn fail(
        &mut self,
        s: &mut SinkCtx<'_>,
        rest: Vec<OwnedRecord>,
        err: SinkError,
    ) -> Result<(), DrainError> {
        self.metrics.sink_error(err.kind());
        self.metrics.retries.inc();
        if matches!(self.sink, Some(Sink::File(_))) {
            return self.refetch(s, &err);
        }
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
        if let Some(reason) = self.producer_fatal(&err) {
            // Resending to this producer fails for ever: the session ends instead (the
            // resend queue stays, so the window is not idle and nothing new is taken).
            self.producer_failed = Some((s.cp.offset, reason));
            return Ok(());
        }
        let n: usize = s.win.resend.iter().map(Vec::len).sum();
        let d = self.sink_retry(&err, s.win.backoff.next_delay())?;
        s.win.resend_at = Instant::now() + d;
        log::warn!(
            "sink failed at offset {} ({err}); resending {n} records from there in {d:.1?}",
            s.cp.offset
        );
        Ok(())
    }

    /// File sink: a write or fsync failed at `s.cp.offset`; every batch written since the
    /// checkpoint is lost to the files (the sink cuts them off before it writes again).
    /// The window keeps no records to resend: the session ends
    /// ([`Window::failed`]), and after a backoff the next one fetches everything from the
    /// checkpoint again ([`Drain::refetch_at`]), one batch to a group up to `s.win.next`
    /// ([`Drain::one_by_one_until`]), with the files the checkpoint covers closed first.
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the sink has failed for the
    /// retry budget with no checkpoint saved ([`Drain::sink_retry`]).
    fn refetch(&mut self, s: &mut SinkCtx<'_>, err: &SinkError) -> Result<(), DrainError> {
        fail_unsynced(s.win, &std::io::Error::other("a write before it failed"));
        s.win.in_flight.clear();
        s.win.failed = true;
        self.one_by_one_until = Some(self.one_by_one_until.unwrap_or(0).max(s.win.next));
        self.close_covered = true;
        let delay = self.refetch_backoff.next_delay();
        let d = self.sink_retry(err, delay)?;
        self.refetch_at = Some(Instant::now() + d);
        log::warn!(
            "sink failed at offset {} ({err}); fetching {} offsets again from there in {d:.1?}",
            s.cp.offset,
            s.win.next - s.cp.offset
        );
        Ok(())
    }
}

/// A batch handed to the sink, waiting for its acknowledgements.
pub(super) struct InFlight {
    /// Kafka: the batch, kept for a resend; file sink: empty (fetched again after a
    /// failure).
    pub(super) records: Vec<OwnedRecord>,
    /// What the batch holds.
    pub(super) span: Span,
    /// Its acknowledgements.
    pub(super) pending: Pending,
    /// When it was handed to the sink.
    pub(super) handed: Instant,
}

/// What a batch in flight holds, all the checkpoint needs once it is acknowledged whole.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Span {
    /// Records.
    pub(super) count: u64,
    /// Their payload bytes.
    pub(super) bytes: u64,
    /// The last record's offset and record CRC (`None`: no record).
    pub(super) last: Option<(u64, u32)>,
    /// File sink: of those, records and payload bytes the files held already (skipped as
    /// duplicates: delivered, not forwarded).
    pub(super) skipped: (u64, u64),
}

impl Span {
    /// The span of `records` (consecutive, oldest first).
    pub(super) fn of(records: &[OwnedRecord]) -> Span {
        Span {
            count: records.len() as u64,
            bytes: records.iter().map(|r| r.payload.len() as u64).sum(),
            last: records.last().map(|r| (r.offset, r.record_crc)),
            skipped: (0, 0),
        }
    }
}

/// The sink side of a session (docs/drain.md, "Pipelining").
pub(super) struct Window {
    /// Batches handed to the sink and not yet checkpointed, oldest first.
    pub(super) in_flight: VecDeque<InFlight>,
    /// Kafka, after a failure: the unacknowledged records, as batches, to hand over again
    /// (in order, before anything new).
    pub(super) resend: VecDeque<Vec<OwnedRecord>>,
    /// When the resend may start (backoff).
    pub(super) resend_at: Instant,
    /// Batches in flight at most.
    pub(super) max: usize,
    /// The offset after the last record handed to the sink: where the next batch starts.
    pub(super) next: u64,
    /// Backoff between resends; reset by a batch acknowledged whole.
    pub(super) backoff: Backoff,
    /// Pipelined sink: the redb save running, if any.
    pub(super) saving: Option<Saving>,
    /// The checkpoint moved past what the save running saves.
    pub(super) dirty: bool,
    /// Batches acknowledged since the save running started.
    pub(super) dirty_batches: usize,
    /// File sink: when the oldest batch written and not fsynced yet was written (the group
    /// checkpoint is due `--checkpoint-interval` later); `None` when there is none.
    pub(super) unsynced_since: Option<Instant>,
    /// File sink: record payload bytes written and not fsynced yet (the group checkpoint
    /// is due at `--checkpoint-bytes`).
    pub(super) unsynced_bytes: u64,
    /// File sink, after a failed write or fsync: every batch is a group of its own (written,
    /// fsynced and checkpointed before the next is written) until everything written before
    /// the failure is checkpointed again ([`Drain::one_by_one_until`]). A whole group can be larger than what the sink's
    /// disk has left (16 MiB by default): resent whole, it would fail again and again and
    /// never close a file that a downstream job could take away to free space; one batch
    /// at a time, the drain gets as far as the space allows and closes the full files
    /// behind it, as it did with a checkpoint per batch.
    pub(super) one_by_one: bool,
    /// File sink: a write or fsync failed; the session ends (see `Drain::refetch`).
    pub(super) failed: bool,
    /// When the sink last settled a batch, or the window last became non-empty: a stall
    /// counts from the later of this and the oldest batch's hand-over.
    pub(super) reported_at: Instant,
    /// Kafka: the stall warned about ([`Drain::warn_stalled`]) began then; `None` while
    /// reports come.
    pub(super) stalled_since: Option<Instant>,
    /// With `--once`, the offset the drain ends at: once it is written, the group
    /// checkpoint is due at once.
    pub(super) target: Option<u64>,
}

/// File sink: fails every batch in flight that was written and not fsynced yet, with
/// `error` (a write or fsync failed: the sink cuts them off its files before it writes
/// again), and clears the group's counters.
fn fail_unsynced(win: &mut Window, error: &std::io::Error) {
    for b in win.in_flight.iter_mut() {
        b.pending.synced(Err(error));
    }
    win.unsynced_since = None;
    win.unsynced_bytes = 0;
}

/// `f`'s output, or never when there is no `f`: how a branch of the window's event
/// select that has nothing to wait for (no batch in flight, no save, no timer) stays out
/// of it. Cancel-safe when `f` is.
async fn or_never<T>(f: Option<impl Future<Output = T>>) -> T {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// A checkpoint save running on the blocking pool.
pub(super) struct Saving {
    /// The checkpoint offset it saves.
    offset: u64,
    /// The save.
    task: smol::Task<Result<(), StoreError>>,
}

impl Window {
    /// Kafka, no stall warned about yet: when the oldest batch in flight, still waiting for
    /// delivery reports, will have waited [`SINK_STALL_WARNING`] with none coming.
    fn stall_warning_at(&self) -> Option<Instant> {
        let front = self.in_flight.front()?;
        (self.stalled_since.is_none() && front.pending.awaits_reports())
            .then(|| self.reported_at.max(front.handed) + SINK_STALL_WARNING)
    }

    /// Nothing in flight, nothing to resend and the checkpoint saved: it is at `next`
    /// (never after a file sink's failure: the checkpoint is behind `next` then).
    pub(super) fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
            && self.resend.is_empty()
            && self.saving.is_none()
            && !self.dirty
            && !self.failed
    }
}

/// What the sink side of a session works on.
pub(super) struct SinkCtx<'a> {
    pub(super) win: &'a mut Window,
    pub(super) src: &'a Source,
    pub(super) cp: &'a mut Checkpoint,
    pub(super) commit: &'a CommitCell,
}

/// What [`Drain::advance`] did.
pub(super) enum Step {
    /// Something (or nothing, after a signal): look again.
    Progress,
    /// Nothing in flight and nothing to take.
    Idle,
    /// Nothing in flight and nothing received for a while (see [`Drain::idle_tick`]).
    Quiet,
    /// The shutdown grace ran out with records unacknowledged, the Kafka producer
    /// failed for good (`Drain::producer_failed`), or a file sink's write or fsync failed
    /// (`Window::failed`): the session ends.
    GaveUp,
    /// The next item from the fetcher (`None`: the fetcher ended).
    Item(Option<Item>),
}

/// What one wait of [`Drain::advance`] ended with.
enum Event {
    /// The checkpoint save running ended.
    Saved(Result<(), StoreError>),
    /// The oldest batch in flight has its outcome.
    Settled,
    /// An item from the fetcher (`None`: the fetcher ended).
    Received(Option<Item>),
    /// The idle tick (see [`Drain::idle_tick`]).
    Tick,
    /// File sink: `--checkpoint-interval` has passed since the first batch written and not
    /// fsynced.
    SyncDue,
    /// Kafka: no delivery report for [`SINK_STALL_WARNING`].
    Stalled,
}

//! One session: spawns the fetcher on a connection whose resume check passed, runs the
//! main loop over its batches (checking each batch's `prev_crc`, handing records to the
//! in-flight window, turning lost ranges into gaps), and lets the fetcher commit the final
//! checkpoint. See `docs/drain.md`, steps 3 and 4.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use smol::channel::Receiver;
use spillway_core::wire::LostReason;

use super::fetcher::{CommitCell, FINAL_COMMIT_TIMEOUT, FetcherCtx, Item, fetcher};
use super::gaps::reason_name;
use super::window::{SinkCtx, Step, Window};
use super::{
    Backoff, Drain, DrainError, MAX_UNSYNCED_BATCHES, NoProgress, SessionEnd, Shutdown,
    refused_commit,
};
use crate::checkpoint::{Checkpoint, ResumeMismatch, check_prev_crc};
use crate::client::{Client, FetchReply, log_id_hex};
use crate::sink::{Sink, Source};

impl Drain {
    /// Runs the fetcher and the main loop until done, a changed log, or an error.
    pub(super) async fn session(
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
            clock: NoProgress::new(self.cfg.retry_budget()),
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
        // A Kafka producer failed for good ends the session (as if the shutdown grace had
        // run out): the run loop puts a new producer in its place and resumes. A file
        // sink's failed write or fsync ends it too: the run loop fetches again from the
        // checkpoint after a backoff.
        match end {
            Ok(SessionEnd::Done) if self.producer_failed.is_some() || self.refetch_at.is_some() => {
                Ok(SessionEnd::Again)
            }
            end => end,
        }
    }

    /// Takes batches from the fetcher and keeps up to `win.max` of them in flight at the
    /// sink (docs/drain.md, step 4 and "Pipelining").
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
                MAX_UNSYNCED_BATCHES
            },
            next: cp.offset,
            backoff: Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max),
            saving: None,
            dirty: false,
            dirty_batches: 0,
            unsynced_since: None,
            unsynced_bytes: 0,
            one_by_one: self.one_by_one_until.is_some_and(|u| cp.offset < u),
            failed: false,
            reported_at: Instant::now(),
            stalled_since: None,
            target,
        };
        if !win.one_by_one {
            self.one_by_one_until = None;
        }
        if std::mem::take(&mut self.close_covered) {
            // After a failed write or fsync, before anything is written: a full disk whose
            // checkpointed files keep their open names does not stay full.
            self.close_covered_files(src.log_id, cp.offset).await;
        }
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
                Step::Quiet => {
                    self.close_expired_files().await;
                    continue;
                }
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
                            let mut records = records;
                            records.retain(|r| r.offset >= next);
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
                                // The uplink cap: wait before the batch goes out (never
                                // after it was delivered). Stopped while waiting: the
                                // batch was not sent, the checkpoint stays before it.
                                if let Some(cap) = &self.cfg.uplink {
                                    let all: u64 =
                                        records.iter().map(|r| r.payload.len() as u64).sum();
                                    // Records the file sink holds already do not go out.
                                    let held = match self.sink.as_ref() {
                                        Some(Sink::File(f)) => f.held_bytes(src, &records),
                                        _ => 0,
                                    };
                                    let bytes = all.saturating_sub(held);
                                    if !cap.take(bytes, &self.stop).await {
                                        self.flush(s).await?;
                                        return Ok(SessionEnd::Done);
                                    }
                                }
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

    /// File sink with `--rotate-interval`, while the drain is idle: closes the files open
    /// for that long (see `sink::file`, "Layout"). A failure is logged and counted; the
    /// sink cuts back and reopens at its next write, as after a failed write.
    async fn close_expired_files(&mut self) {
        let Some(Sink::File(f)) = self.sink.as_mut() else {
            return;
        };
        let r = f.close_expired().await;
        self.files_closed(r, "files open for --rotate-interval", "");
    }

    /// File sink, right after a checkpoint at `offset` of log `log_id` was saved: closes the
    /// files that were full and set aside (see `sink::file`, "Layout"); every record in them
    /// is below the checkpoint now. A failure is logged and counted; the files stay open-named and are closed at a
    /// later checkpoint, and the sink cuts back and reopens at its next write, as after a
    /// failed write.
    pub(super) async fn close_full_files(&mut self, log_id: u128, offset: u64) {
        let Some(Sink::File(f)) = self.sink.as_mut() else {
            return;
        };
        let r = f.checkpointed(log_id, offset).await;
        self.files_closed(r, "full files", " (closed at a later checkpoint)");
    }

    /// File sink, at the start of the session after a failure (before it writes), with the
    /// saved checkpoint's log id and offset: closes the files every record of which it covers (see
    /// `FileSink::before_resend`), not only at the next checkpoint, which a full disk
    /// would hold off for good. A failure is logged and counted; the resend's write then
    /// reopens the sink.
    pub(super) async fn close_covered_files(&mut self, log_id: u128, offset: u64) {
        let Some(Sink::File(f)) = self.sink.as_mut() else {
            return;
        };
        let r = f.before_resend(log_id, offset).await;
        self.files_closed(r, "files the checkpoint covers", "");
    }

    /// Logs how many `what` the file sink closed (`r`), or counts and logs its failure,
    /// with `then` after the error.
    fn files_closed(&self, r: std::io::Result<u64>, what: &str, then: &str) {
        match r {
            Ok(0) => {}
            Ok(1) => log::debug!("file sink: closed 1 {}", what.replacen("files", "file", 1)),
            Ok(n) => log::debug!("file sink: closed {n} {what}"),
            Err(e) => {
                let e = crate::sink::SinkError::Io(e);
                self.metrics.sink_error(e.kind());
                log::warn!("{e} while closing {what}{then}");
            }
        }
    }
}

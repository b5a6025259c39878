//! The resume check: loads the checkpoint of (gateway id, consumer), or picks the start
//! of a new one, checks a stored one against the gateway (log id, CRC of the record before
//! the checkpoint, end of the log), handles `--accept-new-log`, and cuts the file sink back
//! to the checkpoint before anything is written. See `docs/drain.md`, step 2 and "Sink
//! files".

use std::time::Duration;

use spillway_core::wire::ErrorCode;

#[cfg(feature = "kafka")]
use super::WARM_UP_TIMEOUT;
use super::{Backoff, Drain, DrainError, Resumed, StartFrom};
use crate::checkpoint::{Checkpoint, Reset, ResumeMismatch, check_log_id, check_prev_crc, now_ms};
use crate::client::{Client, ClientError, FetchReply, log_id_hex};
use crate::sink::{Sink, SinkError, SinkSpec};

impl Drain {
    /// Loads the checkpoint, checks it against the gateway (docs/drain.md, step 2), then, once
    /// per run, moves it past records the sink already holds (effectively-once resume).
    ///
    /// The first time, a Kafka sink's producer also loads the topic's metadata meanwhile
    /// ([`KafkaSink::warm_up`](crate::sink::kafka::KafkaSink::warm_up)), waited for at most
    /// [`WARM_UP_TIMEOUT`] after the checks.
    pub(super) async fn resume(&mut self, conn: &mut Client) -> Result<Checkpoint, Resumed> {
        let gateway_id = conn.welcome().gateway_id.clone();
        if let Some(ids) = &self.ids
            && let Some(other) = ids.claim(&gateway_id, &self.cfg.gateway.to_string())
        {
            return Err(Resumed::Fatal(DrainError::DuplicateGatewayId {
                id: gateway_id,
                uri: self.cfg.gateway.to_string(),
                other,
            }));
        }
        self.open_gateway_sink(&gateway_id).await?;
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

    /// File sink: opens the sink at `DIR/<gateway id>/` (the id percent-encoded like a
    /// topic, see `sink::file`, "Layout") the first time, and again if the gateway came back
    /// under another id; one gateway or several.
    async fn open_gateway_sink(&mut self, gateway_id: &str) -> Result<(), Resumed> {
        let SinkSpec::File(root) = &self.cfg.sink else {
            return Ok(());
        };
        if self.sink_gateway.as_deref() == Some(gateway_id) {
            return Ok(());
        }
        if let Some(old) = self.sink.take() {
            old.close(Duration::from_secs(5)).await;
        }
        let dir = root.join(crate::sink::file::topic_stem(gateway_id));
        // A directory it may not create or read is a sink failure like any other: retried
        // with backoff (with `--once`, within the retry budget).
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        let sink = loop {
            match Sink::open(&SinkSpec::File(dir.clone()), &self.cfg.sink_options).await {
                Ok(sink) => break sink,
                Err(e) => {
                    let what = format!("opening the sink directory {}", dir.display());
                    if !self
                        .wait_to_retry_sink(&e, &mut backoff, &what)
                        .await
                        .map_err(Resumed::Fatal)?
                    {
                        return Err(Resumed::Stopped);
                    }
                }
            }
        };
        self.sink = Some(sink);
        self.sink_gateway = Some(gateway_id.to_string());
        self.sink_scanned = false;
        Ok(())
    }

    /// File sink: cuts the files back to what `cp` recorded as synced, before anything is
    /// written (docs/drain.md, "Sink files"); retried with backoff while the file system
    /// fails, until the shutdown signal or, with `--once`, the end of the retry budget
    /// ([`Drain::sink_retry`]).
    async fn restore_sink(&mut self, cp: &Checkpoint) -> Result<(), Resumed> {
        let Some(files) = cp.sink_files.as_ref() else {
            return Ok(());
        };
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        loop {
            let Some(Sink::File(f)) = self.sink.as_mut() else {
                return Ok(());
            };
            let covered = u128::from_str_radix(&cp.log_id, 16)
                .ok()
                .map(|log| (log, cp.offset));
            match f.restore(files, covered).await {
                Ok(Some(cut)) if cut.files > 0 => {
                    log::warn!(
                        "file sink: cut {} bytes off {} file{} written after the checkpoint at offset {} (sent again from there)",
                        cut.bytes,
                        cut.files,
                        if cut.files == 1 { "" } else { "s" },
                        cp.offset
                    );
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(e) => {
                    let what = "cutting the files back to the checkpoint";
                    if !self
                        .wait_to_retry_sink(&SinkError::Io(e), &mut backoff, what)
                        .await
                        .map_err(Resumed::Fatal)?
                    {
                        return Err(Resumed::Stopped);
                    }
                }
            }
        }
    }

    /// Loads the checkpoint and checks it against the gateway (docs/drain.md, step 2).
    async fn resume_check(&mut self, conn: &mut Client) -> Result<Checkpoint, Resumed> {
        let w = conn.welcome().clone();
        self.summary.log_id = w.log_id;
        self.summary.gateway_id = w.gateway_id.clone();
        let consumer = self.cfg.consumer.clone();
        let stored = self
            .store()
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
                Some(StartFrom::BeforeEnd(n)) => {
                    stats.next_offset.saturating_sub(n).max(stats.first_offset)
                }
                Some(StartFrom::Time(t)) => match conn.find_offset(t).await {
                    Ok(o) => {
                        log::info!(
                            "gateway {:?} log {}: --from {}: the first record stamped at or after it is at offset {o} (the log's next offset {} if none is)",
                            w.gateway_id,
                            log_id_hex(w.log_id),
                            StartFrom::Time(t),
                            stats.next_offset
                        );
                        o
                    }
                    Err(e @ ClientError::Unsupported { .. }) => {
                        return Err(Resumed::Fatal(DrainError::Config(format!(
                            "--from {}: {e}",
                            StartFrom::Time(t)
                        ))));
                    }
                    Err(e) => return Err(Resumed::Retry(e)),
                },
            };
            let cp = Checkpoint::new(w.log_id, start);
            self.store()
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
        // --from chooses the start only without a checkpoint: say so once, with both
        // offsets, so that a user who expected a replay sees why there is none.
        if let Some(from) = self.cfg.from.take() {
            let asked = match from {
                StartFrom::Offset(o) => Some(o),
                StartFrom::Earliest | StartFrom::Latest | StartFrom::BeforeEnd(_) => {
                    conn.stats().await.ok().map(|s| match from {
                        StartFrom::Earliest => s.first_offset,
                        StartFrom::BeforeEnd(n) => {
                            s.next_offset.saturating_sub(n).max(s.first_offset)
                        }
                        _ => s.next_offset,
                    })
                }
                // Not searched for: the search reads the log up to the answer, for nothing.
                StartFrom::Time(_) => None,
            };
            log::warn!(
                "--from {from} (offset {}) is not used: the state file {} has a checkpoint for gateway {:?} consumer {consumer:?} at offset {}, and the drain resumes there (--from applies only without a checkpoint; give another --state or --consumer to start elsewhere)",
                asked.map_or_else(
                    || match from {
                        StartFrom::Time(_) => "not looked up".to_string(),
                        _ => "unknown".to_string(),
                    },
                    |o| o.to_string()
                ),
                self.cfg.state.display(),
                w.gateway_id,
                cp.offset
            );
        }
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
                self.store()
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
}

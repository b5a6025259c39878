//! Gap bookkeeping: a range the gateway says is gone (dropped or corrupt) is written into
//! the sink (a gap line, a gap record), logged, counted and recorded in the state file's
//! `gaps` table, and the checkpoint moves past it;
//! a range the gateway never persisted is skipped without counting as lost. See
//! `docs/drain.md`, "Gaps".

use spillway_core::wire::LostReason;

use super::{Backoff, Drain, DrainError};
use crate::checkpoint::{Checkpoint, Gap, now_ms};
use crate::sink::{GapNotice, Sink, Source};

impl Drain {
    /// Records a gap `from..to` and moves the checkpoint past it.
    pub(super) async fn gap(
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
        // The gap goes into the data first (a gap line, a gap record); the checkpoint past
        // it only once that is durable. Stopped meanwhile: the next run meets it again.
        if !self
            .write_gap(src, &GapNotice::new(from, to, reason))
            .await?
        {
            return Ok(());
        }
        self.sink_progressed();
        if let Some(Sink::File(f)) = self.sink.as_ref() {
            cp.sink_files = f.synced_files();
        }
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
        self.store()
            .save_with_gap_async(&self.cfg.consumer, src.log_id, &gap, cp)
            .await?;
        self.close_full_files(src.log_id, cp.offset).await;
        self.metrics.gaps.inc();
        self.metrics.lost.inc_by(n);
        self.metrics.set_committed(cp.offset);
        self.summary.gaps += 1;
        self.summary.offset = cp.offset;
        Ok(())
    }

    /// Hands `gap` to the sink until it is durable, retrying with backoff; false if the
    /// shutdown signal came first.
    ///
    /// # Errors
    /// With `--once`, [`DrainError::SinkUnreachable`] once the sink has failed for the
    /// retry budget ([`Drain::sink_retry`]).
    async fn write_gap(&mut self, src: &Source, gap: &GapNotice) -> Result<bool, DrainError> {
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        loop {
            let res = match self.sink.as_mut() {
                Some(sink) => sink.deliver_gap(src, gap).await,
                None => return Ok(true),
            };
            let Err(e) = res else {
                return Ok(true);
            };
            let what = format!("writing the gap {}..{}", gap.from, gap.to);
            if !self.wait_to_retry_sink(&e, &mut backoff, &what).await? {
                return Ok(false);
            }
        }
    }

    /// Moves the checkpoint past `from..to`, a range the gateway never persisted
    /// (`NotPersisted`: offsets handed out from RAM and not durable at a crash, mostly the
    /// rest of its offset lease). No durably acknowledged record had those offsets, so this
    /// is not a gap: logged at `info`, counted in `spillway_bridge_skipped_offsets_total`,
    /// and neither counted as lost nor recorded in redb's `gaps` table.
    pub(super) async fn skip(
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
        self.store()
            .save_async(&src.gateway_id, &self.cfg.consumer, cp)
            .await?;
        self.metrics.skipped_offsets.inc_by(n);
        self.metrics.set_committed(cp.offset);
        self.summary.skipped_offsets += n;
        self.summary.offset = cp.offset;
        Ok(())
    }
}

pub(super) fn reason_name(r: LostReason) -> &'static str {
    match r {
        LostReason::DroppedOldest => "dropped-oldest",
        LostReason::Corrupt => "corrupt",
        LostReason::NotPersisted => "not-persisted",
    }
}

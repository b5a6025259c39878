//! The Kafka-tail resume (effectively-once): once per run, after the resume check, reads
//! the tails of the target topic's partitions for records of this log at or after the
//! checkpoint, checks them against the gateway's records, and moves the checkpoint past
//! the ones already delivered. See `docs/drain.md`, "Effectively-once resume (Kafka)".

use std::time::{Duration, Instant};

use super::{
    Backoff, Drain, DrainError, MAX_RESUME_WINDOW, Resumed, refused_commit, sleep_or_stop,
};
use crate::checkpoint::{Checkpoint, SinkResume, now_ms};
use crate::client::{Client, FetchReply};
use crate::sink::Sink;

impl Drain {
    /// The effectively-once resume (docs/drain.md): scans the Kafka topic's partition tails
    /// for records of this log at or after `cp.offset`, checks them against the gateway's,
    /// and returns the checkpoint moved past them (saved and committed), or `cp`.
    #[cfg(feature = "kafka")]
    pub(super) async fn resume_from_sink(
        &mut self,
        conn: &mut Client,
        cp: Checkpoint,
    ) -> Result<Checkpoint, Resumed> {
        let window = self.cfg.kafka_resume_window;
        let Some(Sink::Kafka(kafka)) = self.sink.as_ref() else {
            return Ok(cp);
        };
        // A handle on the same producer, so that the drain's state can change meanwhile.
        let kafka = kafka.clone();
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
                .scan_gateway_tail(
                    &w.gateway_id,
                    w.log_id,
                    c,
                    window,
                    self.cfg.kafka_resume_timeout,
                )
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
                    if self.cfg.retry_budget().is_some_and(|b| t0.elapsed() >= b) {
                        return Err(Resumed::Fatal(DrainError::SinkUnreachable {
                            sink: format!("kafka topic {:?}", kafka.topic()),
                            waited: t0.elapsed(),
                            last_error: e.to_string(),
                        }));
                    }
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
        self.store()
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
}

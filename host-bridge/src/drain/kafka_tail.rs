//! The Kafka-tail resume (effectively-once): once per run, after the resume check, reads
//! the tails of the target topic's partitions for records of this log at or after the
//! checkpoint, checks them against the gateway's records, and moves the checkpoint past
//! the ones already delivered. With a Kafka topic per Spillway topic (`{topic}` in the
//! sink URI), the topics read are those of the gateway's records from the checkpoint on,
//! as many as the window (a record delivered and not checkpointed is one of them). See
//! `docs/drain.md`, "Effectively-once resume (Kafka)".

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{
    Backoff, Drain, DrainError, MAX_RESUME_WINDOW, Resumed, refused_commit, sleep_or_stop,
};
use crate::checkpoint::{Checkpoint, SinkResume, now_ms};
use crate::client::{Client, ClientError, FetchReply};
use crate::sink::Sink;
use crate::sink::kafka::TailScan;
use crate::sink::kafka_topic::KafkaTopic;

/// The Kafka topics the gateway's records `from..` go to, looking at `window` records at
/// most (fewer at the end of the log): the sink's one topic, or with `{topic}` in it, the
/// Kafka topic of each Spillway topic among them. Records gone from the gateway are
/// passed over (nothing from them can be compared).
async fn kafka_topics_after(
    conn: &mut Client,
    target: &KafkaTopic,
    from: u64,
    window: u64,
    max_bytes: u32,
) -> Result<BTreeSet<String>, ClientError> {
    let mut topics = BTreeSet::new();
    if let KafkaTopic::Fixed(t) = target {
        topics.insert(t.clone());
        return Ok(topics);
    }
    let (mut at, mut seen) = (from, 0u64);
    while seen < window {
        let FetchReply::Records {
            records,
            next_offset,
            ..
        } = conn.fetch(None, at, max_bytes, Duration::ZERO).await?
        else {
            break;
        };
        if records.is_empty() || next_offset <= at {
            break;
        }
        for r in &records {
            let k = target.for_topic(&r.topic);
            if !topics.contains(k.as_ref()) {
                topics.insert(k.into_owned());
            }
        }
        seen += records.len() as u64;
        at = next_offset;
    }
    Ok(topics)
}

/// One scan's findings added to `all` (the scans of several Kafka topics as one).
fn merge(all: &mut TailScan, s: TailScan) {
    for (o, r) in s.found {
        all.found.entry(o).or_insert(r);
    }
    all.highest = all.highest.max(s.highest);
    all.lowest = match (all.lowest, s.lowest) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    all.whole_topic &= s.whole_topic;
    all.partitions += s.partitions;
    all.partitions_read += s.partitions_read;
    all.messages_read += s.messages_read;
}

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
        let target = kafka.topic().clone();
        let mut window = window;
        let mut backoff = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max);
        let t0 = Instant::now();
        let (scan, topics) = 'scan: loop {
            let topics = kafka_topics_after(conn, &target, c, window, self.cfg.max_batch_bytes)
                .await
                .map_err(Resumed::Retry)?;
            let mut all = TailScan {
                whole_topic: true,
                ..TailScan::default()
            };
            // A Kafka topic whose scan found records of the log, all after the checkpoint,
            // without reaching the partition's start: a wider window may find more.
            let mut short = false;
            for topic in &topics {
                match kafka
                    .scan_gateway_tail(
                        topic,
                        &w.gateway_id,
                        w.log_id,
                        c,
                        window,
                        self.cfg.kafka_resume_timeout,
                    )
                    .await
                {
                    Ok(s) => {
                        short |= !s.found.is_empty()
                            && s.lowest.is_some_and(|l| l >= c)
                            && !s.whole_topic;
                        merge(&mut all, s);
                    }
                    Err(e) => {
                        self.metrics.sink_error(e.kind());
                        if self.cfg.retry_budget().is_some_and(|b| t0.elapsed() >= b) {
                            return Err(Resumed::Fatal(DrainError::SinkUnreachable {
                                sink: format!("kafka topic {topic:?}"),
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
                        continue 'scan;
                    }
                }
            }
            if short && !all.found.contains_key(&c) && window < MAX_RESUME_WINDOW {
                window = (window * 8).min(MAX_RESUME_WINDOW);
                log::info!(
                    "partition tails hold records of log {} after offset {c} but not {c}: widening the scan to {window} messages",
                    cp.log_id
                );
                continue;
            }
            break (all, topics);
        };
        // A gap record goes to the Kafka topics of the gateway's records.
        if let Some(Sink::Kafka(k)) = self.sink.as_mut() {
            k.note_topics(topics.iter().map(String::as_str));
        }
        let scanned = match &target {
            KafkaTopic::Fixed(t) => format!("kafka topic {t:?}"),
            KafkaTopic::Template { .. } => format!("kafka topics {topics:?} (of {target})"),
        };
        let end = scan.contiguous_end(c);
        let after_hole = scan.found.range(end..).count();
        log::info!(
            "{scanned}: read {} messages from the tails of {} of its {} partitions in {:.1?}; records of log {} from offset {c}: {}{}",
            scan.messages_read,
            scan.partitions_read,
            scan.partitions,
            t0.elapsed(),
            cp.log_id,
            if end > c {
                format!("{c}..{end}")
            } else {
                "none".to_string()
            },
            if after_hole > 0 {
                format!(", and {after_hole} after a hole at {end}")
            } else {
                String::new()
            }
        );
        let Some(&last_found) = scan.found.keys().next_back() else {
            return Ok(cp);
        };
        // Log matching: every record the tails hold from c on must be the gateway's record
        // at its offset. Those up to the first hole move the checkpoint; those after it
        // (a gateway's records in several partitions are delivered independently) are
        // not sent again.
        let mut at = c;
        let mut end = c;
        let mut in_run = true;
        let mut skip = Vec::new();
        let mut last_crc = cp.last_crc;
        let mut bytes = 0u64;
        'verify: while at <= last_found {
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
                if r.offset != at || at > last_found {
                    break 'verify;
                }
                let Some(k) = scan.found.get(&at) else {
                    in_run = false;
                    at += 1;
                    continue;
                };
                if k.topic != r.topic || k.timestamp_us != r.timestamp_us || k.payload != r.payload
                {
                    log::warn!(
                        "{scanned}: partition {} offset {} claims log {} offset {at} but differs from the gateway's record (topic {:?}/{:?}, timestamp {}/{}, {}/{} payload bytes): ignoring the partition tails, resuming at the checkpoint {c}",
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
                if in_run {
                    last_crc = Some(r.record_crc);
                    bytes += r.payload.len() as u64;
                    end = at + 1;
                } else {
                    skip.push(at);
                }
                at += 1;
            }
        }
        if !skip.is_empty() {
            log::info!(
                "{scanned} also holds {} records of log {} after a hole at {end} (up to offset {}), checked against the gateway: they are not sent again",
                skip.len(),
                cp.log_id,
                skip[skip.len() - 1]
            );
            self.metrics.sink_resumed.inc_by(skip.len() as u64);
            if let Some(Sink::Kafka(k)) = self.sink.as_mut() {
                k.skip_delivered(skip);
            }
        }
        let at = end;
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
            sink: format!("{scanned} ({} partitions)", scan.partitions),
            at_unix_ms: new.updated_unix_ms,
        };
        self.store()
            .save_with_sink_resume_async(&r, &new)
            .await
            .map_err(|e| Resumed::Fatal(e.into()))?;
        log::info!(
            "{scanned} already holds offsets {c}..{at} of log {} (delivered and not checkpointed, before a restart or by a producer since replaced): checked against the gateway, resuming at {at}",
            cp.log_id
        );
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

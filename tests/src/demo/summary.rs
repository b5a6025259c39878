//! The summary table of a demo run: one [`TopicRow`] per topic and the [`Summary`]
//! whose `Display` is the table printed at the end.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// `12345` as `12,345` (the demo counts records).
pub(super) use crate::figures::thousands_u64 as thousands;

/// One row of the summary table: one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicRow {
    /// Topic.
    pub topic: String,
    /// How the records travelled (`serial lines`, `TCP durable` or `MQTT QoS 1`).
    pub path: &'static str,
    /// Rows of the input file replayed (after the row limit).
    pub input_rows: u64,
    /// Rows without a value, not sent.
    pub skipped_empty: u64,
    /// Records sent (lines written, or distinct publishes; resends not counted).
    pub sent: u64,
    /// Publishes resent after a reconnect (same producer id and sequence).
    pub resent: u64,
    /// Records acknowledged by the gateway (`None`: line mode has no acknowledgements).
    pub acked: Option<u64>,
    /// Acknowledgements with `duplicate: true` (a resend of a stored record).
    pub duplicate_acks: u64,
    /// Records of this topic in the gateway's log at the end.
    pub stored: u64,
    /// Distinct records of this topic in the sink.
    pub delivered: u64,
    /// Sink lines beyond the first for the same (log id, offset).
    pub duplicate_lines: u64,
    /// Acknowledged (TCP) or stored (serial) records missing from the sink, or there with
    /// other bytes.
    pub lost: u64,
}

/// What the run showed.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Seed of the kill-time jitter.
    pub seed: u64,
    /// The working directory (sink files, logs).
    pub work_dir: PathBuf,
    /// Per topic, in the order sst, isig, glucose, sst over MQTT.
    pub topics: Vec<TopicRow>,
    /// Time from the first record sent to the end of the final drain.
    pub total: Duration,
    /// Time the replay took (first to last record sent and acknowledged).
    pub replay: Duration,
    /// How long the gateway was down (SIGKILL to listening again).
    pub gateway_downtime: Duration,
    /// How long the uplink was down (start to the first bridge start).
    pub uplink_downtime: Duration,
    /// Records the file sink skipped because it already had them (after the bridge kill).
    pub sink_skipped_duplicates: u64,
    /// Records the final `drain --once` forwarded.
    pub final_drain_records: u64,
    /// Explanations of the differences between the columns.
    pub notes: Vec<String>,
    /// Checks that failed; empty when the demo passed.
    pub failures: Vec<String>,
}

impl Summary {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The row of `topic`.
    pub fn topic(&self, topic: &str) -> Option<&TopicRow> {
        self.topics.iter().find(|t| t.topic == topic)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = [
            "topic",
            "path",
            "input rows",
            "no value",
            "sent",
            "resent",
            "acked",
            "dup acks",
            "stored",
            "delivered",
            "dup lines",
            "lost",
        ];
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut total = TopicRow {
            topic: "total".into(),
            acked: Some(0),
            ..TopicRow::default()
        };
        for t in &self.topics {
            total.input_rows += t.input_rows;
            total.skipped_empty += t.skipped_empty;
            total.sent += t.sent;
            total.resent += t.resent;
            total.acked = Some(total.acked.unwrap_or(0) + t.acked.unwrap_or(0));
            total.duplicate_acks += t.duplicate_acks;
            total.stored += t.stored;
            total.delivered += t.delivered;
            total.duplicate_lines += t.duplicate_lines;
            total.lost += t.lost;
        }
        for t in self.topics.iter().chain(std::iter::once(&total)) {
            rows.push(vec![
                t.topic.clone(),
                t.path.to_string(),
                thousands(t.input_rows),
                thousands(t.skipped_empty),
                thousands(t.sent),
                thousands(t.resent),
                t.acked.map_or("-".into(), thousands),
                thousands(t.duplicate_acks),
                thousands(t.stored),
                thousands(t.delivered),
                thousands(t.duplicate_lines),
                thousands(t.lost),
            ]);
        }
        let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
                if i < 2 {
                    s.push_str(&format!("{c:<w$}  "));
                } else {
                    s.push_str(&format!("{c:>w$}  "));
                }
            }
            writeln!(f, "{}", s.trim_end())
        };
        let head: Vec<String> = head.iter().map(|s| s.to_string()).collect();
        line(f, &head)?;
        let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
        line(f, &rule)?;
        let n = rows.len();
        for (i, r) in rows.iter().enumerate() {
            if i + 1 == n {
                line(f, &rule)?;
            }
            line(f, r)?;
        }
        writeln!(f)?;
        let secs = self.total.as_secs_f64();
        writeln!(
            f,
            "time {:.1} s (replay {:.1} s, gateway down {:.1} s, uplink down for the first {:.1} s); \
             {} records delivered, {} records/s",
            secs,
            self.replay.as_secs_f64(),
            self.gateway_downtime.as_secs_f64(),
            self.uplink_downtime.as_secs_f64(),
            thousands(total.delivered),
            thousands((total.delivered as f64 / secs.max(1e-9)).round() as u64)
        )?;
        writeln!(
            f,
            "bridge: SIGKILLed once while draining; after its restart the file sink skipped {} \
             resent records it already had; the final drain --once forwarded {}{}",
            thousands(self.sink_skipped_duplicates),
            thousands(self.final_drain_records),
            if self.final_drain_records == 0 {
                " (the bridge had caught up before its SIGTERM)"
            } else {
                ""
            }
        )?;
        if !self.notes.is_empty() {
            writeln!(f)?;
            for n in &self.notes {
                writeln!(f, "- {n}")?;
            }
        }
        writeln!(f)?;
        writeln!(f, "files: {} (seed {})", self.work_dir.display(), self.seed)?;
        if self.failures.is_empty() {
            writeln!(
                f,
                "PASS: every acknowledged record delivered exactly once, in order, with its bytes; \
                 lost 0"
            )
        } else {
            writeln!(f, "FAIL:")?;
            for x in &self.failures {
                writeln!(f, "  - {x}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{TOPIC_ISIG, TOPIC_SST};

    #[test]
    fn summary_table_lines_up() {
        let s = Summary {
            topics: vec![
                TopicRow {
                    topic: TOPIC_SST.into(),
                    path: "serial lines",
                    input_rows: 19_226,
                    sent: 19_226,
                    stored: 19_200,
                    delivered: 19_200,
                    ..TopicRow::default()
                },
                TopicRow {
                    topic: TOPIC_ISIG.into(),
                    path: "TCP durable",
                    input_rows: 52_281,
                    skipped_empty: 1_061,
                    sent: 51_220,
                    acked: Some(51_220),
                    stored: 51_220,
                    delivered: 51_220,
                    ..TopicRow::default()
                },
            ],
            total: Duration::from_secs(50),
            ..Summary::default()
        };
        let text = s.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("topic"), "{text}");
        assert!(
            lines[2].contains("19,226") && lines[2].contains(" - "),
            "{text}"
        );
        assert!(
            lines[5].starts_with("total") && lines[5].contains("70,420"),
            "{text}"
        );
        assert!(text.contains("PASS"), "{text}");
    }
}

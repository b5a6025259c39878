//! The log lines about skipped duplicates (see the module doc of `sink::file`, "Exactly
//! once"): after a restart every batch the drain resends may skip some, hundreds of
//! batches in a row, so a run of such batches gets a few lines, not one per batch.

use std::time::{Duration, Instant};

/// Shortest time between two lines about one run of batches that skip duplicates: the
/// first batch's line is logged at once, then at most one line per this interval, and one
/// when a batch skips none.
pub const SKIPPED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The duplicates skipped by the current run of batches, for [`SkippedLog::batch`].
/// Every line that begins `file sink: skipped N` counts only the duplicates no earlier
/// line counted, so the numbers of those lines add up to the sink's total.
#[derive(Debug, Default)]
pub(super) struct SkippedLog {
    /// When the last line was logged; `None` outside a run (the last batch skipped none).
    logged: Option<Instant>,
    /// Duplicates skipped since that line (not logged yet).
    since: u64,
    /// Offsets of the first and last record of the batches counted in `since`.
    since_range: (u64, u64),
    /// Duplicates skipped in the whole run.
    run: u64,
    /// The first record's offset of the run's first batch.
    run_from: u64,
    /// The last record's offset of the run's last batch.
    run_to: u64,
    /// Batches in the run.
    batches: u64,
}

impl SkippedLog {
    /// Counts a written batch of records `first..=last` (offsets) that skipped `n`
    /// duplicates (`total`: skipped so far by the sink, these included) at `now`, and
    /// returns the line to log at `info`, if one is due: the run's first batch, at most
    /// one per [`SKIPPED_LOG_EVERY`] after it, and the end of the run (a batch that skips
    /// none, after batches that skipped some).
    pub(super) fn batch(
        &mut self,
        (first, last): (u64, u64),
        n: u64,
        total: u64,
        now: Instant,
    ) -> Option<String> {
        let Some(logged) = self.logged else {
            if n == 0 {
                return None;
            }
            *self = SkippedLog {
                logged: Some(now),
                run: n,
                run_from: first,
                run_to: last,
                batches: 1,
                ..SkippedLog::default()
            };
            return Some(format!(
                "file sink: skipped {n} duplicates in the batch from offset {first} (already \
                 written before a restart; {total} skipped so far; the batches after it are \
                 summed up, at most one line every {} s)",
                SKIPPED_LOG_EVERY.as_secs()
            ));
        };
        if n == 0 {
            // The run ended.
            let line = if self.since > 0 {
                Some(format!(
                    "{}; the batch from offset {first} skipped none: {} skipped from offset \
                     {} to {} ({total} so far)",
                    self.since_line(),
                    self.run,
                    self.run_from,
                    self.run_to
                ))
            } else if self.batches > 1 {
                Some(format!(
                    "file sink: the batch from offset {first} skipped no duplicates: {} \
                     skipped in all from offset {} to {} (already written before a \
                     restart; {total} skipped so far)",
                    self.run, self.run_from, self.run_to
                ))
            } else {
                None
            };
            *self = SkippedLog::default();
            return line;
        }
        if self.since == 0 {
            self.since_range.0 = first;
        }
        self.since += n;
        self.since_range.1 = last;
        self.run += n;
        self.run_to = last;
        self.batches += 1;
        if now.duration_since(logged) < SKIPPED_LOG_EVERY {
            return None;
        }
        self.logged = Some(now);
        Some(format!(
            "{} (already written before a restart; {total} skipped so far)",
            self.take_since()
        ))
    }

    /// The line for what was skipped since the last line, if anything, when the sink is
    /// dropped (`total`: skipped so far by the sink).
    pub(super) fn end(&mut self, total: u64) -> Option<String> {
        (self.since > 0).then(|| {
            format!(
                "{} (already written before a restart; {total} skipped so far)",
                self.take_since()
            )
        })
    }

    /// `file sink: skipped N more duplicates in the batches from offset A to B` for what
    /// was skipped since the last line, which no longer counts then.
    fn take_since(&mut self) -> String {
        let line = self.since_line();
        self.since = 0;
        line
    }

    /// `file sink: skipped N more duplicates in the batches from offset A to B`.
    fn since_line(&self) -> String {
        format!(
            "file sink: skipped {} more duplicates in the batches from offset {} to {}",
            self.since, self.since_range.0, self.since_range.1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers after `file sink: skipped ` in `lines` (as the demo adds them up).
    fn counted(lines: &[String]) -> u64 {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("file sink: skipped "))
            .map(|r| {
                r.split(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap()
            })
            .sum()
    }

    /// A run of 330 batches that skip 1,000 duplicates each, 50 ms apart, then one that
    /// skips none: the first line, one line per 10 s and one at the end, whose counts add
    /// up to the total; a batch that skips none outside a run logs nothing.
    #[test]
    fn a_run_of_skipping_batches_gets_a_few_lines() {
        let mut s = SkippedLog::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        let mut total = 0;
        for i in 0..330u64 {
            total += 1000;
            let at = t0 + Duration::from_millis(50 * i);
            lines.extend(s.batch((i * 1500, i * 1500 + 1499), 1000, total, at));
        }
        let end = t0 + Duration::from_millis(50 * 330);
        lines.extend(s.batch((495_000, 496_499), 0, total, end));
        assert!(s.batch((496_500, 497_999), 0, total, end).is_none());
        // At 0 s, 10 s and the end (16.5 s).
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert_eq!(
            lines[0],
            "file sink: skipped 1000 duplicates in the batch from offset 0 (already written \
             before a restart; 1000 skipped so far; the batches after it are summed up, at \
             most one line every 10 s)"
        );
        assert_eq!(
            lines[1],
            "file sink: skipped 200000 more duplicates in the batches from offset 1500 to \
             301499 (already written before a restart; 201000 skipped so far)"
        );
        assert_eq!(
            lines[2],
            "file sink: skipped 129000 more duplicates in the batches from offset 301500 to \
             494999; the batch from offset 495000 skipped none: 330000 skipped from offset \
             0 to 494999 (330000 so far)"
        );
        assert_eq!(counted(&lines), total);
        assert!(s.end(total).is_none());
    }

    /// A run cut short by the end of the drain has its last count logged by `end`; a run
    /// whose last line came just before its end gets a line without a count; a run of one
    /// batch gets its first line only.
    #[test]
    fn the_end_of_a_run_is_logged() {
        let t0 = Instant::now();
        let mut s = SkippedLog::default();
        assert!(s.batch((0, 9), 10, 10, t0).is_some());
        assert!(s.batch((10, 19), 10, 20, t0).is_none());
        let end = s.end(20).unwrap();
        assert_eq!(
            end,
            "file sink: skipped 10 more duplicates in the batches from offset 10 to 19 \
             (already written before a restart; 20 skipped so far)"
        );

        let mut s = SkippedLog::default();
        assert!(s.batch((0, 9), 10, 10, t0).is_some());
        assert!(s.batch((10, 19), 10, 20, t0 + SKIPPED_LOG_EVERY).is_some());
        let line = s.batch((20, 29), 0, 20, t0 + SKIPPED_LOG_EVERY).unwrap();
        assert_eq!(
            line,
            "file sink: the batch from offset 20 skipped no duplicates: 20 skipped in all \
             from offset 0 to 19 (already written before a restart; 20 skipped so far)"
        );
        assert!(s.end(20).is_none());

        let mut s = SkippedLog::default();
        assert!(s.batch((0, 9), 10, 10, t0).is_some());
        assert!(s.batch((10, 19), 0, 10, t0).is_none());
        // A later run starts with a first line again.
        assert!(
            s.batch((20, 29), 5, 15, t0)
                .unwrap()
                .contains("in the batch from offset 20")
        );
    }
}

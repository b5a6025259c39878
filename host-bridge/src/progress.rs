//! Backlog progress: a progress bar (indicatif) on a terminal, otherwise a log line every
//! [`LOG_EVERY`].

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Interval of the progress log line when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The rate the ETA is computed at is the rate of the last `RATE_WINDOW` the drain was
/// behind: a run's mean rate would still count a slow start, an outage or hours caught up
/// long after they ended.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Marks of the rate window are at least this far apart (the window holds about 17 of
/// them, however often the checkpoint moves).
const RATE_STEP: Duration = Duration::from_millis(625);

/// How to show progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A bar if stderr is a terminal, else log lines.
    Auto,
    /// Log lines only.
    Log,
    /// Nothing.
    Off,
}

/// Shows how far a drain is behind.
pub struct Progress {
    bar: Option<ProgressBar>,
    log: bool,
    started: Instant,
    last_log: Instant,
    start_records: u64,
    records: u64,
    bytes: u64,
    /// The uplink cap, payload bytes per second (`--max-bytes-per-sec`).
    cap: Option<u64>,
    /// Records this run found in the sink already and skipped ([`Progress::skipped`]).
    skipped: u64,
    /// The rate window: records forwarded or skipped by this run at some updates of the last
    /// [`RATE_WINDOW`] while behind (oldest first, one of them at or before the window's
    /// start), [`RATE_STEP`] apart at least; emptied when the drain catches up.
    marks: VecDeque<(Instant, u64)>,
    /// The newest update while behind (time, records forwarded or skipped).
    latest: Option<(Instant, u64)>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl Progress {
    /// A reporter in `mode`.
    pub fn new(mode: Mode) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = (mode == Mode::Auto && tty).then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} records behind: \
                     {msg} ({per_sec})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        let now = Instant::now();
        Progress {
            log: mode != Mode::Off && bar.is_none(),
            bar,
            started: now,
            last_log: now,
            start_records: 0,
            skipped: 0,
            records: 0,
            bytes: 0,
            cap: None,
            // The run starts behind (if it is): its first updates have a rate from its
            // start.
            marks: VecDeque::from([(now, 0)]),
            latest: None,
        }
    }

    /// Takes an update at `now`: `records` forwarded or skipped by this run, `behind`
    /// records left.
    /// Caught up (`behind` 0), the window is emptied: the time until records come again
    /// is not the drain's.
    fn observe(&mut self, now: Instant, records: u64, behind: u64) {
        if behind == 0 {
            self.marks.clear();
            self.latest = None;
            return;
        }
        if self
            .marks
            .back()
            .is_none_or(|&(t, _)| now.saturating_duration_since(t) >= RATE_STEP)
        {
            self.marks.push_back((now, records));
        }
        self.latest = Some((now, records));
        while self.marks.len() > 2 && now.saturating_duration_since(self.marks[1].0) >= RATE_WINDOW
        {
            self.marks.pop_front();
        }
    }

    /// Records/s over the rate window; `None` until two updates while behind span some
    /// time and records.
    fn rate(&self) -> Option<f64> {
        let (&(t0, r0), (t1, r1)) = (self.marks.front()?, self.latest?);
        let secs = t1.saturating_duration_since(t0).as_secs_f64();
        let rate = r1.saturating_sub(r0) as f64 / secs;
        (secs > 0.0 && rate > 0.0).then_some(rate)
    }

    /// The same reporter, its ETA computed under an uplink cap of `bytes_per_sec`.
    pub fn with_cap(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.cap = bytes_per_sec;
        self
    }

    /// Seconds to forward `behind` records: at the rate of the window ([`RATE_WINDOW`],
    /// records/s), and never faster than the cap allows at this run's mean payload size for
    /// this run's share of records forwarded (not skipped as held already); 0
    /// when caught up; `None` with no rate yet and no mean payload size for the cap (nothing
    /// forwarded yet, or no cap).
    fn eta_secs(&self, behind: u64) -> Option<f64> {
        if behind == 0 {
            return Some(0.0);
        }
        let by_rate = self.rate().map(|rate| behind as f64 / rate);
        // The cap's bound needs the mean payload size: none before a record is forwarded
        // (a drain skipping what the files hold has a rate already). Records skipped as
        // held already do not count against the cap: the bound is for the share of the
        // backlog expected to go out, this run's share of records forwarded.
        let by_cap = self
            .cap
            .zip(self.bytes.checked_div(self.records))
            .map(|(c, avg)| {
                let out = self.records as f64 / self.records.saturating_add(self.skipped) as f64;
                behind.saturating_mul(avg) as f64 * out / c.max(1) as f64
            });
        match (by_rate, by_cap) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts `n` more records the sink held already (skipped, not forwarded): the backlog
    /// moves past them too, so the rate the ETA is computed at counts them (a drain that
    /// skips what a restored state file left behind would read a long ETA for a backlog
    /// it clears in a moment).
    pub fn skipped(&mut self, n: u64) {
        self.skipped += n;
    }

    /// Reports the state: `committed` (checkpoint offset), `next` (the gateway's next
    /// offset), totals forwarded by this run. Returns the backlog's ETA in seconds
    /// (`None`: unknown yet), under the uplink cap if there is one.
    pub fn update(&mut self, committed: u64, next: u64, records: u64, bytes: u64) -> Option<f64> {
        self.records = records;
        self.bytes = bytes;
        let behind = next.saturating_sub(committed);
        self.observe(Instant::now(), records + self.skipped, behind);
        let avg = bytes.checked_div(records).unwrap_or(0);
        let eta_secs = self.eta_secs(behind);
        // Rounded up: "0 s" only when caught up.
        let eta = eta_secs.map_or("unknown".to_string(), |s| format!("{} s", s.ceil()));
        let capped = if self.cap.is_some() {
            " under the cap"
        } else {
            ""
        };
        if let Some(b) = &self.bar {
            b.set_length(records + behind);
            b.set_position(records);
            b.set_message(format!(
                "{behind} records / ~{} bytes, ETA {eta}{capped}",
                behind.saturating_mul(avg)
            ));
        } else if self.log && self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(0.001);
            let mean = (records - self.start_records.min(records)) as f64 / secs;
            let rate = self.rate().unwrap_or(mean);
            log::info!(
                "forwarded {records} records ({bytes} bytes); offset {committed}, {behind} \
                 records (~{} bytes) behind; {rate:.0} records/s; ETA {eta}{capped}",
                behind.saturating_mul(avg)
            );
        }
        eta_secs
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_leaves_out_the_time_caught_up() {
        let mut p = Progress::new(Mode::Off);
        let t = p.started;
        let s = Duration::from_secs;
        // 1,000 records/s for 5 s, then caught up for an hour.
        p.observe(t + s(1), 1_000, 4_000);
        p.observe(t + s(5), 5_000, 1);
        p.observe(t + s(6), 5_001, 0);
        assert_eq!(p.rate(), None, "caught up: no rate");
        // Records come again: 2,000 records/s from then on.
        p.observe(t + s(3_600), 5_001, 10_000);
        p.observe(t + s(3_601), 7_001, 8_000);
        p.observe(t + s(3_602), 9_001, 6_000);
        let r = p.rate().unwrap_or(0.0);
        assert!((r - 2_000.0).abs() < 1.0, "{r}");
        // Over the window alone: 2,000 records/s until 3,615 s, then 1,000 records/s; by
        // 3,630 s the faster spell has left the window.
        let mut records = 9_001;
        for sec in 3_603..=3_630 {
            records += if sec <= 3_615 { 2_000 } else { 1_000 };
            p.observe(t + s(sec), records, 100_000);
        }
        let r = p.rate().unwrap_or(0.0);
        assert!((r - 1_000.0).abs() < 1.0, "{r}");
        assert!(p.marks.len() <= 2 + (RATE_WINDOW.as_millis() / RATE_STEP.as_millis()) as usize);
    }

    #[test]
    fn a_short_run_has_a_rate_from_its_first_updates() {
        let mut p = Progress::new(Mode::Off);
        let t = p.started;
        p.observe(t + Duration::from_millis(500), 1_000, 9_000);
        let r = p.rate().unwrap_or(0.0);
        assert!((r - 2_000.0).abs() < 1.0, "{r}");
        p.records = 1_000;
        p.bytes = 100_000;
        let eta = p.eta_secs(9_000).unwrap_or(0.0);
        assert!((eta - 4.5).abs() < 0.01, "{eta}");
        assert_eq!(p.eta_secs(0), Some(0.0));
    }

    #[test]
    fn the_cap_bounds_the_eta() {
        let mut p = Progress::new(Mode::Off).with_cap(Some(1_000));
        let t = p.started;
        p.observe(t + Duration::from_secs(1), 1_000, 1_000);
        p.records = 1_000;
        p.bytes = 100_000;
        // 1,000 records at 1,000 records/s is 1 s; their 100,000 bytes at the cap 100 s.
        assert_eq!(p.eta_secs(1_000).map(f64::round), Some(100.0));
    }

    #[test]
    fn the_cap_bounds_only_the_share_of_records_forwarded() {
        let mut p = Progress::new(Mode::Off).with_cap(Some(1_000));
        let t = p.started;
        // 100 forwarded (10,000 bytes) and 900 skipped as held already.
        p.skipped(900);
        p.observe(t + Duration::from_secs(100), 1_000, 1_000);
        p.records = 100;
        p.bytes = 10_000;
        // 1,000 records behind, a tenth of them expected to go out: 10,000 bytes at the
        // cap, 10 s (the rate, 10 records/s, says 100 s).
        assert_eq!(p.eta_secs(1_000).map(f64::round), Some(100.0));
        p.observe(t + Duration::from_secs(101), 11_000, 1_000);
        // At 10,000 records/s now: the cap's 10 s.
        assert_eq!(p.eta_secs(1_000).map(f64::round), Some(10.0));
    }

    #[test]
    fn records_skipped_as_held_already_count_in_the_rate() {
        let mut p = Progress::new(Mode::Off);
        // 100 records forwarded and 9,900 skipped in the first update: 10,000 of 20,000
        // offsets behind are cleared, so the rest takes about as long again, not 100 times.
        p.skipped(9_900);
        let eta = p.update(10_000, 20_000, 100, 10_000).unwrap_or(f64::MAX);
        let spent = p.started.elapsed().as_secs_f64();
        assert!(eta <= spent * 1.5, "ETA {eta} s after {spent} s");
    }
}

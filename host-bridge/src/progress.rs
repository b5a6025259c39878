//! Backlog progress: a progress bar (indicatif) on a terminal, otherwise a log line every
//! [`LOG_EVERY`].

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Interval of the progress log line when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

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
            records: 0,
            bytes: 0,
            cap: None,
        }
    }

    /// The same reporter, its ETA computed under an uplink cap of `bytes_per_sec`.
    pub fn with_cap(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.cap = bytes_per_sec;
        self
    }

    /// Seconds to forward `behind` records: at the rate of this run so far (records/s), and
    /// never faster than the cap allows at this run's mean payload size; `None` before
    /// anything was forwarded.
    fn eta_secs(&self, behind: u64) -> Option<f64> {
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = self.records.saturating_sub(self.start_records) as f64 / secs;
        let by_rate = (rate > 0.0).then(|| behind as f64 / rate);
        let avg = self.bytes.checked_div(self.records)?;
        let by_cap = self
            .cap
            .map(|c| behind.saturating_mul(avg) as f64 / c.max(1) as f64);
        match (by_rate, by_cap) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reports the state: `committed` (checkpoint offset), `next` (the gateway's next
    /// offset), totals forwarded by this run. Returns the backlog's ETA in seconds
    /// (`None`: unknown yet), under the uplink cap if there is one.
    pub fn update(&mut self, committed: u64, next: u64, records: u64, bytes: u64) -> Option<f64> {
        self.records = records;
        self.bytes = bytes;
        let behind = next.saturating_sub(committed);
        let avg = bytes.checked_div(records).unwrap_or(0);
        let eta_secs = self.eta_secs(behind);
        let eta = eta_secs.map_or("unknown".to_string(), |s| format!("{s:.0} s"));
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
            let rate = (records - self.start_records.min(records)) as f64 / secs;
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

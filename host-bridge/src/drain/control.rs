//! Retry pacing and stopping: the capped, jittered [`Backoff`] every retry of the bridge
//! uses, the [`NoProgress`] clock of the retry budget (`--retry-for`), and the [`Shutdown`]
//! signal (SIGTERM/SIGINT) a drain and the commands wait on.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use smol::channel::{Receiver, Sender};

/// Capped exponential backoff with jitter: each delay is drawn uniformly from
/// `[d/2, d)`, where `d` doubles from `initial` up to `max`.
///
/// The delays come from `backon`'s exponential backoff, set up so that its jitter (a
/// delay `c` becomes `c + c × U[0, 1)`) over `c = d/2` gives that range; this type only
/// keeps the builder so that [`Backoff::reset`] can start the sequence over.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// A backoff from `initial` to at most `max` (each at least 1 ms).
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        let max = max.max(initial);
        let builder = ExponentialBuilder::new()
            .with_min_delay(initial / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            builder,
            delays: builder.build(),
            max,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        // Without a limit on the number of retries or their total the sequence never ends;
        // `max` only stands in for an end that cannot come.
        self.delays.next().unwrap_or(self.max)
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

/// The clock of a retry budget (`--retry-for`) over one gateway: how long its requests
/// have failed, or been answered without progress, since the last progress.
///
/// It starts when the first attempt that failed began (a request sent and never answered
/// counts from when it was sent, not from its reply timeout), runs through reconnects and
/// gateway error replies alike, and stops only at [`NoProgress::progressed`]: a fetch
/// answered with records, a lost range, or a valid empty reply at the end of the log.
#[derive(Debug, Clone, Copy)]
pub struct NoProgress {
    budget: Option<Duration>,
    since: Option<Instant>,
}

impl NoProgress {
    /// A stopped clock with `budget`; `None`: retry for ever.
    pub fn new(budget: Option<Duration>) -> Self {
        NoProgress {
            budget,
            since: None,
        }
    }

    /// The gateway made progress: the clock stops (the next failure starts it afresh).
    pub fn progressed(&mut self) {
        self.since = None;
    }

    /// The budget; `None`: retry for ever.
    pub fn budget(&self) -> Option<Duration> {
        self.budget
    }

    /// When the failures began, if they have not stopped since.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// An attempt begun at `began` failed at `now` (or was answered without progress):
    /// starts the clock at `began` unless it runs already. `Ok` with the `delay` to wait
    /// before the next attempt, cut to what the budget has left (so that the last attempt
    /// is made right at its end, not after it); `Err` with how long the failures have
    /// lasted once that is the whole budget or more.
    ///
    /// # Errors
    /// The budget is spent: give up.
    pub fn failed(
        &mut self,
        began: Instant,
        delay: Duration,
        now: Instant,
    ) -> Result<Duration, Duration> {
        let since = *self.since.get_or_insert(began);
        let waited = now.saturating_duration_since(since);
        match self.budget {
            Some(b) if waited >= b => Err(waited),
            Some(b) => Ok(delay.min(b - waited)),
            None => Ok(delay),
        }
    }
}

/// A shutdown signal; clones wait on the same signal.
#[derive(Debug, Clone)]
pub struct Shutdown(Receiver<()>);

/// Triggers a [`Shutdown`].
#[derive(Debug, Clone)]
pub struct ShutdownTrigger(Sender<()>);

impl ShutdownTrigger {
    /// Signals every clone of the paired [`Shutdown`].
    pub fn trigger(&self) {
        self.0.close();
    }
}

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = smol::channel::bounded(1);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// True once triggered.
    pub fn is_set(&self) -> bool {
        self.0.is_closed()
    }

    /// Resolves once triggered.
    pub async fn wait(&self) {
        while self.0.recv().await.is_ok() {}
    }
}

/// Sleeps `d` or until `stop` is triggered; returns false if stopped.
pub(super) async fn sleep_or_stop(d: Duration, stop: &Shutdown) -> bool {
    smol::future::or(
        async {
            smol::Timer::after(d).await;
            true
        },
        async {
            stop.wait().await;
            false
        },
    )
    .await
}

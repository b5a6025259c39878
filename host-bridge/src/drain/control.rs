//! Retry pacing and stopping: the capped, jittered [`Backoff`] every retry of the bridge
//! uses, and the [`Shutdown`] signal (SIGTERM/SIGINT) a drain and the commands wait on.

use std::time::Duration;

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

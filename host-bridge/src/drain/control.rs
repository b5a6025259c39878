//! Retry pacing and stopping: the capped, jittered [`Backoff`] every retry of the bridge
//! uses, and the [`Shutdown`] signal (SIGTERM/SIGINT) a drain and the commands wait on.

use std::time::Duration;

use smol::channel::{Receiver, Sender};

/// Capped exponential backoff with jitter: each delay is drawn uniformly from
/// `[d/2, d]`, where `d` doubles from `initial` up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// A backoff from `initial` to at most `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            rand::random_range(0..=jitter_ns)
        };
        half + Duration::from_nanos(extra)
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
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

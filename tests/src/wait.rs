//! Bounded waits on observable state (a log line, a metric, an offset, a file), for the
//! end-to-end tests and, included by path, the bridge's own tests: look again every 10 ms
//! until the state is there, and fail with a message that says what was awaited and what
//! was seen when the time limit passes. A test waits on what it needs to have happened,
//! never for a fixed time that only usually suffices.

use std::time::{Duration, Instant};

/// How long [`wait_until`] pauses between two looks.
pub const POLL: Duration = Duration::from_millis(10);

/// Calls `probe` every [`POLL`] until it returns `Some`, and returns that value.
///
/// # Panics
/// When `within` has passed and `probe` still returned `None`: with `failure()`, called
/// then (so that it can describe the state at the deadline).
pub fn wait_until<T>(
    within: Duration,
    mut probe: impl FnMut() -> Option<T>,
    failure: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("not within {within:.1?}: {}", failure());
        }
        std::thread::sleep(POLL);
    }
}

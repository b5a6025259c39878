//! Warnings that could come in floods (refused connections, a failing log retried every
//! 100 ms) logged at most once per [`WARN_EVERY`], with a count of those passed over.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest time between two warnings of one [`Throttled`] kind.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// The state of one rate-limited warning: when the last one went out, and how many were
/// passed over since. Not synchronised: [`Throttled`] shares one between threads, and the
/// line-mode warnings keep one per reason in the log thread.
#[derive(Default)]
pub struct Throttle {
    last: Option<Instant>,
    passed: u64,
}

impl Throttle {
    /// Warnings passed over since the last one that went out.
    #[cfg(test)]
    pub fn passed(&self) -> u64 {
        self.passed
    }

    /// Whether a warning at `now` goes out: `Some(n)`, with `n` the warnings passed over
    /// since the last one (which starts the count again), or `None` (counted) when the last
    /// one went out less than [`WARN_EVERY`] before `now`.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(at) if now.duration_since(at) < WARN_EVERY => {
                self.passed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.passed))
            }
        }
    }
}

/// A warning of one kind logged at most once per [`WARN_EVERY`], from any thread: the
/// ones in between are counted (no text kept), and the next one logged says how many.
/// A burst of refused connections or a failing log thread writes a few lines, not one per
/// event.
#[derive(Default)]
pub struct Throttled {
    state: Mutex<Throttle>,
}

impl Throttled {
    /// Logs `message()` as a warning (with the count passed over since the last one), or
    /// counts it if the last one went out less than [`WARN_EVERY`] ago. Returns whether it
    /// was logged.
    pub fn warn(&self, message: impl FnOnce() -> String) -> bool {
        let admitted = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(Instant::now());
        match admitted {
            None => return false,
            Some(0) => log::warn!("{}", message()),
            Some(n) => log::warn!(
                "{} (and {n} more like it in the last {} s)",
                message(),
                WARN_EVERY.as_secs()
            ),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warning_is_logged_and_the_next_ones_within_the_period_are_counted() {
        let t = Throttled::default();
        assert!(t.warn(|| "first".into()));
        for _ in 0..1000 {
            assert!(!t.warn(|| unreachable!("not formatted while passed over")));
        }
        assert_eq!(t.state.lock().unwrap().passed, 1000);
        // A period later the next one goes out, with the count, which starts again.
        let mut s = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(s.admit(t0), Some(0));
        assert_eq!(s.admit(t0 + WARN_EVERY / 2), None);
        assert_eq!(s.admit(t0 + WARN_EVERY / 2), None);
        assert_eq!(s.admit(t0 + WARN_EVERY), Some(2));
        assert_eq!(s.admit(t0 + WARN_EVERY), None);
    }
}

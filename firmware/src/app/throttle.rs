//! Warnings that could come in floods (refused connections, a failing log retried every
//! 100 ms) logged at most once per [`WARN_EVERY`], with a count of those passed over.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest time between two warnings of one [`Throttled`] kind.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// A warning of one kind logged at most once per [`WARN_EVERY`], from any thread: the
/// ones in between are counted (no text kept), and the next one logged says how many.
/// A burst of refused connections or a failing log thread writes a few lines, not one per
/// event.
#[derive(Default)]
pub struct Throttled {
    /// When the last one was logged, and how many were passed over since.
    last: Mutex<Option<(Instant, u64)>>,
}

impl Throttled {
    /// Logs `message()` as a warning (with the count passed over since the last one), or
    /// counts it if the last one went out less than [`WARN_EVERY`] ago. Returns whether it
    /// was logged.
    pub fn warn(&self, message: impl FnOnce() -> String) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *last {
            Some((at, passed)) if now.duration_since(*at) < WARN_EVERY => {
                *passed += 1;
                false
            }
            slot => {
                let passed = slot.map_or(0, |(_, n)| n);
                *slot = Some((now, 0));
                if passed > 0 {
                    log::warn!(
                        "{} (and {passed} more like it in the last {} s)",
                        message(),
                        WARN_EVERY.as_secs()
                    );
                } else {
                    log::warn!("{}", message());
                }
                true
            }
        }
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
        assert_eq!(t.last.lock().unwrap().map(|(_, n)| n), Some(1000));
        // A period later the next one goes out, with the count, which starts again.
        *t.last.lock().unwrap() = Some((Instant::now() - WARN_EVERY, 1000));
        assert!(t.warn(|| "again".into()));
        assert_eq!(t.last.lock().unwrap().map(|(_, n)| n), Some(0));
    }
}

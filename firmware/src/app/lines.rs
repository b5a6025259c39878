//! Line mode's dropped lines: why a line was not stored, and the rate-limited warnings
//! that say so (one per reason at once, then at most one per reason every
//! [`WARN_EVERY`], counting the lines dropped meanwhile), each naming the peer and the
//! configured limit that applied.

use std::collections::HashMap;
use std::time::Instant;

use super::throttle::{Throttle, WARN_EVERY};

use spillway_core::wire::LineError;
use spillway_firmware::gateway::LineRejected;

/// Bytes a topic word and the blank after it may add to a line, beyond the payload: a
/// topic of at most 255 bytes and one separator.
pub const TOPIC_WORD_BYTES: usize = 256;

/// The longest line a line-mode connection buffers, bytes without the `\n`: the largest
/// payload (`max_record_bytes`), the topic word when the listener has no fixed topic, and
/// a `\r`.
pub fn max_line(max_record_bytes: usize, fixed_topic: bool) -> usize {
    let topic = if fixed_topic { 0 } else { TOPIC_WORD_BYTES };
    max_record_bytes.saturating_add(topic).saturating_add(1)
}

/// Why the connection's reader dropped a line before the log thread saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderDrop {
    /// The line grew past the connection's limit before its `\n`.
    TooLong {
        /// The line limit, bytes ([`max_line`]).
        limit: usize,
        /// The listener has a fixed topic.
        fixed_topic: bool,
    },
    /// A partial line was followed by silence.
    Partial {
        /// Bytes of the partial line.
        len: usize,
        /// The listener's `line-timeout-ms`.
        timeout_ms: u64,
    },
}

/// The rate-limited warnings of dropped lines, kept by the log thread.
#[derive(Default)]
pub struct DropWarnings {
    reasons: HashMap<&'static str, Throttle>,
}

impl DropWarnings {
    /// Logs `message` as a warning for `reason`, unless one of that reason went out less
    /// than [`WARN_EVERY`] ago (then only counts it; the next warning says how many were
    /// not logged). Returns whether it was logged.
    pub fn warn(
        &mut self,
        reason: &'static str,
        now: Instant,
        message: impl FnOnce() -> String,
    ) -> bool {
        match self.reasons.entry(reason).or_default().admit(now) {
            None => return false,
            Some(0) => log::warn!("{}", message()),
            Some(more) => log::warn!(
                "{} ({more} more line(s) dropped for this reason, by any connection, in the last {} s)",
                message(),
                WARN_EVERY.as_secs()
            ),
        }
        true
    }

    /// Warns of a line the connection's reader dropped.
    pub fn reader_drop(
        &mut self,
        peer: &str,
        why: ReaderDrop,
        max_record_bytes: u32,
        now: Instant,
    ) {
        match why {
            ReaderDrop::TooLong { limit, fixed_topic } => {
                let reason = if fixed_topic {
                    "too_long"
                } else {
                    "too_long_with_topic"
                };
                self.warn(reason, now, || {
                    // `limit` counts a trailing `\r` too: the figures named are the payload's.
                    let payload = limit.saturating_sub(1);
                    if fixed_topic {
                        format!(
                            "{peer}: line dropped: longer than {payload} bytes, --max-record-bytes is {max_record_bytes}"
                        )
                    } else {
                        format!(
                            "{peer}: line dropped: longer than {payload} bytes (a topic word of at most 255 bytes, a blank, and a payload of at most {max_record_bytes} bytes, --max-record-bytes)"
                        )
                    }
                });
            }
            ReaderDrop::Partial { len, timeout_ms } => {
                self.warn("partial", now, || {
                    format!(
                        "{peer}: partial line of {len} bytes dropped: no newline within {timeout_ms} ms (line-timeout-ms)"
                    )
                });
            }
        }
    }

    /// Warns of a line the gateway refused (an empty line is skipped without a word);
    /// returns whether a warning was logged. Each reason has its own rate limit and count:
    /// a line without a topic and one without a payload are two reasons.
    pub fn rejected(&mut self, peer: &str, why: &LineRejected, now: Instant) -> bool {
        match *why {
            LineRejected::Malformed(LineError::Empty) => false,
            LineRejected::Malformed(LineError::InvalidTopic { valid_up_to }) => {
                self.warn("not_utf8", now, || {
                    format!(
                        "{peer}: line dropped: its topic word is not UTF-8 (first bad byte at {valid_up_to})"
                    )
                })
            }
            LineRejected::Malformed(e @ LineError::MissingPayload) => {
                self.warn("no_payload", now, || {
                    format!(
                        "{peer}: line dropped: {e}; a listener without topic= takes lines of the form `TOPIC PAYLOAD`"
                    )
                })
            }
            LineRejected::Malformed(e) => {
                self.warn("no_topic", now, || {
                    format!(
                        "{peer}: line dropped: {e}; a listener without topic= takes lines of the form `TOPIC PAYLOAD`"
                    )
                })
            }
            LineRejected::TooLarge { len, max } => {
                self.warn("too_large", now, || {
                    format!(
                        "{peer}: line dropped: a payload of {len} bytes, --max-record-bytes is {max}"
                    )
                })
            }
            LineRejected::BadTopic => {
                self.warn("bad_topic", now, || {
                    format!("{peer}: line dropped: its topic is over 255 bytes")
                })
            }
            LineRejected::Full => {
                self.warn("full", now, || {
                    format!("{peer}: line dropped: the log is full (--full reject-new)")
                })
            }
            LineRejected::Internal => {
                self.warn("internal", now, || {
                    format!("{peer}: line dropped: the log could not take it (storage failure)")
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_warning_per_reason_per_interval() {
        let mut w = DropWarnings::default();
        let t0 = Instant::now();
        assert!(w.warn("a", t0, String::new));
        assert!(!w.warn("a", t0 + Duration::from_secs(1), String::new));
        assert!(w.warn("b", t0 + Duration::from_secs(1), String::new));
        assert!(!w.warn("a", t0 + Duration::from_secs(9), String::new));
        assert!(w.warn("a", t0 + WARN_EVERY, String::new));
        assert_eq!(w.reasons["a"].passed(), 0);
    }

    #[test]
    fn a_line_without_a_topic_and_one_without_a_payload_are_counted_apart() {
        let mut w = DropWarnings::default();
        let t0 = Instant::now();
        let no_topic = LineRejected::Malformed(LineError::MissingTopic);
        let no_payload = LineRejected::Malformed(LineError::MissingPayload);
        assert!(w.rejected("p", &no_topic, t0));
        // Another reason within the interval gets its own warning, not a share of the
        // first one's count.
        assert!(w.rejected("p", &no_payload, t0 + Duration::from_secs(1)));
        assert!(!w.rejected("p", &no_topic, t0 + Duration::from_secs(2)));
        assert_eq!(w.reasons["no_topic"].passed(), 1);
        assert_eq!(w.reasons["no_payload"].passed(), 0);
    }

    #[test]
    fn the_line_limit_is_the_payload_limit_plus_the_topic_word() {
        assert_eq!(max_line(256, true), 257);
        assert_eq!(max_line(256, false), 513);
    }
}

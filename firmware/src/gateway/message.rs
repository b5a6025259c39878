//! The human-readable detail of an `Error` reply: formatted into a fixed buffer, cut with
//! an ellipsis when longer.

use core::fmt::Write as _;

/// Longest error message sent, bytes.
pub(super) const MAX_ERROR_MESSAGE: usize = 160;

/// An error reply's message.
pub(super) type Message = heapless::String<MAX_ERROR_MESSAGE>;

/// `args` formatted into at most [`MAX_ERROR_MESSAGE`] bytes: a longer message is cut at a
/// character boundary and ends with `…`, so its start always reaches the client.
pub(super) fn message(args: core::fmt::Arguments<'_>) -> Message {
    /// Keeps what fits; after the first cut, nothing more.
    struct Cut(Message, bool);
    impl core::fmt::Write for Cut {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            if self.1 {
                return Ok(());
            }
            let room = MAX_ERROR_MESSAGE - self.0.len();
            if s.len() <= room {
                let _ = self.0.push_str(s);
                return Ok(());
            }
            // Room for the ellipsis (3 bytes), taken back from what is kept if needed.
            let keep = room.saturating_sub('…'.len_utf8());
            let end = (0..=keep)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            let _ = self.0.push_str(&s[..end]);
            while self.0.len() + '…'.len_utf8() > MAX_ERROR_MESSAGE {
                self.0.pop();
            }
            let _ = self.0.push('…');
            self.1 = true;
            Ok(())
        }
    }
    let mut m = Cut(Message::new(), false);
    let _ = m.write_fmt(args);
    m.0
}

#[cfg(test)]
mod tests {
    use super::{MAX_ERROR_MESSAGE, message};

    #[test]
    fn a_long_message_keeps_its_start_and_ends_with_an_ellipsis() {
        let short = message(format_args!("consumer {:?} unknown", "c2"));
        assert_eq!(short.as_str(), "consumer \"c2\" unknown");
        // Pieces that fit, then one that does not (it used to be dropped whole).
        let long = "é".repeat(200);
        let m = message(format_args!("the log's {} {long} tail", "journal entry"));
        assert!(m.len() <= MAX_ERROR_MESSAGE, "{}", m.len());
        assert!(m.len() >= MAX_ERROR_MESSAGE - 4, "{}", m.len());
        assert!(m.starts_with("the log's journal entry éé"), "{m}");
        assert!(m.ends_with('…'), "{m}");
        assert!(!m.contains("tail"), "{m}");
    }
}

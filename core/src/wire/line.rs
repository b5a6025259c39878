//! Line mode: one record per text line, so the simplest sensor can publish with `println`.
//!
//! The listener splits its input at `\n` (and enforces its maximum line length in bytes);
//! [`parse_line`] turns one line into a topic and a payload. Nothing is sent back on a
//! line-mode connection.

/// Why a line is not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The line is empty or only spaces and tabs.
    #[error("empty line")]
    Empty,
    /// No fixed topic, and the line starts with a space or tab.
    #[error("line has no topic (it starts with whitespace)")]
    MissingTopic,
    /// No fixed topic, and the line is a topic with no payload after it.
    #[error("line has a topic but no payload")]
    MissingPayload,
    /// The topic is not UTF-8.
    #[error("topic is not valid UTF-8 (first bad byte at {valid_up_to})")]
    InvalidTopic {
        /// Bytes of the topic that are valid UTF-8.
        valid_up_to: usize,
    },
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Splits one text line into `(topic, payload)`.
///
/// `line` is one line without its `\n` (a trailing `\n`, then a trailing `\r`, are
/// stripped if present). With `fixed_topic` (a listener configured for one topic) the
/// payload is the whole line. Without it the topic is the line's first word — the bytes
/// before the first space or tab — and the payload is the rest after the spaces and tabs
/// that follow it: `b"temp 21.5\r"` gives `("temp", b"21.5")`. The payload is passed on as
/// bytes, unchecked.
///
/// ```
/// # use spillway_core::wire::parse_line;
/// assert_eq!(parse_line(b"temp 21.5\r", None), Ok(("temp", &b"21.5"[..])));
/// assert_eq!(parse_line(b"21.5", Some("buoy/sst")), Ok(("buoy/sst", &b"21.5"[..])));
/// ```
pub fn parse_line<'a>(
    line: &'a [u8],
    fixed_topic: Option<&'a str>,
) -> Result<(&'a str, &'a [u8]), LineError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|&b| is_blank(b)) {
        return Err(LineError::Empty);
    }
    if let Some(topic) = fixed_topic {
        return Ok((topic, line));
    }
    let topic_len = line.iter().position(|&b| is_blank(b)).unwrap_or(line.len());
    if topic_len == 0 {
        return Err(LineError::MissingTopic);
    }
    let (topic, rest) = line.split_at(topic_len);
    let payload_start = rest.iter().position(|&b| !is_blank(b));
    let payload = match payload_start {
        Some(i) => &rest[i..],
        None => return Err(LineError::MissingPayload),
    };
    let topic = core::str::from_utf8(topic).map_err(|e| LineError::InvalidTopic {
        valid_up_to: e.valid_up_to(),
    })?;
    Ok((topic, payload))
}

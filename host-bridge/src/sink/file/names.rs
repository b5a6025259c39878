//! Names in the file sink's directory tree (see the module doc of `sink::file`, "Layout"):
//! the stem of a topic or gateway id (percent-encoded, bounded), file names
//! `<first offset, 20 digits>.jsonl` and `….jsonl.open`, and date directories `YYYY-MM-DD`.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{MAX_STEM, OPEN_SUFFIX, SUFFIX};

const TOPIC_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// Digits of the first offset in a file name: `u64::MAX` has 20.
pub const OFFSET_DIGITS: usize = 20;

/// The directory name of a topic or gateway id (see the module doc of `sink::file`,
/// "Layout"): percent-encoded, at most [`MAX_STEM`] bytes plus `~` and a CRC-32 in 8 hex
/// digits; `%` for the empty string.
pub fn topic_stem(topic: &str) -> String {
    if topic.is_empty() {
        // Never produced by the encoding itself, so it cannot collide.
        return "%".to_string();
    }
    let enc = utf8_percent_encode(topic, TOPIC_SET).to_string();
    if enc.len() <= MAX_STEM {
        return enc;
    }
    let bytes = enc.as_bytes();
    let mut cut = MAX_STEM;
    // Do not cut inside a %XX triple.
    while cut >= 2 && (bytes[cut - 1] == b'%' || bytes[cut - 2] == b'%') {
        cut -= 1;
    }
    format!(
        "{}~{:08x}",
        &enc[..cut],
        spillway_core::log::format::crc32(topic.as_bytes())
    )
}

/// The name of the file whose first record has offset `first`: `<first>.jsonl`, or
/// `<first>.jsonl.open` while it is written.
pub fn file_name(first: u64, open: bool) -> String {
    if open {
        format!("{first:020}{SUFFIX}{OPEN_SUFFIX}")
    } else {
        format!("{first:020}{SUFFIX}")
    }
}

/// Splits a file name into its first offset and whether it is open; `None` for any name
/// [`file_name`] does not make.
pub fn parse_name(name: &str) -> Option<(u64, bool)> {
    let (base, open) = match name.strip_suffix(OPEN_SUFFIX) {
        Some(b) => (b, true),
        None => (name, false),
    };
    let digits = base.strip_suffix(SUFFIX)?;
    if digits.len() != OFFSET_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, open))
}

/// True for a date directory's name, `YYYY-MM-DD`.
pub fn is_date_dir(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
}

/// The UTC date of `timestamp_us` (µs since the Unix epoch) as `YYYY-MM-DD`; a time past
/// year 9999 gives `9999-12-31`, as [`crate::sink::rfc3339_us`] clamps it.
pub fn utc_date(timestamp_us: u64) -> String {
    crate::sink::rfc3339_us(timestamp_us)[..10].to_string()
}

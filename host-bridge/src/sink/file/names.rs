//! File names of the file sink: the stem of a topic (percent-encoded, bounded, see the
//! module doc of `sink::file`, "Layout") and `<stem>.<n>.jsonl`.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{MAX_STEM, SUFFIX};

const TOPIC_SET: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// The file name stem of a topic (see the module doc of `sink::file`, "Layout").
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

/// Splits `<stem>.<n>.jsonl` into its stem and number.
pub(super) fn parse_name(name: &str) -> Option<(&str, u64)> {
    let base = name.strip_suffix(SUFFIX)?;
    let (stem, n) = base.rsplit_once('.')?;
    if stem.is_empty() || n.len() < 8 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem, n.parse().ok()?))
}

pub(super) fn file_name(stem: &str, n: u64) -> String {
    format!("{stem}.{n:08}{SUFFIX}")
}

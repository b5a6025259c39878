//! Which Kafka topic a record goes to: the topic of `kafka://HOST:PORT/TOPIC` as written
//! (one Kafka topic for every record, as before), or a template with `{topic}` in it
//! (`kafka://HOST:PORT/{topic}`, `kafka://HOST:PORT/site-3.{topic}`) that maps each
//! Spillway topic to a Kafka topic of its own.
//!
//! The mapping, for a Spillway topic `T` (1 to 255 bytes of UTF-8):
//!
//! 1. every character of `T` outside `[a-zA-Z0-9._-]` (the characters Kafka accepts in a
//!    topic name) becomes one `_`: `buoy/sst` → `buoy_sst`, `température` → `temp_rature`;
//! 2. `{topic}` in the template is replaced by that; the template's own text around it must
//!    already be made of those characters (else the sink is refused, exit code 2);
//! 3. a name that is exactly `.` or `..` (which Kafka refuses) has its dots replaced by `_`;
//! 4. a name longer than 249 characters (Kafka's limit) keeps the template's text and as
//!    much of the mapped topic as fits before `-` and 8 lowercase hex digits of the CRC-32
//!    (IEEE) of `T`'s bytes, so that it is exactly 249 characters long.
//!
//! Different Spillway topics may map to one Kafka topic (`a/b` and `a_b`); every message
//! still carries its Spillway topic in the `spillway-topic` header. Kafka topics are not
//! created by the bridge: create them (or let the brokers auto-create them).

use std::borrow::Cow;
use std::fmt;

/// The longest Kafka topic name, characters.
pub const MAX_KAFKA_TOPIC_LEN: usize = 249;

/// The placeholder in a template.
pub const PLACEHOLDER: &str = "{topic}";

/// The longest text a template may have around `{topic}`, characters (so that a mapped
/// topic always keeps some of its own characters).
pub const MAX_TEMPLATE_TEXT: usize = 200;

/// Where a Kafka sink sends a record (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaTopic {
    /// Every record to this topic, as written in the URI.
    Fixed(String),
    /// Each Spillway topic `T` to `prefix` + mapped `T` + `suffix`.
    Template {
        /// Text before `{topic}`.
        prefix: String,
        /// Text after `{topic}`.
        suffix: String,
    },
}

/// True for the characters Kafka accepts in a topic name.
fn legal(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

impl KafkaTopic {
    /// Reads the topic of a `kafka://` URI: a template when it holds `{topic}`, else a
    /// fixed topic taken as written.
    ///
    /// # Errors
    /// A template with `{topic}` more than once, with other braces, with characters Kafka
    /// refuses around `{topic}`, or with more than [`MAX_TEMPLATE_TEXT`] characters around it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let Some((prefix, suffix)) = s.split_once(PLACEHOLDER) else {
            return Ok(KafkaTopic::Fixed(s.to_string()));
        };
        let text = format!("{prefix}{suffix}");
        if let Some(c) = text.chars().find(|&c| !legal(c)) {
            return Err(format!(
                "Kafka topic template {s:?}: {c:?} is not allowed around {PLACEHOLDER} (Kafka topic names take [a-zA-Z0-9._-]; {PLACEHOLDER} may appear once)"
            ));
        }
        if text.len() > MAX_TEMPLATE_TEXT {
            return Err(format!(
                "Kafka topic template {s:?}: {} characters around {PLACEHOLDER}, at most {MAX_TEMPLATE_TEXT}",
                text.len()
            ));
        }
        Ok(KafkaTopic::Template {
            prefix: prefix.to_string(),
            suffix: suffix.to_string(),
        })
    }

    /// True for a template (each Spillway topic to its own Kafka topic).
    pub fn is_mapped(&self) -> bool {
        matches!(self, KafkaTopic::Template { .. })
    }

    /// The Kafka topic of a record of Spillway topic `topic` (see the module doc).
    pub fn for_topic(&self, topic: &str) -> Cow<'_, str> {
        match self {
            KafkaTopic::Fixed(t) => Cow::Borrowed(t.as_str()),
            KafkaTopic::Template { prefix, suffix } => Cow::Owned(map_topic(prefix, topic, suffix)),
        }
    }
}

impl fmt::Display for KafkaTopic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaTopic::Fixed(t) => f.write_str(t),
            KafkaTopic::Template { prefix, suffix } => write!(f, "{prefix}{PLACEHOLDER}{suffix}"),
        }
    }
}

/// `prefix` + `topic` with refused characters replaced + `suffix`, made a legal Kafka topic
/// name (rules 1, 3 and 4 of the module doc). `prefix` and `suffix` are legal already.
fn map_topic(prefix: &str, topic: &str, suffix: &str) -> String {
    let mapped: String = topic
        .chars()
        .map(|c| if legal(c) { c } else { '_' })
        .collect();
    let len = prefix.len() + mapped.len() + suffix.len();
    if len > MAX_KAFKA_TOPIC_LEN {
        let crc = spillway_core::log::format::crc32(topic.as_bytes());
        // `-` and 8 hex digits; the mapped text is ASCII, so any cut is on a character.
        let keep = MAX_KAFKA_TOPIC_LEN.saturating_sub(prefix.len() + suffix.len() + 9);
        return format!("{prefix}{}-{crc:08x}{suffix}", &mapped[..keep]);
    }
    let name = format!("{prefix}{mapped}{suffix}");
    if name == "." || name == ".." {
        return name.replace('.', "_");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(template: &str, topic: &str) -> String {
        KafkaTopic::parse(template)
            .unwrap()
            .for_topic(topic)
            .into_owned()
    }

    #[test]
    fn a_plain_topic_is_every_records_topic() {
        let t = KafkaTopic::parse("out").unwrap();
        assert!(!t.is_mapped());
        assert_eq!(t.for_topic("buoy/sst"), "out");
        // Taken as written, as before: the broker judges it.
        assert_eq!(map("a b", "x"), "a b");
    }

    #[test]
    fn refused_characters_become_underscores() {
        assert_eq!(map("{topic}", "buoy/sst"), "buoy_sst");
        assert_eq!(map("{topic}", "a.b-c_D9"), "a.b-c_D9");
        assert_eq!(map("{topic}", "température"), "temp_rature");
        assert_eq!(map("{topic}", "a b+c#🙂"), "a_b_c__");
        assert_eq!(
            map("site-3.{topic}.raw", "cgm/glucose"),
            "site-3.cgm_glucose.raw"
        );
        assert_eq!(map("{topic}", "."), "_");
        assert_eq!(map("{topic}", ".."), "__");
        assert_eq!(map("x{topic}", "."), "x.");
    }

    #[test]
    fn long_names_are_cut_to_249_with_a_crc() {
        let long = "a/".repeat(127); // 254 bytes
        let n = map("p.{topic}.s", &long);
        assert_eq!(n.len(), MAX_KAFKA_TOPIC_LEN);
        assert!(n.starts_with("p.a_a_") && n.ends_with(".s"), "{n}");
        let crc = spillway_core::log::format::crc32(long.as_bytes());
        assert!(n.contains(&format!("-{crc:08x}.s")), "{n}");
        // Two long topics that share their first 249 characters stay apart.
        let other = format!("{}b", &long[..253]);
        assert_ne!(map("p.{topic}.s", &other), n);
        // Exactly 249 is kept as it is.
        let fits = "x".repeat(249);
        assert_eq!(map("{topic}", &fits), fits);
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in [
            "{topic}.{topic}",
            "a/{topic}",
            "{topic}}",
            "{{topic}",
            "ü{topic}",
        ] {
            assert!(KafkaTopic::parse(bad).is_err(), "{bad}");
        }
        assert!(KafkaTopic::parse(&format!("{}{{topic}}", "p".repeat(201))).is_err());
        assert_eq!(
            KafkaTopic::parse("a.{topic}-b").unwrap().to_string(),
            "a.{topic}-b"
        );
    }
}

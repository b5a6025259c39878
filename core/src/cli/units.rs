//! Byte sizes and durations as people write them on a command line or in a config file.
//!
//! Sizes use binary units: `K`, `KB` and `KiB` are all 1,024 bytes (likewise `M` and `G`), so
//! `64K` is 65,536 bytes, as the flash's erase blocks are counted; a bare number is bytes.
//! Durations take a bare number as seconds (`--retry-for 30`), or anything `humantime`
//! reads (`500ms`, `5s`, `2m`, `1h 30m`).

use std::fmt;
use std::str::FromStr;
use std::string::{String, ToString};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size or duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a {what}: {why}")]
pub struct BadValue {
    /// The text as given.
    pub value: String,
    /// `size` or `duration`.
    pub what: &'static str,
    /// What is wrong, with the accepted forms.
    pub why: String,
}

/// Parses a byte count: `4096`, `4K`, `4KiB`, `16M`, `1G` (binary units: K = 1,024 bytes,
/// also written `KB`; fractions like `1.5M` round to the nearest byte).
///
/// # Errors
/// [`BadValue`] for anything else, or a count above `u64::MAX` bytes.
pub fn parse_size(s: &str) -> Result<u64, BadValue> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| BadValue {
            value: s.to_string(),
            what: "size",
            why: std::format!("{e} (expected e.g. 4096, 4K, 16M, 1G)"),
        })
}

/// Parses a duration: a bare number is seconds (`30`, `0.5`), otherwise a `humantime`
/// duration (`500ms`, `5s`, `2m`, `1h 30m`).
///
/// # Errors
/// [`BadValue`] for anything else, a negative number, or one too large for a [`Duration`].
pub fn parse_duration(s: &str) -> Result<Duration, BadValue> {
    let t = s.trim();
    let bad = |why: String| BadValue {
        value: s.to_string(),
        what: "duration",
        why,
    };
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') && !t.is_empty() {
        let secs: f64 = t
            .parse()
            .map_err(|_| bad("expected seconds, e.g. 30 or 0.5".into()))?;
        return Duration::try_from_secs_f64(secs).map_err(|e| bad(e.to_string()));
    }
    humantime::parse_duration(t)
        .map_err(|e| bad(std::format!("{e} (expected e.g. 30, 500ms, 5s, 2m)")))
}

/// A byte count read with [`parse_size()`]: from a flag (`FromStr`) or a config file (an
/// integer, or a string with a unit). Written back as an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The count as a `u32`, or a message naming `what` when it does not fit.
    ///
    /// # Errors
    /// The size is 4 GiB or more.
    pub fn to_u32(self, what: &str) -> Result<u32, String> {
        u32::try_from(self.0).map_err(|_| std::format!("{what}: {} bytes is too large", self.0))
    }
}

impl FromStr for ByteSize {
    type Err = BadValue;
    fn from_str(s: &str) -> Result<Self, BadValue> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    /// An integer; a count above `i64::MAX` (which TOML integers cannot hold) as a string.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if i64::try_from(self.0).is_ok() {
            s.serialize_u64(self.0)
        } else {
            s.serialize_str(&self.0.to_string())
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size in bytes: an integer or a string like \"64K\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(std::format!("a size cannot be negative ({v})")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_size(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A duration read with [`parse_duration()`]: from a flag (`FromStr`) or a config file (a
/// string such as `"1h"` or `"500ms"`, or an integer or float count of seconds). Written back
/// as a string that [`parse_duration()`] reads again (`humantime`'s form, e.g. `1h 30m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DurationValue(pub Duration);

impl FromStr for DurationValue {
    type Err = BadValue;
    fn from_str(s: &str) -> Result<Self, BadValue> {
        parse_duration(s).map(DurationValue)
    }
}

impl fmt::Display for DurationValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for DurationValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: seconds, or a string like \"500ms\", \"5s\", \"1h\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationValue, E> {
                Ok(DurationValue(Duration::from_secs(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationValue, E> {
                u64::try_from(v)
                    .map(|v| DurationValue(Duration::from_secs(v)))
                    .map_err(|_| E::custom(std::format!("a duration cannot be negative ({v})")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<DurationValue, E> {
                Duration::try_from_secs_f64(v)
                    .map(DurationValue)
                    .map_err(|e| E::custom(std::format!("{v} is not a duration: {e}")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationValue, E> {
                parse_duration(v).map(DurationValue).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_units_like_before() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KB"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65_536));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size(" 8 "), Ok(8));
        for bad in ["", "K", "4X", "-1", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        let d: DurationValue = "1h 30m".parse().unwrap();
        assert_eq!(d.to_string().parse::<DurationValue>(), Ok(d));
        for bad in ["", "s", "5x", "-3", "1.2.3"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_size_in_a_file_is_an_integer_or_a_string() {
        #[derive(Debug, Deserialize, Serialize)]
        struct F {
            a: ByteSize,
            b: ByteSize,
        }
        let f: F = toml::from_str("a = 4096\nb = \"64K\"\n").unwrap();
        assert_eq!((f.a, f.b), (ByteSize(4096), ByteSize(65_536)));
        assert_eq!(toml::to_string(&f).unwrap(), "a = 4096\nb = 65536\n");
        let e = toml::from_str::<F>("a = \"4X\"\nb = 1\n").unwrap_err();
        assert!(e.to_string().contains("4X"), "{e}");
        assert!(toml::from_str::<F>("a = -1\nb = 1\n").is_err());
        assert_eq!("2M".parse::<ByteSize>(), Ok(ByteSize(2 << 20)));
        // Past what a TOML integer holds, it goes through a file layer as a string.
        let big = F {
            a: ByteSize(u64::MAX),
            b: ByteSize(1),
        };
        let back: F = toml::from_str(&toml::to_string(&big).unwrap()).unwrap();
        assert_eq!(back.a, ByteSize(u64::MAX));
        assert_eq!(
            ByteSize(5 << 30).to_u32("--size").unwrap_err(),
            "--size: 5368709120 bytes is too large"
        );
    }
}

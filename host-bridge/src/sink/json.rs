//! The JSON line format of the file sink and of `tail --format json`: [`JsonRecord`], the
//! format's definition as a struct, and [`JsonPayload`], how a payload is written (raw
//! JSON only when JSON readers take it as it is: [`is_portable_json`]; else a UTF-8 or
//! base64 string).

use std::borrow::Cow;

use base64::Engine as _;
use serde::Serialize;

use super::{Source, rfc3339_us};
use crate::client::{OwnedRecord, log_id_hex};

/// One output record as JSON, with exactly the keys of the file sink: the format's
/// definition as a struct. The file sink and `tail --format json` write it with
/// [`LineWriter`](super::LineWriter), whose lines its tests check against this struct's.
#[derive(Debug, Serialize)]
pub struct JsonRecord<'a> {
    /// The gateway's configured id.
    pub gateway_id: &'a str,
    /// The gateway's log id, 32 hex digits.
    pub log_id: Cow<'a, str>,
    /// Offset in the gateway's log.
    pub offset: u64,
    /// Topic.
    pub topic: &'a str,
    /// RFC 3339 UTC with microseconds, always a string: a `timestamp_us` past the end of
    /// year 9999 (RFC 3339's range) is shown as the largest representable time,
    /// [`MAX_RFC3339`](super::MAX_RFC3339); `timestamp_us` keeps the exact value.
    pub timestamp: String,
    /// µs since the Unix epoch.
    pub timestamp_us: u64,
    /// The payload (see [`JsonPayload`]).
    pub payload: JsonPayload<'a>,
    /// `json`, `utf8` or `base64` (see [`JsonPayload`]).
    pub payload_encoding: &'static str,
}

/// A payload as the file sink writes it, in this order of preference:
///
/// - `json`: a payload that is one JSON object or array (RFC 8259) on one line (no CR or
///   LF byte in it) that `serde_json` reads with its default limits, also inside the line
///   ([`is_portable_json`]: at most [`MAX_JSON_DEPTH`] levels of nesting, every number
///   finite as an `f64`, no lone UTF-16 surrogate in a `\u` escape) is written as that JSON value, byte for byte as received:
///   not parsed and written again, so a downstream hash of the payload still holds;
/// - `utf8`: other UTF-8 text, as a JSON string (so also JSON that common readers refuse or
///   change, such as `{"a":"\ud800"}`, `[1e400]` or 2,000 nested arrays);
/// - `base64`: anything else, standard base64 with padding (RFC 4648 §4), as a string.
#[derive(Debug)]
pub enum JsonPayload<'a> {
    /// A JSON object or array, written as it is: the payload's text, checked by
    /// [`is_portable_json`].
    Json(&'a str),
    /// A string: `utf8` (the payload itself) or `base64`.
    Text(Cow<'a, str>),
}

impl Serialize for JsonPayload<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            // Read again only to hand the text to the serializer as raw JSON (this path
            // is the format's reference; the sink's lines come from `LineWriter`).
            JsonPayload::Json(text) => serde_json::from_str::<&serde_json::value::RawValue>(text)
                .map_err(serde::ser::Error::custom)?
                .serialize(serializer),
            JsonPayload::Text(text) => serializer.serialize_str(text),
        }
    }
}

/// Levels of nesting a `json` payload may have (`[[1]]` has 2): the sink's line holds the
/// payload one level down, and `serde_json` reads at most 127 levels by default (its
/// recursion limit, 128), so that every line reads with it.
pub const MAX_JSON_DEPTH: usize = 126;

/// True if `text` is one JSON value that `serde_json` reads into a `serde_json::Value`
/// with its default settings also when a sink's line holds it: nesting at most
/// [`MAX_JSON_DEPTH`] levels, every number finite as an `f64` (`1e400` is refused, not
/// read as infinity), strings without a lone UTF-16 surrogate escape (`"\ud800"`) or a
/// raw control character, nothing after the value. JSON readers (`jq`, Python's `json`,
/// `serde_json`) take such a value as it is. A number beyond an `f64`'s 53-bit precision
/// (a 20-digit integer) passes and is written as received; a reader that holds numbers as
/// `f64` rounds it.
///
/// One pass through `serde_json`'s parser that builds nothing: strings without escapes are
/// borrowed, not copied.
pub fn is_portable_json(text: &str) -> bool {
    let mut de = serde_json::Deserializer::from_str(text);
    let any = AnyJson {
        levels: MAX_JSON_DEPTH,
    };
    serde::de::DeserializeSeed::deserialize(any, &mut de)
        .and_then(|()| de.end())
        .is_ok()
}

/// Any JSON value with at most `levels` levels of nesting, read through `deserialize_any`
/// (which, unlike `deserialize_ignored_any`, checks numbers and escapes as reading a
/// `serde_json::Value` does) and dropped.
#[derive(Debug, Clone, Copy)]
struct AnyJson {
    /// Levels of arrays and objects the value may still open.
    levels: usize,
}

impl AnyJson {
    /// The seed of an element or member value of an array or object read with `self`.
    fn inner<E: serde::de::Error>(self) -> Result<AnyJson, E> {
        match self.levels.checked_sub(1) {
            Some(levels) => Ok(AnyJson { levels }),
            None => Err(E::custom(format_args!(
                "nested deeper than {MAX_JSON_DEPTH} levels"
            ))),
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for AnyJson {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for AnyJson {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        // serde_json refuses an overflowing number itself; checked again so that the rule
        // does not hang on that.
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("number out of range"))
        }
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        while map.next_key_seed(inner)?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

impl<'a> JsonPayload<'a> {
    /// The payload of `bytes` and its `payload_encoding`.
    pub fn new(bytes: &'a [u8]) -> (Self, &'static str) {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return (
                JsonPayload::Text(Cow::Owned(
                    base64::engine::general_purpose::STANDARD.encode(bytes),
                )),
                "base64",
            );
        };
        let framed = matches!(
            (text.as_bytes().first(), text.as_bytes().last()),
            (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']'))
        );
        if framed && !text.contains(['\n', '\r']) && is_portable_json(text) {
            return (JsonPayload::Json(text), "json");
        }
        (JsonPayload::Text(Cow::Borrowed(text)), "utf8")
    }
}

impl<'a> JsonRecord<'a> {
    /// Builds the JSON form of `rec`.
    pub fn new(src: &'a Source, rec: &'a OwnedRecord) -> Self {
        JsonRecord::with_log_id(src, Cow::Owned(log_id_hex(src.log_id)), rec)
    }

    /// [`JsonRecord::new`] with `src`'s log id already in hex (`log_id_hex`), so that a
    /// batch formats it once.
    pub fn with_log_id(src: &'a Source, log_id: Cow<'a, str>, rec: &'a OwnedRecord) -> Self {
        let (payload, payload_encoding) = JsonPayload::new(&rec.payload);
        JsonRecord {
            gateway_id: &src.gateway_id,
            log_id,
            offset: rec.offset,
            topic: &rec.topic,
            timestamp: rfc3339_us(rec.timestamp_us),
            timestamp_us: rec.timestamp_us,
            payload,
            payload_encoding,
        }
    }

    /// Appends the line of JSON, newline included, to `out`.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        // Serializing a struct of strings and integers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, self);
        out.push(b'\n');
    }

    /// One line of JSON, newline included.
    pub fn to_line(&self) -> String {
        // Serializing a struct of strings and integers cannot fail.
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

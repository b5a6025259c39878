//! The file sink's JSON lines made fast: [`LineWriter`] appends the bytes
//! [`JsonRecord::write_line`](super::JsonRecord::write_line) would, without building a
//! `JsonRecord` per record. The keys and values that stay the same from record to record
//! are serialized once: the gateway id and log id once per writer, the topic once per run
//! of records of one topic, the timestamp's date and time of day once per second
//! ([`Rfc3339`]). What changes per record (offset, microseconds, `timestamp_us`, the
//! payload) is written by `serde_json` as the struct's serializer writes it.

use std::borrow::Cow;

use super::{JsonPayload, MAX_RFC3339, Source};
use crate::client::{OwnedRecord, Topic, log_id_hex};

/// Length of an RFC 3339 time as [`Rfc3339::format`] writes it (`2023-11-14T22:13:20.000000Z`,
/// and [`MAX_RFC3339`]), bytes.
const RFC3339_LEN: usize = 27;
/// Where the microseconds begin in it.
const MICROS_AT: usize = 20;

/// Formats µs since the Unix epoch as RFC 3339 UTC with 6 fractional digits, as
/// [`rfc3339_us`](super::rfc3339_us) does, without allocating: the date and time of day
/// are computed (by the `time` crate) only when the second differs from the previous
/// call's, else only the microseconds are written again.
#[derive(Debug, Clone)]
pub struct Rfc3339 {
    /// The second since the epoch `text` holds; `None` before the first call.
    second: Option<u64>,
    /// That second is past year 9999: `text` is [`MAX_RFC3339`] whatever the microseconds.
    clamped: bool,
    /// The last time formatted (ASCII).
    text: [u8; RFC3339_LEN],
}

impl Default for Rfc3339 {
    fn default() -> Self {
        Rfc3339 {
            second: None,
            clamped: false,
            text: [b'0'; RFC3339_LEN],
        }
    }
}

/// Writes `n` (below 10^width) as `width` decimal digits with leading zeros into `out`.
fn digits(out: &mut [u8], mut n: u32) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

impl Rfc3339 {
    /// `us` (µs since the Unix epoch) as `YYYY-MM-DDTHH:MM:SS.ffffffZ`; a time past year
    /// 9999 is [`MAX_RFC3339`]. Always 27 ASCII bytes.
    pub fn format(&mut self, us: u64) -> &str {
        // Only ASCII digits and separators are ever written.
        std::str::from_utf8(self.format_ascii(us)).unwrap_or(MAX_RFC3339)
    }

    /// [`Rfc3339::format`] as its 27 ASCII bytes, for a writer of bytes: without the UTF-8
    /// check of each call (3% of a file drain's CPU when every line took it).
    pub fn format_ascii(&mut self, us: u64) -> &[u8; RFC3339_LEN] {
        let second = us / 1_000_000;
        if self.second != Some(second) {
            self.second = Some(second);
            let t = i64::try_from(second)
                .ok()
                .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
                .filter(|t| t.year() <= 9999);
            match t {
                Some(t) => {
                    self.clamped = false;
                    let x = &mut self.text;
                    // The year is at least 1970: four digits.
                    digits(&mut x[0..4], t.year().unsigned_abs());
                    x[4] = b'-';
                    digits(&mut x[5..7], u32::from(u8::from(t.month())));
                    x[7] = b'-';
                    digits(&mut x[8..10], u32::from(t.day()));
                    x[10] = b'T';
                    digits(&mut x[11..13], u32::from(t.hour()));
                    x[13] = b':';
                    digits(&mut x[14..16], u32::from(t.minute()));
                    x[16] = b':';
                    digits(&mut x[17..19], u32::from(t.second()));
                    x[19] = b'.';
                    x[26] = b'Z';
                }
                None => {
                    self.clamped = true;
                    self.text.copy_from_slice(MAX_RFC3339.as_bytes());
                }
            }
        }
        if !self.clamped {
            digits(
                &mut self.text[MICROS_AT..MICROS_AT + 6],
                (us % 1_000_000) as u32,
            );
        }
        &self.text
    }
}

/// Appends records' JSON lines for one [`Source`], byte for byte what
/// [`JsonRecord::write_line`](super::JsonRecord::write_line) appends (see the module doc).
#[derive(Debug)]
pub struct LineWriter {
    /// `{"gateway_id":…,"log_id":…,"offset":`
    head: Vec<u8>,
    /// The topic `topic_keys` is for; `None` before the first record.
    topic: Option<Topic>,
    /// `,"topic":…,"timestamp":"`
    topic_keys: Vec<u8>,
    /// The timestamp's text.
    time: Rfc3339,
}

impl LineWriter {
    /// A writer for the records of `src`.
    pub fn new(src: &Source) -> Self {
        let mut head = Vec::with_capacity(96);
        head.extend_from_slice(b"{\"gateway_id\":");
        // Serializing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut head, &src.gateway_id);
        head.extend_from_slice(b",\"log_id\":");
        let _ = serde_json::to_writer(&mut head, &log_id_hex(src.log_id));
        head.extend_from_slice(b",\"offset\":");
        LineWriter {
            head,
            topic: None,
            topic_keys: Vec::with_capacity(64),
            time: Rfc3339::default(),
        }
    }

    /// Appends the line of `rec`, newline included, to `out`.
    pub fn write(&mut self, rec: &OwnedRecord, out: &mut Vec<u8>) {
        if self.topic.as_ref() != Some(&rec.topic) {
            self.topic_keys.clear();
            self.topic_keys.extend_from_slice(b",\"topic\":");
            let _ = serde_json::to_writer(&mut self.topic_keys, &rec.topic);
            self.topic_keys.extend_from_slice(b",\"timestamp\":\"");
            self.topic = Some(rec.topic.clone());
        }
        out.extend_from_slice(&self.head);
        // Serializing integers and strings into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &rec.offset);
        out.extend_from_slice(&self.topic_keys);
        out.extend_from_slice(self.time.format_ascii(rec.timestamp_us));
        out.extend_from_slice(b"\",\"timestamp_us\":");
        let _ = serde_json::to_writer(&mut *out, &rec.timestamp_us);
        out.extend_from_slice(b",\"payload\":");
        let p = &rec.payload[..];
        let framed = matches!(
            (p.first(), p.last()),
            (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']'))
        );
        let encoding = if !framed && is_plain(p, false) {
            // Printable ASCII with nothing to escape (what most text payloads are): valid
            // UTF-8, not a JSON object or array, so `utf8`, copied between quotes. One
            // pass instead of the UTF-8 check and the escape scan.
            quoted(p, out);
            "utf8"
        } else {
            let (payload, encoding) = JsonPayload::new(p);
            match payload {
                JsonPayload::Json(raw) => out.extend_from_slice(raw.as_bytes()),
                JsonPayload::Text(Cow::Borrowed(s)) => json_string(s, out),
                JsonPayload::Text(Cow::Owned(s)) => {
                    let _ = serde_json::to_writer(&mut *out, &s);
                }
            }
            encoding
        };
        out.extend_from_slice(b",\"payload_encoding\":\"");
        out.extend_from_slice(encoding.as_bytes());
        out.extend_from_slice(b"\"}\n");
    }
}

/// Appends `s` as a JSON string. Text with nothing to escape (no control character, `"`
/// or `\`, which is what most sensor payloads are) is copied between quotes in one pass;
/// the rest goes through `serde_json`, whose escaping this equals byte for byte (RFC 8259
/// section 7 asks no more).
fn json_string(s: &str, out: &mut Vec<u8>) {
    if is_plain(s.as_bytes(), true) {
        quoted(s.as_bytes(), out);
    } else {
        // Serializing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// True if no byte of `bytes` is a control character (below 0x20), `"` or `\\`, nor, unless
/// `high` allows them, above 0x7F: text a JSON string holds as it is. Branch-free over
/// chunks of 64 bytes (the compiler vectorizes it), stopping at the first chunk with such
/// a byte.
fn is_plain(bytes: &[u8], high: bool) -> bool {
    let top = if high { 0xFF } else { 0x7F };
    bytes.chunks(64).all(|c| {
        c.iter().fold(true, |ok, &b| {
            ok & (b >= 0x20) & (b <= top) & (b != b'"') & (b != b'\\')
        })
    })
}

/// Appends `bytes` between quotes (text [`is_plain`] passed).
fn quoted(bytes: &[u8], out: &mut Vec<u8>) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    out.extend_from_slice(bytes);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::JsonRecord;

    /// The formatter of earlier versions, kept as the reference.
    fn reference(us: u64) -> String {
        let Ok(t) = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000) else {
            return MAX_RFC3339.to_string();
        };
        if t.year() > 9999 {
            return MAX_RFC3339.to_string();
        }
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.microsecond()
        )
    }

    #[test]
    fn rfc3339_matches_the_reference() {
        let last = 253_402_300_799_999_999u64; // the last µs of year 9999
        let mut stamps: Vec<u64> = vec![
            0,
            1,
            999_999,
            1_000_000,
            1_700_000_000_000_000,
            951_782_400_000_000, // 2000-02-29
            last - 1,
            last,
            last + 1,
            u64::MAX,
            u64::MAX - 1,
            (i64::MAX as u64) + 5,
        ];
        // A walk in steps that stay in a second, cross seconds, days and years, and go back.
        let mut x = 1_699_999_990_000_000u64;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            x = match rng % 5 {
                0 => x + rng % 1000,
                1 => x + rng % 3_000_000,
                2 => x.saturating_sub(rng % 2_000_000),
                3 => x + rng % 400_000_000_000,
                _ => rng % (last + 10_000_000),
            };
            stamps.push(x);
        }
        let mut f = Rfc3339::default();
        for us in stamps {
            assert_eq!(f.format(us), reference(us), "{us}");
            assert_eq!(crate::sink::rfc3339_us(us), reference(us), "{us}");
        }
    }

    fn rec(offset: u64, topic: &str, timestamp_us: u64, payload: &[u8]) -> OwnedRecord {
        OwnedRecord {
            offset,
            record_crc: 0,
            topic: topic.into(),
            timestamp_us,
            producer: None,
            payload: bytes::Bytes::copy_from_slice(payload),
        }
    }

    /// Every kind of payload, topic and gateway id: the same bytes as `JsonRecord`.
    /// The fast path of `json_string` writes what serde_json writes, for every ASCII
    /// character alone and inside text, and for text beyond ASCII.
    #[test]
    fn json_strings_match_serde_json() {
        let mut cases: Vec<String> = (0u8..0x80)
            .flat_map(|b| {
                let c = char::from(b);
                [c.to_string(), format!("ab{c}cd"), format!("{c}{c}")]
            })
            .collect();
        cases.extend(
            [
                "",
                "héllo wörld",
                "日本",
                "\u{7f}\u{80}\u{2028}\u{fffd}",
                "0123 xxxx",
            ]
            .map(String::from),
        );
        for s in cases {
            let mut ours = Vec::new();
            json_string(&s, &mut ours);
            assert_eq!(ours, serde_json::to_vec(&s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn lines_match_json_record() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let payloads: [&[u8]; 22] = [
            b"",
            b"{not json}",
            b"[1,2",
            b"plain \x7f del, printable ~ text of 70 bytes or more, past one chunk of 64: ok",
            b"plain text with a quote \" past the first chunk of 64 bytes......... here",
            b"21.5",
            b"0000000001 xxxxxxxx",
            br#"{ "t" : 21.50, "b":1e2,"a":[1, 2] }"#,
            b"[1,2]",
            b"{\"a\":\n1}",
            b"{\"a\":1",
            b"quote \" backslash \\ tab \t nul \0 del \x7f",
            "ünïcödé \u{2028} \u{1F600}".as_bytes(),
            &[0xff, 0x00, 0x01],
            &[0xc3],
            b"\x1b[0m\r\n",
            b"{}",
            b"[\"\\u0000\"]",
            br#"{"a":"\ud800"}"#,
            b"[1e400]",
            br#"{"a":"\ud83d\ude00"}"#,
            deep.as_bytes(),
        ];
        let topics = ["bench/sst", "t", "", "a\"b\\c\u{1}", "ü/€"];
        for gateway_id in ["gw-1", "", "g\"w\n\u{7f}é"] {
            for log_id in [0u128, 0xAB, u128::MAX] {
                let src = Source {
                    gateway_id: gateway_id.into(),
                    log_id,
                };
                let mut w = LineWriter::new(&src);
                let (mut ours, mut theirs) = (Vec::new(), Vec::new());
                let mut n = 0u64;
                for (i, p) in payloads.iter().enumerate() {
                    for (j, t) in topics.iter().enumerate() {
                        for ts in [
                            1_700_000_000_000_000 + (i * 7 + j) as u64 * 400_000,
                            u64::MAX,
                        ] {
                            n += 1;
                            let r = rec(n * 1_000_003, t, ts, p);
                            w.write(&r, &mut ours);
                            JsonRecord::new(&src, &r).write_line(&mut theirs);
                            assert_eq!(
                                String::from_utf8_lossy(&ours),
                                String::from_utf8_lossy(&theirs)
                            );
                        }
                    }
                }
                let r = rec(u64::MAX, "t", 0, b"x");
                w.write(&r, &mut ours);
                JsonRecord::new(&src, &r).write_line(&mut theirs);
                assert_eq!(ours, theirs);
            }
        }
    }
}

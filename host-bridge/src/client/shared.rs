//! A fetched record's topic and payload, shared: the records of one reply keep their
//! payloads in one buffer and their topic in one string per run of records of one topic,
//! so a fetch allocates a few times per reply instead of twice per record.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A record's topic: a string shared by the records of a reply that have it (cloning
/// costs a reference count). Compares, hashes and prints as its text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(Arc<str>);

impl Topic {
    /// The topic's text.
    #[inline]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Topic {
    fn default() -> Self {
        Topic::from("")
    }
}

impl Deref for Topic {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Topic {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Topic {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Topic {
    fn from(s: &str) -> Self {
        Topic(Arc::from(s))
    }
}

impl From<String> for Topic {
    fn from(s: String) -> Self {
        Topic(Arc::from(s))
    }
}

impl From<Topic> for String {
    fn from(t: Topic) -> Self {
        t.0.to_string()
    }
}

impl PartialEq<str> for Topic {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Topic {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for Topic {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Topic> for str {
    fn eq(&self, other: &Topic) -> bool {
        *self == *other.0
    }
}

impl PartialEq<Topic> for &str {
    fn eq(&self, other: &Topic) -> bool {
        **self == *other.0
    }
}

impl PartialEq<Topic> for String {
    fn eq(&self, other: &Topic) -> bool {
        **self == *other.0
    }
}

impl serde::Serialize for Topic {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A record's payload: a range of a buffer shared by the records of the reply that
/// brought it (cloning costs a reference count; the buffer lives while any of them
/// does). Compares, hashes and prints as its bytes.
#[derive(Clone)]
pub struct Payload {
    buf: Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl Payload {
    /// The payload `buf[range]`, sharing `buf`. A range outside `buf` is cut to it.
    pub fn shared(buf: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Self {
        let end = range.end.min(buf.len());
        Payload {
            buf: buf.clone(),
            start: range.start.min(end),
            end,
        }
    }

    /// The payload's bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // `start <= end <= buf.len()` always (see `shared`).
        self.buf.get(self.start..self.end).unwrap_or_default()
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload::from(Vec::new())
    }
}

impl Deref for Payload {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Payload {
    #[inline]
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for Payload {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl std::hash::Hash for Payload {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h);
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Payload {}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        let end = v.len();
        Payload {
            buf: Arc::new(v),
            start: 0,
            end,
        }
    }
}

impl From<&[u8]> for Payload {
    fn from(s: &[u8]) -> Self {
        Payload::from(s.to_vec())
    }
}

impl<const N: usize> From<&[u8; N]> for Payload {
    fn from(s: &[u8; N]) -> Self {
        Payload::from(s.to_vec())
    }
}

impl PartialEq<[u8]> for Payload {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<&[u8]> for Payload {
    fn eq(&self, other: &&[u8]) -> bool {
        self.as_slice() == *other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Payload {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.as_slice() == other
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for Payload {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.as_slice() == *other
    }
}

impl PartialEq<Vec<u8>> for Payload {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Payload> for Vec<u8> {
    fn eq(&self, other: &Payload) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl PartialEq<Payload> for [u8] {
    fn eq(&self, other: &Payload) -> bool {
        self == other.as_slice()
    }
}

impl PartialEq<Payload> for &[u8] {
    fn eq(&self, other: &Payload) -> bool {
        *self == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_payloads_are_their_ranges() {
        let buf = Arc::new(b"abcdef".to_vec());
        let p = Payload::shared(&buf, 1..3);
        assert_eq!(p, b"bc");
        assert_eq!(p.len(), 2);
        assert_eq!(Payload::shared(&buf, 4..99), b"ef");
        assert_eq!(Payload::shared(&buf, 9..99), b"");
        assert_eq!(Payload::from(b"bc".to_vec()), p);
        assert_eq!(format!("{p:?}"), format!("{:?}", b"bc".as_slice()));
        let t = Topic::from("buoy/sst");
        assert_eq!(t, "buoy/sst");
        assert_eq!("buoy/sst", t);
        assert_eq!(t.to_string(), "buoy/sst");
        assert_eq!(format!("{t:?}"), "\"buoy/sst\"");
    }
}

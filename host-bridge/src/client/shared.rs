//! A fetched record's topic, shared: the records of one reply keep their topic in one
//! string per run of records of one topic, and their payloads in one buffer (a
//! [`Bytes`](bytes::Bytes) frozen once per reply, of which each record's payload is a
//! slice), so a fetch allocates a few times per reply instead of twice per record.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_their_text() {
        let t = Topic::from("buoy/sst");
        assert_eq!(t, "buoy/sst");
        assert_eq!("buoy/sst", t);
        assert_eq!(t.to_string(), "buoy/sst");
        assert_eq!(format!("{t:?}"), "\"buoy/sst\"");
    }
}

//! librdkafka properties passed through to the Kafka sink: `drain -X KEY=VALUE`
//! (repeatable) and the `[kafka]` table of the config file, the way kcat takes them.
//!
//! The table is read first and the `-X` flags go over it, in order: a later value of a key
//! replaces an earlier one. The properties are set on the producer after the bridge's own
//! settings (so `linger.ms`, `compression.type`, `message.timeout.ms`, ... can be changed)
//! and on the consumer that reads the partition tails at start (so `security.protocol`,
//! `sasl.*` and `ssl.*` reach both).
//!
//! Refused, because the effectively-once guarantee depends on the bridge's values (the
//! idempotent producer, `acks=all`, at most 5 requests in flight, no transactions):
//! [`REFUSED`]. Values of secret properties ([`is_secret`]: passwords, private keys, OAuth
//! secrets) never appear in a log line, an error message or `Debug` output.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Properties the bridge sets itself and refuses to take (with their librdkafka aliases).
pub const REFUSED: &[&str] = &[
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "transactional.id",
];

/// True for a property whose value is a secret: it is shown as `<redacted>`.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "key.pem",
        "ssl_key",
        "oauthbearer.config",
        "token",
        "jaas",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// A `[kafka]` table value: TOML strings, integers, floats and booleans are all given to
/// librdkafka as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PropertyValue {
    /// A string.
    Text(String),
    /// An integer.
    Integer(i64),
    /// A float.
    Float(f64),
    /// A boolean (`true` / `false`).
    Bool(bool),
}

impl Eq for PropertyValue {}

impl std::fmt::Display for PropertyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PropertyValue::Text(s) => f.write_str(s),
            PropertyValue::Integer(v) => write!(f, "{v}"),
            PropertyValue::Float(v) => write!(f, "{v}"),
            PropertyValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// Why a property cannot be used (exit code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropertyError {
    /// A `-X` argument without `=` (shown only when it cannot hold a secret).
    #[error("-X {shown}: expected KEY=VALUE (a librdkafka property)")]
    Malformed {
        /// The argument, or `<redacted>`.
        shown: String,
    },
    /// An empty key.
    #[error("a Kafka property needs a name (got \"={}\")", if *.secret { "<redacted>" } else { .value.as_str() })]
    EmptyKey {
        /// The value.
        value: String,
        /// Whether it looks like a secret.
        secret: bool,
    },
    /// A property the guarantee depends on.
    #[error(
        "Kafka property {key:?} is set by the bridge and cannot be changed: the effectively-once delivery depends on the idempotent producer with acks=all, at most 5 requests in flight and no transactions (refused: {})",
        REFUSED.join(", ")
    )]
    Refused {
        /// The key.
        key: String,
    },
}

/// The properties, by key (a later value replaces an earlier one).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(BTreeMap<String, String>);

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, Self::shown(k, v))))
            .finish()
    }
}

impl KafkaProperties {
    /// The `[kafka]` table (if any), then the `-X KEY=VALUE` arguments over it.
    ///
    /// # Errors
    /// A malformed argument, an empty key or a refused key ([`PropertyError`]).
    pub fn from_table_and_flags(
        table: Option<&BTreeMap<String, PropertyValue>>,
        flags: &[String],
    ) -> Result<Self, PropertyError> {
        let mut p = KafkaProperties::default();
        for (k, v) in table.into_iter().flatten() {
            p.set(k.trim(), &v.to_string())?;
        }
        for arg in flags {
            let Some((k, v)) = arg.split_once('=') else {
                return Err(PropertyError::Malformed {
                    shown: if is_secret(arg) {
                        "<redacted>".into()
                    } else {
                        arg.clone()
                    },
                });
            };
            let k = k.trim();
            if is_secret(k) {
                log::warn!(
                    "Kafka property {k} given with -X: command lines are visible to other users of this machine (ps); put it in the [kafka] table of the --config file instead"
                );
            }
            p.set(k, v)?;
        }
        Ok(p)
    }

    /// Sets `key` to `value`, unless refused.
    ///
    /// # Errors
    /// An empty or refused key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), PropertyError> {
        if key.is_empty() {
            return Err(PropertyError::EmptyKey {
                value: value.into(),
                secret: is_secret(value),
            });
        }
        if REFUSED.contains(&key.to_ascii_lowercase().as_str()) {
            return Err(PropertyError::Refused { key: key.into() });
        }
        self.0.insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// The properties, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// No property given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `value` as it may be shown for `key`: `<redacted>` for a secret.
    pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
        if is_secret(key) { "<redacted>" } else { value }
    }

    /// `text` with every secret value replaced by `<redacted>` (for messages that may quote
    /// a value, such as librdkafka's configuration errors).
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (k, v) in &self.0 {
            if is_secret(k) && !v.is_empty() {
                out = out.replace(v.as_str(), "<redacted>");
            }
        }
        out
    }

    /// `key=value, ...` with secrets redacted, for a log line.
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={}", Self::shown(k, v)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_go_over_the_table_and_refused_keys_are_refused() {
        let mut t = BTreeMap::new();
        t.insert("linger.ms".to_string(), PropertyValue::Integer(20));
        t.insert(
            "compression.type".to_string(),
            PropertyValue::Text("gzip".into()),
        );
        t.insert(
            "socket.nagle.disable".to_string(),
            PropertyValue::Bool(true),
        );
        let p = KafkaProperties::from_table_and_flags(
            Some(&t),
            &["compression.type=lz4".into(), "batch.size=1000000".into()],
        )
        .unwrap();
        assert_eq!(p.get("compression.type"), Some("lz4"));
        assert_eq!(p.get("linger.ms"), Some("20"));
        assert_eq!(p.get("socket.nagle.disable"), Some("true"));
        assert_eq!(p.get("batch.size"), Some("1000000"));
        for k in REFUSED {
            let e = KafkaProperties::from_table_and_flags(None, &[format!("{k}=1")]).unwrap_err();
            assert_eq!(e, PropertyError::Refused { key: k.to_string() });
            let mut t = BTreeMap::new();
            t.insert(k.to_uppercase(), PropertyValue::Text("x".into()));
            assert!(KafkaProperties::from_table_and_flags(Some(&t), &[]).is_err());
        }
        assert!(matches!(
            KafkaProperties::from_table_and_flags(None, &["linger.ms".into()]),
            Err(PropertyError::Malformed { .. })
        ));
    }

    #[test]
    fn secrets_are_never_shown() {
        let p = KafkaProperties::from_table_and_flags(
            None,
            &[
                "sasl.password=hunter2".into(),
                "ssl.key.password=k3y".into(),
                "sasl.username=alice".into(),
            ],
        )
        .unwrap();
        let dbg = format!("{p:?}");
        let sum = p.summary();
        for shown in [&dbg, &sum] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("k3y"),
                "{shown}"
            );
            assert!(shown.contains("alice"), "{shown}");
        }
        assert_eq!(
            p.redact("Invalid value \"hunter2\" for sasl.password"),
            "Invalid value \"<redacted>\" for sasl.password"
        );
        let e = KafkaProperties::from_table_and_flags(None, &["sasl.password:hunter2".into()])
            .unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}

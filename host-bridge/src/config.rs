//! The `--config FILE` TOML file: every setting of the command line, flat, in kebab-case,
//! all optional. Flags given on the command line override the file; the file overrides the
//! built-in defaults. Unknown keys are an error (exit code 2), and so is a value of the wrong
//! type (the message names the key). [`FileConfig`] is both the file's shape and the result
//! of laying a subcommand's flags over it ([`FileConfig::with_flags`]).
//!
//! ```toml
//! gateway = "tcp://127.0.0.1:7878"     # all subcommands; drain, status and consumers
//!                                      # also take a list: ["tcp://gw1:7878", "tcp://gw2:7878"]
//! state = "./spillway-bridge.redb"     # drain, status
//! sink = "file:./spillway-out"         # drain
//! consumer = "bridge"
//! from = "earliest"                    # drain, tail: earliest | latest | OFFSET | -N | TIME
//! once = false
//! retry-for = "5m"                     # drain, publish, tail: give up after this without progress
//! topic = "buoy/sst"                   # publish (tail's --topic filters are flags only)
//! ack = "durable"                      # publish: none | buffered | durable
//! producer-id = 42                     # publish: a number from 0 to 9223372036854775807
//! timestamp-field = "ts"               # publish
//! follow = false                       # tail
//! count = 100                          # tail
//! format = "json"                      # tail: json | raw | a template such as "%t %s\n"
//! accept-new-log = false
//! metrics = "127.0.0.1:9185"
//! max-batch-bytes = "256K"             # bytes per fetch (an integer, or K/M/G = 1024)
//! prefetch = 4                         # batches fetched ahead of the sink
//! max-in-flight-batches = 8            # Kafka: batches awaiting delivery reports
//! checkpoint-interval = "1s"           # file sink: longest wait for a checkpoint; 0 = each fetch
//! checkpoint-bytes = "16M"             # file sink: payload bytes that make a checkpoint due
//! rotate-bytes = "64M"                 # file sink rotation size, bytes
//! rotate-interval = "1h"               # file sink: close files open this long; default none
//! partition-by-date = false            # file sink: files under YYYY-MM-DD/ (record time, UTC)
//! kafka-delivery-timeout-ms = 300000
//! kafka-resume-window = 10000          # the gateway's records read back at start; 0 = off
//! kafka-key = "gateway"                # gateway | gateway-topic
//! poll-wait-ms = 500                   # long poll at the end of the log, ms
//! backoff-initial-ms = 100
//! backoff-max-ms = 30000
//! reply-timeout-ms = 10000
//! shutdown-grace-ms = 30000
//! progress = "auto"                    # auto | log | off
//!
//! [kafka]                              # librdkafka properties, like drain -X KEY=VALUE
//! "compression.type" = "zstd"
//! "linger.ms" = 20
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
pub use spillway_core::cli::layer::ConfigError;
use spillway_core::cli::layer::layered;
use spillway_core::cli::units::{ByteSize, DurationValue};

use crate::sink::properties::PropertyValue;

/// A key that takes one string or a list of them (`gateway = "tcp://…"` or
/// `gateway = ["tcp://…", …]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One value.
    One(String),
    /// Several values.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The values, in order.
    pub fn list(&self) -> Vec<String> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// The `gateway` key: one gateway URI or several.
pub type Gateways = OneOrMany;

/// The `topic` key: `publish` takes one topic (`topic = "a/b"`); a list is read, and
/// refused by `publish` with a usage error.
pub type Topics = OneOrMany;

/// `publish --ack` (key `ack`): what the gateway acknowledges a record after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AckSetting {
    /// No acknowledgement (fire and forget).
    None,
    /// Once the record is in the gateway's RAM buffer.
    Buffered,
    /// Once the record is on flash.
    Durable,
}

impl From<AckSetting> for spillway_core::wire::AckLevel {
    fn from(a: AckSetting) -> Self {
        match a {
            AckSetting::None => Self::None,
            AckSetting::Buffered => Self::Buffered,
            AckSetting::Durable => Self::Durable,
        }
    }
}

/// The config file's contents.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    /// Gateway URI, or several (`drain`, `status`, `consumers`).
    pub gateway: Option<Gateways>,
    /// State file.
    pub state: Option<PathBuf>,
    /// Sink.
    pub sink: Option<String>,
    /// Consumer name.
    pub consumer: Option<String>,
    /// Start position.
    pub from: Option<String>,
    /// `--once`.
    pub once: Option<bool>,
    /// `drain` and `publish`: how long to retry without progress (`--retry-for`); `tail`
    /// (which has no flag for it) takes it too.
    pub retry_for: Option<DurationValue>,
    /// `publish --topic` (not tail's filters, which are flags only).
    pub topic: Option<Topics>,
    /// `publish --ack`.
    pub ack: Option<AckSetting>,
    /// `publish --producer-id`: a number (see [`producer_id`]).
    #[serde(default, with = "producer_id")]
    pub producer_id: Option<u64>,
    /// `publish --timestamp-field`.
    pub timestamp_field: Option<String>,
    /// `publish --max-record-bytes`: the longest line sent, bytes.
    pub max_record_bytes: Option<ByteSize>,
    /// `tail --follow`.
    pub follow: Option<bool>,
    /// `tail --count`.
    pub count: Option<u64>,
    /// `tail --format`: `json`, `raw` or a template.
    pub format: Option<String>,
    /// `--accept-new-log`.
    pub accept_new_log: Option<bool>,
    /// `--log-level`: error, warn, info (the default), debug or trace.
    pub log_level: Option<String>,
    /// Metrics listen address.
    pub metrics: Option<String>,
    /// Fetch budget, bytes.
    pub max_batch_bytes: Option<ByteSize>,
    /// Uplink cap, record payload bytes per second (`--max-bytes-per-sec`).
    pub max_bytes_per_sec: Option<ByteSize>,
    /// Prefetched batches.
    pub prefetch: Option<usize>,
    /// Batches in flight at a pipelined sink.
    pub max_in_flight_batches: Option<usize>,
    /// File sink: longest wait for a checkpoint (`--checkpoint-interval`).
    pub checkpoint_interval: Option<DurationValue>,
    /// File sink: payload bytes written that make a checkpoint due (`--checkpoint-bytes`).
    pub checkpoint_bytes: Option<ByteSize>,
    /// File sink rotation size, bytes.
    pub rotate_bytes: Option<ByteSize>,
    /// File sink: longest a file stays open.
    pub rotate_interval: Option<DurationValue>,
    /// File sink: files under `YYYY-MM-DD/`.
    pub partition_by_date: Option<bool>,
    /// Kafka delivery timeout, ms.
    pub kafka_delivery_timeout_ms: Option<u64>,
    /// Kafka resume scan window, records of the gateway's log.
    pub kafka_resume_window: Option<u64>,
    /// Kafka message key: `gateway` or `gateway-topic`.
    pub kafka_key: Option<String>,
    /// Long-poll wait, ms.
    pub poll_wait_ms: Option<u64>,
    /// First retry delay, ms.
    pub backoff_initial_ms: Option<u64>,
    /// Largest retry delay, ms.
    pub backoff_max_ms: Option<u64>,
    /// Reply timeout, ms.
    pub reply_timeout_ms: Option<u64>,
    /// Shutdown grace, ms.
    pub shutdown_grace_ms: Option<u64>,
    /// Progress mode.
    pub progress: Option<String>,
    /// The `[kafka]` table: librdkafka properties passed through (see
    /// [`crate::sink::properties`]); `drain -X` flags go over it.
    pub kafka: Option<BTreeMap<String, PropertyValue>>,
    /// CA certificates (PEM) a `tls://` gateway's certificate must chain to.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a gateway that verifies clients.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// File holding the token sent in the `Hello`.
    pub token_file: Option<PathBuf>,
}

impl FileConfig {
    /// The settings of config file `file` (if any) with the flags of `flags` over them:
    /// each key the flags serialize replaces the file's (leave out the flags that were not
    /// given, and mark the flags that are no config key `#[serde(skip)]`).
    ///
    /// # Errors
    /// The file cannot be read or parsed; the message names the file and the key.
    pub fn with_flags(file: Option<&Path>, flags: &impl Serialize) -> Result<Self, ConfigError> {
        layered(file, flags)
    }
}

/// A producer id in the file and in the flags laid over it. The ids are 0 to
/// 9223372036854775807 (`i64::MAX`): those from 2^63 up are the gateway's own
/// (`wire::GATEWAY_PRODUCER_BIT`). Any `u64` is read, an id above `i64::MAX` as a string of
/// digits (TOML integers are signed 64-bit), so that `publish` can refuse the gateway's ids
/// with a message that says why, naming the flag or the key. Use with
/// `#[serde(default, with = "producer_id")]` on an `Option<u64>`.
pub mod producer_id {
    use serde::de::{self, Deserializer, Unexpected, Visitor};
    use serde::ser::Serializer;

    /// Writes `v` as a TOML integer when it is one, else as a string of digits.
    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match *v {
            None => s.serialize_none(),
            Some(id) if i64::try_from(id).is_ok() => s.serialize_some(&id),
            Some(id) => s.serialize_some(&id.to_string()),
        }
    }

    /// Reads a non-negative integer or a string of digits up to `u64::MAX` (the caller
    /// refuses the ids from 2^63 up).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        struct Id;
        impl Visitor<'_> for Id {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a producer id: a number from 0 to 9223372036854775807")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
                Ok(v)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
                u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
                v.parse()
                    .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_any(Id).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_unknown_keys() {
        let c: FileConfig = toml::from_str(
            "gateway = \"tcp://h:1\"\nonce = true\naccept-new-log = true\nmax-batch-bytes = 10\n",
        )
        .unwrap();
        assert_eq!(c.gateway, Some(Gateways::One("tcp://h:1".into())));
        assert_eq!(c.once, Some(true));
        assert_eq!(c.accept_new_log, Some(true));
        assert_eq!(c.max_batch_bytes, Some(ByteSize(10)));
        let c: FileConfig =
            toml::from_str("max-batch-bytes = \"256K\"\nrotate-bytes = \"64M\"\n").unwrap();
        assert_eq!(c.max_batch_bytes, Some(ByteSize(256 << 10)));
        assert_eq!(c.rotate_bytes, Some(ByteSize(64 << 20)));
        let c: FileConfig =
            toml::from_str("rotate-interval = \"1h\"\npartition-by-date = true\n").unwrap();
        assert_eq!(
            c.rotate_interval,
            Some(DurationValue(std::time::Duration::from_secs(3600)))
        );
        assert_eq!(c.partition_by_date, Some(true));
        let c: FileConfig =
            toml::from_str("checkpoint-interval = 0.25\ncheckpoint-bytes = \"4M\"\n").unwrap();
        assert_eq!(
            c.checkpoint_interval,
            Some(DurationValue(std::time::Duration::from_millis(250)))
        );
        assert_eq!(c.checkpoint_bytes, Some(ByteSize(4 << 20)));
        let c: FileConfig = toml::from_str("log-level = \"debug\"\n").unwrap();
        assert_eq!(c.log_level.as_deref(), Some("debug"));
        let c: FileConfig = toml::from_str(
            "topic = \"t\"\nack = \"buffered\"\nproducer-id = 42\nretry-for = \"1m\"\ntimestamp-field = \"ts\"\n",
        )
        .unwrap();
        assert_eq!(c.topic, Some(Topics::One("t".into())));
        assert_eq!(c.ack, Some(AckSetting::Buffered));
        assert_eq!(c.producer_id, Some(42));
        // Every u64 id, the ones above i64::MAX as strings (TOML integers are signed).
        let big: FileConfig = toml::from_str("producer-id = \"18446744073709551615\"\n").unwrap();
        assert_eq!(big.producer_id, Some(u64::MAX));
        let flags = FileConfig {
            producer_id: Some(u64::MAX),
            ..FileConfig::default()
        };
        let merged: FileConfig = layered(None, &flags).unwrap();
        assert_eq!(merged.producer_id, Some(u64::MAX));
        assert_eq!(
            c.retry_for,
            Some(DurationValue(std::time::Duration::from_secs(60)))
        );
        for bad in [
            "ack = \"all\"\n",
            "producer-id = \"sensor-7\"\n",
            "producer-id = -1\n",
            "retry-for = \"soon\"\n",
        ] {
            let key = bad.split(' ').next().unwrap();
            let e = spillway_core::cli::layer::parse_file::<FileConfig>(Path::new("b.toml"), bad)
                .unwrap_err();
            assert!(e.to_string().contains(&format!("key `{key}`")), "{e}");
        }
        // The range a bad id is told is the ids a producer may take (from 2^63 up they
        // are the gateway's): it used to say up to 18446744073709551615.
        let e = spillway_core::cli::layer::parse_file::<FileConfig>(
            Path::new("b.toml"),
            "producer-id = \"sensor-7\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("from 0 to 9223372036854775807"), "{e}");
        assert!(!e.contains("18446744073709551615"), "{e}");
        let e = toml::from_str::<FileConfig>("rotate-interval = \"soon\"\n").unwrap_err();
        assert!(e.to_string().contains("rotate-interval"), "{e}");
        assert!(toml::from_str::<FileConfig>("gatway = \"x\"").is_err());
        let c: FileConfig = toml::from_str("gateway = [\"tcp://a:1\", \"unix:///b\"]\n").unwrap();
        assert_eq!(
            c.gateway.map(|g| g.list()),
            Some(vec!["tcp://a:1".to_string(), "unix:///b".to_string()])
        );
    }

    /// A flag given replaces its key; the file's other keys stay; a bad value names its key.
    #[test]
    fn flags_over_the_file() {
        #[derive(Serialize)]
        #[serde(rename_all = "kebab-case")]
        struct Flags {
            gateway: Option<String>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            once: bool,
            #[serde(skip)]
            _not_a_key: u8,
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.toml");
        std::fs::write(&p, "gateway = \"tcp://h:1\"\nonce = true\nprefetch = 9\n").unwrap();
        let flags = Flags {
            gateway: Some("unix:///g".into()),
            once: false,
            _not_a_key: 0,
        };
        let c = FileConfig::with_flags(Some(&p), &flags).unwrap();
        assert_eq!(c.gateway, Some(Gateways::One("unix:///g".into())));
        assert_eq!((c.once, c.prefetch), (Some(true), Some(9)));
        std::fs::write(&p, "prefetch = \"many\"\n").unwrap();
        let e = FileConfig::with_flags(Some(&p), &flags).unwrap_err();
        assert!(e.to_string().contains("key `prefetch`"), "{e}");
    }
}

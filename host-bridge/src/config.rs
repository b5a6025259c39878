//! The `--config FILE` TOML file: every setting of the command line, flat, in kebab-case,
//! all optional. Flags given on the command line override the file; the file overrides the
//! built-in defaults. Unknown keys are an error (exit code 2).
//!
//! ```toml
//! gateway = "tcp://127.0.0.1:7878"     # all subcommands
//! state = "./spillway-bridge.redb"     # drain, status
//! sink = "file:./spillway-out"         # drain
//! consumer = "bridge"
//! from = "earliest"                    # drain, tail: earliest | latest | OFFSET
//! once = false
//! accept-new-log = false
//! metrics = "127.0.0.1:9185"
//! max-batch-bytes = 262144             # bytes per fetch
//! prefetch = 4                         # batches fetched ahead of the sink
//! max-in-flight-batches = 4            # Kafka: batches awaiting delivery reports
//! rotate-bytes = 67108864              # file sink rotation size, bytes
//! kafka-delivery-timeout-ms = 300000
//! kafka-resume-window = 10000          # messages per partition read at start; 0 = off
//! poll-wait-ms = 500                   # long poll at the end of the log, ms
//! backoff-initial-ms = 100
//! backoff-max-ms = 30000
//! reply-timeout-ms = 10000
//! shutdown-grace-ms = 30000
//! progress = "auto"                    # auto | log | off
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The config file's contents.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileConfig {
    /// Gateway URI.
    pub gateway: Option<String>,
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
    /// `--accept-new-log`.
    pub accept_new_log: Option<bool>,
    /// Metrics listen address.
    pub metrics: Option<String>,
    /// Fetch budget, bytes.
    pub max_batch_bytes: Option<u32>,
    /// Prefetched batches.
    pub prefetch: Option<usize>,
    /// Batches in flight at a pipelined sink.
    pub max_in_flight_batches: Option<usize>,
    /// File sink rotation size, bytes.
    pub rotate_bytes: Option<u64>,
    /// Kafka delivery timeout, ms.
    pub kafka_delivery_timeout_ms: Option<u64>,
    /// Kafka resume scan window, messages per partition.
    pub kafka_resume_window: Option<u64>,
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
}

/// A config file that cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {why}")]
pub struct ConfigError {
    /// The file.
    pub path: String,
    /// What went wrong.
    pub why: String,
}

impl FileConfig {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let err = |why: String| ConfigError {
            path: path.display().to_string(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        toml::from_str(&text).map_err(|e| err(e.to_string()))
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
        assert_eq!(c.gateway.as_deref(), Some("tcp://h:1"));
        assert_eq!(c.once, Some(true));
        assert_eq!(c.accept_new_log, Some(true));
        assert_eq!(c.max_batch_bytes, Some(10));
        assert!(toml::from_str::<FileConfig>("gatway = \"x\"").is_err());
    }
}

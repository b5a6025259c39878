//! # spillway-bridge
//!
//! The host side of Spillway: drains a gateway's log upstream (newline-delimited JSON files
//! or Kafka) with checkpoints in a redb file and an exact, checked resume; plus `publish`,
//! `tail` and `status` for people at a terminal.
//!
//! - [`client`]: the wire protocol client (TCP, Unix socket, serial line).
//! - [`checkpoint`]: the redb state file and the resume check.
//! - [`drain`]: the drain loop (fetch ahead, deliver, checkpoint, commit; gaps; backoff).
//! - [`sink`]: the `file:` and `kafka://` sinks.
//! - [`metrics`]: Prometheus metrics; [`progress`]: backlog display.
//! - [`commands`]: `publish`, `tail`, `status`, `consumers`.
//!
//! ## Exit codes of `spillway-bridge`
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (`drain`: `--once` reached its target, or stopped by SIGTERM/SIGINT after finishing in-flight work) |
//! | 1 | failure: `publish` had records rejected or left them unacknowledged, the gateway could not be reached by `tail`/`status`/`consumers`, the sink could not be opened, output failed, a second SIGTERM/SIGINT during `drain`'s shutdown grace stopped it at once |
//! | 2 | usage or configuration error (bad flag, config file, URI, `--from` beyond the log, a Kafka property refused by the bridge or by librdkafka) |
//! | 3 | `drain`: the resume check failed (log id, previous record CRC, or checkpoint beyond the log's end); not retried — see `--accept-new-log` |
//! | 4 | the state file could not be opened (e.g. another drain holds it) or, for `drain --once`, a transaction on it failed (without `--once` the drain reopens it and resumes from its last durable checkpoint) |
//!
//! ## Features
//! - `kafka` (default): the `kafka://` sink (librdkafka built from source with OpenSSL,
//!   zlib and zstd: needs `cmake`, the libcurl headers, `pkg-config` and `libssl-dev`).
//!   Without it the bridge drains to files only.

pub mod checkpoint;
pub mod client;
pub mod commands;
pub mod config;
pub mod drain;
pub mod metrics;
pub mod progress;
pub mod security;
pub mod sink;

/// Process exit codes (see the crate doc).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// A failure at run time.
    pub const FAILURE: i32 = 1;
    /// Bad usage or configuration.
    pub const USAGE: i32 = 2;
    /// The resume check failed (`drain`).
    pub const RESUME: i32 = 3;
    /// The state file failed.
    pub const STATE: i32 = 4;
}

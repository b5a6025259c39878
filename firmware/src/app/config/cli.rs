//! The command line of `spillway` (clap): the subcommands, the flags of `spillway run`
//! (which are also the keys of its config file) and the exit codes.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use spillway_core::cli::units::ByteSize;

/// Exit codes, shown by `--help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success (run: stopped by SIGTERM/SIGINT after a clean shutdown)
  1  run-time failure (flash I/O error, a listener that cannot be served)
  2  usage or configuration error
  3  image unusable: locked by another gateway, geometry disagrees, not a Spillway image
  4  inspect: corruption found (a CRC that does not verify, lost ranges)";

/// `spillway`: the Spillway gateway for Linux.
#[derive(Debug, Parser)]
#[command(name = "spillway", about, after_help = EXIT_CODES, disable_version_flag = true)]
pub struct Cli {
    /// Print the program, protocol and on-flash format versions.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    #[command(after_help = EXIT_CODES)]
    Run(Box<RunArgs>),
    /// Print an image's segments, offsets, consumers and lost ranges; verify every CRC.
    #[command(after_help = EXIT_CODES)]
    Inspect {
        /// The flash image file (its geometry is read from its segment headers).
        image: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a configuration file without starting.
    #[command(after_help = EXIT_CODES)]
    Validate {
        /// The TOML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
}

/// Acknowledgement level flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckArg {
    /// No reply.
    None,
    /// Reply when the record is in the RAM buffer.
    Buffered,
    /// Reply when the record is on flash and synced.
    Durable,
}

/// Spill policy flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpillArg {
    /// Every record reaches flash.
    Always,
    /// Only what consumers have not committed when the buffer fills or lingers.
    OnPressure,
}

/// Full policy flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FullArg {
    /// Refuse new records (backpressure).
    RejectNew,
    /// Erase the oldest segment.
    DropOldest,
}

/// Flags of `spillway run`, and the keys of its config file: every flag but `--config` has
/// a key of the same name (`erase-size = "4K"`, `listen = ["tcp://127.0.0.1:7878"]`). A
/// flag not given is left out when the flags are laid over the file
/// ([`layered`](spillway_core::cli::layer::layered)): `None` and empty lists are not
/// serialized.
#[derive(Debug, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RunArgs {
    /// TOML configuration file; flags override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Flash image file, created and formatted on first run [default: spillway.img].
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Image size when creating it, bytes with optional K/M/G suffix (K = 1024)
    /// [default: 16M].
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Erase block size when creating the image, bytes (K/M/G) [default: 4K].
    #[arg(long)]
    pub erase_size: Option<ByteSize>,
    /// Write size when creating the image, bytes [default: 4].
    #[arg(long)]
    pub write_size: Option<ByteSize>,
    /// Listener URI, repeatable: tcp://HOST:PORT or unix:///PATH, with an optional
    /// ?mode=lines&topic=NAME [default: tcp://127.0.0.1:7878].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<String>,
    /// Serial port URI, repeatable: serial:///dev/ttyX?baud=115200&mode=frames|lines&topic=NAME.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serial: Vec<String>,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9187).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Acknowledgement level of line-mode records and of publishes that leave the level to
    /// the gateway [default: buffered].
    #[arg(long, value_enum)]
    pub ack: Option<AckArg>,
    /// Spill policy [default: always].
    #[arg(long, value_enum)]
    pub spill: Option<SpillArg>,
    /// Full-storage policy [default: reject-new].
    #[arg(long, value_enum)]
    pub full: Option<FullArg>,
    /// Longest time a record waits in RAM before it is written, milliseconds [default: 100].
    #[arg(long)]
    pub linger_ms: Option<u64>,
    /// RAM buffer size, bytes (K/M/G) [default: 64K].
    #[arg(long)]
    pub buffer_bytes: Option<ByteSize>,
    /// Largest record payload accepted, bytes (K/M/G) [default: 4K].
    #[arg(long)]
    pub max_record_bytes: Option<ByteSize>,
    /// Gateway name announced to clients [default: the host name].
    #[arg(long)]
    pub gateway_id: Option<String>,
    /// Most client connections served at once (TCP and Unix, all listeners); further
    /// connections are closed at once [default: 256].
    #[arg(long)]
    pub max_connections: Option<usize>,
}

//! The command line of `spillway` (clap): the subcommands, the flags of `spillway run`
//! (which are also the keys of its config file) and the exit codes.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use spillway_core::cli::units::ByteSize;

/// What `spillway --help` opens with.
pub const ABOUT: &str = "Spillway gateway: keeps the messages of sensors and local \
producers in a flash log on this machine, durably and in order, until a bridge drains them";

/// The longer opening of `spillway --help`.
pub const LONG_ABOUT: &str = "\
Spillway gateway: keeps the messages of sensors and local producers in a flash log on this
machine, durably and in order, until a bridge (spillway-bridge drain) hands them on to files
or Kafka. Clients publish over TCP, Unix sockets or serial ports, in the framed protocol
(core/PROTOCOL.md) or as text lines. `spillway run` serves, `spillway inspect` verifies an
image, `spillway validate` checks a configuration without starting.";

/// Exit codes of `spillway run`, shown by its `--help`.
pub const RUN_EXIT_CODES: &str = "\
Exit codes:
  0  stopped by SIGTERM/SIGINT after a clean shutdown
  1  run-time failure (flash I/O error, a listener that cannot be served)
  2  usage or configuration error
  3  image unusable: locked by another gateway, geometry disagrees, not a Spillway image";

/// Exit codes of `spillway inspect`, shown by its `--help`.
pub const INSPECT_EXIT_CODES: &str = "\
Exit codes:
  0  the image verifies
  2  usage error
  3  image unusable: cannot be opened, locked by a running gateway, not a Spillway image
  4  corruption found in the records (a segment or batch CRC that does not verify, a
     corrupt lost range). Not corruption, reported with exit 0: offsets reserved before a
     crash and never persisted (lost ... not_persisted), and damaged journal entries
     (a warning: they are skipped; with none left, committed offsets restart at 0)";

/// Exit codes of `spillway validate`, shown by its `--help`.
pub const VALIDATE_EXIT_CODES: &str = "\
Exit codes:
  0  the configuration is usable (warnings, e.g. a port in use, are printed on stderr)
  2  usage or configuration error
  3  the existing image disagrees with the configuration, or is not a Spillway image";

/// Exit codes of `spillway token`, shown by its `--help`.
pub const TOKEN_EXIT_CODES: &str = "\
Exit codes:
  0  the entry was printed (and the token file written, if it did not exist)
  1  the token file cannot be created, written or read (the path and the OS reason)
  2  usage error: bad --roles, an empty token file";

/// Every exit code, shown by `spillway --help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success (run: stopped by SIGTERM/SIGINT after a clean shutdown)
  1  run-time failure (flash I/O error, a listener that cannot be served)
  2  usage or configuration error
  3  image unusable: locked by another gateway, geometry disagrees, not a Spillway image
  4  inspect: corruption found in the records (a segment or batch CRC, a corrupt lost range)";

/// `spillway`: the Spillway gateway for Linux.
#[derive(Debug, Parser)]
#[command(
    name = "spillway",
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXIT_CODES,
    disable_version_flag = true
)]
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
    /// Run the gateway: mount (or create) the image, serve the listeners and serial ports.
    #[command(after_help = RUN_EXIT_CODES)]
    Run(Box<RunArgs>),
    /// Print an image's segments, offsets, consumers and lost ranges; verify every CRC.
    #[command(after_help = INSPECT_EXIT_CODES)]
    Inspect {
        /// The flash image file (its geometry is read from its segment headers).
        image: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a configuration file without starting: every setting, the geometry against
    /// an existing image, serial devices and ports (missing or in use: warnings).
    #[command(after_help = VALIDATE_EXIT_CODES)]
    Validate {
        /// The TOML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Make a client token, or read one: writes a new random token to FILE (mode 0600) if
    /// FILE does not exist, then prints the `[[credential]]` entry for the gateway's config
    /// file with the token's SHA-256 (the gateway keeps only the hash).
    #[command(after_help = TOKEN_EXIT_CODES)]
    Token {
        /// The token file (the client's `--token-file`).
        file: PathBuf,
        /// The credential's name in the printed entry (for the gateway's logs).
        #[arg(long, default_value = "client")]
        name: String,
        /// The credential's roles in the printed entry (publish, consume, admin).
        #[arg(long, default_value = "publish")]
        roles: String,
    },
}

/// Log level flag values (`--log-level`, key `log-level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevelArg {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// What the gateway does (the default).
    Info,
    /// Connections and rejected requests too.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevelArg {
    /// The level's name, as `RUST_LOG` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevelArg::Error => "error",
            LogLevelArg::Warn => "warn",
            LogLevelArg::Info => "info",
            LogLevelArg::Debug => "debug",
            LogLevelArg::Trace => "trace",
        }
    }
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

/// Compression flag values (`--compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompressionArg {
    /// LZ4 on batches that come out smaller; skips short batches and backs off after
    /// batches that do not compress.
    Auto,
    /// Never compress.
    None,
    /// Try LZ4 on every batch (stored compressed when it comes out smaller).
    Lz4,
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
    /// Listener URI, repeatable: tcp://IP:PORT, tls://IP:PORT or unix:///PATH (framed
    /// protocol, or ?mode=lines&topic=NAME&line-timeout-ms=N: a partial line followed by N
    /// ms of silence is dropped, 1000 by default), mqtt://IP:PORT or mqtts://IP:PORT (MQTT
    /// 3.1.1 and 5 publishers, ?ack=durable|buffered; a client's password is its token, its
    /// user name the credential's name). Every listener takes
    /// ?roles=publish,consume,admin (MQTT: only publish matters, and it is in the default
    /// roles; a roles= list without it refuses every PUBLISH); plaintext on a non-loopback address needs ?allow-insecure=true
    /// [default: tcp://127.0.0.1:7878].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<String>,
    /// Serial port URI, repeatable:
    /// serial:///dev/ttyX?baud=115200&mode=frames|lines&topic=NAME&line-timeout-ms=N. A
    /// device that is absent is waited for (USB adapters appear late at boot).
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
    /// Per-batch LZ4 compression of what is written to the image: auto (when a batch
    /// comes out smaller), none, or lz4 (try every batch). The gateway keeps a second
    /// buffer of about 1.1 times the larger of --buffer-bytes and a segment under every
    /// setting [default: auto].
    #[arg(long, value_enum)]
    pub compression: Option<CompressionArg>,
    /// Largest record payload accepted, bytes (K/M/G) [default: 4K].
    #[arg(long)]
    pub max_record_bytes: Option<ByteSize>,
    /// Largest frame on a framed connection, either way, bytes (K/M/G), from 64K to 16M: a
    /// fetch reply carries up to this much of records. Each connection may hold up to twice
    /// this plus 32 KiB in memory (the frame it is receiving, and the requests and replies
    /// in flight), so the gateway's bound is --max-connections times that. Raised to carry
    /// the largest record the RAM buffer can hold. A larger frame means fewer round trips
    /// for a drain [default: 64K].
    #[arg(long)]
    pub max_frame_bytes: Option<ByteSize>,
    /// Gateway name announced to clients [default: the host name].
    #[arg(long)]
    pub gateway_id: Option<String>,
    /// Most client connections served at once (TCP and Unix, all listeners); a further
    /// framed connection is told so (an `Error`, seq 0, naming --max-connections) and
    /// closed [default: 256].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Close a framed TCP, TLS or Unix connection that has completed its handshake and has
    /// sent nothing for this long while nothing of it is in flight (no long-poll fetch
    /// waiting, no request unanswered, no reply unwritten), so that forgotten connections
    /// give their --max-connections slot back; milliseconds, 0 = never (serial ports and
    /// line-mode connections are never closed for idleness) [default: 300000].
    #[arg(long)]
    pub idle_timeout_ms: Option<u64>,
    /// Log level; the RUST_LOG environment variable, when set, wins [default: info].
    #[arg(long, value_enum)]
    pub log_level: Option<LogLevelArg>,
    /// Certificate chain (PEM) of every tls:// listener.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) of the --tls-cert certificate.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates are verified against (mTLS): a
    /// client with a certificate from this CA needs no token; one with another certificate
    /// is refused in the TLS handshake; one without a certificate presents a token.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// Client credentials (config file only, `[[credential]]` tables): name, token-sha256,
    /// roles, consumers.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credential: Vec<CredentialSpec>,
}

/// One `[[credential]]` of the config file: a client token's SHA-256 and what it may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CredentialSpec {
    /// Name, for the gateway's logs (e.g. `bridge`, `buoy-7`).
    pub name: String,
    /// SHA-256 of the token, 64 hex digits (`spillway token FILE` prints it).
    pub token_sha256: String,
    /// Roles: `publish`, `consume`, `admin`.
    pub roles: Vec<String>,
    /// The consumers `consume` may commit; every consumer when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumers: Option<Vec<String>>,
}

//! Command line and configuration file of `spillway run`.
//!
//! Every setting can come from the TOML file given with `--config` (keys spelled like the
//! flags, e.g. `erase-size = "4K"`, `listen = ["tcp://127.0.0.1:7878"]`) or from a flag;
//! a flag overrides the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use spillway_core::log::{FullPolicy, SpillPolicy};
use spillway_core::wire::AckLevel;

use super::AppError;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpillArg {
    /// Every record reaches flash.
    Always,
    /// Only what consumers have not committed when the buffer fills or lingers.
    OnPressure,
}

/// Full policy flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FullArg {
    /// Refuse new records (backpressure).
    RejectNew,
    /// Erase the oldest segment.
    DropOldest,
}

/// Flags of `spillway run`.
#[derive(Debug, Default, Args)]
pub struct RunArgs {
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Flash image file, created and formatted on first run [default: spillway.img].
    #[arg(long)]
    pub image: Option<PathBuf>,
    /// Image size when creating it, bytes with optional K/M/G suffix [default: 16M].
    #[arg(long)]
    pub size: Option<String>,
    /// Erase block size when creating the image, bytes (K/M/G) [default: 4K].
    #[arg(long)]
    pub erase_size: Option<String>,
    /// Write size when creating the image, bytes [default: 4].
    #[arg(long)]
    pub write_size: Option<String>,
    /// Listener URI, repeatable: tcp://HOST:PORT or unix:///PATH, with an optional
    /// ?mode=lines&topic=NAME [default: tcp://127.0.0.1:7878].
    #[arg(long)]
    pub listen: Vec<String>,
    /// Serial port URI, repeatable: serial:///dev/ttyX?baud=115200&mode=frames|lines&topic=NAME.
    #[arg(long)]
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
    pub buffer_bytes: Option<String>,
    /// Largest record payload accepted, bytes (K/M/G) [default: 4K].
    #[arg(long)]
    pub max_record_bytes: Option<String>,
    /// Gateway name announced to clients [default: the host name].
    #[arg(long)]
    pub gateway_id: Option<String>,
    /// Most client connections served at once (TCP and Unix, all listeners); further
    /// connections are closed at once [default: 256].
    #[arg(long)]
    pub max_connections: Option<usize>,
}

/// A size in a config file: an integer or a string with a suffix.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Int(u64),
    Text(String),
}

impl SizeValue {
    fn text(&self) -> String {
        match self {
            SizeValue::Int(n) => n.to_string(),
            SizeValue::Text(s) => s.clone(),
        }
    }
}

/// The configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    image: Option<PathBuf>,
    size: Option<SizeValue>,
    erase_size: Option<SizeValue>,
    write_size: Option<SizeValue>,
    listen: Option<Vec<String>>,
    serial: Option<Vec<String>>,
    metrics: Option<String>,
    ack: Option<AckArg>,
    spill: Option<SpillArg>,
    full: Option<FullArg>,
    linger_ms: Option<u64>,
    buffer_bytes: Option<SizeValue>,
    max_record_bytes: Option<SizeValue>,
    gateway_id: Option<String>,
    max_connections: Option<usize>,
}

/// What a listener or serial port carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Protocol frames.
    Frames,
    /// One record per line; topic fixed or the first word.
    Lines {
        /// Fixed topic.
        topic: Option<String>,
    },
}

/// Where a listener listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

/// One `--listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    /// The URI as given.
    pub uri: String,
    /// Where.
    pub endpoint: Endpoint,
    /// What it carries.
    pub mode: Mode,
}

/// One `--serial`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serial {
    /// The URI as given.
    pub uri: String,
    /// Device path.
    pub path: String,
    /// Baud rate, bits/s.
    pub baud: u32,
    /// What it carries.
    pub mode: Mode,
}

/// Everything `spillway run` needs, after merging file and flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Image file.
    pub image: PathBuf,
    /// Size for creation, bytes.
    pub size: u64,
    /// Erase size, bytes, if given (checked against an existing image).
    pub erase_size: Option<u32>,
    /// Write size, bytes, if given.
    pub write_size: Option<u32>,
    /// Size given explicitly (checked against an existing image).
    pub size_given: bool,
    /// Listeners.
    pub listen: Vec<Listen>,
    /// Serial ports.
    pub serial: Vec<Serial>,
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Acknowledgement level of line mode and of publishes that leave it to the gateway.
    pub ack: AckLevel,
    /// Spill policy.
    pub spill: SpillPolicy,
    /// Full policy.
    pub full: FullPolicy,
    /// Linger, ms.
    pub linger_ms: u64,
    /// RAM buffer, bytes.
    pub buffer_bytes: usize,
    /// Largest payload, bytes.
    pub max_record_bytes: u32,
    /// Gateway id.
    pub gateway_id: String,
    /// Most client connections served at once.
    pub max_connections: usize,
}

/// Default image size, bytes.
pub const DEFAULT_SIZE: u64 = 16 << 20;
/// Default limit of client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default erase size, bytes.
pub const DEFAULT_ERASE: u32 = 4096;
/// Default write size, bytes.
pub const DEFAULT_WRITE: u32 = 4;
/// Default listener.
pub const DEFAULT_LISTEN: &str = "tcp://127.0.0.1:7878";

/// Parses a byte count with an optional binary suffix: `4096`, `4K`, `4KiB`, `16M`, `1G`
/// (K = 1024 bytes; `B` alone is allowed).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(format!(
            "{s:?} is not a size (expected e.g. 4096, 4K, 16M, 1G)"
        ));
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|_| format!("{s:?}: number too large"))?;
    let mult: u64 = match t[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "{s:?}: unknown size suffix {other:?} (use K, M or G)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?}: size too large"))
}

fn size_u32(s: &str, what: &str) -> Result<u32, AppError> {
    let n = parse_size(s).map_err(|e| AppError::Usage(format!("--{what}: {e}")))?;
    u32::try_from(n).map_err(|_| AppError::Usage(format!("--{what}: {s} is too large")))
}

fn split_query(rest: &str) -> (&str, Vec<(String, String)>) {
    match rest.split_once('?') {
        None => (rest, Vec::new()),
        Some((base, q)) => (
            base,
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (p.to_string(), String::new()),
                })
                .collect(),
        ),
    }
}

fn mode_of(uri: &str, query: &[(String, String)], allowed: &[&str]) -> Result<Mode, AppError> {
    let mut mode = "frames".to_string();
    let mut topic = None;
    for (k, v) in query {
        match k.as_str() {
            "mode" => mode = v.clone(),
            "topic" => {
                if v.is_empty() || v.len() > 255 {
                    return Err(AppError::Usage(format!(
                        "{uri}: topic must be 1 to 255 bytes"
                    )));
                }
                topic = Some(v.clone());
            }
            k if allowed.contains(&k) => {}
            k => return Err(AppError::Usage(format!("{uri}: unknown parameter {k:?}"))),
        }
    }
    match mode.as_str() {
        "frames" => {
            if topic.is_some() {
                return Err(AppError::Usage(format!("{uri}: topic= needs mode=lines")));
            }
            Ok(Mode::Frames)
        }
        "lines" => Ok(Mode::Lines { topic }),
        m => Err(AppError::Usage(format!(
            "{uri}: mode must be frames or lines, not {m:?}"
        ))),
    }
}

/// Parses a `--listen` URI. A TCP address without a host binds 127.0.0.1.
pub fn parse_listen(uri: &str) -> Result<Listen, AppError> {
    let (endpoint, query) = if let Some(rest) = uri.strip_prefix("tcp://") {
        let (addr, query) = split_query(rest);
        let addr = if addr.starts_with(':') {
            format!("127.0.0.1{addr}")
        } else {
            addr.to_string()
        };
        let sa: SocketAddr = addr.parse().map_err(|_| {
            AppError::Usage(format!(
                "{uri}: expected tcp://IP:PORT, e.g. tcp://127.0.0.1:7878"
            ))
        })?;
        (Endpoint::Tcp(sa), query)
    } else if let Some(rest) = uri.strip_prefix("unix://") {
        let (path, query) = split_query(rest);
        if path.is_empty() {
            return Err(AppError::Usage(format!("{uri}: expected unix:///PATH")));
        }
        (Endpoint::Unix(PathBuf::from(path)), query)
    } else {
        return Err(AppError::Usage(format!(
            "{uri}: listener URIs start with tcp:// or unix://"
        )));
    };
    Ok(Listen {
        uri: uri.to_string(),
        endpoint,
        mode: mode_of(uri, &query, &[])?,
    })
}

/// Parses a `--serial` URI.
pub fn parse_serial(uri: &str) -> Result<Serial, AppError> {
    let rest = uri
        .strip_prefix("serial://")
        .ok_or_else(|| AppError::Usage(format!("{uri}: serial URIs start with serial://")))?;
    let (path, query) = split_query(rest);
    if path.is_empty() {
        return Err(AppError::Usage(format!(
            "{uri}: expected serial:///dev/ttyX"
        )));
    }
    let mut baud = 115_200u32;
    for (k, v) in &query {
        if k == "baud" {
            baud = v
                .parse()
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| AppError::Usage(format!("{uri}: bad baud rate {v:?}")))?;
        }
    }
    Ok(Serial {
        uri: uri.to_string(),
        path: path.to_string(),
        baud,
        mode: mode_of(uri, &query, &["baud"])?,
    })
}

fn read_file_config(path: &Path) -> Result<FileConfig, AppError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| AppError::Usage(format!("cannot read config {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| AppError::Usage(format!("config {}: {e}", path.display())))
}

/// The host name, for the default gateway id.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "spillway".to_string())
}

/// Merges the config file (if any) and the flags, and checks everything.
pub fn settings(args: &RunArgs) -> Result<Settings, AppError> {
    let file = match &args.config {
        Some(p) => read_file_config(p)?,
        None => FileConfig::default(),
    };
    let pick = |flag: &Option<String>, file: &Option<SizeValue>| {
        flag.clone().or_else(|| file.as_ref().map(SizeValue::text))
    };
    let size_s = pick(&args.size, &file.size);
    let size = match &size_s {
        Some(s) => parse_size(s).map_err(|e| AppError::Usage(format!("--size: {e}")))?,
        None => DEFAULT_SIZE,
    };
    let erase_size = pick(&args.erase_size, &file.erase_size)
        .map(|s| size_u32(&s, "erase-size"))
        .transpose()?;
    let write_size = pick(&args.write_size, &file.write_size)
        .map(|s| size_u32(&s, "write-size"))
        .transpose()?;
    let buffer_bytes = pick(&args.buffer_bytes, &file.buffer_bytes)
        .map(|s| size_u32(&s, "buffer-bytes"))
        .transpose()?
        .unwrap_or(64 * 1024) as usize;
    let max_record_bytes = pick(&args.max_record_bytes, &file.max_record_bytes)
        .map(|s| size_u32(&s, "max-record-bytes"))
        .transpose()?
        .unwrap_or(4096);
    let listen_uris: Vec<String> = if !args.listen.is_empty() {
        args.listen.clone()
    } else {
        file.listen
            .clone()
            .unwrap_or_else(|| vec![DEFAULT_LISTEN.to_string()])
    };
    let serial_uris: Vec<String> = if !args.serial.is_empty() {
        args.serial.clone()
    } else {
        file.serial.clone().unwrap_or_default()
    };
    let listen = listen_uris
        .iter()
        .map(|u| parse_listen(u))
        .collect::<Result<Vec<_>, _>>()?;
    let serial = serial_uris
        .iter()
        .map(|u| parse_serial(u))
        .collect::<Result<Vec<_>, _>>()?;
    let metrics = args
        .metrics
        .clone()
        .or(file.metrics.clone())
        .map(|m| {
            m.parse::<SocketAddr>()
                .map_err(|_| AppError::Usage(format!("--metrics: {m:?} is not an IP:PORT address")))
        })
        .transpose()?;
    let ack = match args.ack.or(file.ack).unwrap_or(AckArg::Buffered) {
        AckArg::None => AckLevel::None,
        AckArg::Buffered => AckLevel::Buffered,
        AckArg::Durable => AckLevel::Durable,
    };
    let spill = match args.spill.or(file.spill).unwrap_or(SpillArg::Always) {
        SpillArg::Always => SpillPolicy::Always,
        SpillArg::OnPressure => SpillPolicy::OnPressure,
    };
    let full = match args.full.or(file.full).unwrap_or(FullArg::RejectNew) {
        FullArg::RejectNew => FullPolicy::RejectNew,
        FullArg::DropOldest => FullPolicy::DropOldest,
    };
    let gateway_id = args
        .gateway_id
        .clone()
        .or(file.gateway_id.clone())
        .unwrap_or_else(hostname);
    if gateway_id.is_empty() || gateway_id.len() > spillway_firmware::gateway::MAX_GATEWAY_ID_LEN {
        return Err(AppError::Usage(format!(
            "--gateway-id must be 1 to {} bytes",
            spillway_firmware::gateway::MAX_GATEWAY_ID_LEN
        )));
    }
    let s = Settings {
        image: args
            .image
            .clone()
            .or(file.image.clone())
            .unwrap_or_else(|| PathBuf::from("spillway.img")),
        size,
        size_given: size_s.is_some(),
        erase_size,
        write_size,
        listen,
        serial,
        metrics,
        ack,
        spill,
        full,
        linger_ms: args.linger_ms.or(file.linger_ms).unwrap_or(100),
        buffer_bytes,
        max_record_bytes,
        gateway_id,
        max_connections: args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS),
    };
    check(&s)?;
    Ok(s)
}

/// Consistency checks that need no image.
fn check(s: &Settings) -> Result<(), AppError> {
    let erase = s.erase_size.unwrap_or(DEFAULT_ERASE);
    let write = s.write_size.unwrap_or(DEFAULT_WRITE);
    if !erase.is_power_of_two() || erase < spillway_core::log::MIN_ERASE_SIZE {
        return Err(AppError::Usage(format!(
            "--erase-size must be a power of two of at least {} bytes",
            spillway_core::log::MIN_ERASE_SIZE
        )));
    }
    if !write.is_power_of_two() || write > 32 {
        return Err(AppError::Usage(
            "--write-size must be a power of two from 1 to 32".into(),
        ));
    }
    if !s.size.is_multiple_of(u64::from(erase))
        || s.size >= 1 << 32
        || s.size < 4 * u64::from(erase)
    {
        return Err(AppError::Usage(format!(
            "--size must be a multiple of the erase size, at least 4 erase blocks and below 4G (got {})",
            s.size
        )));
    }
    if s.buffer_bytes < spillway_core::log::MIN_BUFFER || s.buffer_bytes > 16 << 20 {
        return Err(AppError::Usage(format!(
            "--buffer-bytes must be {} bytes to 16M",
            spillway_core::log::MIN_BUFFER
        )));
    }
    // A new image must hold two segments of the buffer's size (what `run` would create).
    if !s.image.exists() {
        let geo = spillway_core::storage::Geometry {
            erase_size: erase,
            write_size: write,
            capacity: s.size as u32,
            erased: 0xFF,
        };
        super::image::blocks_per_segment(&geo, s.buffer_bytes)?;
    }
    // Largest record: payload + longest topic + producer + record header.
    let need = s.max_record_bytes as usize + 255 + 12 + 14 + 32;
    if s.max_record_bytes == 0 || need > s.buffer_bytes {
        return Err(AppError::Usage(format!(
            "--max-record-bytes {} needs --buffer-bytes of at least {need}",
            s.max_record_bytes
        )));
    }
    if s.linger_ms > 3_600_000 {
        return Err(AppError::Usage(
            "--linger-ms must be at most one hour".into(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for l in &s.listen {
        if !seen.insert(l.endpoint.clone()) {
            return Err(AppError::Usage(format!("{} is given twice", l.uri)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("K").is_err());
        assert!(parse_size("4T").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn uris() {
        let l = parse_listen("tcp://:7000?mode=lines&topic=t").unwrap();
        assert_eq!(l.endpoint, Endpoint::Tcp("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(
            l.mode,
            Mode::Lines {
                topic: Some("t".into())
            }
        );
        let u = parse_listen("unix:///tmp/s.sock").unwrap();
        assert_eq!(u.endpoint, Endpoint::Unix("/tmp/s.sock".into()));
        assert!(parse_listen("http://x").is_err());
        assert!(parse_listen("tcp://127.0.0.1:1?mode=x").is_err());
        let s = parse_serial("serial:///dev/ttyUSB0?baud=9600&mode=lines").unwrap();
        assert_eq!(s.path, "/dev/ttyUSB0");
        assert_eq!(s.baud, 9600);
    }

    #[test]
    fn flags_override_file() {
        let dir = tempfile_dir();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            "linger-ms = 5\nbuffer-bytes = \"128K\"\nlisten = [\"tcp://127.0.0.1:9\"]\n",
        )
        .unwrap();
        let args = RunArgs {
            config: Some(p.clone()),
            linger_ms: Some(7),
            ..RunArgs::default()
        };
        let s = settings(&args).unwrap();
        assert_eq!(s.linger_ms, 7);
        assert_eq!(s.buffer_bytes, 128 * 1024);
        assert_eq!(s.listen.len(), 1);
        std::fs::write(&p, "bogus = 1\n").unwrap();
        assert!(settings(&args).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("spillway-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

//! The settings of `spillway run`: the TOML file given with `--config` under the flags
//! (keys spelled like the flags, e.g. `erase-size = "4K"`, `listen =
//! ["tcp://127.0.0.1:7878"]`; a flag overrides the file's key), the built-in defaults, and
//! the checks. The flags themselves are in [`cli`], the listener and serial URIs in
//! [`uri`], the checks in `check`, the safe defaults among them in [`security`].

mod check;
pub mod cli;
pub mod security;
pub mod uri;

use std::net::SocketAddr;
use std::path::PathBuf;

use spillway_core::cli::layer::layered;
use spillway_core::cli::units::ByteSize;
use spillway_core::log::{Compression, FullPolicy, SpillPolicy};
use spillway_core::wire::AckLevel;

use std::sync::Arc;

use super::AppError;
use super::auth::{Access, Credentials};
use super::tls::Tls;
pub use cli::{
    AckArg, Cli, Command, CompressionArg, CredentialSpec, FullArg, LogLevelArg, RunArgs, SpillArg,
};
pub use uri::{Endpoint, Listen, Mode, MqttAck, Serial, parse_listen, parse_serial};

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
    /// Per-batch compression (`--compression`).
    pub compression: Compression,
    /// Largest payload, bytes.
    pub max_record_bytes: u32,
    /// Largest frame asked for (`--max-frame-bytes`), bytes; the gateway raises it to
    /// carry its largest record ([`crate::app::engine::max_frame_bytes`]).
    pub max_frame_bytes: u32,
    /// Gateway id.
    pub gateway_id: String,
    /// Most client connections served at once.
    pub max_connections: usize,
    /// How long a handshaken framed socket connection may stay silent with nothing in
    /// flight before it is closed (`--idle-timeout-ms`; `None`: never).
    pub idle_timeout: Option<std::time::Duration>,
    /// TLS of the `tls://` listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
    pub tls: Option<Tls>,
    /// Client credentials (`[[credential]]`).
    pub credentials: Arc<Credentials>,
}

impl Settings {
    /// What a connection on listener `l` may do before its `Hello` is judged, and whether
    /// it must present a credential (see [`security`]).
    pub fn access(&self, l: &Listen) -> Access {
        Access {
            roles: l.roles,
            token_required: security::token_required(l, &self.credentials),
            client_cert: None,
            credentials: self.credentials.clone(),
        }
    }
}

/// Default image size, bytes.
pub const DEFAULT_SIZE: u64 = 16 << 20;
/// Default limit of client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default `--idle-timeout-ms`: five minutes, longer than the reporting period of most
/// sensors that keep a connection open, short enough that forgotten connections free their
/// slots within minutes.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300_000;
/// Default erase size, bytes.
pub const DEFAULT_ERASE: u32 = 4096;
/// Default write size, bytes.
pub const DEFAULT_WRITE: u32 = 4;
/// Default listener.
pub const DEFAULT_LISTEN: &str = "tcp://127.0.0.1:7878";

/// Default RAM buffer, bytes.
pub const DEFAULT_BUFFER_BYTES: u64 = 64 * 1024;
/// Default largest record payload, bytes.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 4096;
/// Default and smallest `--max-frame-bytes`, bytes (64 KiB).
pub const DEFAULT_MAX_FRAME_BYTES: u64 = 64 * 1024;
/// Largest `--max-frame-bytes`, bytes (16 MiB, the largest frame the bridge accepts).
pub const MAX_MAX_FRAME_BYTES: u64 = 16 * 1024 * 1024;
/// Default linger, ms.
pub const DEFAULT_LINGER_MS: u64 = 100;
/// Default image file.
pub const DEFAULT_IMAGE: &str = "spillway.img";

/// The host name, for the default gateway id.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "spillway".to_string())
}

/// A size setting as a `u32`, or a usage error naming its flag.
fn size_u32(size: ByteSize, flag: &str) -> Result<u32, AppError> {
    size.to_u32(&format!("--{flag}")).map_err(AppError::Usage)
}

/// The log level `args` ask for: `--log-level`, else the config file's `log-level` key,
/// else `info`. A config file that does not read or parse gives `info` here; [`settings`]
/// reports it.
pub fn log_level(args: &RunArgs) -> LogLevelArg {
    layered::<RunArgs, _>(args.config.as_deref(), args)
        .ok()
        .and_then(|a| a.log_level)
        .unwrap_or(LogLevelArg::Info)
}

/// Lays the flags over the config file (if any), applies the defaults and checks
/// everything.
///
/// # Errors
/// [`AppError::Usage`] for a config file that cannot be read or parsed (naming the file and
/// the key), a URI that does not parse, or settings that do not fit together.
pub fn settings(args: &RunArgs) -> Result<Settings, AppError> {
    let a: RunArgs =
        layered(args.config.as_deref(), args).map_err(|e| AppError::Usage(e.to_string()))?;
    let listen = if a.listen.is_empty() {
        vec![DEFAULT_LISTEN.to_string()]
    } else {
        a.listen
    };
    let listen = listen
        .iter()
        .map(|u| parse_listen(u))
        .collect::<Result<Vec<_>, _>>()?;
    let serial = a
        .serial
        .iter()
        .map(|u| parse_serial(u))
        .collect::<Result<Vec<_>, _>>()?;
    let metrics = a
        .metrics
        .map(|m| {
            m.parse::<SocketAddr>()
                .map_err(|_| AppError::Usage(format!("--metrics: {m:?} is not an IP:PORT address")))
        })
        .transpose()?;
    let ack = match a.ack.unwrap_or(AckArg::Buffered) {
        AckArg::None => AckLevel::None,
        AckArg::Buffered => AckLevel::Buffered,
        AckArg::Durable => AckLevel::Durable,
    };
    let spill = match a.spill.unwrap_or(SpillArg::Always) {
        SpillArg::Always => SpillPolicy::Always,
        SpillArg::OnPressure => SpillPolicy::OnPressure,
    };
    let compression = match a.compression.unwrap_or(CompressionArg::Auto) {
        CompressionArg::Auto => Compression::Auto,
        CompressionArg::None => Compression::None,
        CompressionArg::Lz4 => Compression::Lz4,
    };
    let full = match a.full.unwrap_or(FullArg::RejectNew) {
        FullArg::RejectNew => FullPolicy::RejectNew,
        FullArg::DropOldest => FullPolicy::DropOldest,
    };
    let tls_paths = security::TlsPaths {
        cert: a.tls_cert.clone(),
        key: a.tls_key.clone(),
        client_ca: a.tls_client_ca.clone(),
    };
    let credentials = Arc::new(Credentials::from_specs(&a.credential)?);
    let gateway_id = a.gateway_id.unwrap_or_else(hostname);
    if gateway_id.is_empty() || gateway_id.len() > spillway_firmware::gateway::MAX_GATEWAY_ID_LEN {
        return Err(AppError::Usage(format!(
            "--gateway-id must be 1 to {} bytes",
            spillway_firmware::gateway::MAX_GATEWAY_ID_LEN
        )));
    }
    let s = Settings {
        image: a.image.unwrap_or_else(|| PathBuf::from(DEFAULT_IMAGE)),
        size: a.size.map_or(DEFAULT_SIZE, |s| s.0),
        size_given: a.size.is_some(),
        erase_size: a
            .erase_size
            .map(|s| size_u32(s, "erase-size"))
            .transpose()?,
        write_size: a
            .write_size
            .map(|s| size_u32(s, "write-size"))
            .transpose()?,
        listen,
        serial,
        metrics,
        ack,
        spill,
        full,
        linger_ms: a.linger_ms.unwrap_or(DEFAULT_LINGER_MS),
        buffer_bytes: size_u32(
            a.buffer_bytes.unwrap_or(ByteSize(DEFAULT_BUFFER_BYTES)),
            "buffer-bytes",
        )? as usize,
        compression,
        max_record_bytes: size_u32(
            a.max_record_bytes
                .unwrap_or(ByteSize(DEFAULT_MAX_RECORD_BYTES)),
            "max-record-bytes",
        )?,
        max_frame_bytes: {
            let frame = a.max_frame_bytes.map_or(DEFAULT_MAX_FRAME_BYTES, |f| f.0);
            u32::try_from(frame).map_err(|_| check::frame_outside_range(frame))?
        },
        gateway_id,
        max_connections: a.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        idle_timeout: match a.idle_timeout_ms.unwrap_or(DEFAULT_IDLE_TIMEOUT_MS) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        },
        tls: None,
        credentials,
    };
    let mut s = s;
    security::check(&s, &tls_paths)?;
    if let (Some(cert), Some(key)) = (&tls_paths.cert, &tls_paths.key) {
        s.tls = Some(Tls::new(cert, key, tls_paths.client_ca.as_deref())?);
    }
    check::check(&s)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file() {
        let dir = tempfile_dir("flags");
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

    /// `compression` is `auto` by default, read from the file's key, and the flag wins.
    #[test]
    fn compression_defaults_to_auto_and_the_flag_wins_over_the_key() {
        let dir = tempfile_dir("compression");
        let p = dir.join("c.toml");
        let mut args = RunArgs::default();
        assert_eq!(settings(&args).unwrap().compression, Compression::Auto);
        std::fs::write(&p, "compression = \"none\"\n").unwrap();
        args.config = Some(p.clone());
        assert_eq!(settings(&args).unwrap().compression, Compression::None);
        args.compression = Some(CompressionArg::Lz4);
        assert_eq!(settings(&args).unwrap().compression, Compression::Lz4);
        std::fs::write(&p, "compression = \"zstd\"\n").unwrap();
        args.compression = None;
        let e = settings(&args).unwrap_err().to_string();
        assert!(e.contains("compression"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Every key README's config file example shows is read, with sizes in binary units,
    /// and a flag given on the command line wins over its key.
    #[test]
    fn the_readme_config_file_works() {
        let dir = tempfile_dir("readme");
        let p = dir.join("spillway.toml");
        let img = dir.join("gw.img");
        std::fs::write(
            &p,
            format!(
                r#"image = "{}"
size = "256M"
erase-size = "64K"
write-size = 4
listen = ["tcp://127.0.0.1:7878", "unix:///run/spillway.sock"]
serial = ["serial:///dev/ttyUSB0?baud=115200&mode=lines&topic=buoy/sst"]
metrics = "127.0.0.1:9187"
ack = "durable"
spill = "always"          # or "on-pressure"
full = "reject-new"       # or "drop-oldest"
linger-ms = 100
buffer-bytes = "64K"
max-record-bytes = "4K"
max-frame-bytes = "256K"
gateway-id = "pier-7"
max-connections = 256     # client connections served at once; more are closed at once
log-level = "info"        # error, warn, info, debug, trace; RUST_LOG wins when set
"#,
                img.display()
            ),
        )
        .unwrap();
        let mut args = RunArgs {
            config: Some(p.clone()),
            ..RunArgs::default()
        };
        let s = settings(&args).unwrap();
        assert_eq!(s.image, img);
        assert_eq!((s.size, s.size_given), (256 << 20, true));
        assert_eq!((s.erase_size, s.write_size), (Some(64 << 10), Some(4)));
        assert_eq!(s.listen.len(), 2);
        assert_eq!(s.serial[0].baud, 115_200);
        assert_eq!(s.metrics, Some("127.0.0.1:9187".parse().unwrap()));
        assert_eq!(s.ack, AckLevel::Durable);
        assert_eq!(
            (s.spill, s.full),
            (SpillPolicy::Always, FullPolicy::RejectNew)
        );
        assert_eq!(
            (s.linger_ms, s.buffer_bytes, s.max_record_bytes),
            (100, 65_536, 4096)
        );
        assert_eq!((s.gateway_id.as_str(), s.max_connections), ("pier-7", 256));
        assert_eq!(s.max_frame_bytes, 256 << 10);
        assert_eq!(log_level(&args), LogLevelArg::Info);
        args.listen = vec!["tcp://:7000".into()];
        args.gateway_id = Some("flag".into());
        let s = settings(&args).unwrap();
        assert_eq!(s.listen.len(), 1);
        assert_eq!(s.gateway_id, "flag");
        assert_eq!(
            s.serial.len(),
            1,
            "the file's key stays when its flag is not given"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A TOML error names the file and the key.
    #[test]
    fn toml_errors_name_the_key() {
        let dir = tempfile_dir("keys");
        let p = dir.join("c.toml");
        let args = RunArgs {
            config: Some(p.clone()),
            ..RunArgs::default()
        };
        for (text, key) in [
            ("linger-ms = \"soon\"\n", "linger-ms"),
            ("buffer-bytes = \"64X\"\n", "buffer-bytes"),
            ("ack = \"maybe\"\n", "ack"),
            ("listen = [\"tcp://:1\", 2]\n", "listen[1]"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = settings(&args).unwrap_err().to_string();
            assert!(
                e.contains(&format!("key `{key}`")) && e.contains("c.toml"),
                "{e}"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Frames: `--max-frame-bytes` outside 64K..=16M is refused, and so is a
    /// `--max-record-bytes` whose publish would need a frame over 16M (the largest a bridge
    /// takes), however large the RAM buffer.
    #[test]
    fn frame_limits_are_checked() {
        let dir = tempfile_dir("frames");
        let base = || RunArgs {
            image: Some(dir.join("gw.img")),
            ..RunArgs::default()
        };
        for (frame, ok) in [
            (63 << 10, false),
            (64 << 10, true),
            (16 << 20, true),
            ((16 << 20) + 1, false),
            (4 << 30, false),
        ] {
            let args = RunArgs {
                max_frame_bytes: Some(ByteSize(frame)),
                ..base()
            };
            let r = settings(&args);
            assert_eq!(r.is_ok(), ok, "--max-frame-bytes {frame}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("--max-frame-bytes"), "{e}");
                assert!(e.to_string().contains("(64K to 16M)"), "{e}");
            }
        }
        for (record, ok) in [(1 << 20, true), (16_776_000, false), (16_000_000, true)] {
            let args = RunArgs {
                buffer_bytes: Some(ByteSize(16 << 20)),
                size: Some(ByteSize(1 << 30)),
                max_record_bytes: Some(ByteSize(record)),
                ..base()
            };
            let r = settings(&args);
            assert_eq!(r.is_ok(), ok, "--max-record-bytes {record}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("largest a bridge takes"), "{e}");
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A directory of this test's own (the tests run in parallel).
    fn tempfile_dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("spillway-cfg-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

//! The listener and serial port URIs of `spillway run`: where (`tcp://`, `unix://`,
//! `serial://`, read by the shared parser `spillway_core::cli::uri`) and what the
//! connection carries (`mode=frames|lines`, `topic=`, percent-decoded).

use std::net::SocketAddr;
use std::path::PathBuf;

use spillway_core::cli::uri::{BadUri, GatewayAddr, Uri};

use super::super::AppError;

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

/// The mode and topic of a listener or serial URI (`mode=frames|lines`, `topic=NAME`).
fn mode_of(uri: &Uri) -> Result<Mode, AppError> {
    let text = &uri.text;
    let topic = match uri.param("topic") {
        Some(t) if t.is_empty() || t.len() > 255 => {
            return Err(AppError::Usage(format!(
                "{text}: topic must be 1 to 255 bytes"
            )));
        }
        t => t.map(str::to_string),
    };
    match uri.param("mode").unwrap_or("frames") {
        "frames" => {
            if topic.is_some() {
                return Err(AppError::Usage(format!("{text}: topic= needs mode=lines")));
            }
            Ok(Mode::Frames)
        }
        "lines" => Ok(Mode::Lines { topic }),
        m => Err(AppError::Usage(format!(
            "{text}: mode must be frames or lines, not {m:?}"
        ))),
    }
}

/// Parses a URI and its address with the shared parser, leaving `mode` and `topic` to
/// [`mode_of`].
fn address_of(text: &str) -> Result<(Uri, GatewayAddr), AppError> {
    let usage = |e: BadUri| AppError::Usage(e.to_string());
    let uri = Uri::parse(text).map_err(usage)?;
    let addr = GatewayAddr::from_uri(&uri, &["mode", "topic"]).map_err(usage)?;
    Ok((uri, addr))
}

/// Parses a `--listen` URI. A TCP address without a host binds 127.0.0.1; the host is an
/// IP address (a listener binds, it does not resolve names).
pub fn parse_listen(text: &str) -> Result<Listen, AppError> {
    let (uri, addr) = address_of(text)?;
    let endpoint = match addr {
        GatewayAddr::Tcp(hp) => Endpoint::Tcp(hp.parse().map_err(|_| {
            AppError::Usage(format!(
                "{text}: expected tcp://IP:PORT, e.g. tcp://127.0.0.1:7878"
            ))
        })?),
        GatewayAddr::Unix(path) => Endpoint::Unix(PathBuf::from(path)),
        GatewayAddr::Serial { .. } => {
            return Err(AppError::Usage(format!(
                "{text}: listener URIs start with tcp:// or unix:// (serial ports: --serial)"
            )));
        }
    };
    Ok(Listen {
        uri: text.to_string(),
        endpoint,
        mode: mode_of(&uri)?,
    })
}

/// Parses a `--serial` URI.
pub fn parse_serial(text: &str) -> Result<Serial, AppError> {
    let (uri, addr) = address_of(text)?;
    let GatewayAddr::Serial { path, baud } = addr else {
        return Err(AppError::Usage(format!(
            "{text}: serial URIs start with serial://"
        )));
    };
    Ok(Serial {
        uri: text.to_string(),
        path,
        baud,
        mode: mode_of(&uri)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_without_a_host_binds_loopback_and_lines_take_a_topic() {
        let l = parse_listen("tcp://:7000?mode=lines&topic=t").unwrap();
        assert_eq!(l.endpoint, Endpoint::Tcp("127.0.0.1:7000".parse().unwrap()));
        assert_eq!(
            l.mode,
            Mode::Lines {
                topic: Some("t".into())
            }
        );
        assert_eq!(
            parse_listen("tcp://0.0.0.0:7878").unwrap().mode,
            Mode::Frames
        );
    }

    #[test]
    fn a_topic_is_percent_decoded() {
        let l = parse_listen("unix:///run/x.sock?mode=lines&topic=a%2Fb").unwrap();
        assert_eq!(l.endpoint, Endpoint::Unix("/run/x.sock".into()));
        assert_eq!(
            l.mode,
            Mode::Lines {
                topic: Some("a/b".into())
            }
        );
        let s =
            parse_serial("serial:///dev/ttyUSB0?baud=9600&mode=lines&topic=buoy%2Fsst").unwrap();
        assert_eq!((s.path.as_str(), s.baud), ("/dev/ttyUSB0", 9600));
        assert_eq!(
            s.mode,
            Mode::Lines {
                topic: Some("buoy/sst".into())
            }
        );
    }

    #[test]
    fn bad_listener_and_serial_uris() {
        for bad in [
            "http://x",
            "tcp://127.0.0.1:1?mode=x",
            "tcp://127.0.0.1:1?topic=t",
            "tcp://127.0.0.1:1?mode=lines&topic=",
            "tcp://127.0.0.1:1?baud=9600",
            "tcp://localhost:1",
            "serial:///dev/ttyS0",
            "unix://",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
        for bad in [
            "tcp://:1",
            "serial://",
            "serial:///dev/x?baud=0",
            "serial:///dev/x?parity=odd",
        ] {
            assert!(parse_serial(bad).is_err(), "{bad}");
        }
        let s = parse_serial("serial:///dev/ttyS1").unwrap();
        assert_eq!((s.baud, s.mode), (115_200, Mode::Frames));
    }
}

//! The one parser of the URIs the binaries take: where a gateway listens or is reached
//! (`tcp://`, `unix://`, `serial://`: [`GatewayAddr`]) and where the bridge drains to
//! (`file:`, `kafka://`: [`SinkUri`]), both over the generic split of [`Uri`].
//!
//! The forms, and what they mean:
//!
//! | URI | meaning |
//! |---|---|
//! | `tcp://127.0.0.1:7878`, `tcp://gw.lan:7878`, `tcp://[::1]:7878` | a TCP address (a host name is resolved when connecting) |
//! | `tcp://:7000` | `127.0.0.1:7000`: loopback unless told otherwise |
//! | `tls://gw.lan:7879`, `tls://:7879` | `tcp://` over TLS (same address rules; a client verifies the host name against the gateway's certificate) |
//! | `unix:///run/x.sock` | the Unix socket `/run/x.sock` (`unix://x.sock` is relative) |
//! | `serial:///dev/ttyUSB0?baud=N` | a serial device at N baud ([`DEFAULT_BAUD`] without `baud=`) |
//! | `file:./spillway-out`, `file:/abs/dir`, `file:///abs/dir` | a directory (relative or absolute) |
//! | `kafka://h1:9092,h2:9092/topic` | a Kafka topic and its bootstrap brokers |
//! | `kafka://h1:9092/pre.{topic}` | a Kafka topic per record topic (the bridge maps `{topic}`) |
//!
//! A query (`?key=value&...`) follows the path; its keys and values are percent-decoded
//! (`topic=a%2Fb` is the topic `a/b`), the path and the authority are taken as written. A
//! key the caller does not read is an error. `url` is not used: it refuses an empty host and
//! a broker list, and reads `file:./x` as `/x`. A new scheme (`mqtt://` next) is a new arm
//! over [`Uri`].

use std::path::PathBuf;
use std::str::FromStr;
use std::string::{String, ToString};
use std::vec::Vec;
use std::{fmt, format};

use percent_encoding::percent_decode_str;

/// Default serial line speed, baud.
pub const DEFAULT_BAUD: u32 = 115_200;

/// What [`GatewayAddr`] accepts, for error messages.
const GATEWAY_FORMS: &str =
    "tcp://HOST:PORT, tls://HOST:PORT, unix:///PATH or serial:///dev/ttyX?baud=N";
/// What [`SinkUri`] accepts, for error messages.
const SINK_FORMS: &str = "file:DIR or kafka://HOST:PORT[,HOST:PORT...]/TOPIC";

/// A URI that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad URI {uri:?}: {why} (expected {expected})")]
pub struct BadUri {
    /// The URI as given.
    pub uri: String,
    /// What is wrong with it.
    pub why: String,
    /// The forms accepted where it was given.
    pub expected: &'static str,
}

/// A URI split into its parts: `scheme:[//authority]path[?query]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    /// The URI as given.
    pub text: String,
    /// Before the first `:`, e.g. `tcp`.
    pub scheme: String,
    /// After `//` up to the next `/` (or the query); `None` without `//` (`file:./out`).
    pub authority: Option<String>,
    /// After the authority (or the `:`), before `?`, as written.
    pub path: String,
    /// The query's `key=value` pairs in order, percent-decoded; a key without `=` has an
    /// empty value.
    pub query: Vec<(String, String)>,
}

impl Uri {
    /// Splits `text`.
    ///
    /// # Errors
    /// No scheme, or a query key or value that is not UTF-8 once decoded.
    pub fn parse(text: &str) -> Result<Uri, BadUri> {
        Self::parse_for(text, "a URI")
    }

    fn parse_for(text: &str, expected: &'static str) -> Result<Uri, BadUri> {
        let bad = |why: String| BadUri {
            uri: text.to_string(),
            why,
            expected,
        };
        let (scheme, rest) = text
            .split_once(':')
            .filter(|(s, _)| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
            })
            .ok_or_else(|| bad("missing scheme".into()))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.strip_prefix("//") {
            Some(r) => {
                let end = r.find('/').unwrap_or(r.len());
                (Some(r[..end].to_string()), r[end..].to_string())
            }
            None => (None, rest.to_string()),
        };
        let decode = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| bad(format!("{s:?} is not UTF-8 once percent-decoded")))
        };
        let mut pairs = Vec::new();
        for p in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            pairs.push((decode(k)?, decode(v)?));
        }
        Ok(Uri {
            text: text.to_string(),
            scheme: scheme.to_ascii_lowercase(),
            authority,
            path,
            query: pairs,
        })
    }

    /// The (last) value of query key `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The authority and the path as one: `unix:///run/x.sock` → `/run/x.sock`,
    /// `file:./out` → `./out`.
    pub fn location(&self) -> String {
        let mut s = self.authority.clone().unwrap_or_default();
        s.push_str(&self.path);
        s
    }

    /// Checks that every query key is one of `known`.
    ///
    /// # Errors
    /// The first other key, by name.
    pub fn only_params(&self, known: &[&str]) -> Result<(), String> {
        match self
            .query
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(format!("unknown parameter {k:?}")),
            None => Ok(()),
        }
    }

    fn error(&self, why: impl Into<String>, expected: &'static str) -> BadUri {
        BadUri {
            uri: self.text.clone(),
            why: why.into(),
            expected,
        }
    }
}

/// Where a gateway listens or is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayAddr {
    /// A TCP address `HOST:PORT` (`127.0.0.1` when the URI gave no host).
    Tcp(String),
    /// A TCP address `HOST:PORT` spoken over TLS (`tls://`; `127.0.0.1` when the URI gave
    /// no host).
    Tls(String),
    /// A Unix socket path.
    Unix(String),
    /// A serial device and its speed in baud.
    Serial {
        /// Device path, e.g. `/dev/ttyUSB0`.
        path: String,
        /// Line speed, baud.
        baud: u32,
    },
}

impl GatewayAddr {
    /// The address `uri` names. `params` are the query keys the caller reads itself (the
    /// gateway's `mode` and `topic`); `baud` is read here for `serial:`; any other key is
    /// an error.
    ///
    /// # Errors
    /// An unknown scheme or parameter, a missing or bad port, path or baud rate.
    pub fn from_uri(uri: &Uri, params: &[&str]) -> Result<GatewayAddr, BadUri> {
        let bad = |why: &str| uri.error(why, GATEWAY_FORMS);
        let known = |extra: &[&str]| -> Result<(), BadUri> {
            let all: Vec<&str> = params.iter().chain(extra).copied().collect();
            uri.only_params(&all)
                .map_err(|e| uri.error(e, GATEWAY_FORMS))
        };
        match uri.scheme.as_str() {
            scheme @ ("tcp" | "tls") => {
                known(&[])?;
                let Some(hp) = uri.authority.as_deref().filter(|a| !a.is_empty()) else {
                    return Err(bad("missing HOST:PORT"));
                };
                if !uri.path.is_empty() && uri.path != "/" {
                    return Err(bad("a TCP address has no path"));
                }
                let (host, port) = hp.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
                port.parse::<u16>().map_err(|_| bad("bad port"))?;
                let host = if host.is_empty() { "127.0.0.1" } else { host };
                let hp = format!("{host}:{port}");
                Ok(if scheme == "tls" {
                    GatewayAddr::Tls(hp)
                } else {
                    GatewayAddr::Tcp(hp)
                })
            }
            "unix" => {
                known(&[])?;
                let path = uri.location();
                if path.is_empty() {
                    return Err(bad("missing path"));
                }
                Ok(GatewayAddr::Unix(path))
            }
            "serial" => {
                known(&["baud"])?;
                let path = uri.location();
                if path.is_empty() {
                    return Err(bad("missing device path"));
                }
                let baud = match uri.param("baud") {
                    None => DEFAULT_BAUD,
                    Some(v) => v
                        .parse()
                        .ok()
                        .filter(|&b: &u32| b > 0)
                        .ok_or_else(|| bad("bad baud rate"))?,
                };
                Ok(GatewayAddr::Serial { path, baud })
            }
            _ => Err(bad("unknown scheme")),
        }
    }
}

impl FromStr for GatewayAddr {
    type Err = BadUri;
    /// A gateway URI without query keys but `baud`; a bare `HOST:PORT` (`127.0.0.1:7878`,
    /// `gw.lan:7878`, `[::1]:7878`: no `//`, a port of digits after the last `:`) is taken
    /// as `tcp://HOST:PORT`.
    fn from_str(s: &str) -> Result<Self, BadUri> {
        if !s.contains("//")
            && let Some((host, port)) = s.rsplit_once(':')
            && !host.is_empty()
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && !matches!(host, "tcp" | "tls" | "unix" | "serial")
        {
            return GatewayAddr::from_uri(
                &Uri::parse_for(&format!("tcp://{s}"), GATEWAY_FORMS)?,
                &[],
            );
        }
        GatewayAddr::from_uri(&Uri::parse_for(s, GATEWAY_FORMS)?, &[])
    }
}

impl fmt::Display for GatewayAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayAddr::Tcp(a) => write!(f, "tcp://{a}"),
            GatewayAddr::Tls(a) => write!(f, "tls://{a}"),
            GatewayAddr::Unix(p) => write!(f, "unix://{p}"),
            GatewayAddr::Serial { path, baud } => write!(f, "serial://{path}?baud={baud}"),
        }
    }
}

/// Where the bridge drains to: `file:DIR` or `kafka://HOST:PORT[,HOST:PORT…]/TOPIC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkUri {
    /// Newline-delimited JSON files in a directory.
    File(PathBuf),
    /// A Kafka topic.
    Kafka {
        /// Bootstrap servers, comma-separated `HOST:PORT`.
        brokers: String,
        /// Target topic, as written: a topic name, or a template with `{topic}` that the
        /// bridge fills per record (its `sink::kafka_topic`).
        topic: String,
    },
}

impl FromStr for SinkUri {
    type Err = BadUri;
    fn from_str(s: &str) -> Result<Self, BadUri> {
        let uri = Uri::parse_for(s, SINK_FORMS)?;
        let bad = |why: &str| uri.error(why, SINK_FORMS);
        uri.only_params(&[]).map_err(|e| uri.error(e, SINK_FORMS))?;
        match uri.scheme.as_str() {
            "file" => {
                let dir = uri.location();
                if dir.is_empty() {
                    return Err(bad("missing directory"));
                }
                Ok(SinkUri::File(PathBuf::from(dir)))
            }
            "kafka" => {
                let brokers = uri.authority.clone().unwrap_or_default();
                let topic = uri
                    .path
                    .strip_prefix('/')
                    .ok_or_else(|| bad("missing /TOPIC"))?;
                if brokers.is_empty() {
                    return Err(bad("missing HOST:PORT"));
                }
                if topic.is_empty() || topic.contains('/') {
                    return Err(bad("bad topic"));
                }
                Ok(SinkUri::Kafka {
                    brokers,
                    topic: topic.to_string(),
                })
            }
            _ => Err(bad("unknown scheme")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(s: &str) -> GatewayAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn sink(s: &str) -> SinkUri {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn tcp_without_a_host_is_loopback() {
        assert_eq!(gw("tcp://:7000"), GatewayAddr::Tcp("127.0.0.1:7000".into()));
        // A bare HOST:PORT is a TCP address.
        assert_eq!(
            gw("127.0.0.1:7878"),
            GatewayAddr::Tcp("127.0.0.1:7878".into())
        );
        assert_eq!(gw("gw.lan:7878"), GatewayAddr::Tcp("gw.lan:7878".into()));
        assert_eq!(gw("[::1]:7878"), GatewayAddr::Tcp("[::1]:7878".into()));
        assert!("gw.lan:x".parse::<GatewayAddr>().is_err());
        assert_eq!(
            gw("tcp://127.0.0.1:7878"),
            GatewayAddr::Tcp("127.0.0.1:7878".into())
        );
        assert_eq!(
            gw("tcp://gw.lan:7878/"),
            GatewayAddr::Tcp("gw.lan:7878".into())
        );
        assert_eq!(
            gw("tcp://[::1]:7878"),
            GatewayAddr::Tcp("[::1]:7878".into())
        );
        assert_eq!(gw("tls://:7879"), GatewayAddr::Tls("127.0.0.1:7879".into()));
        assert_eq!(
            gw("tls://gw.lan:7879").to_string(),
            "tls://gw.lan:7879".to_string()
        );
    }

    #[test]
    fn unix_paths_absolute_and_relative() {
        assert_eq!(
            gw("unix:///run/x.sock"),
            GatewayAddr::Unix("/run/x.sock".into())
        );
        assert_eq!(gw("unix://x.sock"), GatewayAddr::Unix("x.sock".into()));
    }

    #[test]
    fn serial_with_and_without_baud() {
        assert_eq!(
            gw("serial:///dev/ttyUSB0?baud=9600"),
            GatewayAddr::Serial {
                path: "/dev/ttyUSB0".into(),
                baud: 9600
            }
        );
        assert_eq!(
            gw("serial:///dev/ttyS1"),
            GatewayAddr::Serial {
                path: "/dev/ttyS1".into(),
                baud: DEFAULT_BAUD
            }
        );
    }

    #[test]
    fn a_file_sink_keeps_a_relative_directory() {
        assert_eq!(
            sink("file:./spillway-out"),
            SinkUri::File("./spillway-out".into())
        );
        assert_eq!(sink("file:/abs/dir"), SinkUri::File("/abs/dir".into()));
        assert_eq!(
            sink("file:///var/spool/x"),
            SinkUri::File("/var/spool/x".into())
        );
    }

    #[test]
    fn a_kafka_sink_takes_a_broker_list() {
        assert_eq!(
            sink("kafka://h1:9092,h2:9092/topic"),
            SinkUri::Kafka {
                brokers: "h1:9092,h2:9092".into(),
                topic: "topic".into()
            }
        );
        assert_eq!(
            sink("kafka://h1:9092/pre.{topic}"),
            SinkUri::Kafka {
                brokers: "h1:9092".into(),
                topic: "pre.{topic}".into()
            }
        );
    }

    #[test]
    fn query_values_are_percent_decoded() {
        let u = Uri::parse("tcp://:1?mode=lines&topic=a%2Fb&flag").unwrap();
        assert_eq!(u.param("topic"), Some("a/b"));
        assert_eq!(u.param("flag"), Some(""));
        assert_eq!(u.param("none"), None);
        assert_eq!(
            GatewayAddr::from_uri(&u, &["mode", "topic", "flag"]),
            Ok(GatewayAddr::Tcp("127.0.0.1:1".into()))
        );
        assert!(GatewayAddr::from_uri(&u, &["mode"]).is_err());
        assert!(Uri::parse("tcp://:1?topic=%FF").is_err());
        let u = Uri::parse("mqtt://broker:1883/sensors?qos=1").unwrap();
        assert_eq!(
            (u.scheme.as_str(), u.authority.as_deref(), u.path.as_str()),
            ("mqtt", Some("broker:1883"), "/sensors")
        );
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        for bad in [
            "",
            "tcp://",
            "tcp://host",
            "tcp://host:x",
            "tcp://h:1/path",
            "tcp://h:1?mode=lines",
            "http://a:1",
            "unix://",
            "serial://?baud=1",
            "serial:///dev/x?baud=0",
            "serial:///dev/x?parity=odd",
            ":7878",
            "host:",
        ] {
            assert!(bad.parse::<GatewayAddr>().is_err(), "{bad}");
        }
        for bad in [
            "",
            "file:",
            "kafka://",
            "kafka://h:1",
            "kafka://h:1/",
            "kafka:///t",
            "kafka://h:1/a/b",
            "s3://x",
            "file:./out?x=1",
        ] {
            assert!(bad.parse::<SinkUri>().is_err(), "{bad}");
        }
        let e = "tcp://host".parse::<GatewayAddr>().unwrap_err().to_string();
        assert!(
            e.contains("missing port") && e.contains("tcp://HOST:PORT"),
            "{e}"
        );
    }

    #[test]
    fn display_gives_a_uri_that_parses_back() {
        for s in [
            "tcp://127.0.0.1:7000",
            "unix:///run/x.sock",
            "serial:///dev/ttyS0?baud=9600",
        ] {
            assert_eq!(gw(s).to_string(), s);
            assert_eq!(gw(&gw(s).to_string()), gw(s));
        }
    }
}

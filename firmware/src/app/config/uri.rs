//! The listener and serial port URIs of `spillway run`: where (`tcp://`, `tls://`,
//! `unix://`, `serial://`, read by the shared parser `spillway_core::cli::uri`, and
//! `mqtt://`, a TCP address served by the MQTT listener), what the connection may do
//! (`roles=publish,consume,admin`), whether plaintext on a non-loopback address is meant
//! (`allow-insecure=true`), and what the connection carries (`mode=frames|lines`, `topic=`,
//! percent-decoded; `ack=durable|buffered` for `mqtt://`).

use std::net::SocketAddr;
use std::path::PathBuf;

use spillway_core::cli::uri::{BadUri, GatewayAddr, Uri};
use spillway_firmware::Roles;

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
        /// A partial line followed by this many milliseconds of silence is dropped
        /// (`line-timeout-ms=N`, [`DEFAULT_LINE_TIMEOUT_MS`] by default).
        timeout_ms: u64,
    },
    /// MQTT 3.1.1 and 5.0 publishes (`mqtt://`), one record per PUBLISH.
    Mqtt {
        /// When a QoS 1 or 2 publish is acknowledged (PUBACK, PUBREC).
        ack: MqttAck,
    },
}

/// When the MQTT listener acknowledges a QoS 1 or 2 publish (`mqtt://…?ack=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MqttAck {
    /// Once the record is on flash and synced (the default, whatever `--ack` says).
    Durable,
    /// Once the record is in the log's RAM buffer (`ack=buffered`): a power cut may lose
    /// what was acknowledged.
    Buffered,
}

/// Milliseconds of silence after which a partial line (no `\n` yet) is dropped, unless a
/// listener or serial URI gives `line-timeout-ms=N`.
pub const DEFAULT_LINE_TIMEOUT_MS: u64 = 1000;

/// Largest `line-timeout-ms`, milliseconds (one hour).
pub const MAX_LINE_TIMEOUT_MS: u64 = 3_600_000;

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
    /// `tls://`: TCP wrapped in TLS (the certificate settings apply).
    pub tls: bool,
    /// What its connections may do (`roles=`; every role without it, `publish` only in
    /// line mode).
    pub roles: Roles,
    /// `allow-insecure=true`: plaintext on a non-loopback address is meant.
    pub allow_insecure: bool,
}

impl Listen {
    /// Whether the listener is reachable only from this host: a loopback address or a
    /// Unix socket.
    pub fn is_local(&self) -> bool {
        match &self.endpoint {
            Endpoint::Tcp(a) => a.ip().is_loopback(),
            Endpoint::Unix(_) => true,
        }
    }
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
    /// What the link may do: `publish` unless `roles=` says more (frames only: a port in
    /// line mode only publishes).
    pub roles: Roles,
}

/// The mode, topic and line timeout of a listener or serial URI (`mode=frames|lines`,
/// `topic=NAME`, `line-timeout-ms=N`).
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
    let timeout_ms = match uri.param("line-timeout-ms") {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .ok()
                .filter(|&ms| (1..=MAX_LINE_TIMEOUT_MS).contains(&ms))
                .ok_or_else(|| {
                    AppError::Usage(format!(
                        "{text}: line-timeout-ms must be 1 to {MAX_LINE_TIMEOUT_MS} milliseconds, not {v:?}"
                    ))
                })?,
        ),
    };
    match uri.param("mode").unwrap_or("frames") {
        "frames" => {
            if topic.is_some() {
                return Err(AppError::Usage(format!("{text}: topic= needs mode=lines")));
            }
            if timeout_ms.is_some() {
                return Err(AppError::Usage(format!(
                    "{text}: line-timeout-ms= needs mode=lines"
                )));
            }
            Ok(Mode::Frames)
        }
        "lines" => Ok(Mode::Lines {
            topic,
            timeout_ms: timeout_ms.unwrap_or(DEFAULT_LINE_TIMEOUT_MS),
        }),
        m => Err(AppError::Usage(format!(
            "{text}: mode must be frames or lines, not {m:?}"
        ))),
    }
}

/// Parses a role list such as `publish,consume` (`publish`, `consume`, `admin`, comma
/// separated, at least one). `what` names the setting in errors.
pub fn parse_roles(list: &str, what: &str) -> Result<Roles, AppError> {
    let mut roles = Roles::NONE;
    for r in list.split(',').map(str::trim) {
        match r {
            "publish" => roles.publish = true,
            "consume" => roles.consume = true,
            "admin" => roles.admin = true,
            other => {
                return Err(AppError::Usage(format!(
                    "{what}: unknown role {other:?} (roles are publish, consume, admin)"
                )));
            }
        }
    }
    Ok(roles)
}

/// The `roles=` of a listener or serial URI, `default` without it. A line-mode connection
/// only publishes: any other role is an error.
fn roles_of(uri: &Uri, mode: &Mode, default: Roles) -> Result<Roles, AppError> {
    let text = &uri.text;
    let given = uri
        .param("roles")
        .map(|l| parse_roles(l, text))
        .transpose()?;
    let roles = given.unwrap_or(default);
    if matches!(mode, Mode::Lines { .. }) {
        if given.is_some_and(|r| r.consume || r.admin) {
            return Err(AppError::Usage(format!(
                "{text}: a line-mode connection only publishes (roles=publish)"
            )));
        }
        return Ok(Roles::PUBLISH);
    }
    Ok(roles)
}

/// Parses a URI and its address with the shared parser, leaving `mode`, `topic` and
/// `line-timeout-ms` to [`mode_of`], `roles` to [`roles_of`] and `allow-insecure` to
/// [`parse_listen`].
/// What `--listen` accepts, for the messages of a URI that does not parse (the bridge's
/// forms, which the shared parser names, include serial ports and host names).
const LISTENER_FORMS: &str = "tcp://IP:PORT, tls://IP:PORT or unix:///PATH, with mode, topic, line-timeout-ms, roles, allow-insecure; mqtt://IP:PORT or mqtts://IP:PORT, with ack, roles, allow-insecure";

/// What `--serial` accepts, for the same messages.
const SERIAL_FORMS: &str = "serial:///dev/ttyX?baud=N, with mode, topic, line-timeout-ms, roles";

/// A parse error of a listener URI, naming the listener forms.
fn listener_usage(mut e: BadUri) -> AppError {
    e.expected = LISTENER_FORMS;
    AppError::Usage(e.to_string())
}

/// Parses `text` as a listener URI (`forms`: [`LISTENER_FORMS`]) or a serial port URI
/// ([`SERIAL_FORMS`]); a parse error names those forms.
fn address_of(text: &str, forms: &'static str) -> Result<(Uri, GatewayAddr), AppError> {
    let usage = |mut e: BadUri| {
        e.expected = forms;
        AppError::Usage(e.to_string())
    };
    let uri = Uri::parse(text).map_err(usage)?;
    if !matches!(uri.scheme.as_str(), "tcp" | "tls" | "unix" | "serial") {
        return Err(AppError::Usage(format!(
            "bad URI {text:?}: unknown scheme (expected {forms})"
        )));
    }
    let params = [
        "mode",
        "topic",
        "line-timeout-ms",
        "roles",
        "allow-insecure",
    ];
    let addr = GatewayAddr::from_uri(&uri, &params).map_err(usage)?;
    Ok((uri, addr))
}

/// Parses an `mqtt://IP:PORT[?ack=durable|buffered][&roles=…]` listener URI (a TCP
/// address; no `mode` or `topic`: the MQTT topic is the record's topic), or `mqtts://` (the
/// same over TLS). MQTT connections only publish: `roles=` is `publish` by default, and a
/// list without `publish` makes a listener that refuses every PUBLISH (`consume` and
/// `admin` grant nothing over MQTT, which has no way to ask for them).
fn parse_mqtt_listen(text: &str, uri: Uri) -> Result<Listen, AppError> {
    let tls = uri.scheme == "mqtts";
    let allow_insecure = allow_insecure_of(&uri)?;
    let usage = listener_usage;
    let ack = match uri.param("ack") {
        None | Some("durable") => MqttAck::Durable,
        Some("buffered") => MqttAck::Buffered,
        Some(other) => {
            return Err(AppError::Usage(format!(
                "{text}: ack must be durable or buffered, not {other:?}"
            )));
        }
    };
    let roles = uri
        .param("roles")
        .map(|l| parse_roles(l, text))
        .transpose()?
        .unwrap_or(Roles::PUBLISH);
    // The address rules are those of tcp://.
    let mut tcp = uri;
    tcp.scheme = "tcp".into();
    let GatewayAddr::Tcp(hp) =
        GatewayAddr::from_uri(&tcp, &["ack", "allow-insecure", "roles"]).map_err(usage)?
    else {
        return Err(AppError::Usage(format!("{text}: expected mqtt://IP:PORT")));
    };
    let addr = hp.parse().map_err(|_| {
        AppError::Usage(format!(
            "{text}: expected mqtt://IP:PORT, e.g. mqtt://127.0.0.1:1883"
        ))
    })?;
    Ok(Listen {
        uri: text.to_string(),
        endpoint: Endpoint::Tcp(addr),
        mode: Mode::Mqtt { ack },
        tls,
        roles,
        allow_insecure,
    })
}

/// The `allow-insecure=true|false` of a listener URI.
fn allow_insecure_of(uri: &Uri) -> Result<bool, AppError> {
    match uri.param("allow-insecure") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(AppError::Usage(format!(
            "{}: allow-insecure must be true or false, not {v:?}",
            uri.text
        ))),
    }
}

/// Parses a `--listen` URI. A TCP address without a host binds 127.0.0.1; the host is an
/// IP address (a listener binds, it does not resolve names).
pub fn parse_listen(text: &str) -> Result<Listen, AppError> {
    if let Ok(uri) = Uri::parse(text)
        && (uri.scheme == "mqtt" || uri.scheme == "mqtts")
    {
        return parse_mqtt_listen(text, uri);
    }
    let (uri, addr) = address_of(text, LISTENER_FORMS)?;
    let ip_port = |hp: String, scheme: &str| {
        hp.parse().map(Endpoint::Tcp).map_err(|_| {
            AppError::Usage(format!(
                "{text}: expected {scheme}://IP:PORT, e.g. {scheme}://127.0.0.1:7878"
            ))
        })
    };
    let (endpoint, tls) = match addr {
        GatewayAddr::Tcp(hp) => (ip_port(hp, "tcp")?, false),
        GatewayAddr::Tls(hp) => (ip_port(hp, "tls")?, true),
        GatewayAddr::Unix(path) => (Endpoint::Unix(PathBuf::from(path)), false),
        GatewayAddr::Serial { .. } => {
            return Err(AppError::Usage(format!(
                "{text}: listener URIs start with tcp://, tls://, unix://, mqtt:// or mqtts:// (serial ports: --serial)"
            )));
        }
    };
    let allow_insecure = allow_insecure_of(&uri)?;
    let mode = mode_of(&uri)?;
    Ok(Listen {
        uri: text.to_string(),
        endpoint,
        roles: roles_of(&uri, &mode, Roles::ALL)?,
        mode,
        tls,
        allow_insecure,
    })
}

/// Parses a `--serial` URI.
pub fn parse_serial(text: &str) -> Result<Serial, AppError> {
    let (uri, addr) = address_of(text, SERIAL_FORMS)?;
    let GatewayAddr::Serial { path, baud } = addr else {
        return Err(AppError::Usage(format!(
            "{text}: serial URIs start with serial://"
        )));
    };
    if uri.param("allow-insecure").is_some() {
        return Err(AppError::Usage(format!(
            "{text}: allow-insecure is for network listeners"
        )));
    }
    let mode = mode_of(&uri)?;
    Ok(Serial {
        uri: text.to_string(),
        path,
        baud,
        roles: roles_of(&uri, &mode, Roles::PUBLISH)?,
        mode,
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
                topic: Some("t".into()),
                timeout_ms: DEFAULT_LINE_TIMEOUT_MS,
            }
        );
        assert_eq!(
            parse_listen("tcp://:7000?mode=lines&line-timeout-ms=250")
                .unwrap()
                .mode,
            Mode::Lines {
                topic: None,
                timeout_ms: 250,
            }
        );
        assert_eq!(
            parse_listen("tcp://0.0.0.0:7878").unwrap().mode,
            Mode::Frames
        );
    }

    #[test]
    fn mqtt_listeners_take_a_tcp_address_and_an_ack_level() {
        let l = parse_listen("mqtt://127.0.0.1:1883").unwrap();
        assert_eq!(l.endpoint, Endpoint::Tcp("127.0.0.1:1883".parse().unwrap()));
        assert_eq!(
            l.mode,
            Mode::Mqtt {
                ack: MqttAck::Durable
            }
        );
        let l = parse_listen("mqtt://:1884?ack=buffered").unwrap();
        assert_eq!(l.endpoint, Endpoint::Tcp("127.0.0.1:1884".parse().unwrap()));
        assert_eq!(
            l.mode,
            Mode::Mqtt {
                ack: MqttAck::Buffered
            }
        );
        for bad in [
            "mqtt://127.0.0.1:1883?ack=none",
            "mqtt://127.0.0.1:1883?mode=lines",
            "mqtt://127.0.0.1",
            "mqtt://localhost:1883",
            "mqtt:///path",
            "mqtt://127.0.0.1:1883?roles=root",
            "mqtts://127.0.0.1:8883?roles=",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mqtt_listeners_publish_unless_roles_say_otherwise() {
        assert_eq!(
            parse_listen("mqtt://127.0.0.1:1883").unwrap().roles,
            Roles::PUBLISH
        );
        let l = parse_listen("mqtt://127.0.0.1:1883?roles=consume").unwrap();
        assert!(!l.roles.publish && l.roles.consume && !l.roles.admin);
        let l = parse_listen("mqtts://127.0.0.1:8883?ack=buffered&roles=publish,admin").unwrap();
        assert!(l.tls && l.roles.publish && l.roles.admin && !l.roles.consume);
        assert_eq!(
            l.mode,
            Mode::Mqtt {
                ack: MqttAck::Buffered
            }
        );
    }

    #[test]
    fn a_topic_is_percent_decoded() {
        let l = parse_listen("unix:///run/x.sock?mode=lines&topic=a%2Fb").unwrap();
        assert_eq!(l.endpoint, Endpoint::Unix("/run/x.sock".into()));
        assert_eq!(
            l.mode,
            Mode::Lines {
                topic: Some("a/b".into()),
                timeout_ms: DEFAULT_LINE_TIMEOUT_MS,
            }
        );
        let s =
            parse_serial("serial:///dev/ttyUSB0?baud=9600&mode=lines&topic=buoy%2Fsst").unwrap();
        assert_eq!((s.path.as_str(), s.baud), ("/dev/ttyUSB0", 9600));
        assert_eq!(
            s.mode,
            Mode::Lines {
                topic: Some("buoy/sst".into()),
                timeout_ms: DEFAULT_LINE_TIMEOUT_MS,
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
            "tcp://127.0.0.1:1?line-timeout-ms=5",
            "tcp://127.0.0.1:1?mode=lines&line-timeout-ms=0",
            "tcp://127.0.0.1:1?mode=lines&line-timeout-ms=soon",
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

    #[test]
    fn roles_tls_and_allow_insecure_are_read_from_the_uri() {
        let l = parse_listen("tls://0.0.0.0:7879?roles=consume,admin").unwrap();
        assert!(l.tls && !l.is_local() && !l.allow_insecure);
        assert!(!l.roles.publish && l.roles.consume && l.roles.admin);
        let l = parse_listen("tcp://10.0.0.1:7878?allow-insecure=true").unwrap();
        assert!(!l.tls && l.allow_insecure && l.roles == Roles::ALL);
        assert!(parse_listen("unix:///run/x.sock").unwrap().is_local());
        // Serial links publish unless told; lines only ever publish.
        assert_eq!(
            parse_serial("serial:///dev/ttyS1").unwrap().roles,
            Roles::PUBLISH
        );
        let s = parse_serial("serial:///dev/ttyS1?roles=publish,consume").unwrap();
        assert!(s.roles.publish && s.roles.consume && !s.roles.admin);
        assert_eq!(
            parse_listen("tcp://127.0.0.1:1?mode=lines").unwrap().roles,
            Roles::PUBLISH
        );
        for bad in [
            "tcp://127.0.0.1:1?mode=lines&roles=consume",
            "tcp://127.0.0.1:1?roles=root",
            "tcp://127.0.0.1:1?allow-insecure=yes",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
        assert!(parse_serial("serial:///dev/ttyS1?allow-insecure=true").is_err());
    }
}

//! The listener and serial port URIs of `spillway run`: where (`tcp://`, `unix://`,
//! `serial://`) and what the connection carries (`mode=frames|lines`, `topic=`).

use std::net::SocketAddr;
use std::path::PathBuf;

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

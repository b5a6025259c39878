//! The safe defaults of `spillway run`, checked before the image is touched (exit 2 on a
//! failure): no plaintext listener on a non-loopback address unless its URI says
//! `allow-insecure=true`, TLS settings that fit together, and no non-loopback listener
//! that nobody could use or that anybody could use.
//!
//! Who must present a credential ([`token_required`]): every connection to a non-loopback
//! listener, a token (in its `Hello`, or as an MQTT CONNECT's password) or a client
//! certificate verified against `--tls-client-ca`; loopback and Unix listeners are anonymous (their `roles=` apply to
//! everyone on the host), and so is a plaintext non-loopback listener with
//! `allow-insecure=true` while no credential is configured.

use super::super::AppError;
use super::super::auth::Credentials;
use super::{Endpoint, Listen, Mode, Settings};
use std::path::PathBuf;

/// The TLS files as given (flags or keys).
#[derive(Debug, Clone, Default)]
pub struct TlsPaths {
    /// `--tls-cert`.
    pub cert: Option<PathBuf>,
    /// `--tls-key`.
    pub key: Option<PathBuf>,
    /// `--tls-client-ca`.
    pub client_ca: Option<PathBuf>,
}

/// Whether a connection to `l` must present a token or a client certificate.
pub fn token_required(l: &Listen, credentials: &Credentials) -> bool {
    if l.is_local() {
        return false;
    }
    !(l.allow_insecure && !l.tls && credentials.is_empty())
}

/// The checks; `a` holds the TLS paths as given.
pub(super) fn check(s: &Settings, a: &TlsPaths) -> Result<(), AppError> {
    let usage = |m: String| Err(AppError::Usage(m));
    match (&a.cert, &a.key) {
        (Some(_), None) => return usage("--tls-cert needs --tls-key (key tls-key)".into()),
        (None, Some(_)) => return usage("--tls-key needs --tls-cert (key tls-cert)".into()),
        _ => {}
    }
    if a.client_ca.is_some() && a.cert.is_none() {
        return usage("--tls-client-ca needs --tls-cert and --tls-key".into());
    }
    let client_ca = a.client_ca.is_some();
    for l in &s.listen {
        if l.tls && a.cert.is_none() {
            return usage(format!(
                "{}: a tls:// listener needs --tls-cert and --tls-key (keys tls-cert, tls-key)",
                l.uri
            ));
        }
        if l.is_local() {
            continue;
        }
        let Endpoint::Tcp(addr) = &l.endpoint else {
            continue;
        };
        if !l.tls && !l.allow_insecure {
            let secure = match l.mode {
                Mode::Mqtt { .. } => "mqtts",
                _ => "tls",
            };
            return usage(format!(
                "{}: plaintext on the non-loopback address {addr}: anyone on that network could read and forge records. Use {secure}://{addr} with --tls-cert and --tls-key, bind 127.0.0.1, or add ?allow-insecure=true to the URI",
                l.uri
            ));
        }
        if token_required(l, &s.credentials) {
            // Lines carry no token; an MQTT CONNECT carries one as its password.
            if matches!(l.mode, Mode::Lines { .. }) && !client_ca {
                return usage(format!(
                    "{}: a line-mode listener on a non-loopback address admits only clients with a certificate (it carries no token): give --tls-client-ca, or bind 127.0.0.1",
                    l.uri
                ));
            }
            if s.credentials.is_empty() && !client_ca {
                return usage(format!(
                    "{}: a non-loopback listener admits only clients with a credential, and none is configured: add [[credential]] entries to the config file (spillway token FILE prints one) or give --tls-client-ca",
                    l.uri
                ));
            }
        }
    }
    Ok(())
}

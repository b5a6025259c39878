//! What the bridge presents to a gateway: TLS for `tls://` gateways (the CA that signs the
//! gateway's certificate, `--tls-ca`; optionally a client certificate, `--tls-cert` and
//! `--tls-key`) and a token (`--token-file`, sent in the `Hello`).
//!
//! Set once at start ([`set`]) from the flags and the config file, and read by every
//! connection the process opens ([`get`]). A token is only ever read from a file: a flag
//! value would show in `ps` to every user of the host.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use futures_rustls::TlsConnector;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The bridge's TLS and credential settings.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS to `tls://` gateways; `None` without `--tls-ca`.
    pub tls: Option<TlsConnector>,
    /// The token sent in the `Hello`, white space trimmed.
    pub token: Option<Vec<u8>>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

/// The files the settings come from.
#[derive(Debug, Clone, Default)]
pub struct SecurityFiles {
    /// CA certificates (PEM) the gateway's certificate must chain to.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM), for a gateway with `--tls-client-ca`.
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// File holding the token.
    pub token_file: Option<PathBuf>,
}

static SECURITY: OnceLock<Arc<Security>> = OnceLock::new();

/// Sets the process's settings (the first call wins).
pub fn set(s: Security) {
    let _ = SECURITY.set(Arc::new(s));
}

/// The process's settings (none set: no TLS, no token).
pub fn get() -> Arc<Security> {
    SECURITY.get().cloned().unwrap_or_default()
}

fn certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let list = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if list.is_empty() {
        return Err(format!(
            "{flag} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(list)
}

impl SecurityFiles {
    /// Reads the files and builds the settings.
    ///
    /// # Errors
    /// A message naming the flag, the file and the reason: unreadable, no PEM item, a key
    /// that does not fit the certificate, an empty token file, `--tls-cert` without
    /// `--tls-key` (or the reverse) or without `--tls-ca`.
    pub fn load(&self) -> Result<Security, String> {
        let token = match &self.token_file {
            None => None,
            Some(p) => {
                let bytes =
                    std::fs::read(p).map_err(|e| format!("--token-file {}: {e}", p.display()))?;
                let t = bytes.trim_ascii().to_vec();
                if t.is_empty() {
                    return Err(format!("--token-file {}: the file is empty", p.display()));
                }
                warn_if_readable_by_others(p);
                Some(t)
            }
        };
        let tls = match &self.tls_ca {
            None => {
                if self.tls_cert.is_some() || self.tls_key.is_some() {
                    return Err("--tls-cert and --tls-key need --tls-ca".into());
                }
                None
            }
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca, "--tls-ca")? {
                    roots
                        .add(c)
                        .map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?;
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let b = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("TLS: {e}"))?
                    .with_root_certificates(roots);
                let config = match (&self.tls_cert, &self.tls_key) {
                    (Some(cert), Some(key)) => {
                        let chain = certs(cert, "--tls-cert")?;
                        let k = PrivateKeyDer::from_pem_file(key)
                            .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
                        b.with_client_auth_cert(chain, k)
                            .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
                    }
                    (None, None) => b.with_no_client_auth(),
                    _ => return Err("--tls-cert and --tls-key go together".into()),
                };
                Some(TlsConnector::from(Arc::new(config)))
            }
        };
        Ok(Security { tls, token })
    }
}

/// A token file others may read is worth a warning, not a refusal.
fn warn_if_readable_by_others(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(p)
        && m.permissions().mode() & 0o077 != 0
    {
        log::warn!(
            "--token-file {}: readable by other users (mode {:o}); chmod 600 it",
            p.display(),
            m.permissions().mode() & 0o777
        );
    }
}

/// The name a `tls://HOST:PORT` gateway's certificate must carry: `HOST` (a DNS name or an
/// IP address, brackets of an IPv6 address removed).
pub fn server_name(host_port: &str) -> Result<ServerName<'static>, String> {
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?}: {e}"))
}

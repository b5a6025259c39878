//! TLS for the `tls://` listeners (and any listener kind that wraps TCP in TLS): the server
//! configuration built once from `--tls-cert`, `--tls-key` and `--tls-client-ca`, and the
//! handshake of one accepted connection, bounded in time.
//!
//! rustls on its `ring` provider, TLS 1.2 and 1.3 with rustls's safe defaults. With a
//! client CA, a client certificate is optional in the handshake (a client without one
//! presents a token in its `Hello`), but one that is presented must chain to that CA and
//! be valid now: an expired certificate or one from another CA fails the handshake.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use smol::io::{AsyncRead, AsyncWrite};

use super::AppError;

/// Longest time an accepted connection has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS settings of every TLS listener.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    /// Client certificates are verified against a CA (`--tls-client-ca`).
    pub client_ca: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, AppError> {
    let bad = |e: &dyn std::fmt::Display| {
        AppError::Usage(format!(
            "{what} {}: cannot read certificates: {e}",
            path.display()
        ))
    };
    let list = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if list.is_empty() {
        return Err(AppError::Usage(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(list)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Reads the certificate chain, its key and (for mTLS) the client CA, and builds the
    /// server configuration.
    ///
    /// # Errors
    /// [`AppError::Usage`] naming the file and the reason: missing, unreadable, no PEM
    /// item, a key that does not match the certificate.
    pub fn new(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Tls, AppError> {
        let chain = certs(cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            AppError::Usage(format!(
                "--tls-key {}: cannot read a private key: {e}",
                key.display()
            ))
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| AppError::Usage(format!("TLS: {e}")))?;
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca, "--tls-client-ca")? {
                    roots.add(c).map_err(|e| {
                        AppError::Usage(format!("--tls-client-ca {}: {e}", ca.display()))
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .allow_unauthenticated()
                        .build()
                        .map_err(|e| {
                            AppError::Usage(format!("--tls-client-ca {}: {e}", ca.display()))
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            AppError::Usage(format!(
                "--tls-cert {} and its --tls-key: {e}",
                cert.display()
            ))
        })?;
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            client_ca: client_ca.is_some(),
        })
    }

    /// Runs the server side of the handshake on `stream` within [`HANDSHAKE_TIMEOUT`].
    /// Returns the encrypted stream and, when the client presented a certificate (verified
    /// against the client CA by then), its fingerprint (`sha256:` and the first 8 bytes of
    /// the certificate's SHA-256 in hex) for the logs.
    ///
    /// # Errors
    /// The handshake failed (a plaintext client, an untrusted or expired client
    /// certificate, no common protocol version) or timed out: the reason, for the log.
    pub async fn accept<S>(
        &self,
        stream: S,
    ) -> Result<(futures_rustls::server::TlsStream<S>, Option<String>), String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = async {
            self.acceptor
                .accept(stream)
                .await
                .map_err(|e| e.to_string())
        };
        let timeout = async {
            smol::Timer::after(HANDSHAKE_TIMEOUT).await;
            Err(format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}"))
        };
        let s = smol::future::or(handshake, timeout).await?;
        let cert = s
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| {
                let d = ring::digest::digest(&ring::digest::SHA256, c.as_ref());
                let hex: String = d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("sha256:{hex}")
            });
        Ok((s, cert))
    }
}

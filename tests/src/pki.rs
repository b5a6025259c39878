//! Certificates and tokens for the TLS tests, made at run time (never committed keys): a CA
//! and the gateway's certificate for `localhost` and `127.0.0.1`, a client CA with a valid
//! and an expired client certificate, and an unrelated CA with a certificate of its own (a
//! wrong CA on either side). Tokens are made by the real `spillway token` command.
//!
//! [`TlsSetup`] bundles what an end-to-end test needs to run the same scenario over TLS:
//! the gateway's flags (a config file with the certificate, key and credentials) and the
//! bridge's (`--tls-ca`, `--token-file`).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// PEM files written into one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA that signs the gateway's certificate (the bridge's `--tls-ca`).
    pub ca: PathBuf,
    /// The gateway's certificate (`localhost`, `127.0.0.1`) and key.
    pub gw_cert: PathBuf,
    /// Its key.
    pub gw_key: PathBuf,
    /// The CA of client certificates (the gateway's `--tls-client-ca`).
    pub client_ca: PathBuf,
    /// A valid client certificate from `client_ca`.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// A client certificate from `client_ca` that expired yesterday.
    pub expired_cert: PathBuf,
    /// Its key.
    pub expired_key: PathBuf,
    /// An unrelated CA.
    pub other_ca: PathBuf,
    /// A certificate for `localhost`/`127.0.0.1` and a client from `other_ca`.
    pub other_cert: PathBuf,
    /// Its key.
    pub other_key: PathBuf,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("CA key");
    let cert = p.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(p, key))
}

fn leaf(names: &[&str], issuer: &Issuer<'static, KeyPair>, expired: bool) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut p = CertificateParams::new(names).expect("leaf params");
    p.distinguished_name
        .push(DnType::CommonName, "spillway test");
    if expired {
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::days(10);
        p.not_after = now - time::Duration::days(1);
    }
    let key = KeyPair::generate().expect("leaf key");
    let cert = p.signed_by(&key, issuer).expect("signed leaf");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// Makes every certificate and key and writes them into `dir`.
    ///
    /// # Panics
    /// If a certificate cannot be made or written (a test cannot go on).
    pub fn make(dir: &Path) -> Pki {
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write PEM");
            p
        };
        let server_names = ["localhost", "127.0.0.1"];
        let (ca_pem, gw_ca) = ca("spillway test CA");
        let (gw_cert, gw_key) = leaf(&server_names, &gw_ca, false);
        let (client_ca_pem, client_ca) = ca("spillway test client CA");
        let (client_cert, client_key) = leaf(&["bridge"], &client_ca, false);
        let (expired_cert, expired_key) = leaf(&["bridge"], &client_ca, true);
        let (other_ca_pem, other) = ca("someone else's CA");
        let (other_cert, other_key) = leaf(&server_names, &other, false);
        Pki {
            ca: write("ca.pem", &ca_pem),
            gw_cert: write("gw.pem", &gw_cert),
            gw_key: write("gw.key", &gw_key),
            client_ca: write("client-ca.pem", &client_ca_pem),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            expired_cert: write("expired.pem", &expired_cert),
            expired_key: write("expired.key", &expired_key),
            other_ca: write("other-ca.pem", &other_ca_pem),
            other_cert: write("other.pem", &other_cert),
            other_key: write("other.key", &other_key),
        }
    }
}

/// Makes a token file with `spillway token FILE --name NAME --roles ROLES` and returns the
/// `[[credential]]` entry it printed.
///
/// # Panics
/// If the command fails.
pub fn make_token(file: &Path, name: &str, roles: &str) -> String {
    make_token_with(&crate::gateway::spillway_bin(), file, name, roles)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`make_token`] with the gateway binary `bin` (run under `SPILLWAY_RUNNER` if set).
///
/// # Errors
/// The command cannot be run or fails: its stderr.
pub fn make_token_with(bin: &Path, file: &Path, name: &str, roles: &str) -> Result<String, String> {
    let out = crate::gateway::gateway_command(bin)
        .arg("token")
        .arg(file)
        .args(["--name", name, "--roles", roles])
        .output()
        .map_err(|e| format!("run {} token: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("[[credential]]") {
        return Err(format!(
            "spillway token failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// What the same end-to-end test needs to run over TLS with tokens.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    /// The certificates.
    pub pki: Pki,
    /// The bridge's token (publish, consume, admin).
    pub token: PathBuf,
    /// The gateway's config file: certificate, key and the bridge's credential.
    pub config: PathBuf,
}

impl TlsSetup {
    /// Certificates, a token for the bridge and the gateway's config file, in `dir`.
    pub fn new(dir: &Path) -> TlsSetup {
        Self::with_gateway(dir, &crate::gateway::spillway_bin()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TlsSetup::new`] with the gateway binary `bin` making the token.
    ///
    /// # Errors
    /// The token cannot be made, or the config file written.
    pub fn with_gateway(dir: &Path, bin: &Path) -> Result<TlsSetup, String> {
        let pki = Pki::make(dir);
        let token = dir.join("bridge.token");
        let entry = make_token_with(bin, &token, "bridge", "publish,consume,admin")?;
        let config = dir.join("tls.toml");
        let text = format!(
            "tls-cert = {:?}\ntls-key = {:?}\n{entry}",
            pki.gw_cert.display().to_string(),
            pki.gw_key.display().to_string(),
        );
        std::fs::write(&config, text).map_err(|e| format!("write {}: {e}", config.display()))?;
        Ok(TlsSetup { pki, token, config })
    }

    /// The gateway's flags besides its listener.
    pub fn gateway_args(&self) -> Vec<String> {
        vec!["--config".into(), self.config.display().to_string()]
    }

    /// The bridge's flags.
    pub fn bridge_args(&self) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.pki.ca.display().to_string(),
            "--token-file".into(),
            self.token.display().to_string(),
        ]
    }
}

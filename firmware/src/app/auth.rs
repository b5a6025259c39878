//! Credentials of the Linux gateway: client tokens kept as SHA-256 hashes, and the verdict
//! on a connection's `Hello` (which roles it gets, or why it is refused) that the
//! connection hands to the log thread before the `Hello` itself.
//!
//! ## Why SHA-256 and not a password hash
//! A token is 32 random bytes (`spillway token` makes them), not a password a person
//! chose: guessing one takes 2^256 tries whatever the hash, so a slow, salted password hash
//! (argon2, bcrypt) buys nothing against a stolen config file. It would cost tens of
//! milliseconds of CPU per handshake on a small ARM gateway, which anyone who can reach
//! the port could spend at will. The config file therefore holds the unsalted SHA-256 of
//! each token: a leaked file does not reveal a token, and checking one costs about a
//! microsecond. Tokens typed by a person are not protected this way; use generated ones.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use spillway_core::wire::{HelloV3, Request};
use spillway_firmware::{Auth, Roles};

use super::AppError;
use super::config::CredentialSpec;
use super::config::uri::parse_roles;

/// Bytes of a token `spillway token` makes (random), written as 64 hex digits.
pub const TOKEN_BYTES: usize = 32;

/// Why a `Hello` with a wrong token is refused.
pub const WRONG_TOKEN: &str = "credential not accepted";

/// Why a `Hello` without a token is refused where one is required.
pub const TOKEN_REQUIRED: &str =
    "this listener requires a credential: a token in the Hello, or a client certificate";

/// SHA-256 of `token` with surrounding white space (a token file's newline) removed.
pub fn token_hash(token: &[u8]) -> [u8; 32] {
    let token = token.trim_ascii();
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut h = [0u8; 32];
    h.copy_from_slice(d.as_ref());
    h
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let text = text.as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// One configured client.
#[derive(Debug, Clone)]
pub struct Credential {
    /// Its name, for logs.
    pub name: String,
    /// What it may do.
    pub roles: Roles,
}

/// The configured credentials, by token hash.
#[derive(Debug, Default)]
pub struct Credentials {
    by_hash: HashMap<[u8; 32], Credential>,
}

impl Credentials {
    /// The table of the config file's `[[credential]]` entries.
    ///
    /// The consumer names of each entry are kept for the life of the process (the no_std
    /// gateway's roles borrow them as `'static`); the table is built once at start.
    ///
    /// # Errors
    /// [`AppError::Usage`] naming the entry: a hash that is not 64 hex digits, an unknown
    /// role, no role, a consumer name longer than the log allows, or a hash given twice.
    pub fn from_specs(specs: &[CredentialSpec]) -> Result<Credentials, AppError> {
        let mut by_hash = HashMap::new();
        for c in specs {
            let what = format!("credential {:?}", c.name);
            let hash = unhex(&c.token_sha256).ok_or_else(|| {
                AppError::Usage(format!(
                    "{what}: token-sha256 must be 64 hex digits (spillway token FILE prints it)"
                ))
            })?;
            if c.roles.is_empty() {
                return Err(AppError::Usage(format!("{what}: roles is empty")));
            }
            let mut roles = parse_roles(&c.roles.join(","), &what)?;
            if let Some(names) = &c.consumers {
                let max = spillway_core::log::format::MAX_CONSUMER_NAME_LEN;
                if let Some(bad) = names.iter().find(|n| n.is_empty() || n.len() > max) {
                    return Err(AppError::Usage(format!(
                        "{what}: consumer name {bad:?} must be 1 to {max} bytes"
                    )));
                }
                let names: Vec<&'static str> = names
                    .iter()
                    .map(|n| &*Box::leak(n.clone().into_boxed_str()))
                    .collect();
                roles.consumers = Some(Box::leak(names.into_boxed_slice()));
            }
            let cred = Credential {
                name: c.name.clone(),
                roles,
            };
            if by_hash.insert(hash, cred).is_some() {
                return Err(AppError::Usage(format!(
                    "{what}: the same token-sha256 is given twice"
                )));
            }
        }
        Ok(Credentials { by_hash })
    }

    /// Whether no credential is configured.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The credential whose token this is.
    pub fn find(&self, token: &[u8]) -> Option<&Credential> {
        self.by_hash.get(&token_hash(token))
    }
}

/// What a connection may do before its `Hello` is judged, and how to judge it.
#[derive(Debug, Clone)]
pub struct Access {
    /// The listener's roles.
    pub roles: Roles,
    /// A `Hello` without a token is refused (a non-loopback listener), unless the peer
    /// has a verified client certificate.
    pub token_required: bool,
    /// The subject of the peer's verified client certificate (mTLS), if any.
    pub client_cert: Option<String>,
    /// The configured credentials.
    pub credentials: Arc<Credentials>,
}

impl Access {
    /// Access for a connection that presents nothing but its listener (serial ports,
    /// anonymous listeners): the listener's roles.
    pub fn anonymous(roles: Roles, credentials: Arc<Credentials>) -> Self {
        Access {
            roles,
            token_required: false,
            client_cert: None,
            credentials,
        }
    }

    /// The verdict on the message `msg` if it is a `Hello`: the `Auth` and the roles the
    /// connection gets (`None` for any other message). Logs a refusal with `peer`.
    pub fn judge(&self, msg: &[u8], peer: &str) -> Option<(Auth, Roles)> {
        let (req, rest) = spillway_core::wire::take_message::<Request<'_>>(msg).ok()?;
        let Request::Hello {
            protocol_version,
            client_name,
        } = req
        else {
            return None;
        };
        let token = if protocol_version >= 3 && !rest.is_empty() {
            // A Hello whose credential field does not decode is the gateway's to refuse.
            postcard::from_bytes::<HelloV3<'_>>(rest)
                .ok()?
                .credential
                .filter(|c| !c.is_empty())
        } else {
            None
        };
        Some(match self.check(token) {
            // The gateway answers "not configured" itself.
            Verdict::NotConfigured => (Auth::NotConfigured, self.roles),
            Verdict::Credential(c) => {
                log::debug!("{peer}: client {client_name:?} is credential {:?}", c.name);
                (Auth::Accepted, self.roles.intersect(c.roles))
            }
            Verdict::Wrong => {
                log::warn!("{peer}: client {client_name:?}: {WRONG_TOKEN}");
                (Auth::Refused(WRONG_TOKEN), Roles::NONE)
            }
            Verdict::Missing => {
                log::warn!("{peer}: client {client_name:?}: no credential");
                (Auth::Refused(TOKEN_REQUIRED), Roles::NONE)
            }
            Verdict::Anonymous => (Auth::Accepted, self.roles),
        })
    }

    /// What `token` comes to on this connection: the one check behind both a `Hello`'s
    /// token and an MQTT CONNECT's password. `None` or an empty token is "none presented".
    /// The token is looked up by its SHA-256 ([`Credentials::find`]), never compared as
    /// text, so the time taken says nothing about how much of a token was right.
    pub fn check(&self, token: Option<&[u8]>) -> Verdict<'_> {
        match token.filter(|t| !t.is_empty()) {
            Some(_) if self.credentials.is_empty() => Verdict::NotConfigured,
            Some(t) => match self.credentials.find(t) {
                Some(c) => Verdict::Credential(c),
                None => Verdict::Wrong,
            },
            None if self.token_required && self.client_cert.is_none() => Verdict::Missing,
            None => Verdict::Anonymous,
        }
    }
}

/// The outcome of [`Access::check`]; each protocol answers it in its own terms.
#[derive(Debug, Clone, Copy)]
pub enum Verdict<'a> {
    /// No token, and none needed (an anonymous listener, or a verified client
    /// certificate): the listener's roles apply.
    Anonymous,
    /// A token where no credential is configured: never ignored, as its sender expects it
    /// to count.
    NotConfigured,
    /// The token is this credential's: the listener's roles ∩ the credential's apply.
    Credential(&'a Credential),
    /// A token that is no configured credential's.
    Wrong,
    /// No token, on a listener that requires a credential, from a peer without a client
    /// certificate.
    Missing,
}

/// `spillway token FILE`: makes FILE with a new random token if it does not exist, then
/// prints the `[[credential]]` entry of its hash.
///
/// # Errors
/// [`AppError::Runtime`] naming the file and the OS reason when it cannot be created or
/// read; [`AppError::Usage`] for bad roles or an empty token file.
pub fn token_command(file: &Path, name: &str, roles: &str) -> Result<(), AppError> {
    let r = parse_roles(roles, "--roles")?;
    let token = if file.exists() {
        std::fs::read(file)
            .map_err(|e| AppError::Runtime(format!("cannot read {}: {e}", file.display())))?
    } else {
        let mut bytes = [0u8; TOKEN_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map_err(|_| AppError::Runtime("the system random source failed".into()))?;
        let token = format!("{}\n", hex(&bytes));
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
        }
        .map_err(|e| AppError::Runtime(format!("cannot create {}: {e}", file.display())))?;
        f.write_all(token.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| AppError::Runtime(format!("cannot write {}: {e}", file.display())))?;
        eprintln!("wrote a new token to {}", file.display());
        token.into_bytes()
    };
    if token.trim_ascii().is_empty() {
        return Err(AppError::Usage(format!("{} is empty", file.display())));
    }
    let list: Vec<String> = [
        (r.publish, "publish"),
        (r.consume, "consume"),
        (r.admin, "admin"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, n)| format!("{n:?}"))
    .collect();
    println!("[[credential]]");
    println!("name = {name:?}");
    println!("token-sha256 = \"{}\"", hex(&token_hash(&token)));
    println!("roles = [{}]", list.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(roles: &[&str], consumers: Option<&[&str]>, token: &str) -> CredentialSpec {
        CredentialSpec {
            name: "t".into(),
            token_sha256: hex(&token_hash(token.as_bytes())),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            consumers: consumers.map(|c| c.iter().map(|n| n.to_string()).collect()),
        }
    }

    fn encode<T: serde::Serialize>(msg: &T) -> Vec<u8> {
        let mut buf = [0u8; 256];
        postcard::to_slice(msg, &mut buf).unwrap().to_vec()
    }

    fn hello(token: Option<&[u8]>) -> Vec<u8> {
        let h = Request::Hello {
            protocol_version: 3,
            client_name: "c",
        };
        encode(&(h, HelloV3 { credential: token }))
    }

    #[test]
    fn the_hash_is_sha256_of_the_trimmed_token() {
        // SHA-256("abc"), the FIPS 180-2 example.
        assert_eq!(
            hex(&token_hash(b"abc\n")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn tokens_are_judged_against_the_listener_and_the_credential() {
        let creds = Arc::new(
            Credentials::from_specs(&[spec(&["consume"], Some(&["kafka"]), "good")]).unwrap(),
        );
        let access = Access {
            roles: Roles::ALL,
            token_required: true,
            client_cert: None,
            credentials: creds.clone(),
        };
        let (auth, roles) = access.judge(&hello(Some(b"good")), "p").unwrap();
        assert_eq!(auth, Auth::Accepted);
        assert!(roles.consume && !roles.publish && !roles.admin);
        assert_eq!(roles.consumers, Some(&["kafka"][..]));
        assert_eq!(
            access.judge(&hello(Some(b"bad")), "p").unwrap().0,
            Auth::Refused(WRONG_TOKEN)
        );
        assert_eq!(
            access.judge(&hello(None), "p").unwrap().0,
            Auth::Refused(TOKEN_REQUIRED)
        );
        let with_cert = Access {
            client_cert: Some("CN=bridge".into()),
            ..access.clone()
        };
        assert_eq!(
            with_cert.judge(&hello(None), "p").unwrap(),
            (Auth::Accepted, Roles::ALL)
        );
        let stats = encode(&Request::Stats { seq: 1 });
        assert_eq!(access.judge(&stats, "p"), None);
    }

    #[test]
    fn bad_credential_entries_are_refused() {
        let mut s = spec(&["publish"], None, "x");
        s.token_sha256 = "abc".into();
        assert!(Credentials::from_specs(&[s]).is_err());
        assert!(Credentials::from_specs(&[spec(&[], None, "x")]).is_err());
        assert!(Credentials::from_specs(&[spec(&["root"], None, "x")]).is_err());
        assert!(
            Credentials::from_specs(&[spec(&["publish"], None, "x"), spec(&["admin"], None, "x")])
                .is_err()
        );
    }
}

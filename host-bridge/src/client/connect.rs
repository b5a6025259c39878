//! Opening a connection: [`Client::connect`] and its variants, the handshake (a leading
//! 0x00, the `Hello`, the `Welcome` or its refusal), and [`FirstContact`], which tells a
//! port that does not speak the protocol from a gateway that went down as it accepted.

use std::time::Duration;

use super::io::{self, Io};
use super::{
    Client, ClientError, GatewayAddr, MAX_FRAME_ABSOLUTE, MAX_FRAME_BEFORE_WELCOME, RX_BUFFER,
    Reply, Welcome, with_timeout,
};
use crate::security::Security;
use spillway_core::wire::{self, PROTOCOL_VERSION, Request};

/// Time a gateway has to answer the `Hello` with its `Welcome` on a TCP, TLS or Unix
/// connection (at most the reply timeout): a peer silent for that long is taken for a port
/// that does not speak the protocol (a line-mode or MQTT listener, say). A serial link
/// waits the whole reply timeout.
pub const WELCOME_TIMEOUT: Duration = Duration::from_secs(2);
/// First connections in a row whose peer closed them before a `Welcome`
/// ([`ClientError::NotSpillway`] with `closed`) before a command gives the address up as
/// not a Spillway listener ([`FirstContact::not_spillway`]): a gateway stopped or killed
/// just as it accepted the connection closes it that way too, once, and is back (or
/// refusing connections) at the next try; an MQTT or `tls://` port does it every time. A
/// peer silent for [`WELCOME_TIMEOUT`] is given up at the first time.
pub const NOT_SPILLWAY_TRIES: u32 = 3;

/// What a command's connections to one address have shown so far, to tell a port that is
/// not a Spillway listener (give up: the same command would meet the same port) from a
/// gateway that went down as it accepted (retry): a `Welcome` ever received, and the
/// [`ClientError::NotSpillway`] answers in a row since the last other outcome.
#[derive(Debug, Default, Clone, Copy)]
pub struct FirstContact {
    welcomed: bool,
    not_spillway_in_a_row: u32,
}

impl FirstContact {
    /// A record for an address a `Welcome` already came from (never given up as not a
    /// Spillway listener).
    pub fn welcomed() -> Self {
        FirstContact {
            welcomed: true,
            not_spillway_in_a_row: 0,
        }
    }

    /// Notes the outcome of a connect; true when the address is to be given up as not a
    /// Spillway listener: no `Welcome` ever came from it, and this connect's peer stayed
    /// silent, or was the [`NOT_SPILLWAY_TRIES`]th in a row to close before a `Welcome`.
    pub fn not_spillway(&mut self, r: &Result<Client, ClientError>) -> bool {
        match r {
            Ok(_) => {
                self.welcomed = true;
                self.not_spillway_in_a_row = 0;
            }
            Err(ClientError::NotSpillway { closed, .. }) => {
                self.not_spillway_in_a_row = self.not_spillway_in_a_row.saturating_add(1);
                if !closed {
                    return !self.welcomed;
                }
            }
            Err(_) => self.not_spillway_in_a_row = 0,
        }
        !self.welcomed && self.not_spillway_in_a_row >= NOT_SPILLWAY_TRIES
    }
}

impl Client {
    /// Connects to `addr` and performs the handshake (`client_name` goes to the gateway's
    /// logs), with TLS and the token from the process's [`security`](crate::security)
    /// settings. `reply_timeout` bounds the wait for each reply.
    pub async fn connect(
        addr: &GatewayAddr,
        client_name: &str,
        reply_timeout: Duration,
    ) -> Result<Client, ClientError> {
        Client::connect_with(addr, client_name, reply_timeout, &crate::security::get()).await
    }

    /// As [`Client::connect`], with TLS and the token from `security` instead of the
    /// process's settings.
    pub async fn connect_with(
        addr: &GatewayAddr,
        client_name: &str,
        reply_timeout: Duration,
        security: &Security,
    ) -> Result<Client, ClientError> {
        let io = with_timeout(reply_timeout, Io::connect(addr, security)).await?;
        let welcome_timeout = match addr {
            GatewayAddr::Serial { .. } => reply_timeout,
            _ => WELCOME_TIMEOUT.min(reply_timeout),
        };
        let hello = Client::handshake(
            io,
            client_name,
            security.token.as_deref(),
            reply_timeout,
            welcome_timeout,
        )
        .await;
        match (hello, addr) {
            // TLS 1.3 settles the client certificate after the client's side of the
            // handshake: a refused one shows as the session ending here.
            (Err(e @ (ClientError::Io(_) | ClientError::Closed)), GatewayAddr::Tls(a)) => {
                Err(ClientError::Tls {
                    addr: a.clone(),
                    why: format!(
                        "the gateway ended the session before its Welcome ({e}): it did not accept this client's certificate (expired, or not from its --tls-client-ca), or it closed"
                    ),
                })
            }
            // A TLS listener drops a plaintext client in its handshake; an MQTT or HTTP
            // (metrics) port closes on the Hello's bytes. The close may arrive as a reset:
            // the peer closed with the Hello's bytes still unread (RFC 1122 4.2.2.13).
            (Err(e), GatewayAddr::Tcp(_))
                if matches!(&e, ClientError::Closed)
                    || matches!(&e, ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionReset) =>
            {
                Err(ClientError::NotSpillway {
                    closed: true,
                    why: "the peer closed the connection before a Welcome (a tls:// port? connect with tls://HOST:PORT and --tls-ca; or an MQTT or metrics port)".into(),
                })
            }
            (Err(ClientError::Timeout(t)), a) if !matches!(a, GatewayAddr::Serial { .. }) => {
                Err(ClientError::NotSpillway {
                    closed: false,
                    why: format!(
                        "no Welcome within {t:?}: the peer does not speak the Spillway protocol (a line-mode, MQTT or metrics port?), or the gateway is stalled"
                    ),
                })
            }
            (other, _) => other,
        }
    }

    /// Performs the handshake over a serial port the caller opened (one side of a pty
    /// pair, say), with the token from the process's settings; otherwise as
    /// [`Client::connect`] with a `serial://` address.
    pub async fn over_serial_port(
        port: Box<dyn serialport::SerialPort>,
        client_name: &str,
        reply_timeout: Duration,
    ) -> Result<Client, ClientError> {
        let io = Io::Serial(io::SerialIo::from_port(port)?);
        let security = crate::security::get();
        let token = security.token.as_deref();
        Client::handshake(io, client_name, token, reply_timeout, reply_timeout).await
    }

    /// Sends a leading 0x00, the `Hello` and takes the `Welcome` over `io`.
    async fn handshake(
        io: Io,
        client_name: &str,
        token: Option<&[u8]>,
        reply_timeout: Duration,
        welcome_timeout: Duration,
    ) -> Result<Client, ClientError> {
        let mut c = Client {
            io,
            rx: vec![0u8; RX_BUFFER].into_boxed_slice(),
            rx_pos: 0,
            rx_len: 0,
            frames: wire::FrameDecoder::new(wire::GrowingFrameBuffer::new(
                MAX_FRAME_BEFORE_WELCOME,
            )),
            tx: vec![0u8; 1024],
            seq: 0,
            welcome: Welcome {
                protocol_version: 0,
                log_id: 0,
                gateway_id: String::new(),
                max_record_bytes: 0,
                max_frame_bytes: 0,
                producer_window: None,
            },
            max_frame: MAX_FRAME_BEFORE_WELCOME,
            reply_timeout,
            pool: Default::default(),
        };
        // A leading 0x00 ends any noise the gateway holds (PROTOCOL.md §1).
        c.io.write_all(&[0]).await?;
        // Version 3 appends its fields (the token, if any) after the Hello.
        c.hello(client_name, token, welcome_timeout).await?;
        Ok(c)
    }

    /// Sends the `Hello` and takes the `Welcome` (or the refusal).
    async fn hello(
        &mut self,
        client_name: &str,
        token: Option<&[u8]>,
        welcome_timeout: Duration,
    ) -> Result<(), ClientError> {
        let c = self;
        c.send(&(
            Request::Hello {
                protocol_version: PROTOCOL_VERSION,
                client_name,
            },
            wire::HelloV3 { credential: token },
        ))
        .await?;
        match c.recv(None, welcome_timeout).await? {
            Reply::Welcome(w) => {
                c.max_frame = (w.max_frame_bytes as usize).clamp(64, MAX_FRAME_ABSOLUTE);
                // Nothing follows the Welcome unasked, so no partial frame is lost here.
                c.frames = wire::FrameDecoder::new(wire::GrowingFrameBuffer::new(c.max_frame));
                c.welcome = w;
                Ok(())
            }
            Reply::Error { code, message } => Err(ClientError::Gateway { code, message }),
            _ => Err(ClientError::Protocol("expected Welcome".into())),
        }
    }
}

//! The stream of an accepted TCP connection, plaintext or TLS ([`Stream`], [`Accepted`]),
//! and telling a TLS client hello that came to a plaintext port ([`looks_like_tls`]).

use std::io;

use smol::io::{AsyncRead, AsyncWrite};

/// Whether the first bytes of a connection are a TLS handshake record (`16 03 0x`, a
/// client hello) rather than frames: a client that took a plaintext port for a TLS one.
pub(super) fn looks_like_tls(first: &[u8]) -> bool {
    matches!(first, [0x16, 0x03, minor, ..] if *minor <= 0x04)
}

/// The reading half of an accepted connection, whatever its transport (TCP, TLS over TCP).
pub type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
/// The writing half of an accepted connection.
pub type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

/// An accepted TCP connection: plaintext, or TLS once its handshake is done.
pub enum Stream {
    /// Plaintext TCP.
    Tcp(smol::net::TcpStream),
    /// TLS over TCP.
    Tls(Box<futures_rustls::server::TlsStream<smol::net::TcpStream>>),
}

impl Stream {
    /// Its reading and writing halves, to read and write at once (plaintext: two handles
    /// of the socket; TLS: the halves of one session).
    pub fn halves(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => (Box::new(s.clone()), Box::new(s)),
            Stream::Tls(s) => {
                let (r, w) = smol::io::split(s);
                (Box::new(r), Box::new(w))
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_close(cx),
            Stream::Tls(s) => std::pin::Pin::new(s).poll_close(cx),
        }
    }
}

/// One accepted TCP connection, after its TLS handshake when the listener has TLS.
pub struct Accepted {
    /// The connection.
    pub stream: Stream,
    /// The peer's address, for logs.
    pub peer: String,
    /// The fingerprint of the client certificate the TLS handshake verified (mTLS).
    pub client_cert: Option<String>,
}

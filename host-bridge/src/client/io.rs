//! The byte stream under a [`Client`](super::Client): TCP, TLS over TCP, a Unix socket, or a
//! serial line driven by a blocking reader thread.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smol::io::{AsyncReadExt, AsyncWriteExt};

use super::{ClientError, GatewayAddr};
use crate::security::Security;

/// One connection's bytes; the framing is the [`Client`](super::Client)'s.
pub(super) enum Io {
    Tcp(smol::net::TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<smol::net::TcpStream>>),
    Unix(smol::net::unix::UnixStream),
    Serial(SerialIo),
}

/// A serial port driven by a blocking reader thread.
pub(super) struct SerialIo {
    writer: Arc<Mutex<Box<dyn serialport::SerialPort>>>,
    chunks: smol::channel::Receiver<std::io::Result<Vec<u8>>>,
    /// What is left of the last chunk when it did not fit the reader's buffer, and how
    /// much of it was read.
    rest: (Vec<u8>, usize),
    stop: Arc<AtomicBool>,
}

impl Drop for SerialIo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl SerialIo {
    fn open(path: &str, baud: u32) -> Result<Self, ClientError> {
        let port = serialport::new(path, baud)
            .timeout(Duration::from_millis(100))
            .open()?;
        SerialIo::from_port(port)
    }

    /// Drives an opened port: a reader thread feeds the async side (the port's read
    /// timeout is how often the thread looks whether the connection was dropped).
    pub(super) fn from_port(port: Box<dyn serialport::SerialPort>) -> Result<Self, ClientError> {
        let mut reader = port.try_clone()?;
        let (tx, rx) = smol::channel::bounded(16);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("serial-reader".into())
            .spawn(move || {
                let mut buf = vec![0u8; 4096];
                while !stop2.load(Ordering::Relaxed) {
                    match reader.read(&mut buf) {
                        Ok(0) => {
                            let _ = tx.send_blocking(Ok(Vec::new()));
                            return;
                        }
                        Ok(n) => {
                            if tx.send_blocking(Ok(buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let _ = tx.send_blocking(Err(e));
                            return;
                        }
                    }
                }
            })?;
        Ok(SerialIo {
            writer: Arc::new(Mutex::new(port)),
            chunks: rx,
            rest: (Vec::new(), 0),
            stop,
        })
    }
}

impl Io {
    /// Opens the connection `addr` names (TCP without Nagle's delay, TLS per `security`,
    /// a Unix socket, or a serial port with its reader thread).
    pub(super) async fn connect(
        addr: &GatewayAddr,
        security: &Security,
    ) -> Result<Io, ClientError> {
        Ok(match addr {
            GatewayAddr::Tcp(a) => {
                let s = smol::net::TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                Io::Tcp(s)
            }
            GatewayAddr::Tls(a) => {
                let tls_err = |why: String| ClientError::Tls {
                    addr: a.clone(),
                    why,
                };
                let Some(connector) = security.tls.clone() else {
                    return Err(tls_err(
                        "no CA to verify the gateway with: give --tls-ca".into(),
                    ));
                };
                let name = crate::security::server_name(a).map_err(tls_err)?;
                let s = smol::net::TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                let s = connector.connect(name, s).await.map_err(|e| {
                    tls_err(format!(
                        "handshake failed: {e} (a plaintext tcp:// port answers no TLS)"
                    ))
                })?;
                Io::Tls(Box::new(s))
            }
            GatewayAddr::Unix(p) => Io::Unix(smol::net::unix::UnixStream::connect(p).await?),
            GatewayAddr::Serial { path, baud } => {
                let (path, baud) = (path.clone(), *baud);
                Io::Serial(smol::unblock(move || SerialIo::open(&path, baud)).await?)
            }
        })
    }

    /// Writes all of `bytes` and flushes.
    pub(super) async fn write_all(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        match self {
            Io::Tcp(s) => {
                s.write_all(bytes).await?;
                s.flush().await?;
            }
            Io::Tls(s) => {
                s.write_all(bytes).await?;
                s.flush().await?;
            }
            Io::Unix(s) => {
                s.write_all(bytes).await?;
                s.flush().await?;
            }
            Io::Serial(s) => {
                let w = s.writer.clone();
                let bytes = bytes.to_vec();
                smol::unblock(move || -> std::io::Result<()> {
                    let mut port = w
                        .lock()
                        .map_err(|_| std::io::Error::other("serial writer poisoned"))?;
                    port.write_all(&bytes)?;
                    port.flush()
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Reads some bytes into `buf` (not empty), straight from the socket; returns how many,
    /// 0 at the end of the stream.
    pub(super) async fn read(&mut self, buf: &mut [u8]) -> Result<usize, ClientError> {
        Ok(match self {
            Io::Tcp(s) => s.read(buf).await?,
            Io::Tls(s) => s.read(buf).await?,
            Io::Unix(s) => s.read(buf).await?,
            Io::Serial(s) => {
                if s.rest.1 >= s.rest.0.len() {
                    let chunk = s.chunks.recv().await.map_err(|_| ClientError::Closed)??;
                    s.rest = (chunk, 0);
                }
                let (chunk, at) = &mut s.rest;
                let n = buf.len().min(chunk.len() - *at);
                buf[..n].copy_from_slice(&chunk[*at..*at + n]);
                *at += n;
                n
            }
        })
    }
}

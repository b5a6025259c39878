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

    /// Reads some bytes into `buf`; 0 means end of stream.
    pub(super) async fn read(&mut self, buf: &mut Vec<u8>) -> Result<usize, ClientError> {
        let mut tmp = [0u8; 8192];
        let n = match self {
            Io::Tcp(s) => s.read(&mut tmp).await?,
            Io::Tls(s) => s.read(&mut tmp).await?,
            Io::Unix(s) => s.read(&mut tmp).await?,
            Io::Serial(s) => {
                let chunk = s.chunks.recv().await.map_err(|_| ClientError::Closed)??;
                buf.extend_from_slice(&chunk);
                return Ok(chunk.len());
            }
        };
        buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }
}

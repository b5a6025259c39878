//! A small blocking client of the Spillway protocol, over any `Read + Write` transport
//! (TCP, Unix socket, serial port). Replies are turned into owned values.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use spillway_core::wire::{
    AckLevel, ErrorCode, FeedResult, FrameDecoder, GatewayStats, GrowingFrameBuffer, LostRange,
    PROTOCOL_VERSION, Producer, Request, Response, encode_frame,
};

/// Largest reply frame the client accepts, bytes.
pub const MAX_FRAME: usize = 1 << 20;

/// A record as fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Offset.
    pub offset: u64,
    /// Record CRC.
    pub crc: u32,
    /// Topic.
    pub topic: String,
    /// Timestamp, µs since the Unix epoch.
    pub timestamp_us: u64,
    /// Producer, if idempotent.
    pub producer: Option<Producer>,
    /// Payload.
    pub payload: Vec<u8>,
}

/// An owned reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Handshake answer.
    Welcome {
        /// Agreed protocol version.
        protocol_version: u16,
        /// Log id.
        log_id: u128,
        /// Gateway id.
        gateway_id: String,
        /// Largest payload, bytes.
        max_record_bytes: u32,
        /// Largest frame, bytes.
        max_frame_bytes: u32,
    },
    /// Publish acknowledged.
    Ack {
        /// Echoed seq.
        seq: u32,
        /// Offset.
        offset: u64,
        /// Was a resend.
        duplicate: bool,
    },
    /// Error.
    Error {
        /// Echoed seq.
        seq: u32,
        /// Code.
        code: ErrorCode,
        /// Detail.
        message: String,
    },
    /// Fetched records.
    Records {
        /// Echoed seq.
        seq: u32,
        /// CRC of the record before the first.
        prev_crc: u32,
        /// Where to fetch next.
        next_offset: u64,
        /// Gone offsets before the first record.
        lost: Option<LostRange>,
        /// The records.
        records: Vec<FetchedRecord>,
    },
    /// Offsets dropped.
    Dropped {
        /// Echoed seq.
        seq: u32,
        /// First available offset.
        first_available: u64,
    },
    /// Commit recorded.
    Committed {
        /// Echoed seq.
        seq: u32,
        /// Committed offset after the request.
        offset: u64,
    },
    /// Consumers.
    Consumers {
        /// Echoed seq.
        seq: u32,
        /// (name, committed offset).
        list: Vec<(String, u64)>,
    },
    /// Delete answer.
    Deleted {
        /// Echoed seq.
        seq: u32,
        /// Whether it existed.
        existed: bool,
    },
    /// Counters.
    Stats {
        /// Echoed seq.
        seq: u32,
        /// The counters.
        stats: GatewayStats,
    },
    /// A producer session (protocol version 3).
    Session {
        /// Echoed seq.
        seq: u32,
        /// The session's epoch.
        epoch: u32,
        /// The last sequence stored in it.
        last_seq: u32,
    },
    /// A step of a search by time (protocol version 4).
    FoundOffset {
        /// Echoed seq.
        seq: u32,
        /// The answer (`done`) or where to search on from.
        offset: u64,
        /// The search is over.
        done: bool,
    },
}

impl Reply {
    /// Whether this is an error whose request may be resent once the gateway recovers:
    /// `StorageFailed` (its storage failed; it remounts or is restarted) or `Internal`
    /// (what a version 1 connection gets in its place).
    pub fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            Reply::Error {
                code: ErrorCode::StorageFailed | ErrorCode::Internal,
                ..
            }
        )
    }

    fn from_response(r: &Response<'_>) -> io::Result<Reply> {
        let bad = |e: postcard::Error| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        Ok(match *r {
            Response::Welcome {
                protocol_version,
                log_id,
                gateway_id,
                max_record_bytes,
                max_frame_bytes,
            } => Reply::Welcome {
                protocol_version,
                log_id,
                gateway_id: gateway_id.to_string(),
                max_record_bytes,
                max_frame_bytes,
            },
            Response::Ack {
                seq,
                offset,
                duplicate,
            } => Reply::Ack {
                seq,
                offset,
                duplicate,
            },
            Response::Error { seq, code, message } => Reply::Error {
                seq,
                code,
                message: message.to_string(),
            },
            Response::Records {
                seq,
                prev_crc,
                next_offset,
                lost,
                records,
            } => {
                let mut out = Vec::new();
                for rec in records.iter() {
                    let rec = rec.map_err(bad)?;
                    out.push(FetchedRecord {
                        offset: rec.offset,
                        crc: rec.record_crc,
                        topic: rec.topic.to_string(),
                        timestamp_us: rec.timestamp_us,
                        producer: rec.producer,
                        payload: rec.payload.to_vec(),
                    });
                }
                Reply::Records {
                    seq,
                    prev_crc,
                    next_offset,
                    lost,
                    records: out,
                }
            }
            Response::Dropped {
                seq,
                first_available,
            } => Reply::Dropped {
                seq,
                first_available,
            },
            Response::Committed { seq, offset, .. } => Reply::Committed { seq, offset },
            Response::Consumers { seq, list } => {
                let mut out = Vec::new();
                for c in list.iter() {
                    let c = c.map_err(bad)?;
                    out.push((c.name.to_string(), c.committed_offset));
                }
                Reply::Consumers { seq, list: out }
            }
            Response::Deleted { seq, existed } => Reply::Deleted { seq, existed },
            Response::StatsReply { seq, stats } => Reply::Stats { seq, stats },
            Response::Session {
                seq,
                epoch,
                last_seq,
                ..
            } => Reply::Session {
                seq,
                epoch,
                last_seq,
            },
            Response::FoundOffset { seq, offset, done } => Reply::FoundOffset { seq, offset, done },
        })
    }
}

/// Boxed transport.
pub trait Transport: Read + Write + Send {}
impl<T: Read + Write + Send> Transport for T {}

/// A protocol client.
pub struct Client {
    io: Box<dyn Transport>,
    /// The bytes of the last read; `pending[pending_pos..]` are not yet fed to `frames`.
    pending: Vec<u8>,
    pending_pos: usize,
    frames: FrameDecoder<GrowingFrameBuffer>,
    buf: Vec<u8>,
    seq: u32,
    /// The `Welcome`, once [`Client::hello`] succeeded.
    pub welcome: Option<Reply>,
}

impl Client {
    /// A client over any transport (no handshake yet).
    pub fn new(io: Box<dyn Transport>) -> Self {
        Client {
            io,
            pending: vec![0u8; 64 * 1024],
            pending_pos: 64 * 1024,
            frames: FrameDecoder::new(GrowingFrameBuffer::new(MAX_FRAME)),
            buf: vec![0u8; MAX_FRAME],
            seq: 0,
            welcome: None,
        }
    }

    /// Connects over TCP (with a 10 s read timeout) and says hello.
    pub fn tcp(addr: &str) -> io::Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut c = Client::new(Box::new(s));
        c.hello("test-client")?;
        Ok(c)
    }

    /// Connects over TLS to a `tls://` listener at `addr` (with a 10 s read timeout),
    /// checking its certificate for `server_name` against the CA certificates in `ca`
    /// (PEM), and says hello.
    pub fn tls(addr: &str, server_name: &str, ca: &Path) -> io::Result<Self> {
        use rustls_pki_types::pem::PemObject;
        let bad = |e: &dyn std::fmt::Display| io::Error::other(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
            roots.add(c.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name =
            rustls_pki_types::ServerName::try_from(server_name.to_string()).map_err(|e| bad(&e))?;
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
            .map_err(|e| bad(&e))?;
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut c = Client::new(Box::new(rustls::StreamOwned::new(conn, s)));
        c.hello("test-client")?;
        Ok(c)
    }

    /// Connects to a Unix socket (with a 10 s read timeout) and says hello.
    pub fn unix(path: &Path) -> io::Result<Self> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut c = Client::new(Box::new(s));
        c.hello("test-client")?;
        Ok(c)
    }

    /// Sends one request frame.
    pub fn send(&mut self, req: &Request<'_>) -> io::Result<()> {
        let n = encode_frame(req, &mut self.buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.io.write_all(&self.buf[..n])
    }

    /// Sends raw bytes (garbage, hand-made frames).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes)
    }

    /// Reads the next reply (frames that do not decode are skipped).
    pub fn recv(&mut self) -> io::Result<Reply> {
        loop {
            while self.pending_pos < self.pending.len() {
                let input = &self.pending[self.pending_pos..];
                let message = match self.frames.feed(input) {
                    FeedResult::Consumed => {
                        self.pending_pos = self.pending.len();
                        break;
                    }
                    FeedResult::Frame { message, remaining } => {
                        self.pending_pos = self.pending.len() - remaining.len();
                        message
                    }
                    FeedResult::Error { remaining, .. } => {
                        self.pending_pos = self.pending.len() - remaining.len();
                        continue;
                    }
                };
                if let Ok(resp) = postcard::from_bytes::<Response<'_>>(message) {
                    return Reply::from_response(&resp);
                }
            }
            self.pending.resize(64 * 1024, 0);
            let n = self.io.read(&mut self.pending)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "gateway closed",
                ));
            }
            self.pending.truncate(n);
            self.pending_pos = 0;
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends the request `make` builds with the next seq and reads its reply, which must
    /// echo that seq (or carry 0, a reply to no request).
    fn call<'r>(&mut self, make: impl FnOnce(u32) -> Request<'r>) -> io::Result<Reply> {
        let seq = self.next_seq();
        self.send(&make(seq))?;
        let r = self.recv()?;
        check_seq(&r, seq)?;
        Ok(r)
    }

    /// Handshake.
    pub fn hello(&mut self, name: &str) -> io::Result<Reply> {
        self.send_raw(&[0])?;
        self.send(&Request::Hello {
            protocol_version: PROTOCOL_VERSION,
            client_name: name,
        })?;
        let r = self.recv()?;
        if matches!(r, Reply::Welcome { .. }) {
            self.welcome = Some(r.clone());
        }
        Ok(r)
    }

    /// Publishes one record and waits for its reply (`ack` must not be `None`).
    pub fn publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        ack: AckLevel,
        producer: Option<Producer>,
    ) -> io::Result<Reply> {
        let seq = self.send_publish(topic, payload, ack, producer)?;
        let r = self.recv()?;
        check_seq(&r, seq)?;
        Ok(r)
    }

    /// Sends a publish without waiting; returns its seq.
    pub fn send_publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        ack: AckLevel,
        producer: Option<Producer>,
    ) -> io::Result<u32> {
        let seq = self.next_seq();
        self.send(&Request::Publish {
            seq,
            topic,
            timestamp_us: None,
            payload,
            ack,
            producer,
        })?;
        Ok(seq)
    }

    /// Fetches from `from` (no consumer).
    pub fn fetch(&mut self, from: u64, max_bytes: u32, wait_ms: Option<u32>) -> io::Result<Reply> {
        self.fetch_as(None, from, max_bytes, wait_ms)
    }

    /// Fetches from `from` as `consumer`.
    pub fn fetch_as(
        &mut self,
        consumer: Option<&str>,
        from: u64,
        max_bytes: u32,
        wait_ms: Option<u32>,
    ) -> io::Result<Reply> {
        self.call(|seq| Request::Fetch {
            seq,
            consumer,
            from_offset: from,
            max_bytes,
            wait_ms,
        })
    }

    /// Reads every record from `from` up to the log's current end.
    pub fn fetch_all(&mut self, from: u64) -> io::Result<Vec<FetchedRecord>> {
        let mut out = Vec::new();
        let mut at = from;
        loop {
            match self.fetch(at, 256 * 1024, None)? {
                Reply::Records {
                    next_offset,
                    records,
                    ..
                } => {
                    if next_offset == at && records.is_empty() {
                        return Ok(out);
                    }
                    out.extend(records);
                    at = next_offset;
                }
                Reply::Dropped {
                    first_available, ..
                } => at = first_available,
                other => {
                    return Err(io::Error::other(format!("unexpected reply {other:?}")));
                }
            }
        }
    }

    /// Commits `offset` for `consumer`.
    pub fn commit(&mut self, consumer: &str, offset: u64) -> io::Result<Reply> {
        self.call(|seq| Request::Commit {
            seq,
            consumer,
            offset,
        })
    }

    /// Lists consumers.
    pub fn consumers(&mut self) -> io::Result<Reply> {
        let seq = self.next_seq();
        self.send(&Request::ListConsumers { seq })?;
        self.recv()
    }

    /// Deletes a consumer.
    pub fn delete_consumer(&mut self, consumer: &str) -> io::Result<Reply> {
        let seq = self.next_seq();
        self.send(&Request::DeleteConsumer { seq, consumer })?;
        self.recv()
    }

    /// One `FindOffset` step: the first offset at or after `from` stamped at or after
    /// `timestamp_us`, or where to go on from (the reply as it came).
    pub fn find_offset(&mut self, timestamp_us: u64, from: u64) -> io::Result<Reply> {
        self.call(|seq| Request::FindOffset {
            seq,
            timestamp_us,
            from_offset: from,
        })
    }

    /// The gateway's counters.
    pub fn stats(&mut self) -> io::Result<GatewayStats> {
        let seq = self.next_seq();
        self.send(&Request::Stats { seq })?;
        match self.recv()? {
            Reply::Stats { stats, .. } => Ok(stats),
            other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }
}

fn check_seq(r: &Reply, seq: u32) -> io::Result<()> {
    let got = match r {
        Reply::Ack { seq, .. }
        | Reply::Error { seq, .. }
        | Reply::Records { seq, .. }
        | Reply::Dropped { seq, .. }
        | Reply::Committed { seq, .. }
        | Reply::Consumers { seq, .. }
        | Reply::Deleted { seq, .. }
        | Reply::Stats { seq, .. }
        | Reply::Session { seq, .. }
        | Reply::FoundOffset { seq, .. } => *seq,
        Reply::Welcome { .. } => return Ok(()),
    };
    if got != seq && got != 0 {
        return Err(io::Error::other(format!(
            "reply for seq {got}, expected {seq}: {r:?}"
        )));
    }
    Ok(())
}

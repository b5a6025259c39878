//! NATS JetStream as a benchmark peer: a harness that starts a `nats-server` process with
//! its own store directory and configuration, and a small blocking client of the NATS text
//! protocol over any `Read + Write` transport (no async runtime).
//!
//! ## The server
//! [`nats_server_bin`] finds the binary: `$SPILLWAY_NATS_SERVER`, else the one that
//! `scripts/nats-server.sh` installs under `target/tools/`. [`NatsServer::start`] writes a
//! configuration file into a fresh temporary directory (client port and monitoring port on
//! 127.0.0.1, JetStream with `store_dir` in that directory, and `sync_interval: always` when
//! every write must be synced), starts the server, waits until it answers `PING` and reads
//! back its JetStream configuration from the monitoring endpoint (`/jsz`), so a setting the
//! server ignored cannot go unnoticed. Dropping it kills the process and removes the
//! directory.
//!
//! `sync_interval: always` needs nats-server 2.10 or later (2.9 rejects the key); without it
//! JetStream writes each message to its block file and leaves the `fsync` to a timer (every
//! two minutes by default).
//!
//! ## The protocol subset
//! [`NatsConn`] speaks the client side of the text protocol: it reads `INFO`, sends
//! `CONNECT` (not verbose, so the server sends no `+OK`) and a `PING`, and waits for the
//! `PONG`. Publishes are `PUB <subject> <reply> <len>` with a reply subject under the
//! connection's own inbox (`_INBOX.<token>.<n>`, one subscription `_INBOX.<token>.*`), which
//! is where JetStream sends the publish acknowledgement (a JSON `PubAck`). Incoming `MSG` and
//! `HMSG` are returned as [`NatsMsg`]; the server's `PING` is answered inside
//! [`NatsConn::next_msg`]; `-ERR` becomes an error.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::gateway::free_port;
use crate::process::spawn_configured;

/// The nats-server version that `scripts/nats-server.sh` installs (keep the two equal).
pub const NATS_SERVER_VERSION: &str = "2.15.1";

/// Largest message payload the client accepts, bytes (the server's default `max_payload`).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Path of the nats-server binary: `$SPILLWAY_NATS_SERVER` if set, else the one
/// `scripts/nats-server.sh` installs; `None` if neither exists.
pub fn nats_server_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPILLWAY_NATS_SERVER") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target/tools")
        .join(format!("nats-server-{NATS_SERVER_VERSION}"))
        .join("bin/nats-server");
    p.is_file().then_some(p)
}

/// The version line a nats-server binary prints (`nats-server: v2.15.1`), trimmed.
pub fn nats_server_version(bin: &Path) -> io::Result<String> {
    let out = Command::new(bin).arg("--version").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A running nats-server with JetStream; killed and its store removed on drop.
pub struct NatsServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Client address, `127.0.0.1:PORT`.
    pub addr: String,
    /// The JetStream `config` object the server reported on `/jsz` after starting.
    pub jetstream_config: serde_json::Value,
}

impl NatsServer {
    /// Starts `bin` with JetStream storing under a new temporary directory; with
    /// `sync_always`, every write to a stream's file is followed by an `fsync` before the
    /// acknowledgement. Waits (10 s at most) until it answers, and checks on `/jsz` that
    /// the server runs with the `sync_always` asked for.
    pub fn start(bin: &Path, sync_always: bool) -> io::Result<NatsServer> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let http_port = free_port();
        let store = dir.path().join("store");
        let sync = if sync_always {
            "  sync_interval: always\n"
        } else {
            ""
        };
        let config = format!(
            "listen: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{http_port}\"\n\
             jetstream {{\n  store_dir: \"{}\"\n{sync}}}\n",
            store.display()
        );
        let child = spawn_configured(bin, dir.path(), "nats", &config)?;
        let mut server = NatsServer {
            child: Some(child),
            dir,
            addr: format!("127.0.0.1:{port}"),
            jetstream_config: serde_json::Value::Null,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(c) = NatsConn::tcp(&server.addr) {
                drop(c);
                break;
            }
            if let Some(Ok(Some(status))) = server.child.as_mut().map(Child::try_wait) {
                return Err(io::Error::other(format!(
                    "nats-server exited with {status}:\n{}",
                    server.log_text()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "nats-server did not start:\n{}",
                    server.log_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let jsz = http_get(&format!("127.0.0.1:{http_port}"), "/jsz")?;
        let jsz: serde_json::Value = serde_json::from_str(&jsz)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        server.jetstream_config = jsz["config"].clone();
        let reported = server.jetstream_config["sync_always"].as_bool() == Some(true);
        if reported != sync_always {
            return Err(io::Error::other(format!(
                "nats-server reports sync_always = {reported}, asked for {sync_always}: {}",
                server.jetstream_config
            )));
        }
        Ok(server)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A plain HTTP/1.0 GET of `path` from `addr`; the body of a `200` answer.
fn http_get(addr: &str, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP header end"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(io::Error::other(format!("GET {path}: {status}")));
    }
    Ok(body.to_string())
}

/// A message delivered to a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsMsg {
    /// Subject it was published to.
    pub subject: String,
    /// Subscription id it was delivered for.
    pub sid: u64,
    /// Reply subject, if any.
    pub reply: Option<String>,
    /// Header block (`HMSG` only, including its `NATS/1.0` line).
    pub headers: Option<Vec<u8>>,
    /// Payload.
    pub payload: Vec<u8>,
}

/// What JetStream answered to one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubAck {
    /// Stored as the stream's sequence number `seq`.
    Stored {
        /// Stream sequence number.
        seq: u64,
    },
    /// Refused (the JSON `error` object, or an answer that is not a `PubAck`).
    Error(String),
}

impl PubAck {
    /// Reads a `PubAck` payload (`{"stream":"S","seq":N}` or `{"error":{...}}`).
    ///
    /// A hand scan rather than a JSON parser: the benchmark reads one of these per record.
    pub fn parse(payload: &[u8]) -> PubAck {
        let text = String::from_utf8_lossy(payload);
        if text.contains("\"error\"") {
            return PubAck::Error(text.into_owned());
        }
        let seq = text.split_once("\"seq\":").and_then(|(_, rest)| {
            let digits: String = rest
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        });
        match seq {
            Some(seq) => PubAck::Stored { seq },
            None => PubAck::Error(text.into_owned()),
        }
    }
}

/// A NATS connection's byte stream: any `Read + Write + Send`.
pub trait NatsTransport: Read + Write + Send {}
impl<T: Read + Write + Send> NatsTransport for T {}

/// A blocking NATS client connection (see the module doc for the subset spoken).
pub struct NatsConn {
    io: Box<dyn NatsTransport>,
    /// Received bytes not parsed yet: `rbuf[rpos..]`.
    rbuf: Vec<u8>,
    rpos: usize,
    out: Vec<u8>,
    inbox: String,
    next_reply: u64,
    /// The server's `INFO` JSON.
    pub info: String,
}

impl NatsConn {
    /// Connects over TCP (no Nagle, 30 s read timeout) and completes the handshake.
    pub fn tcp(addr: &str) -> io::Result<NatsConn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        NatsConn::handshake(Box::new(s))
    }

    /// Reads `INFO`, sends `CONNECT` and `PING`, and waits for the `PONG`.
    pub fn handshake(io: Box<dyn NatsTransport>) -> io::Result<NatsConn> {
        static CONNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CONNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut c = NatsConn {
            io,
            rbuf: Vec::with_capacity(64 * 1024),
            rpos: 0,
            out: Vec::with_capacity(256),
            inbox: format!("_INBOX.sw{}x{n}", std::process::id()),
            next_reply: 0,
            info: String::new(),
        };
        let line = c.read_line()?;
        c.info = line
            .strip_prefix("INFO ")
            .ok_or_else(|| bad(format!("expected INFO, got {line:?}")))?
            .to_string();
        c.io.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"lang\":\"rust\",\
              \"name\":\"spillway-bench\",\"protocol\":1,\"headers\":false}\r\nPING\r\n",
        )?;
        c.wait_pong()?;
        Ok(c)
    }

    /// The reply-subject prefix of this connection (`_INBOX.<token>`).
    pub fn inbox(&self) -> &str {
        &self.inbox
    }

    /// Subscribes to `subject` as subscription `sid`, and waits until the server has
    /// processed it (a `PING` round trip).
    pub fn subscribe(&mut self, subject: &str, sid: u64) -> io::Result<()> {
        write!(self.io, "SUB {subject} {sid}\r\nPING\r\n")?;
        self.wait_pong()
    }

    /// Subscribes to this connection's inbox (`<inbox>.*`) as subscription `sid`.
    pub fn subscribe_inbox(&mut self, sid: u64) -> io::Result<()> {
        let subject = format!("{}.*", self.inbox);
        self.subscribe(&subject, sid)
    }

    /// Publishes `payload` to `subject` with reply subject `<inbox>.<n>` (one system call);
    /// returns `n`.
    pub fn publish_with_reply(&mut self, subject: &str, payload: &[u8]) -> io::Result<u64> {
        self.next_reply += 1;
        let n = self.next_reply;
        self.out.clear();
        write!(
            self.out,
            "PUB {subject} {}.{n} {}\r\n",
            self.inbox,
            payload.len()
        )?;
        self.out.extend_from_slice(payload);
        self.out.extend_from_slice(b"\r\n");
        self.io.write_all(&self.out)?;
        Ok(n)
    }

    /// Sends a request and waits for its answer (needs [`NatsConn::subscribe_inbox`]; any
    /// other message that arrives first is an error).
    pub fn request(&mut self, subject: &str, payload: &[u8]) -> io::Result<NatsMsg> {
        let n = self.publish_with_reply(subject, payload)?;
        let msg = self.next_msg()?;
        let want = format!("{}.{n}", self.inbox);
        if msg.subject != want {
            return Err(bad(format!("answer on {}, expected {want}", msg.subject)));
        }
        Ok(msg)
    }

    /// Creates a file-backed JetStream stream `name` capturing `subjects` (one replica,
    /// limits retention) through `$JS.API.STREAM.CREATE.<name>`; returns the answer JSON.
    pub fn create_file_stream(
        &mut self,
        name: &str,
        subjects: &[&str],
    ) -> io::Result<serde_json::Value> {
        let config = serde_json::json!({
            "name": name,
            "subjects": subjects,
            "storage": "file",
            "retention": "limits",
            "discard": "old",
            "num_replicas": 1,
        });
        let msg = self.request(
            &format!("$JS.API.STREAM.CREATE.{name}"),
            config.to_string().as_bytes(),
        )?;
        let answer: serde_json::Value = serde_json::from_slice(&msg.payload)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if answer.get("error").is_some() || answer["config"]["storage"] != "file" {
            return Err(io::Error::other(format!("stream create failed: {answer}")));
        }
        Ok(answer)
    }

    /// The state and configuration of JetStream stream `name`
    /// (`$JS.API.STREAM.INFO.<name>`): the answer JSON, e.g. `state.messages`,
    /// `state.bytes`.
    ///
    /// # Errors
    /// As [`NatsConn::request`], or an answer that is not JSON.
    pub fn stream_info(&mut self, name: &str) -> io::Result<serde_json::Value> {
        let msg = self.request(&format!("$JS.API.STREAM.INFO.{name}"), b"")?;
        serde_json::from_slice(&msg.payload)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The next `MSG`/`HMSG` (answering the server's `PING`s on the way).
    pub fn next_msg(&mut self) -> io::Result<NatsMsg> {
        loop {
            let line = self.read_line()?;
            let mut words = line.split_ascii_whitespace();
            match words.next() {
                Some("MSG") => {
                    let w: Vec<&str> = words.collect();
                    let (subject, sid, reply, len) = match w.as_slice() {
                        [s, sid, len] => (*s, *sid, None, *len),
                        [s, sid, r, len] => (*s, *sid, Some(*r), *len),
                        _ => return Err(bad(format!("bad MSG line {line:?}"))),
                    };
                    let len = parse_len(len)?;
                    let payload = self.read_payload(len)?;
                    return Ok(NatsMsg {
                        subject: subject.to_string(),
                        sid: parse_num(sid)?,
                        reply: reply.map(str::to_string),
                        headers: None,
                        payload,
                    });
                }
                Some("HMSG") => {
                    let w: Vec<&str> = words.collect();
                    let (subject, sid, reply, hlen, len) = match w.as_slice() {
                        [s, sid, h, len] => (*s, *sid, None, *h, *len),
                        [s, sid, r, h, len] => (*s, *sid, Some(*r), *h, *len),
                        _ => return Err(bad(format!("bad HMSG line {line:?}"))),
                    };
                    let (hlen, len) = (parse_len(hlen)?, parse_len(len)?);
                    if hlen > len {
                        return Err(bad(format!("bad HMSG line {line:?}")));
                    }
                    let mut payload = self.read_payload(len)?;
                    let headers = payload.drain(..hlen).collect();
                    return Ok(NatsMsg {
                        subject: subject.to_string(),
                        sid: parse_num(sid)?,
                        reply: reply.map(str::to_string),
                        headers: Some(headers),
                        payload,
                    });
                }
                Some("PING") => self.io.write_all(b"PONG\r\n")?,
                Some("PONG" | "+OK" | "INFO") => {}
                Some("-ERR") => return Err(io::Error::other(format!("server: {line}"))),
                _ => return Err(bad(format!("unexpected line {line:?}"))),
            }
        }
    }

    fn wait_pong(&mut self) -> io::Result<()> {
        loop {
            let line = self.read_line()?;
            match line.split_ascii_whitespace().next() {
                Some("PONG") => return Ok(()),
                Some("PING") => self.io.write_all(b"PONG\r\n")?,
                Some("+OK" | "INFO") => {}
                Some("-ERR") => return Err(io::Error::other(format!("server: {line}"))),
                _ => return Err(bad(format!("unexpected line {line:?} before PONG"))),
            }
        }
    }

    /// One control line, without its `\r\n`.
    fn read_line(&mut self) -> io::Result<String> {
        loop {
            if let Some(p) = self.rbuf[self.rpos..].windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.rbuf[self.rpos..self.rpos + p]).into();
                self.rpos += p + 2;
                return Ok(line);
            }
            if self.rbuf.len() - self.rpos > 64 * 1024 {
                return Err(bad("control line longer than 64 KiB".into()));
            }
            self.fill()?;
        }
    }

    /// `len` payload bytes and the `\r\n` after them.
    fn read_payload(&mut self, len: usize) -> io::Result<Vec<u8>> {
        while self.rbuf.len() - self.rpos < len + 2 {
            self.fill()?;
        }
        let start = self.rpos;
        if &self.rbuf[start + len..start + len + 2] != b"\r\n" {
            return Err(bad("payload not followed by CRLF".into()));
        }
        self.rpos += len + 2;
        Ok(self.rbuf[start..start + len].to_vec())
    }

    /// Reads more bytes, first moving the unparsed rest to the front.
    fn fill(&mut self) -> io::Result<()> {
        if self.rpos > 0 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
        let have = self.rbuf.len();
        self.rbuf.resize(have + 64 * 1024, 0);
        let n = match self.io.read(&mut self.rbuf[have..]) {
            Ok(n) => n,
            Err(e) => {
                self.rbuf.truncate(have);
                return Err(e);
            }
        };
        self.rbuf.truncate(have + n);
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "nats-server closed the connection",
            ));
        }
        Ok(())
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn parse_num(s: &str) -> io::Result<u64> {
    s.parse().map_err(|_| bad(format!("bad number {s:?}")))
}

fn parse_len(s: &str) -> io::Result<usize> {
    let n = parse_num(s)? as usize;
    if n > MAX_PAYLOAD {
        return Err(bad(format!("message of {n} bytes is over {MAX_PAYLOAD}")));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::sync::{Arc, Mutex};

    /// A transport that reads from a script and records what is written.
    struct Scripted {
        input: Cursor<Vec<u8>>,
        written: Arc<Mutex<Vec<u8>>>,
        chunk: usize,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk);
            self.input.read(&mut buf[..n])
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn conn(script: &str, chunk: usize) -> (NatsConn, Arc<Mutex<Vec<u8>>>) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let io = Scripted {
            input: Cursor::new(script.as_bytes().to_vec()),
            written: written.clone(),
            chunk,
        };
        (NatsConn::handshake(Box::new(io)).unwrap(), written)
    }

    #[test]
    fn parses_messages_split_across_reads() {
        for chunk in [1, 3, 7, 4096] {
            let (mut c, written) = conn(
                "INFO {\"server_id\":\"x\"}\r\n+OK\r\nPONG\r\n\
                 MSG _INBOX.a.1 1 23\r\n{\"stream\":\"S\",\"seq\":41}\r\n\
                 PING\r\n\
                 HMSG a.b 2 r.1 12 15\r\nNATS/1.0\r\n\r\nhey\r\n\
                 MSG x 3 0\r\n\r\n",
                chunk,
            );
            assert_eq!(c.info, "{\"server_id\":\"x\"}");
            let m = c.next_msg().unwrap();
            assert_eq!(
                (m.subject.as_str(), m.sid, m.reply),
                ("_INBOX.a.1", 1, None)
            );
            assert_eq!(PubAck::parse(&m.payload), PubAck::Stored { seq: 41 });
            let m = c.next_msg().unwrap();
            assert_eq!(m.reply.as_deref(), Some("r.1"));
            assert_eq!(m.headers.as_deref(), Some(&b"NATS/1.0\r\n\r\n"[..]));
            assert_eq!(m.payload, b"hey");
            assert_eq!(c.next_msg().unwrap().payload, b"");
            let err = c.next_msg().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            let sent = String::from_utf8(written.lock().unwrap().clone()).unwrap();
            assert!(sent.starts_with("CONNECT {"), "{sent}");
            assert!(sent.ends_with("PING\r\nPONG\r\n"), "{sent}");
        }
    }

    #[test]
    fn publish_frames_and_errors() {
        let (mut c, written) = conn("INFO {}\r\nPONG\r\n-ERR 'Maximum Payload'\r\n", 4096);
        written.lock().unwrap().clear();
        assert_eq!(c.publish_with_reply("bench", b"abc").unwrap(), 1);
        let want = format!("PUB bench {}.1 3\r\nabc\r\n", c.inbox());
        assert_eq!(*written.lock().unwrap(), want.as_bytes());
        assert!(c.next_msg().unwrap_err().to_string().contains("Maximum"));
    }

    #[test]
    fn pub_ack_parse() {
        assert_eq!(
            PubAck::parse(br#"{"stream":"B","domain":"d","seq":7,"duplicate":true}"#),
            PubAck::Stored { seq: 7 }
        );
        assert!(matches!(
            PubAck::parse(br#"{"error":{"code":503,"description":"x"}}"#),
            PubAck::Error(_)
        ));
        assert!(matches!(PubAck::parse(b"nonsense"), PubAck::Error(_)));
    }
}

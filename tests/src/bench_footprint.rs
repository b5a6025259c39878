//! Footprint of the `spillway` gateway beside `nats-server` and `mosquitto` on the same
//! machine: binary size (as installed, and of a stripped copy), shared libraries, and
//! resident memory with 100 idle clients and under load. [`run`] measures; its [`Report`]
//! prints as a Markdown table.
//!
//! ## How each server is exercised
//! Every server starts fresh with its own store in a temporary directory, and the same
//! steps run against each:
//! 1. [`IDLE_CLIENTS`] clients connect and complete their protocol's handshake (spillway:
//!    `Hello`/`Welcome`; NATS: `CONNECT` + `PING`/`PONG`; MQTT: `CONNECT`/`CONNACK`), and
//!    stay connected, idle, for the rest of the run. After a short pause the server's
//!    `VmRSS` and `VmHWM` (peak resident set) are read from `/proc/PID/status`.
//! 2. Load: [`PUBLISHERS`] more connections publish [`Options::per_publisher`] 100-byte
//!    records each, [`WINDOW`] unacknowledged at most, every record acknowledged by the
//!    server after it took charge of it, and nothing consumes them, so each server has to
//!    keep every record: spillway buffered publishes (its RAM buffer, spilled to the image
//!    file); JetStream publishes into a file-backed stream; MQTT QoS 1 publishes to a topic
//!    that a persistent-session subscriber subscribed to at QoS 1 and then left, so
//!    mosquitto queues every message for it (in memory: mosquitto writes its persistence
//!    file only at autosave intervals and at shutdown, so it is off here and the queue limits
//!    are lifted). Then the memory is read again: `VmHWM` is the peak of the whole run.
//!
//! Sizes: the file as it is (Debian's `mosquitto` is already stripped and links a dozen
//! shared libraries; `nats-server` is a static Go binary; `spillway` a Rust release
//! binary linking only the C library) and a copy passed through `strip`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_core::wire::AckLevel;

use crate::bench_gateway::{
    PAYLOAD, PUBLISHERS, WINDOW, nats_connect, nats_publisher, spillway_args, spillway_publisher,
    thousands, timed,
};
use crate::client::Client;
use crate::gateway::{GatewayProcess, free_port, spillway_bin};
use crate::nats::NatsServer;

/// Idle clients connected during the whole run.
pub const IDLE_CLIENTS: usize = 100;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Records per publisher of the load step.
    pub per_publisher: usize,
    /// The nats-server binary; `None` skips NATS.
    pub nats_bin: Option<PathBuf>,
    /// The mosquitto binary; `None` skips mosquitto.
    pub mosquitto_bin: Option<PathBuf>,
}

/// Memory of a process, KiB, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set now (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set so far (`VmHWM`).
    pub hwm_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of process `pid`.
pub fn memory(pid: u32) -> io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    })
}

/// Size of a binary: as installed and of a stripped copy, plus the shared libraries it
/// needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinarySize {
    /// The binary's path.
    pub path: PathBuf,
    /// File size, bytes.
    pub file_bytes: u64,
    /// Size of a copy after `strip`, bytes (`None` if `strip` failed).
    pub stripped_bytes: Option<u64>,
    /// Shared libraries `ldd` lists (not counting the vDSO and the dynamic loader).
    pub shared_libs: Vec<String>,
    /// Total size of the shared libraries besides the C runtime every program here links
    /// (`libc`, `libm`, `libgcc_s`, `libpthread`, `libdl`, `librt`), bytes: what the binary
    /// brings with it.
    pub extra_libs_bytes: u64,
}

/// The C runtime libraries that every binary here links or that the system has anyway.
const C_RUNTIME: [&str; 6] = [
    "libc.so",
    "libm.so",
    "libgcc_s.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
];

/// Measures `bin`: its size, a stripped copy's size (in a temporary directory), its shared
/// libraries.
pub fn binary_size(bin: &Path) -> io::Result<BinarySize> {
    let file_bytes = std::fs::metadata(bin)?.len();
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("stripped");
    std::fs::copy(bin, &copy)?;
    let stripped_bytes = Command::new("strip")
        .arg(&copy)
        .status()
        .ok()
        .filter(|s| s.success())
        .and_then(|_| std::fs::metadata(&copy).ok())
        .map(|m| m.len());
    let ldd = Command::new("ldd").arg(bin).output()?;
    let mut shared_libs = Vec::new();
    let mut extra_libs_bytes = 0;
    // Lines: `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x...)`.
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        if name.starts_with("linux-vdso") || name.contains("ld-linux") || !name.contains(".so") {
            continue;
        }
        if !C_RUNTIME.iter().any(|c| name.starts_with(c)) {
            let path = words.nth(1).unwrap_or(name);
            extra_libs_bytes += std::fs::metadata(path).map_or(0, |m| m.len());
        }
        shared_libs.push(name.to_string());
    }
    Ok(BinarySize {
        path: bin.to_path_buf(),
        file_bytes,
        stripped_bytes,
        shared_libs,
        extra_libs_bytes,
    })
}

/// One server's footprint.
#[derive(Debug, Clone)]
pub struct Server {
    /// Name and version for the table.
    pub name: String,
    /// Its binary.
    pub binary: BinarySize,
    /// Memory with the idle clients connected.
    pub idle: Memory,
    /// Memory after the load (with the idle clients still connected).
    pub loaded: Memory,
    /// Records/s of the load step (not the benchmark of record: one run, no peer beside it).
    pub load_rate: f64,
    /// What the load was, in words.
    pub load: &'static str,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// What ran.
    pub options: Options,
    /// Spillway, then NATS and mosquitto when present.
    pub servers: Vec<Server>,
    /// Servers skipped, with the reason.
    pub skipped: Vec<String>,
}

/// Waits for the idle connections to settle, then reads memory.
fn settled_memory(pid: u32) -> Memory {
    std::thread::sleep(Duration::from_millis(300));
    memory(pid).unwrap_or_default()
}

fn spillway_footprint(opts: &Options) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let gateway = GatewayProcess::start(&spillway_args(dir.path(), &addr), 1);
    let pid = gateway.pid();
    let idle: Vec<Client> = (0..IDLE_CLIENTS)
        .map(|_| Client::tcp(&addr).expect("idle client"))
        .collect();
    let idle_mem = settled_memory(pid);
    let m = timed(
        pid,
        opts.per_publisher,
        || Client::tcp(&addr).expect("publisher"),
        |c, n| spillway_publisher(c, n, AckLevel::Buffered),
    );
    let loaded = settled_memory(pid);
    drop(idle);
    let stats = Client::tcp(&addr)
        .and_then(|mut c| c.stats())
        .expect("spillway stats");
    assert_eq!(
        stats.records_appended,
        (PUBLISHERS * opts.per_publisher) as u64,
        "footprint: spillway appended a different number of records than the load sent"
    );
    Server {
        name: "spillway".to_string(),
        binary: binary_size(&spillway_bin()).expect("spillway binary"),
        idle: idle_mem,
        loaded,
        load_rate: m.records_per_s,
        load: "buffered publishes (64 MiB image, 256 KiB RAM buffer)",
    }
}

fn nats_footprint(bin: &Path, opts: &Options) -> Server {
    let server = NatsServer::start(bin, false).expect("start nats-server");
    let pid = server.pid();
    let idle: Vec<_> = (0..IDLE_CLIENTS)
        .map(|_| crate::nats::NatsConn::tcp(&server.addr).expect("idle client"))
        .collect();
    let idle_mem = settled_memory(pid);
    let mut admin = nats_connect(&server.addr);
    admin
        .create_file_stream("BENCH", &[crate::bench_gateway::SUBJECT])
        .expect("create stream");
    let m = timed(
        pid,
        opts.per_publisher,
        || nats_connect(&server.addr),
        nats_publisher,
    );
    let loaded = settled_memory(pid);
    drop(idle);
    let info = admin
        .request("$JS.API.STREAM.INFO.BENCH", b"")
        .expect("stream info");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("stream info");
    assert_eq!(
        info["state"]["messages"].as_u64(),
        Some((PUBLISHERS * opts.per_publisher) as u64),
        "footprint: JetStream stored a different number of messages than the load sent: {info}"
    );
    let version = crate::nats::nats_server_version(bin).unwrap_or_default();
    Server {
        name: version.replace(": v", " "),
        binary: binary_size(bin).expect("nats-server binary"),
        idle: idle_mem,
        loaded,
        load_rate: m.records_per_s,
        load: "JetStream publishes into a file stream",
    }
}

/// A running mosquitto; killed on drop.
struct Mosquitto {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts `bin` on a free port of 127.0.0.1, anonymous access, no persistence file,
    /// unlimited queues; waits (10 s at most) until it accepts an MQTT connection.
    fn start(bin: &Path) -> io::Result<Mosquitto> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 max_queued_messages 0\nmax_queued_bytes 0\nmax_inflight_messages 0\n\
                 log_dest stderr\nuser root\n"
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("mosquitto.log"))?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut m = Mosquitto {
            child,
            addr: format!("127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if Mqtt::connect(&m.addr, "probe", true).is_ok() {
                return Ok(m);
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                return Err(io::Error::other(format!("mosquitto exited with {status}")));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("mosquitto did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The smallest MQTT 3.1.1 client the footprint run needs: connect, subscribe, QoS 1
/// publish, disconnect.
pub struct Mqtt {
    s: TcpStream,
    next_id: u16,
}

/// Appends MQTT's variable-length "remaining length".
fn put_len(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

/// Appends a length-prefixed UTF-8 string.
fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A control packet of `kind` (first byte) with `body`.
fn packet(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    put_len(&mut out, body.len());
    out.extend_from_slice(body);
    out
}

impl Mqtt {
    /// Connects as `client_id` and waits for a `CONNACK` that accepts (`clean`: a clean
    /// session; otherwise the server keeps the session and its queue after a disconnect).
    pub fn connect(addr: &str, client_id: &str, clean: bool) -> io::Result<Mqtt> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut c = Mqtt { s, next_id: 0 };
        let mut body = Vec::new();
        put_str(&mut body, "MQTT");
        body.push(4); // protocol level 3.1.1
        body.push(if clean { 0x02 } else { 0x00 });
        body.extend_from_slice(&600u16.to_be_bytes()); // keep alive, s
        put_str(&mut body, client_id);
        c.s.write_all(&packet(0x10, &body))?;
        let (kind, ack) = c.read_packet()?;
        if kind >> 4 != 2 || ack.get(1) != Some(&0) {
            return Err(io::Error::other(format!(
                "CONNACK refused: {kind:#x} {ack:?}"
            )));
        }
        Ok(c)
    }

    /// Subscribes to `topic` at QoS 1 and waits for the `SUBACK`.
    pub fn subscribe(&mut self, topic: &str) -> io::Result<()> {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let mut body = self.next_id.to_be_bytes().to_vec();
        put_str(&mut body, topic);
        body.push(1);
        self.s.write_all(&packet(0x82, &body))?;
        let (kind, ack) = self.read_packet()?;
        if kind >> 4 != 9 || ack.get(2).is_none_or(|&q| q > 2) {
            return Err(io::Error::other(format!(
                "SUBACK refused: {kind:#x} {ack:?}"
            )));
        }
        Ok(())
    }

    /// Sends a QoS 1 `PUBLISH` (does not wait for its `PUBACK`).
    pub fn publish_qos1(&mut self, topic: &str, payload: &[u8]) -> io::Result<()> {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let mut body = Vec::with_capacity(topic.len() + payload.len() + 4);
        put_str(&mut body, topic);
        body.extend_from_slice(&self.next_id.to_be_bytes());
        body.extend_from_slice(payload);
        self.s.write_all(&packet(0x32, &body))
    }

    /// Waits for the next `PUBACK`.
    pub fn puback(&mut self) -> io::Result<()> {
        let (kind, _) = self.read_packet()?;
        if kind >> 4 != 4 {
            return Err(io::Error::other(format!("expected PUBACK, got {kind:#x}")));
        }
        Ok(())
    }

    /// Counts the `PUBLISH` packets the server sends until none comes for `quiet` (what
    /// it had queued for this persistent session); acknowledges none of them.
    pub fn count_publishes(&mut self, quiet: Duration) -> io::Result<usize> {
        self.s.set_read_timeout(Some(quiet))?;
        let mut n = 0;
        loop {
            match self.read_packet() {
                Ok((kind, _)) if kind >> 4 == 3 => n += 1,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `DISCONNECT` and closes.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.s.write_all(&[0xE0, 0x00])
    }

    /// One packet: its first byte and body.
    fn read_packet(&mut self) -> io::Result<(u8, Vec<u8>)> {
        let mut b = [0u8; 1];
        self.s.read_exact(&mut b)?;
        let kind = b[0];
        let (mut len, mut shift) = (0usize, 0);
        loop {
            self.s.read_exact(&mut b)?;
            len |= usize::from(b[0] & 0x7f) << shift;
            if b[0] & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 21 {
                return Err(io::Error::other("bad remaining length"));
            }
        }
        let mut body = vec![0u8; len];
        self.s.read_exact(&mut body)?;
        Ok((kind, body))
    }
}

/// One MQTT publisher: `n` pipelined QoS 1 publishes, [`WINDOW`] in flight at most.
fn mqtt_publisher(mut c: Mqtt, n: usize) {
    let payload = [0x5au8; PAYLOAD];
    let mut inflight = 0;
    for _ in 0..n {
        c.publish_qos1(MQTT_TOPIC, &payload).expect("publish");
        inflight += 1;
        if inflight >= WINDOW {
            c.puback().expect("PUBACK");
            inflight -= 1;
        }
    }
    for _ in 0..inflight {
        c.puback().expect("PUBACK");
    }
}

/// Topic of the MQTT load.
const MQTT_TOPIC: &str = "bench/records";

fn mosquitto_version(bin: &Path) -> String {
    // `mosquitto -h` prints "mosquitto version X" first and exits non-zero.
    Command::new(bin)
        .arg("-h")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.replace(" version", ""))
        })
        .unwrap_or_else(|| "mosquitto".to_string())
}

fn mosquitto_footprint(bin: &Path, opts: &Options) -> Server {
    let m = Mosquitto::start(bin).expect("start mosquitto");
    let pid = m.child.id();
    let idle: Vec<Mqtt> = (0..IDLE_CLIENTS)
        .map(|i| Mqtt::connect(&m.addr, &format!("idle{i}"), true).expect("idle client"))
        .collect();
    let idle_mem = settled_memory(pid);
    // The consumer that is away: its persistent session queues every message.
    let mut sub = Mqtt::connect(&m.addr, "away", false).expect("subscriber");
    sub.subscribe(MQTT_TOPIC).expect("subscribe");
    sub.disconnect().expect("disconnect");
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rate = timed(
        pid,
        opts.per_publisher,
        || {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Mqtt::connect(&m.addr, &format!("pub{i}"), true).expect("publisher")
        },
        mqtt_publisher,
    );
    let loaded = settled_memory(pid);
    drop(idle);
    let queued = Mqtt::connect(&m.addr, "away", false)
        .and_then(|mut c| c.count_publishes(Duration::from_secs(2)))
        .expect("count the queued messages");
    assert_eq!(
        queued,
        PUBLISHERS * opts.per_publisher,
        "footprint: mosquitto queued a different number of messages than the load sent"
    );
    Server {
        name: mosquitto_version(bin),
        binary: binary_size(bin).expect("mosquitto binary"),
        idle: idle_mem,
        loaded,
        load_rate: rate.records_per_s,
        load: "QoS 1 publishes queued for an offline persistent subscriber",
    }
}

/// Measures every server of `opts`; `progress` is told what starts.
///
/// # Panics
/// If a server does not start or refuses the load.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Report {
    let mut servers = Vec::new();
    let mut skipped = Vec::new();
    progress("footprint: spillway");
    servers.push(spillway_footprint(opts));
    match &opts.nats_bin {
        Some(bin) => {
            progress("footprint: nats-server");
            servers.push(nats_footprint(bin, opts));
        }
        None => skipped.push("nats-server: not installed (scripts/nats-server.sh)".into()),
    }
    match &opts.mosquitto_bin {
        Some(bin) => {
            progress("footprint: mosquitto");
            servers.push(mosquitto_footprint(bin, opts));
        }
        None => skipped.push("mosquitto: not installed (apt package mosquitto)".into()),
    }
    Report {
        options: opts.clone(),
        servers,
        skipped,
    }
}

/// Finds `mosquitto`: `$SPILLWAY_MOSQUITTO`, else `/usr/sbin/mosquitto`.
pub fn mosquitto_bin() -> Option<PathBuf> {
    let p = std::env::var_os("SPILLWAY_MOSQUITTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/mosquitto"));
    p.is_file().then_some(p)
}

/// Bytes as KiB or MiB.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.0} KiB", bytes as f64 / 1024.0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| server | binary | stripped copy | shared libraries | peak RSS (VmHWM), {IDLE_CLIENTS} idle clients | \
             peak RSS (VmHWM) after load | load: {PUBLISHERS} × {} records of {PAYLOAD} B | records/s |",
            thousands(self.options.per_publisher as f64)
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|")?;
        for s in &self.servers {
            let libs = if s.binary.shared_libs.is_empty() {
                "none (static)".to_string()
            } else {
                format!(
                    "{}, {} besides the C runtime",
                    s.binary.shared_libs.len(),
                    size(s.binary.extra_libs_bytes)
                )
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                s.name,
                size(s.binary.file_bytes),
                s.binary.stripped_bytes.map_or("–".into(), size),
                libs,
                size(s.idle.hwm_kib * 1024),
                size(s.loaded.hwm_kib * 1024),
                s.load,
                thousands(s.load_rate),
            )?;
        }
        for s in &self.skipped {
            writeln!(f, "\nSkipped: {s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_length_encoding() {
        for (n, want) in [
            (0usize, vec![0u8]),
            (127, vec![0x7f]),
            (128, vec![0x80, 0x01]),
            (16_383, vec![0xff, 0x7f]),
            (16_384, vec![0x80, 0x80, 0x01]),
        ] {
            let mut out = Vec::new();
            put_len(&mut out, n);
            assert_eq!(out, want, "{n}");
        }
    }

    #[test]
    fn own_memory_is_readable() {
        let m = memory(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib, "{m:?}");
    }
}

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
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use spillway_core::wire::AckLevel;

use crate::bench_gateway::{
    PAYLOAD, PUBLISHERS, WINDOW, nats_connect, nats_publisher, spillway_args, spillway_publisher,
    timed,
};
use crate::client::{Client, Wait, connect};
use crate::figures::{table_head, thousands};
use crate::gateway::{GatewayProcess, free_port, spillway_bin};
pub use crate::mosquitto::mosquitto_bin;
use crate::mosquitto::{Mosquitto, Persistence, mosquitto_version};
use crate::mqtt_load::MqttConn;
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
        .map(|_| connect(&addr).expect("idle client"))
        .collect();
    let idle_mem = settled_memory(pid);
    let m = timed(
        pid,
        opts.per_publisher,
        || connect(&addr).expect("publisher"),
        |c, n| spillway_publisher(c, n, AckLevel::Buffered),
    );
    let loaded = settled_memory(pid);
    drop(idle);
    let stats = connect(&addr)
        .and_then(|mut c| c.stats().wait())
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
    let info = admin.stream_info("BENCH").expect("stream info");
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

/// One MQTT publisher: `n` pipelined QoS 1 publishes, [`WINDOW`] in flight at most.
fn mqtt_publisher(mut c: MqttConn, n: usize) {
    let mut inflight = 0;
    for _ in 0..n {
        c.publish_qos1(MQTT_TOPIC, vec![0x5au8; PAYLOAD])
            .expect("publish");
        inflight += 1;
        if inflight >= WINDOW {
            inflight -= c.wait_pubacks(1).expect("PUBACK").min(inflight);
        }
    }
    c.wait_pubacks(inflight).expect("PUBACK");
}

/// Topic of the MQTT load.
const MQTT_TOPIC: &str = "bench/records";

fn mosquitto_footprint(bin: &Path, opts: &Options) -> Server {
    let m = Mosquitto::start(bin, Persistence::Off).expect("start mosquitto");
    let pid = m.child.id();
    let idle: Vec<MqttConn> = (0..IDLE_CLIENTS)
        .map(|i| MqttConn::connect(&m.addr, &format!("idle{i}"), true).expect("idle client"))
        .collect();
    let idle_mem = settled_memory(pid);
    // The consumer that is away: its persistent session queues every message.
    let mut sub = MqttConn::connect(&m.addr, "away", false).expect("subscriber");
    sub.subscribe(MQTT_TOPIC).expect("subscribe");
    sub.disconnect().expect("disconnect");
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rate = timed(
        pid,
        opts.per_publisher,
        || {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            MqttConn::connect(&m.addr, &format!("pub{i}"), true).expect("publisher")
        },
        mqtt_publisher,
    );
    let loaded = settled_memory(pid);
    drop(idle);
    let queued = MqttConn::connect(&m.addr, "away", false)
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
        table_head(
            f,
            &format!(
                "| server | binary | stripped copy | shared libraries | peak RSS (VmHWM), {IDLE_CLIENTS} idle clients | \
             peak RSS (VmHWM) after load | load: {PUBLISHERS} × {} records of {PAYLOAD} B | records/s |",
                thousands(self.options.per_publisher as f64)
            ),
        )?;
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
    fn own_memory_is_readable() {
        let m = memory(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib, "{m:?}");
    }
}

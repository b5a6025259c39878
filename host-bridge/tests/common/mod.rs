//! The real gateway for the bridge's tests: [`spillway_firmware::Gateway`] over a real
//! `spillway_core::log::Log` on a simulated flash, behind a thin TCP loop (one thread per
//! connection; the gateway and the log behind one mutex, as the Linux binary's engine owns
//! them). The loop only moves frames and does what the gateway's `Outcome` says: reply now,
//! reply once a flush made the record durable, or hold a long-poll fetch until its offset
//! is appended or its wait runs out.
//!
//! Fault switches, each a real event rather than a made-up reply: an outage (connections
//! cut, new ones refused for a while), a reflashed gateway (a fresh log with another id), a
//! power cut (the flash taken without a clean shutdown and mounted again: offsets handed
//! out but not durable are skipped), damage on the flash (a bit flipped for good, a flaky
//! cell), and a small ring under `drop-oldest`, where publishing past its capacity drops the
//! oldest records.
#![allow(dead_code, missing_docs)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spillway_bridge::drain::{Drain, DrainConfig, DrainError, DrainSummary, ShutdownTrigger};
use spillway_bridge::metrics::Metrics;
use spillway_bridge::progress::Mode;
use spillway_core::log::{
    Config, FullPolicy, Log, Memory, Record, RecoveryReport, SegmentSlot, segments_for,
};
use spillway_core::storage::{Flash, Geometry, SimFlash};
use spillway_core::wire::{self, ErrorCode, Request};
use spillway_firmware::gateway::error_reply;
use spillway_firmware::{Conn, Gateway, GatewayConfig, Outcome};

/// The end-to-end tests' listing of a file sink's files (one copy, included by path).
#[path = "../../../tests/src/sink_files.rs"]
pub mod sink_files;

/// The end-to-end tests' bounded wait on observable state (one copy, included by path).
#[path = "../../../tests/src/wait.rs"]
pub mod wait;

type TheLog = Log<'static, SimFlash<Vec<u8>>>;

/// Largest frame, bytes on the wire (announced in the `Welcome`).
const MAX_FRAME: usize = 64 * 1024;
/// The largest payload accepted (announced in the `Welcome`); larger ones get `TooLarge`.
const MAX_RECORD: u32 = 4096;
/// The log's RAM buffer, bytes.
const BUFFER: usize = 16 * 1024;

/// A `--once` drain of `gw` into the sink `sink` (a sink URI), its state file in `dir`, with
/// the short waits and backoffs of a test: batches of 2 KiB, long polls of 50 ms, backoff
/// from 10 ms to 200 ms, no progress display.
pub fn drain_config(gw: &SimGateway, sink: &str, dir: &Path) -> DrainConfig {
    let mut c = DrainConfig::new(
        gw.uri().parse().unwrap(),
        sink.parse().unwrap(),
        dir.join("state.redb"),
    );
    c.once = true;
    c.progress = Mode::Off;
    c.max_batch_bytes = 2048;
    c.poll_wait = Duration::from_millis(50);
    c.backoff_initial = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(200);
    c
}

/// Runs the drain `c` to its end (a `--once` drain, or one whose config stops it) on this
/// thread, counting into `m`.
pub fn run_drain(c: DrainConfig, m: &Metrics) -> Result<DrainSummary, DrainError> {
    let (_trigger, stop) = spillway_bridge::drain::Shutdown::new();
    smol::block_on(async {
        let d = Drain::open(c, m.clone(), stop).await?;
        d.run().await
    })
}

/// A drain running on its own thread: join `handle` for its outcome, read `metrics` while it
/// runs, stop it with `trigger` (dropping the trigger stops it too).
pub struct Background {
    pub handle: std::thread::JoinHandle<Result<DrainSummary, DrainError>>,
    pub metrics: Metrics,
    pub trigger: ShutdownTrigger,
}

/// Starts the drain `c` on its own thread.
pub fn spawn_drain(c: DrainConfig) -> Background {
    let metrics = Metrics::default();
    let m2 = metrics.clone();
    let (trigger, stop) = spillway_bridge::drain::Shutdown::new();
    let handle = std::thread::spawn(move || {
        smol::block_on(async {
            let d = Drain::open(c, m2, stop).await?;
            d.run().await
        })
    });
    Background {
        handle,
        metrics,
        trigger,
    }
}

/// How the simulated flash and the log are set up.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Erase block size, bytes.
    pub erase_size: u32,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
    /// Segments in the ring.
    pub segments: u32,
    /// What a full ring does.
    pub full: FullPolicy,
    /// Offsets reserved per journal write of the offset lease (what a power cut skips at
    /// most).
    pub lease_step: u64,
}

impl Default for Options {
    /// 128 segments of 8 KiB (1 MiB), `reject-new`, the log's default lease.
    fn default() -> Self {
        Options {
            erase_size: 4096,
            blocks_per_segment: 2,
            segments: 128,
            full: FullPolicy::RejectNew,
            lease_step: Config::default().lease_step,
        }
    }
}

impl Options {
    /// A ring of two 1 KiB segments under `drop-oldest`: about 40 short records fill a
    /// segment, and the third segment opened drops the oldest one.
    pub fn small_ring_dropping_oldest() -> Self {
        Options {
            erase_size: 1024,
            blocks_per_segment: 1,
            segments: 2,
            full: FullPolicy::DropOldest,
            ..Options::default()
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            erase_size: self.erase_size,
            write_size: 4,
            capacity: self.erase_size * (2 + self.segments * self.blocks_per_segment),
            erased: 0xFF,
        }
    }

    fn config(&self) -> Config {
        Config {
            full: self.full,
            lease_step: self.lease_step,
            ..Config::default()
        }
    }
}

fn new_log(opts: &Options, log_id: u128) -> TheLog {
    let mut flash = SimFlash::new_vec(opts.geometry()).unwrap();
    Log::format(&mut flash, log_id, opts.blocks_per_segment).unwrap();
    mount_log(opts, flash).0
}

fn mount_log(opts: &Options, flash: SimFlash<Vec<u8>>) -> (TheLog, RecoveryReport) {
    let g = flash.geometry();
    let buf: &'static mut [u8] = Box::leak(vec![0u8; BUFFER].into_boxed_slice());
    let slots: &'static mut [SegmentSlot] = Box::leak(
        vec![SegmentSlot::EMPTY; segments_for(&g, opts.blocks_per_segment) as usize]
            .into_boxed_slice(),
    );
    let mem = Memory {
        buffer: buf,
        segments: slots,
    };
    Log::mount(flash, opts.config(), mem, 0).unwrap()
}

/// What the gateway process holds: the gateway (settings and counters) and its log.
struct State {
    gw: Gateway,
    log: TheLog,
    opts: Options,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled after every request handled and every record appended by the test, so
    /// that a parked fetch looks at the log again.
    changed: Condvar,
    started: Instant,
    down_until: Mutex<Option<Instant>>,
    conns: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
    /// The highest `from_offset` of the fetches received so far.
    fetched_from: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn cut_connections(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn gateway(gateway_id: &str, now_us: u64) -> Gateway {
    Gateway::new(
        GatewayConfig::new(gateway_id, MAX_RECORD, MAX_FRAME as u32),
        now_us,
    )
}

/// The real gateway on a simulated flash, served on a TCP port of 127.0.0.1.
pub struct SimGateway {
    pub addr: String,
    gateway_id: String,
    shared: Arc<Shared>,
}

impl SimGateway {
    /// A gateway named `gateway_id` with a freshly formatted log `log_id` of the default
    /// [`Options`].
    pub fn start(gateway_id: &str, log_id: u128) -> SimGateway {
        Self::start_with(gateway_id, log_id, Options::default())
    }

    pub fn start_with(gateway_id: &str, log_id: u128, opts: Options) -> SimGateway {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let started = Instant::now();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                gw: gateway(gateway_id, 0),
                log: new_log(&opts, log_id),
                opts,
            }),
            changed: Condvar::new(),
            started,
            down_until: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            fetched_from: AtomicU64::new(0),
        });
        let sh = shared.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(s) = s else { continue };
                let is_down = sh
                    .down_until
                    .lock()
                    .unwrap()
                    .is_some_and(|t| Instant::now() < t);
                if is_down {
                    let _ = s.shutdown(Shutdown::Both);
                    continue;
                }
                sh.conns.lock().unwrap().push(s.try_clone().unwrap());
                let sh = sh.clone();
                std::thread::spawn(move || serve(s, &sh));
            }
        });
        SimGateway {
            addr,
            gateway_id: gateway_id.to_string(),
            shared,
        }
    }

    pub fn uri(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    fn append(&self, topic: &str, payloads: &[&[u8]], flush: bool) -> Vec<u64> {
        let mut st = self.shared.lock();
        let now = self.shared.now_us();
        let mut out = Vec::new();
        for p in payloads {
            let rec = Record {
                topic,
                timestamp_us: wall_us(),
                producer: None,
                payload: p,
            };
            out.push(st.log.append(now, &rec).unwrap().offset);
        }
        if flush {
            st.log.flush(now).unwrap();
        }
        self.shared.changed.notify_all();
        out
    }

    /// Appends records straight into the log (as a sensor's lines would arrive) and
    /// flushes: one batch per call, unless it crosses a segment. Returns their offsets.
    pub fn publish(&self, topic: &str, payloads: &[&[u8]]) -> Vec<u64> {
        self.append(topic, payloads, true)
    }

    /// Appends records without flushing: offsets handed out, records only in RAM.
    pub fn publish_unflushed(&self, topic: &str, payloads: &[&[u8]]) -> Vec<u64> {
        self.append(topic, payloads, false)
    }

    pub fn next_offset(&self) -> u64 {
        self.shared.lock().log.next_offset()
    }

    pub fn first_offset(&self) -> u64 {
        self.shared.lock().log.first_offset()
    }

    /// The highest offset a fetch asked for so far (0 before any fetch): the drain has
    /// received every record before it.
    pub fn fetched_from(&self) -> u64 {
        self.shared.fetched_from.load(Ordering::Relaxed)
    }

    pub fn committed(&self, consumer: &str) -> Option<u64> {
        self.shared.lock().log.committed(consumer)
    }

    /// Records the log dropped unread (its `records_dropped` counter since the mount).
    pub fn records_dropped(&self) -> u64 {
        self.shared.lock().log.stats().records_dropped
    }

    /// Cuts every connection and refuses new ones for `d`.
    pub fn outage(&self, d: Duration) {
        *self.shared.down_until.lock().unwrap() = Some(Instant::now() + d);
        self.shared.cut_connections();
    }

    /// Replaces the log with a freshly formatted one (a reflashed gateway): a restart,
    /// connections cut.
    pub fn replace_log(&self, log_id: u128) {
        {
            let mut st = self.shared.lock();
            let opts = st.opts;
            st.log = new_log(&opts, log_id);
            st.gw = gateway(&self.gateway_id, self.shared.now_us());
        }
        self.shared.cut_connections();
    }

    /// Runs `f` on the flash between a shutdown and a mount (clean or not), restarting the
    /// gateway; returns the mount's report.
    fn remount(&self, clean: bool, f: impl FnOnce(&mut SimFlash<Vec<u8>>)) -> RecoveryReport {
        let report = {
            let mut st = self.shared.lock();
            let opts = st.opts;
            let now = self.shared.now_us();
            let log = std::mem::replace(&mut st.log, new_log(&opts, 0));
            let mut flash = if clean {
                log.close(now).unwrap()
            } else {
                log.into_flash()
            };
            f(&mut flash);
            let (log, report) = mount_log(&opts, flash);
            st.log = log;
            st.gw = gateway(&self.gateway_id, now);
            report
        };
        self.shared.cut_connections();
        report
    }

    /// A power cut: the flash is taken as it is (the RAM buffer lost, no clean shutdown)
    /// and mounted again. Returns the mount's report (`not_durable`: the offsets skipped).
    pub fn power_cut(&self) -> RecoveryReport {
        self.remount(false, |_| {})
    }

    /// The flash address of the byte `at` bytes into the first copy of `needle`.
    fn find(flash: &SimFlash<Vec<u8>>, needle: &[u8], at: usize) -> u32 {
        let pos = flash
            .bytes()
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("needle on the flash");
        u32::try_from(pos + at).unwrap()
    }

    /// Damage: inverts bit 0 of the byte `at` bytes into the first copy of `needle` on the
    /// flash for good (the log is closed cleanly first and mounted again after). The batch
    /// holding it fails its CRC on every read. Returns the byte's flash address.
    pub fn flip_bit(&self, needle: &[u8], at: usize) -> u32 {
        let mut addr = 0;
        self.remount(true, |flash| {
            addr = Self::find(flash, needle, at);
            flash.flip_bit(addr, 0).unwrap();
        });
        addr
    }

    /// Makes the byte `at` bytes into the first copy of `needle` on the flash a flaky cell
    /// (`SimFlash::set_flaky`: wrong on `percent`% of reads): the log is closed cleanly, the
    /// cell armed, and the log mounted again. Returns the cell's flash address.
    pub fn flaky_cell(&self, needle: &[u8], at: usize, percent: u8) -> u32 {
        let mut addr = 0;
        self.remount(true, |flash| {
            addr = Self::find(flash, needle, at);
            flash.set_flaky(addr, 0x01, percent);
        });
        addr
    }

    /// Reads of the flaky cell that returned it wrong so far (the simulated flash's count).
    pub fn flaky_reads(&self) -> u64 {
        self.shared.lock().log.flash().faults().flaky_reads
    }
}

impl Drop for SimGateway {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the stop.
        let _ = TcpStream::connect(&self.addr);
        self.shared.cut_connections();
    }
}

/// Serves one connection: decodes frames, hands each to the gateway, writes the replies in
/// order.
fn serve(mut s: TcpStream, sh: &Shared) {
    let mut frames = wire::FrameDecoder::new(wire::GrowingFrameBuffer::new(MAX_FRAME));
    let mut conn = Conn::default();
    let mut tmp = vec![0u8; 8192];
    let mut scratch = vec![0u8; MAX_FRAME];
    let mut out = vec![0u8; MAX_FRAME];
    loop {
        let n = match s.read(&mut tmp) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &tmp[..n];
        loop {
            let reply = match frames.feed(input) {
                wire::FeedResult::Consumed => break,
                wire::FeedResult::Frame { message, remaining } => {
                    input = remaining;
                    handle(sh, &mut conn, message, &mut scratch, &mut out)
                }
                wire::FeedResult::Error { error, remaining } => {
                    input = remaining;
                    let mut st = sh.lock();
                    match st.gw.frame_error(&error, &mut out) {
                        Outcome::Reply { len } => Some(len),
                        _ => None,
                    }
                }
            };
            if let Some(len) = reply
                && s.write_all(&out[..len]).is_err()
            {
                return;
            }
        }
    }
}

/// Handles one message as the Linux binary's engine does; returns the reply's length in
/// `out`, if any.
fn handle(
    sh: &Shared,
    conn: &mut Conn,
    msg: &[u8],
    scratch: &mut [u8],
    out: &mut [u8],
) -> Option<usize> {
    if let Ok(Request::Fetch { from_offset, .. }) = postcard::from_bytes::<Request<'_>>(msg) {
        sh.fetched_from.fetch_max(from_offset, Ordering::Relaxed);
    }
    let mut st = sh.lock();
    let now = sh.now_us();
    let State { gw, log, .. } = &mut *st;
    // The engine's timer: linger and commit persistence.
    let _ = log.tick(now);
    let outcome = gw.handle_message(conn, msg, log, now, wall_us(), scratch, out);
    sh.changed.notify_all();
    match outcome {
        Outcome::Reply { len } => Some(len),
        Outcome::NoReply => None,
        Outcome::ReplyWhenDurable { len, offset } => {
            // The group flush.
            let flushed = log.flush(now);
            if log.durable_offset() > offset {
                return Some(len);
            }
            let seq = postcard::from_bytes::<Request<'_>>(msg)
                .ok()
                .and_then(|r| r.seq())
                .unwrap_or(0);
            let code = match flushed {
                Err(spillway_core::FlushError::Full) => ErrorCode::Full,
                _ => ErrorCode::StorageFailed.for_version(conn.protocol_version.unwrap_or(1)),
            };
            match error_reply(out, seq, code, "record not durable: flush failed") {
                Outcome::Reply { len } => Some(len),
                _ => None,
            }
        }
        Outcome::Park {
            from_offset,
            deadline_us,
        } => {
            // Wait for a record at `from_offset` or the end of the fetch's wait, then
            // answer the fetch with what there is.
            while st.log.next_offset() <= from_offset {
                let now = sh.now_us();
                if now >= deadline_us {
                    break;
                }
                st = sh
                    .changed
                    .wait_timeout(st, Duration::from_micros(deadline_us - now))
                    .unwrap()
                    .0;
            }
            let Ok(Request::Fetch {
                seq,
                consumer,
                from_offset,
                max_bytes,
                ..
            }) = postcard::from_bytes::<Request<'_>>(msg)
            else {
                return None;
            };
            let now = sh.now_us();
            let State { gw, log, .. } = &mut *st;
            let fetch = Request::Fetch {
                seq,
                consumer,
                from_offset,
                max_bytes,
                wait_ms: None,
            };
            match gw.handle_request(conn, &fetch, log, now, wall_us(), scratch, out) {
                Outcome::Reply { len } | Outcome::ReplyWhenDurable { len, .. } => Some(len),
                Outcome::NoReply | Outcome::Park { .. } => None,
            }
        }
    }
}

//! The core benchmark: spillway-core's [`Log`] against the queue of the `sequential-storage`
//! crate (the peer), measured in one run on the same machine, on simulated NOR flash of the
//! same geometry. [`run`] measures everything and its [`Report`] prints as Markdown tables;
//! [`write_case`] and [`mount_size`] measure one group of rows.
//!
//! ## What is compared
//! - **Appends** ([`write_case`]): the same number of records with the same payloads (the
//!   record index stamped into the first 8 bytes, the rest fixed pseudo-random bytes) into a
//!   partition of [`Options::write_flash`] bytes with 4 KiB erase blocks, so that the ring
//!   wraps many times. Neither side has a consumer: spillway runs with
//!   [`FullPolicy::DropOldest`] (the oldest segment is erased when the ring is full) and the
//!   peer pushes with `allow_overwrite_old_data = true` (the oldest page is erased when the
//!   queue is full), so both keep going the same way. Spillway runs twice: with a RAM buffer
//!   of [`RAM_BUFFER`] bytes written as one batch when full (normal operation), and with a
//!   [`Log::flush`] after every record (durable on return, the peer's guarantee on every push).
//!   Before the measured window each side appends one flash capacity of payload the same way
//!   (not timed, not counted), so the ring has wrapped and the figures are the steady state,
//!   where every block written must first be erased. Flash bytes programmed and erases cover
//!   every header, padding, journal entry and page-state marker, per payload byte. Spillway
//!   also stores, per record, a topic (1 byte here), a timestamp and a length that the peer's
//!   items do not have. The timestamp is the wall clock at append (µs since the Unix epoch,
//!   as the gateway stamps a line): the first repetition of each engine reads the clock at
//!   every append and the later ones replay those [`Stamps`], so that every repetition
//!   writes the same bytes and the flash counts can be checked equal between them.
//! - **Reads** (same function): after the appends, every retained record is read back in
//!   order, the pass repeated for at least 25 ms: spillway with [`Log::read`] into a
//!   [`READ_BUFFER`]-byte buffer, the peer with its queue iterator into a buffer of the same
//!   size. Both check every CRC on the way.
//! - **Mount** ([`mount_size`]): an image of each size is filled with 256-byte records to
//!   [`Options::mount_fill_percent`] of its capacity (so the ring has wrapped and its head sits
//!   mid-flash), then the first operation after a reboot is timed: spillway's [`Log::mount`]
//!   after a power cut (no clean close), the peer's first `peek` and first `push` with a fresh
//!   cache (it learns the page states by reading them, up to its head: mid-flash is its
//!   average case). The bound beside them is a plain read of every byte of the image once.
//!
//! - **Compression** ([`crate::bench_compression`]): the demo's two real series with
//!   per-batch LZ4 off, `auto` and `lz4`, batched by the default linger or flushed record
//!   by record, beside the peer storing the same payloads, and the codec alone.
//!
//! Repetitions of the engines are interleaved, so that other work on the machine disturbs
//! them alike.
//!
//! ## Flash model
//! Both engines run on the same [`RamNor`], a plain NOR flash in RAM that ANDs data in and
//! counts operations: the peer through the `embedded-storage` async traits, spillway through
//! [`NorFlashAdapter`] (the adapter it uses for any `embedded-storage` driver). Spillway's
//! strict simulator (`SimFlash`) is not used here: it tracks every word's programmed state,
//! which would bill its own bookkeeping to spillway. The whole image is in RAM, so the
//! figures measure CPU work and flash operations, not flash latency: on a real part, add the
//! operation counts times its read, program and erase times.
//!
//! The peer gets its best cache (page states and page pointers for every page, on the heap)
//! and is driven by a busy-polling `block_on`: its operations never wait.

use std::cell::Cell;
use std::fmt;
use std::hint::black_box;
use std::rc::Rc;
use std::time::{Duration, Instant};

use embassy_futures::block_on;
use sequential_storage::cache::page_pointers::HeapPagePointers;
use sequential_storage::cache::page_states::HeapPageStates;
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::queue::{QueueConfig, QueueStorage};
use spillway_core::log::{Config, FullPolicy, Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, NorFlashAdapter};

use crate::ram_nor::{self, NorCounters, RamNor};

/// Erase block size of every flash in the benchmark, bytes.
pub const ERASE_SIZE: u32 = ram_nor::ERASE_SIZE as u32;

/// Spillway's RAM buffer (the largest batch), bytes.
pub const RAM_BUFFER: usize = 4096;

/// The buffer records are read into, on both sides, bytes.
pub const READ_BUFFER: usize = 4096;

/// Erase blocks per spillway segment in the append runs (16 KiB segments).
pub const BLOCKS_PER_SEGMENT: u32 = 4;

/// Topic of every spillway record (one byte, the smallest allowed).
const TOPIC: &str = "t";

/// Payload of the records that fill the mount images, bytes.
const MOUNT_PAYLOAD: usize = 256;

/// Write size of the mount images, bytes.
const MOUNT_WRITE_SIZE: u32 = 4;

const LOG_ID: u128 = 0x5350_494C_4C57_4159_0000_0000_0000_0001;

const MIB: f64 = 1024.0 * 1024.0;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Repetitions of every timed figure (min, median and max are reported).
    pub reps: usize,
    /// Capacity of the flash of the append and read runs, bytes.
    pub write_flash: u32,
    /// Payload bytes appended per append run (the record count is this over the payload
    /// size).
    pub write_payload_total: u64,
    /// Append cases, one table row group each.
    pub write_cases: Vec<WriteCase>,
    /// Mount cases (the peer runs once per distinct size).
    pub mount_cases: Vec<MountCase>,
    /// Repetitions of every mount figure (each is short, so more of them).
    pub mount_reps: usize,
    /// How full the mount images are filled, percent of their capacity in payload bytes
    /// (above 100 the ring has wrapped).
    pub mount_fill_percent: u32,
    /// Largest image the peer is filled and timed on, MiB: filling it one push at a time
    /// takes minutes at the largest sizes. Above it, spillway's rows have no peer figures.
    pub mount_peer_max_mib: u32,
    /// Rows of each real series of the compression rows ([`crate::bench_compression`]);
    /// `Some(0)` leaves them out, `None` takes every row.
    pub compression_rows: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        let mut write_cases = Vec::new();
        for payload_len in [32, 256] {
            for write_size in [4, 16] {
                write_cases.push(WriteCase {
                    payload_len,
                    write_size,
                });
            }
        }
        let mut mount_cases: Vec<MountCase> = [1, 4, 16, 64]
            .into_iter()
            .map(|size_mib| MountCase {
                size_mib,
                blocks_per_segment: BLOCKS_PER_SEGMENT,
            })
            .collect();
        mount_cases.push(MountCase {
            size_mib: 64,
            blocks_per_segment: 1,
        });
        Options {
            reps: 5,
            write_flash: 1 << 20,
            write_payload_total: 32 << 20,
            write_cases,
            mount_cases,
            mount_reps: 15,
            mount_fill_percent: 150,
            mount_peer_max_mib: u32::MAX,
            compression_rows: None,
        }
    }
}

impl Options {
    /// A run of a second or so that exercises every row (for tests, and for the bench binary
    /// when it runs under `cargo test`): small flashes, two repetitions.
    pub fn smoke() -> Options {
        Options {
            reps: 2,
            write_flash: 64 << 10,
            write_payload_total: 256 << 10,
            write_cases: vec![WriteCase {
                payload_len: 32,
                write_size: 4,
            }],
            mount_cases: vec![MountCase {
                size_mib: 1,
                blocks_per_segment: 4,
            }],
            mount_reps: 2,
            mount_fill_percent: 150,
            mount_peer_max_mib: u32::MAX,
            compression_rows: Some(400),
        }
    }
}

/// The machine a report was measured on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo` (or "unknown").
    pub cpu: String,
    /// Logical cores available to the process.
    pub cores: usize,
    /// Operating system and architecture.
    pub os: String,
    /// Kernel release from `/proc/sys/kernel/osrelease` (or "unknown").
    pub kernel: String,
    /// The 1-, 5- and 15-minute load averages from `/proc/loadavg` when described (other
    /// work on the machine disturbs the timings).
    pub load: String,
}

/// Describes this machine.
pub fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string()),
        load: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_string()),
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} logical cores, {}, kernel {}, load average {}",
            self.cpu, self.cores, self.os, self.kernel, self.load
        )
    }
}

/// Smallest, median and largest of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Smallest sample.
    pub min: f64,
    /// Median (the mean of the two middle samples for an even count).
    pub median: f64,
    /// Largest sample.
    pub max: f64,
}

impl Spread {
    /// The spread of `samples`.
    ///
    /// # Panics
    /// If `samples` is empty.
    pub fn of(samples: &[f64]) -> Spread {
        assert!(!samples.is_empty(), "no samples");
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Spread {
            min: s[0],
            median,
            max: s[n - 1],
        }
    }
}

/// Payload size and flash write size of an append run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCase {
    /// Payload bytes per record (at least 8).
    pub payload_len: usize,
    /// Flash write size (word), bytes: 4 or 16.
    pub write_size: u32,
}

/// The engine of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Spillway with its RAM buffer written when full.
    Spillway,
    /// Spillway with a flush after every record.
    SpillwayDurable,
    /// The `sequential-storage` queue.
    Peer,
}

impl Engine {
    /// Every engine, in table order.
    pub const ALL: [Engine; 3] = [Engine::Spillway, Engine::SpillwayDurable, Engine::Peer];

    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Engine::Spillway => "spillway, 4 KiB buffer",
            Engine::SpillwayDurable => "spillway, flush every record",
            Engine::Peer => "sequential-storage 8.0.2",
        }
    }
}

/// Figures of one engine on one [`WriteCase`].
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRun {
    /// The engine.
    pub engine: Engine,
    /// The case.
    pub case: WriteCase,
    /// Records appended per run.
    pub records: u64,
    /// Payload bytes appended per run.
    pub payload_bytes: u64,
    /// Appends per second (the final flush included).
    pub appends_per_s: Spread,
    /// Flash bytes programmed per run.
    pub bytes_programmed: u64,
    /// Erase blocks erased per run.
    pub erases: u64,
    /// Records read back per run (those still retained after the ring wrapped).
    pub records_read: u64,
    /// Records read per second.
    pub reads_per_s: Spread,
}

impl WriteRun {
    /// Flash bytes programmed per payload byte.
    pub fn programmed_per_payload_byte(&self) -> f64 {
        self.bytes_programmed as f64 / self.payload_bytes as f64
    }

    /// Erases per MiB of payload appended.
    pub fn erases_per_mib(&self) -> f64 {
        self.erases as f64 / (self.payload_bytes as f64 / MIB)
    }
}

/// What one repetition measured.
struct Rep {
    write: Duration,
    /// Time of every read pass together.
    read: Duration,
    /// Records read by every read pass together.
    read_total: u64,
    programmed: u64,
    erases: u64,
    /// Records retained (read by one pass).
    records_read: u64,
}

/// Shortest time the read passes of one repetition take together: passes are repeated
/// until it is reached, so that one timer tick or preemption does not dominate.
const MIN_READ_WINDOW: Duration = Duration::from_millis(25);

/// A payload of `len` bytes: fixed pseudo-random bytes.
fn payload(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The timestamps of one engine's appends: the wall clock read at every append of its first
/// repetition (µs since the Unix epoch), replayed by the later ones.
#[derive(Debug, Clone, Default)]
pub struct Stamps(Vec<u64>);

impl Stamps {
    /// The timestamp of append `i`: the one recorded, or the wall clock now (recorded).
    fn at(&mut self, i: u64) -> u64 {
        if let Some(&t) = self.0.get(i as usize) {
            return t;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.0.push(now);
        now
    }
}

/// Stamps record index `i` into the first 8 bytes of `p`.
fn stamp(p: &mut [u8], i: u64) {
    p[..8].copy_from_slice(&i.to_le_bytes());
}

fn rate(count: u64, d: Duration) -> f64 {
    count as f64 / d.as_secs_f64().max(1e-9)
}

/// Runs every engine on `case` `opts.reps` times, interleaved (one repetition of each engine
/// in turn, so that a disturbance of the machine hits all of them alike): appends, then
/// reads back. Returns one [`WriteRun`] per engine, in [`Engine::ALL`] order.
///
/// # Panics
/// If an engine fails, if a run's flash counts differ between repetitions, or if a read
/// does not end with the newest record.
pub fn write_case(case: WriteCase, opts: &Options) -> Vec<WriteRun> {
    assert!(case.payload_len >= 8, "payloads carry an 8-byte index");
    let records = opts.write_payload_total / case.payload_len as u64;
    let (cap, len) = (opts.write_flash as usize, case.payload_len);
    let n = Engine::ALL.len();
    let mut writes = vec![Vec::new(); n];
    let mut reads = vec![Vec::new(); n];
    let mut counts = vec![None; n];
    let mut stamps = vec![Stamps::default(); n];
    for _ in 0..opts.reps.max(1) {
        for (k, engine) in Engine::ALL.into_iter().enumerate() {
            let durable = engine == Engine::SpillwayDurable;
            let rep = match (engine, case.write_size) {
                (Engine::Peer, 4) => peer_rep::<4>(cap, len, records),
                (Engine::Peer, 16) => peer_rep::<16>(cap, len, records),
                (_, 4) => {
                    let (flash, device) = counted_flash::<4>(cap);
                    let s = &mut stamps[k];
                    spillway_rep(flash, Some(&device), durable, records, len, s)
                }
                (_, 16) => {
                    let (flash, device) = counted_flash::<16>(cap);
                    let s = &mut stamps[k];
                    spillway_rep(flash, Some(&device), durable, records, len, s)
                }
                (_, ws) => panic!("no flash with a {ws}-byte write size"),
            };
            let c = (rep.programmed, rep.erases, rep.records_read);
            assert!(
                counts[k].is_none_or(|x| x == c),
                "{engine:?} {case:?}: counts differ between repetitions"
            );
            counts[k] = Some(c);
            writes[k].push(rate(records, rep.write));
            reads[k].push(rate(rep.read_total, rep.read));
        }
    }
    Engine::ALL
        .into_iter()
        .enumerate()
        .map(|(k, engine)| {
            let (bytes_programmed, erases, records_read) = counts[k].unwrap_or_default();
            WriteRun {
                engine,
                case,
                records,
                payload_bytes: records * case.payload_len as u64,
                appends_per_s: Spread::of(&writes[k]),
                bytes_programmed,
                erases,
                records_read,
                reads_per_s: Spread::of(&reads[k]),
            }
        })
        .collect()
}

fn spillway_config() -> Config {
    Config {
        full: FullPolicy::DropOldest,
        ..Config::default()
    }
}

/// Runs spillway on a fresh `flash`: formats, mounts, appends `records` records (flushing
/// after each when `durable`), then reads back every retained record. Programmed bytes and
/// erases are the log's own counts (see `Stats`), which cover every program and erase it
/// sends to the flash after the mount; with `device`, the flash's own counters, they are
/// checked against what the flash saw in the measured window.
///
/// # Panics
/// If the log fails, if a read does not end with the newest record, or if the log's counts
/// differ from the device's.
fn spillway_rep<F: Flash>(
    mut flash: F,
    device: Option<&Cell<NorCounters>>,
    durable: bool,
    records: u64,
    payload_len: usize,
    stamps: &mut Stamps,
) -> Rep {
    let warm_up = u64::from(flash.geometry().capacity) / payload_len as u64;
    let g = flash.geometry();
    Log::format(&mut flash, LOG_ID, BLOCKS_PER_SEGMENT).expect("format");
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, BLOCKS_PER_SEGMENT) as usize];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
    let mut p = payload(payload_len);
    let mut before = log.stats();
    let mut device_before = device.map(Cell::get);
    let mut t = Instant::now();
    for i in 0..warm_up + records {
        if i == warm_up {
            log.flush(i).expect("flush");
            before = log.stats();
            device_before = device.map(Cell::get);
            t = Instant::now();
        }
        stamp(&mut p, i);
        let rec = Record {
            topic: TOPIC,
            timestamp_us: stamps.at(i),
            producer: None,
            payload: &p,
        };
        log.append(i, &rec).expect("append");
        if durable {
            log.flush(i).expect("flush");
        }
    }
    log.flush(warm_up + records).expect("flush");
    let write = t.elapsed();
    let after = log.stats();
    let programmed = after.flash_bytes_programmed - before.flash_bytes_programmed;
    let erases = after.erases - before.erases;
    if let (Some(d0), Some(d1)) = (device_before, device.map(Cell::get)) {
        assert_eq!(
            (programmed, erases),
            (d1.bytes_written - d0.bytes_written, d1.erases - d0.erases),
            "spillway's own counts of bytes programmed and erases (left) differ from the \
             flash's (right)"
        );
    }

    let mut out = vec![0u8; READ_BUFFER];
    let (first, end) = (log.first_offset(), log.next_offset());
    let t = Instant::now();
    let mut passes = 0u64;
    while passes == 0 || t.elapsed() < MIN_READ_WINDOW {
        let mut at = first;
        let mut sum = 0u64;
        let mut last = None;
        while at < end {
            let r = log.read(at, &mut out).expect("read");
            assert!(r.lost.is_none(), "lost records at {at}: {r:?}");
            for rec in r.records(&out) {
                sum = sum.wrapping_add(rec.payload[0] as u64 + rec.payload.len() as u64);
                last = Some(u64::from_le_bytes(
                    rec.payload[..8].try_into().unwrap_or_default(),
                ));
            }
            at = r.next_offset;
        }
        black_box(sum);
        assert_eq!(
            last,
            Some(warm_up + records - 1),
            "the newest record read back"
        );
        passes += 1;
    }
    let read = t.elapsed();
    Rep {
        write,
        read,
        read_total: passes * (end - first),
        programmed,
        erases,
        records_read: end - first,
    }
}

/// [`spillway_flash`] with a cell that holds its counters (see [`RamNor::shared_counters`]).
fn counted_flash<const WS: usize>(
    capacity: usize,
) -> (NorFlashAdapter<RamNor<WS>>, Rc<Cell<NorCounters>>) {
    let mut nor = RamNor::<WS>::new(capacity);
    let device = nor.shared_counters();
    (NorFlashAdapter::new(nor), device)
}

/// The benchmark's flash for spillway: a [`RamNor`] of `capacity` bytes with `WS`-byte
/// words behind the adapter spillway uses for any `embedded-storage` driver.
pub fn spillway_flash<const WS: usize>(capacity: usize) -> NorFlashAdapter<RamNor<WS>> {
    NorFlashAdapter::new(RamNor::<WS>::new(capacity))
}

pub(crate) type PeerCache = Cache<HeapPageStates, HeapPagePointers, Uncached>;

/// The peer's best cache, empty: page states and page pointers of every page.
fn peer_cache(pages: usize) -> PeerCache {
    Cache::new(
        HeapPageStates::new(pages),
        HeapPagePointers::new(pages),
        Uncached,
    )
}

/// The peer's queue over all of `flash`, with its best cache.
pub(crate) fn peer_queue<const WS: usize>(
    flash: RamNor<WS>,
) -> QueueStorage<RamNor<WS>, PeerCache> {
    let len = flash.image().len();
    QueueStorage::new(
        flash,
        QueueConfig::new(0..len as u32),
        peer_cache(len / ram_nor::ERASE_SIZE),
    )
}

fn peer_rep<const WS: usize>(capacity: usize, payload_len: usize, records: u64) -> Rep {
    let mut q = peer_queue(RamNor::<WS>::new(capacity));
    let mut p = payload(payload_len);
    let warm_up = capacity as u64 / payload_len as u64;
    block_on(async move {
        for i in 0..warm_up {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
        }
        let before = q.flash().counters();
        let t = Instant::now();
        for i in warm_up..warm_up + records {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
        }
        let write = t.elapsed();
        let c = q.flash().counters();

        let mut buf = vec![0u8; READ_BUFFER];
        let t = Instant::now();
        let mut passes = 0u64;
        let mut n = 0u64;
        while passes == 0 || t.elapsed() < MIN_READ_WINDOW {
            let mut sum = 0u64;
            let mut last = None;
            n = 0;
            let mut it = q.iter().await.expect("iter");
            while let Some(e) = it.next(&mut buf).await.expect("next") {
                n += 1;
                sum = sum.wrapping_add(e[0] as u64 + e.len() as u64);
                last = Some(u64::from_le_bytes(e[..8].try_into().unwrap_or_default()));
            }
            black_box(sum);
            assert_eq!(
                last,
                Some(warm_up + records - 1),
                "the newest record read back"
            );
            passes += 1;
        }
        let read = t.elapsed();
        Rep {
            write,
            read,
            read_total: passes * n,
            programmed: c.bytes_written - before.bytes_written,
            erases: c.erases - before.erases,
            records_read: n,
        }
    })
}

/// Size of a mount image and spillway's segment size in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountCase {
    /// Image size, MiB.
    pub size_mib: u32,
    /// Erase blocks per spillway segment.
    pub blocks_per_segment: u32,
}

/// Spillway's mount of one image.
#[derive(Debug, Clone, PartialEq)]
pub struct SpillwayMount {
    /// The case.
    pub case: MountCase,
    /// Segments in the ring.
    pub segments: u32,
    /// Records in the image (durable, retained).
    pub records: u64,
    /// Mount time, ms.
    pub ms: Spread,
    /// Flash read operations of the mount.
    pub reads: u64,
    /// Bytes read by the mount.
    pub bytes_read: u64,
    /// Time to read every byte of the image once, ms (the bound a full scan cannot beat).
    pub full_scan_ms: Spread,
}

/// The peer's first operations on one image with a fresh cache.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerCold {
    /// Image size, MiB.
    pub size_mib: u32,
    /// Pages (erase blocks) of the queue.
    pub pages: u32,
    /// First `peek`, ms.
    pub peek_ms: Spread,
    /// Flash read operations of the first `peek`.
    pub peek_reads: u64,
    /// Bytes read by the first `peek`.
    pub peek_bytes_read: u64,
    /// First `push` (of one more 256-byte record), ms.
    pub push_ms: Spread,
    /// Flash read operations of the first `push`.
    pub push_reads: u64,
    /// Time it took to fill the image, one push at a time (not a benchmark figure: it
    /// shows what filling larger images would cost).
    pub fill: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// An image of `capacity` bytes filled by spillway with segments of `bps` blocks, left as
/// a power cut leaves it (no close).
fn spillway_image(capacity: usize, bps: u32, fill_percent: u32) -> Vec<u8> {
    let mut flash = spillway_flash::<{ MOUNT_WRITE_SIZE as usize }>(capacity);
    let segments = segments_for(&flash.geometry(), bps);
    Log::format(&mut flash, LOG_ID, bps).expect("format");
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut slots = vec![SegmentSlot::EMPTY; segments as usize];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
    let target = capacity as u64 * u64::from(fill_percent) / 100;
    let mut p = payload(MOUNT_PAYLOAD);
    let mut i = 0u64;
    while i * (MOUNT_PAYLOAD as u64) < target {
        stamp(&mut p, i);
        let rec = Record {
            topic: TOPIC,
            timestamp_us: i,
            producer: None,
            payload: &p,
        };
        log.append(i, &rec).expect("append");
        i += 1;
    }
    log.flush(i).expect("flush");
    drop(log);
    flash.into_inner().into_image()
}

/// An image of `capacity` bytes filled by the peer.
fn peer_image(capacity: usize, fill_percent: u32) -> Vec<u8> {
    let mut q = peer_queue(RamNor::<{ MOUNT_WRITE_SIZE as usize }>::new(capacity));
    let target = capacity as u64 * u64::from(fill_percent) / 100;
    let mut p = payload(MOUNT_PAYLOAD);
    block_on(async {
        let mut i = 0u64;
        while i * (MOUNT_PAYLOAD as u64) < target {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
            i += 1;
        }
    });
    q.destroy().0.into_image()
}

/// Fills one image of `size_mib` MiB per entry of `blocks_per_segment` with spillway and one
/// with the peer, then times, `opts.mount_reps` times and interleaved: spillway's mount after
/// a power cut and a read of every byte of its image, the peer's first `peek` and first
/// `push` with a fresh cache. Every repetition starts from a fresh copy of the image. The
/// peer is left out (`None`) above [`Options::mount_peer_max_mib`].
///
/// # Panics
/// If an engine fails, if a mount does not find every segment, or if the peer's first
/// `peek` finds nothing.
pub fn mount_size(
    size_mib: u32,
    blocks_per_segment: &[u32],
    opts: &Options,
) -> (Vec<SpillwayMount>, Option<PeerCold>) {
    const WS: usize = MOUNT_WRITE_SIZE as usize;
    let capacity = (size_mib as usize) << 20;
    let images: Vec<Vec<u8>> = blocks_per_segment
        .iter()
        .map(|&bps| spillway_image(capacity, bps, opts.mount_fill_percent))
        .collect();
    let with_peer = size_mib <= opts.mount_peer_max_mib;
    let t = Instant::now();
    let peer = if with_peer {
        peer_image(capacity, opts.mount_fill_percent)
    } else {
        Vec::new()
    };
    let peer_fill = t.elapsed();
    let pages = capacity / ram_nor::ERASE_SIZE;

    let k = blocks_per_segment.len();
    let mut times = vec![Vec::new(); k];
    let mut scans = vec![Vec::new(); k];
    let mut found = vec![(0u32, 0u64, 0u64, 0u64); k];
    let mut peeks = Vec::new();
    let mut pushes = Vec::new();
    let (mut peek_reads, mut peek_bytes_read, mut push_reads) = (0, 0, 0);
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut read_buf = vec![0u8; READ_BUFFER];
    let p = payload(MOUNT_PAYLOAD);
    for _ in 0..opts.mount_reps.max(1) {
        for (j, &bps) in blocks_per_segment.iter().enumerate() {
            let mut flash = NorFlashAdapter::new(RamNor::<WS>::from_image(images[j].clone()));
            let g = flash.geometry();
            let segments = segments_for(&g, bps);
            let mut slots = vec![SegmentSlot::EMPTY; segments as usize];
            let mem = Memory {
                buffer: &mut buffer,
                segments: &mut slots,
            };
            let t = Instant::now();
            let (log, rep) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
            times[j].push(ms(t.elapsed()));
            assert_eq!(rep.segments_valid, segments, "{rep:?}");
            assert!(!rep.clean);
            drop(log);
            let device = flash.inner_mut().counters();
            assert_eq!(
                rep.flash_reads, device.reads,
                "{size_mib} MiB: spillway's own count of mount reads (left) differs from the \
                 flash's (right)"
            );
            let bytes_read = device.bytes_read;
            found[j] = (
                segments,
                rep.next_offset - rep.first_offset,
                rep.flash_reads,
                bytes_read,
            );

            let mut chunk = vec![0u8; ERASE_SIZE as usize];
            let t = Instant::now();
            for block in 0..g.blocks() {
                flash
                    .read(block * ERASE_SIZE, &mut chunk)
                    .expect("full scan");
                black_box(&chunk);
            }
            scans[j].push(ms(t.elapsed()));
        }

        if !with_peer {
            continue;
        }
        let mut q = peer_queue(RamNor::<WS>::from_image(peer.clone()));
        let t = Instant::now();
        let got = block_on(q.peek(&mut read_buf))
            .expect("peek")
            .map(|d| d.len());
        peeks.push(ms(t.elapsed()));
        assert_eq!(got, Some(MOUNT_PAYLOAD), "the oldest record");
        let c = q.flash().counters();
        (peek_reads, peek_bytes_read) = (c.reads, c.bytes_read);
        drop(q);

        let mut q = peer_queue(RamNor::<WS>::from_image(peer.clone()));
        let t = Instant::now();
        block_on(q.push(&p, true)).expect("push");
        pushes.push(ms(t.elapsed()));
        push_reads = q.flash().counters().reads;
    }
    let spillway = blocks_per_segment
        .iter()
        .enumerate()
        .map(|(j, &bps)| {
            let (segments, records, reads, bytes_read) = found[j];
            SpillwayMount {
                case: MountCase {
                    size_mib,
                    blocks_per_segment: bps,
                },
                segments,
                records,
                ms: Spread::of(&times[j]),
                reads,
                bytes_read,
                full_scan_ms: Spread::of(&scans[j]),
            }
        })
        .collect();
    let peer = with_peer.then(|| PeerCold {
        size_mib,
        pages: pages as u32,
        peek_ms: Spread::of(&peeks),
        peek_reads,
        peek_bytes_read,
        push_ms: Spread::of(&pushes),
        push_reads,
        fill: peer_fill,
    });
    (spillway, peer)
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Where it ran, described when the run started.
    pub machine: Machine,
    /// Load averages when the run ended.
    pub load_at_end: String,
    /// What ran.
    pub options: Options,
    /// Append and read figures, in `options.write_cases` order, [`Engine::ALL`] order inside.
    pub writes: Vec<WriteRun>,
    /// Spillway mounts, in `options.mount_cases` order.
    pub mounts: Vec<SpillwayMount>,
    /// Peer cold starts, one per distinct image size up to [`Options::mount_peer_max_mib`].
    pub peer_cold: Vec<PeerCold>,
    /// Compression on the real series ([`crate::bench_compression`]).
    pub compression: crate::bench_compression::Report,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// Runs every figure of `opts`; `progress` is told what starts.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Report {
    let t = Instant::now();
    let at_start = machine();
    let mut writes = Vec::new();
    for &case in &opts.write_cases {
        progress(&format!(
            "append and read {} B records, write size {}",
            case.payload_len, case.write_size
        ));
        writes.extend(write_case(case, opts));
    }
    let compression = compression_runs(opts, &mut progress);
    let mut mounts = Vec::new();
    let mut peer = Vec::new();
    let mut sizes: Vec<u32> = opts.mount_cases.iter().map(|c| c.size_mib).collect();
    sizes.dedup();
    for size_mib in sizes {
        let bps: Vec<u32> = opts
            .mount_cases
            .iter()
            .filter(|c| c.size_mib == size_mib)
            .map(|c| c.blocks_per_segment)
            .collect();
        progress(&format!("mount {size_mib} MiB"));
        let (m, p) = mount_size(size_mib, &bps, opts);
        mounts.extend(m);
        peer.extend(p);
    }
    Report {
        machine: at_start,
        load_at_end: machine().load,
        options: opts.clone(),
        writes,
        mounts,
        peer_cold: peer,
        compression,
        elapsed: t.elapsed(),
    }
}

/// The compression rows of `opts` (none when `compression_rows` is `Some(0)`).
pub fn compression_runs(
    opts: &Options,
    progress: &mut impl FnMut(&str),
) -> crate::bench_compression::Report {
    if opts.compression_rows == Some(0) {
        return Default::default();
    }
    crate::bench_compression::run(
        &crate::bench_compression::Options {
            rows: opts.compression_rows,
            reps: opts.reps,
        },
        progress,
    )
}

/// Formats a rate with a k/M suffix.
fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn si_spread(s: &Spread) -> String {
    format!("{} / {} / {}", si(s.min), si(s.median), si(s.max))
}

fn ms_spread(s: &Spread) -> String {
    format!("{:.3} / {:.3} / {:.3}", s.min, s.median, s.max)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.machine;
        let o = &self.options;
        writeln!(f, "# spillway-core vs sequential-storage 8.0.2")?;
        writeln!(f)?;
        writeln!(
            f,
            "Machine: {}, {} logical cores, {}, kernel {}; load average {} at the start, {} at the end. \
             Every figure: min / median / max of {} runs ({} for mounts), the engines \
             interleaved; ×peer is spillway / sequential-storage on medians. Whole run {:.0} s.",
            m.cpu,
            m.cores,
            m.os,
            m.kernel,
            m.load,
            self.load_at_end,
            o.reps,
            o.mount_reps,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "## Appends: {} KiB flash, 4 KiB erase blocks, {} MiB of payload per run \
             (ring wraps; spillway DropOldest, 16 KiB segments; peer overwrites oldest)",
            o.write_flash >> 10,
            o.write_payload_total >> 20
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| payload | write size | engine | records | appends/s | ×peer | \
             programmed B / payload B | ×peer | erases / MiB payload | ×peer |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|---|")?;
        for group in self.writes.chunks(Engine::ALL.len()) {
            let peer = group.iter().find(|r| r.engine == Engine::Peer);
            for r in group {
                let ratio = |a: f64, b: Option<f64>| match b {
                    Some(b) if r.engine != Engine::Peer && b > 0.0 => format!("{:.2}", a / b),
                    _ => "—".to_string(),
                };
                writeln!(
                    f,
                    "| {} B | {} B | {} | {} | {} | {} | {:.3} | {} | {:.1} | {} |",
                    r.case.payload_len,
                    r.case.write_size,
                    r.engine.label(),
                    r.records,
                    si_spread(&r.appends_per_s),
                    ratio(r.appends_per_s.median, peer.map(|p| p.appends_per_s.median)),
                    r.programmed_per_payload_byte(),
                    ratio(
                        r.programmed_per_payload_byte(),
                        peer.map(WriteRun::programmed_per_payload_byte)
                    ),
                    r.erases_per_mib(),
                    ratio(r.erases_per_mib(), peer.map(WriteRun::erases_per_mib)),
                )?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Reads: every retained record after the appends, in order, {} KiB read buffer",
            READ_BUFFER >> 10
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| payload | write size | engine | records read | reads/s | ×peer | payload MB/s (median) |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|")?;
        for group in self.writes.chunks(Engine::ALL.len()) {
            let peer = group.iter().find(|r| r.engine == Engine::Peer);
            for r in group {
                let ratio = match peer {
                    Some(p) if r.engine != Engine::Peer => {
                        format!("{:.2}", r.reads_per_s.median / p.reads_per_s.median)
                    }
                    _ => "—".to_string(),
                };
                writeln!(
                    f,
                    "| {} B | {} B | {} | {} | {} | {} | {:.1} |",
                    r.case.payload_len,
                    r.case.write_size,
                    r.engine.label(),
                    r.records_read,
                    si_spread(&r.reads_per_s),
                    ratio,
                    r.reads_per_s.median * r.case.payload_len as f64 / 1e6,
                )?;
            }
        }
        if !self.compression.runs.is_empty() {
            writeln!(f)?;
            write!(
                f,
                "{}",
                crate::bench_compression::Section(&self.compression)
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Exact flash counts of one append run (the same in every repetition; spillway's \
             checked against the flash's own counters)"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| payload | write size | engine | payload bytes | bytes programmed | erases |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for r in &self.writes {
            writeln!(
                f,
                "| {} B | {} B | {} | {} | {} | {} |",
                r.case.payload_len,
                r.case.write_size,
                r.engine.label(),
                r.payload_bytes,
                r.bytes_programmed,
                r.erases,
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Mount: image filled to {}% of capacity with {} B records (ring wrapped, head \
             mid-flash), 4-byte words; first operation after a reboot",
            o.mount_fill_percent, MOUNT_PAYLOAD
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "| image | spillway segments | spillway mount ms | flash reads | bytes read | \
             read every byte once, ms | peer pages | peer first peek ms | flash reads | \
             peer first push ms | mount ×peek | mount ×scan |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
        for mnt in &self.mounts {
            let peer = self
                .peer_cold
                .iter()
                .find(|p| p.size_mib == mnt.case.size_mib);
            let (pages, peek, peek_reads, push, x_peek) = match peer {
                Some(p) => (
                    p.pages.to_string(),
                    ms_spread(&p.peek_ms),
                    p.peek_reads.to_string(),
                    ms_spread(&p.push_ms),
                    format!("{:.2}", mnt.ms.median / p.peek_ms.median),
                ),
                None => Default::default(),
            };
            writeln!(
                f,
                "| {} MiB | {} × {} KiB | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                mnt.case.size_mib,
                mnt.segments,
                mnt.case.blocks_per_segment * ERASE_SIZE / 1024,
                ms_spread(&mnt.ms),
                mnt.reads,
                mnt.bytes_read,
                ms_spread(&mnt.full_scan_ms),
                pages,
                peek,
                peek_reads,
                push,
                x_peek,
                mnt.ms.median / mnt.full_scan_ms.median,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_samples() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 4.0]).median, 2.5);
    }

    #[test]
    fn flash_counts_do_not_depend_on_the_flash_model() {
        use spillway_core::storage::{Geometry, SimFlash};
        for durable in [false, true] {
            let g = Geometry {
                erase_size: ERASE_SIZE,
                write_size: 16,
                capacity: 64 << 10,
                erased: 0xFF,
            };
            let mut sim = SimFlash::new_vec(g).unwrap();
            let mut stamps = Stamps::default();
            let on_sim = spillway_rep(&mut sim, None, durable, 5000, 32, &mut stamps);
            let (flash, device) = counted_flash::<16>(64 << 10);
            let on_ram = spillway_rep(flash, Some(&device), durable, 5000, 32, &mut stamps);
            assert_eq!(
                (on_sim.programmed, on_sim.erases, on_sim.records_read),
                (on_ram.programmed, on_ram.erases, on_ram.records_read)
            );
            // The log's counts cover what the device saw after format and mount.
            let c = sim.counters();
            assert!(c.bytes_written > on_sim.programmed && c.erases > on_sim.erases);
        }
    }

    #[test]
    fn a_small_run_renders_every_row() {
        let r = run(&Options::smoke(), |_| {});
        assert_eq!(r.writes.len(), 3);
        for w in &r.writes {
            assert!(w.records_read > 0 && w.records_read <= w.records, "{w:?}");
            assert!(w.programmed_per_payload_byte() > 1.0, "{w:?}");
            assert!(w.erases > 0, "the ring wrapped: {w:?}");
        }
        let text = r.to_string();
        assert!(text.contains("flush every record"), "{text}");
        assert!(text.contains("| 1 MiB | 63 × 16 KiB |"), "{text}");
    }
}

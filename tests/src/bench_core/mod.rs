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
//!
//! [`Log`]: spillway_core::log::Log
//! [`Log::flush`]: spillway_core::log::Log::flush
//! [`Log::read`]: spillway_core::log::Log::read
//! [`Log::mount`]: spillway_core::log::Log::mount

use std::time::{Duration, Instant};

use sequential_storage::cache::page_pointers::HeapPagePointers;
use sequential_storage::cache::page_states::HeapPageStates;
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::queue::{QueueConfig, QueueStorage};
use spillway_core::log::{Config, FullPolicy};
use spillway_core::storage::NorFlashAdapter;

use crate::ram_nor::{self, RamNor};

mod appends;
mod machine;
mod mount;
mod report;

pub use appends::{Engine, Stamps, WriteCase, WriteRun, write_case};
pub use machine::{Machine, Spread, machine};
pub use mount::{MountCase, PeerCold, SpillwayMount, mount_size};

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

/// Stamps record index `i` into the first 8 bytes of `p`.
fn stamp(p: &mut [u8], i: u64) {
    p[..8].copy_from_slice(&i.to_le_bytes());
}

fn spillway_config() -> Config {
    Config {
        full: FullPolicy::DropOldest,
        ..Config::default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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

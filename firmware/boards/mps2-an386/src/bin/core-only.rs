//! The log alone on the MPS2 AN386, for the footprint table: the same NOR partition and
//! 4 KiB RAM buffer as the gateway image, no gateway, no UART. Formats the partition,
//! mounts, appends [`RECORDS`] records, flushes, reads them back, commits, persists, closes,
//! remounts and checks every record again; then reports its stack high water on the
//! semihosting stderr and exits 0 (1 and a line saying what failed otherwise).
//!
//! With the board's `compression` feature the log gets a scratch buffer and writes its
//! batches LZ4-compressed (and the image requires that it did): built with and without
//! it, the two images give the footprint of the feature.
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use spillway_core::log::{BRIDGE_CONSUMER, Config, Log, Memory, Record, SegmentSlot};
use spillway_core::storage::{Flash, NorFlashAdapter};
use spillway_mps2_an386::nor::{BLOCKS_PER_SEGMENT, BUFFER_BYTES, RamNor, SEGMENTS};
use spillway_mps2_an386::{report, stack};

/// Records appended.
const RECORDS: u64 = 200;
/// Scratch for compressed batches: the LZ4 worst case for the buffer with `compression`,
/// none without.
#[cfg(feature = "compression")]
const SCRATCH: usize = spillway_core::log::scratch_len(BUFFER_BYTES);
#[cfg(not(feature = "compression"))]
const SCRATCH: usize = 0;

/// The log's settings: LZ4 on every batch with `compression`.
fn config() -> Config {
    Config {
        #[cfg(feature = "compression")]
        compression: spillway_core::log::Compression::Lz4,
        ..Config::default()
    }
}

/// The payload of record `i`.
fn payload(i: u64, buf: &mut [u8; 24]) -> &[u8] {
    buf.fill(b'.');
    buf[..8].copy_from_slice(&i.to_le_bytes());
    &buf[..8 + (i % 16) as usize]
}

/// Reads `0..RECORDS` back and compares every payload.
fn check<F: Flash>(log: &mut Log<'_, F>) -> Result<(), &'static str> {
    let mut out = [0u8; 512];
    let mut at = 0;
    while at < RECORDS {
        let r = log.read(at, &mut out).map_err(|_| "read failed")?;
        if r.lost.is_some() || r.count == 0 {
            return Err("records lost");
        }
        for rec in r.records(&out) {
            let mut want = [0u8; 24];
            if rec.offset != at || rec.payload != payload(at, &mut want) {
                return Err("record differs");
            }
            at += 1;
        }
    }
    Ok(())
}

/// Mounts in place (`mount_in`: the log is built in this function's slot, never copied
/// on the stack), appends [`RECORDS`] records, flushes, reads them back, commits, persists
/// and closes in place (`close_in`). Not inlined, like [`remount`]: one slot on the stack at a time.
#[inline(never)]
fn fill<'a, F: Flash>(flash: F, mem: Memory<'a>, scratch: &'a mut [u8]) -> Result<F, &'static str> {
    let mut slot = None;
    let (log, _) = Log::mount_in_with_scratch(&mut slot, flash, config(), mem, scratch, 1)
        .map_err(|_| "mount")?;
    for i in 0..RECORDS {
        let mut p = [0u8; 24];
        let rec = Record {
            topic: "buoy/sst",
            timestamp_us: 1_764_547_200_000_000 + i,
            producer: None,
            payload: payload(i, &mut p),
        };
        log.append(10 + i, &rec).map_err(|_| "append")?;
    }
    log.flush(1_000).map_err(|_| "flush")?;
    if cfg!(feature = "compression") && log.stats().batches_compressed == 0 {
        return Err("nothing compressed");
    }
    check(log)?;
    log.commit(BRIDGE_CONSUMER, RECORDS).map_err(|_| "commit")?;
    log.persist(2_000).map_err(|_| "persist")?;
    Log::close_in(&mut slot, 3_000)
        .map_err(|_| "close")?
        .ok_or("no log")
}

/// Mounts again in place and checks the clean shutdown, the commit and every record.
#[inline(never)]
fn remount<'a, F: Flash>(
    flash: F,
    mem: Memory<'a>,
    scratch: &'a mut [u8],
) -> Result<(), &'static str> {
    let mut slot = None;
    let (log, rep) = Log::mount_in_with_scratch(&mut slot, flash, config(), mem, scratch, 4_000)
        .map_err(|_| "remount")?;
    if !rep.clean || rep.next_offset != RECORDS || log.committed(BRIDGE_CONSUMER) != Some(RECORDS) {
        return Err("remount state");
    }
    check(log)
}

fn run() -> Result<(), &'static str> {
    let mut flash = NorFlashAdapter::new(RamNor::take().ok_or("no partition")?);
    Log::format(&mut flash, 0x5350_494c_4c57_4159, BLOCKS_PER_SEGMENT).map_err(|_| "format")?;
    let mut buffer = [0u8; BUFFER_BYTES];
    let mut slots = [SegmentSlot::EMPTY; SEGMENTS];
    let mut scratch = [0u8; SCRATCH];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    // The log works on `&mut` the partition, as `Log::format` does: one instantiation of
    // the engine's flash layer instead of two.
    fill(&mut flash, mem, &mut scratch)?;
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    remount(&mut flash, mem, &mut scratch)
}

#[entry]
fn main() -> ! {
    stack::paint();
    match run() {
        Ok(()) => {
            report!(
                "core-only: ok, stack high water {} bytes",
                stack::high_water()
            );
            report::exit(0)
        }
        Err(what) => {
            report!("core-only: FAILED: {}", what);
            report::exit(1)
        }
    }
}

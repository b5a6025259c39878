//! Proof that `spillway-core` and `spillway-firmware` build and run without `std`.
//!
//! A freestanding x86_64 Linux executable: no libc, no std, its own entry point, panic
//! handler and memory functions (see `rt`). If anything in the dependency graph links
//! `std`, the build fails with E0152 (a second `panic_impl`). The program formats a log on
//! a NOR flash in RAM reached through `NorFlashAdapter`, appends, flushes, closes,
//! remounts, reads back, commits, simulates a power cut and remounts again, and exits with
//! 0 on success or with the code of the first failed check ([`Fail`]).
//!
//! Built with the `compression` feature, the log writes its batch LZ4-compressed through a
//! scratch buffer (and the check requires that it did) and reads it back from there.
//!
//! Built with the `defmt` feature (and `DEFMT_LOG=trace`), the core's log lines go through
//! `defmt` to a null logger, and the check also requires that some were emitted.
#![no_std]
#![no_main]

mod flash;
#[cfg(feature = "defmt")]
mod logger;
mod rt;

// Linked so that the gateway logic is covered by the proof as it grows.
use spillway_firmware as _;

use spillway_core::log::{
    BRIDGE_CONSUMER, Config, Log, Memory, Producer, Record, SegmentSlot, record_crc, segments_for,
};
use spillway_core::storage::{Flash, NorFlashAdapter};

use flash::RamFlash;

/// Why the check failed; the discriminant is the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Fail {
    /// The adapter reports another geometry than the driver's constants.
    Geometry = 1,
    /// `Log::format` failed.
    Format = 2,
    /// The first mount failed.
    Mount = 3,
    /// The first mount is not clean or not empty.
    FreshMountState = 4,
    /// An append failed.
    Append = 5,
    /// An append returned an unexpected offset or duplicate flag.
    AppendOffset = 6,
    /// The resend of an idempotent producer's record was stored again.
    Resend = 7,
    /// `Log::flush` failed or left records not durable.
    Flush = 8,
    /// `Log::close` failed.
    Close = 9,
    /// The remount after the clean close failed.
    Remount = 10,
    /// The remount after the clean close is not clean or has the wrong offsets.
    RemountState = 11,
    /// `Log::read` failed.
    Read = 12,
    /// A read reported lost offsets or returned no records.
    ReadLost = 13,
    /// A record came back at another offset than expected.
    RecordOffset = 14,
    /// A record came back with another topic, timestamp, producer or payload.
    RecordContent = 15,
    /// A record's CRC or the CRC chain does not match.
    RecordCrc = 16,
    /// `Log::commit` failed or returned the wrong offset.
    Commit = 17,
    /// `Log::persist` failed.
    Persist = 18,
    /// The mount after the simulated power cut failed.
    CrashMount = 19,
    /// The mount after the power cut claims a clean shutdown or lost durable state.
    CrashMountState = 20,
    /// Committed offsets did not survive the power cut.
    CrashCommits = 21,
    /// The flash driver saw a word programmed twice.
    DoubleWrite = 22,
    /// With `defmt` on, no log frame reached the logger.
    #[cfg_attr(not(feature = "defmt"), allow(dead_code))]
    DefmtSilent = 23,
    /// With `compression` on, the batch was not written compressed.
    #[cfg_attr(not(feature = "compression"), allow(dead_code))]
    NotCompressed = 24,
}

/// The log's settings: LZ4 on every batch with the `compression` feature.
fn config() -> Config {
    Config {
        #[cfg(feature = "compression")]
        compression: spillway_core::log::Compression::Lz4,
        ..Config::default()
    }
}

/// Scratch for compressed batches: the LZ4 worst case for the 1 KiB RAM buffer with the
/// `compression` feature, none without.
#[cfg(feature = "compression")]
const SCRATCH: usize = spillway_core::log::scratch_len(1024);
#[cfg(not(feature = "compression"))]
const SCRATCH: usize = 0;

/// Fails with `fail` unless `cond` holds.
fn ensure(cond: bool, fail: Fail) -> Result<(), Fail> {
    if cond { Ok(()) } else { Err(fail) }
}

/// The log id (a u128, so the `defmt` build also formats one).
const LOG_ID: u128 = 0x5350_494c_4c57_4159_0123_4567_89ab_cdef;
/// Erase blocks per segment: 8 blocks make the journal and 3 segments.
const BLOCKS_PER_SEGMENT: u32 = 2;
/// Topic of every record.
const TOPIC: &str = "buoy/sst";
/// Payloads of the records appended, in order.
const PAYLOADS: [&[u8]; 6] = [
    b"sst=18.42C",
    b"sst=18.40C",
    b"",
    b"sst=18.37C depth=1m",
    b"sst=18.42C sst=18.42C sst=18.42C sst=18.42C sst=18.42C sst=18.42C",
    b"\x00\xff\x00\xff binary",
];
/// Producer id of the last record (an idempotent publisher).
const PRODUCER_ID: u64 = 0x0bad_cafe;

/// The record appended at offset `i`.
fn record(i: usize) -> Record<'static> {
    Record {
        topic: TOPIC,
        timestamp_us: 1_764_000_000_000_000 + i as u64 * 1_000_000,
        producer: (i == PAYLOADS.len() - 1).then_some(Producer {
            id: PRODUCER_ID,
            seq: 7,
        }),
        payload: PAYLOADS[i],
    }
}

/// Reads every record in `from..to` and checks it against [`record`]; returns the record
/// CRC of the last one.
fn read_back<F: Flash>(log: &mut Log<'_, F>, from: u64, to: u64) -> Result<u32, Fail> {
    let mut out = [0u8; 256];
    let mut at = from;
    let mut last_crc = None;
    while at < to {
        let r = log.read(at, &mut out).map_err(|_| Fail::Read)?;
        ensure(r.lost.is_none() && r.count > 0, Fail::ReadLost)?;
        ensure(r.first_offset == at, Fail::RecordOffset)?;
        if let Some(prev) = last_crc {
            ensure(r.prev_crc == prev, Fail::RecordCrc)?;
        }
        for rec in r.records(&out) {
            ensure(rec.offset == at, Fail::RecordOffset)?;
            let want = record(at as usize);
            ensure(
                rec.topic == want.topic
                    && rec.timestamp_us == want.timestamp_us
                    && rec.producer == want.producer
                    && rec.payload == want.payload,
                Fail::RecordContent,
            )?;
            ensure(
                rec.crc == record_crc(rec.offset, rec.encoded),
                Fail::RecordCrc,
            )?;
            last_crc = Some(rec.crc);
            at += 1;
        }
        ensure(r.next_offset == at, Fail::RecordOffset)?;
    }
    last_crc.ok_or(Fail::ReadLost)
}

/// The whole check.
fn run() -> Result<(), Fail> {
    let n = PAYLOADS.len() as u64;
    let mut nor = NorFlashAdapter::new(RamFlash::new());
    let geo = nor.geometry();
    ensure(
        geo.erase_size == flash::ERASE_SIZE as u32
            && geo.write_size == flash::WRITE_SIZE as u32
            && geo.capacity == flash::CAPACITY as u32
            && geo.erased == 0xFF
            && segments_for(&geo, BLOCKS_PER_SEGMENT) == 3,
        Fail::Geometry,
    )?;
    Log::format(&mut nor, LOG_ID, BLOCKS_PER_SEGMENT).map_err(|_| Fail::Format)?;

    let mut buffer = [0u8; 1024];
    let mut slots = [SegmentSlot::EMPTY; 3];
    let mut scratch = [0u8; SCRATCH];

    // Fresh mount, appends, group commit, clean close.
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, rep) = Log::mount_with_scratch(&mut nor, config(), mem, &mut scratch, 1_000)
        .map_err(|_| Fail::Mount)?;
    ensure(
        rep.clean && rep.next_offset == 0 && log.log_id() == LOG_ID,
        Fail::FreshMountState,
    )?;
    for i in 0..PAYLOADS.len() {
        let a = log
            .append(2_000 + i as u64, &record(i))
            .map_err(|_| Fail::Append)?;
        ensure(a.offset == i as u64 && !a.duplicate, Fail::AppendOffset)?;
    }
    let resend = log
        .append(3_000, &record(PAYLOADS.len() - 1))
        .map_err(|_| Fail::Append)?;
    ensure(resend.duplicate && resend.offset == n - 1, Fail::Resend)?;
    let durable = log.flush(4_000).map_err(|_| Fail::Flush)?;
    ensure(durable == n && log.durable_offset() == n, Fail::Flush)?;
    #[cfg(feature = "compression")]
    ensure(log.stats().batches_compressed == 1, Fail::NotCompressed)?;
    let last_crc = log.last_crc();
    log.close(5_000).map_err(|_| Fail::Close)?;

    // Clean remount: everything back, byte for byte; commits.
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, rep) = Log::mount_with_scratch(&mut nor, config(), mem, &mut scratch, 6_000)
        .map_err(|_| Fail::Remount)?;
    ensure(
        rep.clean
            && rep.first_offset == 0
            && rep.next_offset == n
            && rep.torn_tail_bytes == 0
            && log.last_crc() == last_crc,
        Fail::RemountState,
    )?;
    ensure(read_back(&mut log, 0, n)? == last_crc, Fail::RecordCrc)?;
    let bridge = log.commit(BRIDGE_CONSUMER, n).map_err(|_| Fail::Commit)?;
    let dashboard = log.commit("dashboard", 2).map_err(|_| Fail::Commit)?;
    ensure(bridge == n && dashboard == 2, Fail::Commit)?;
    ensure(log.committed(BRIDGE_CONSUMER) == Some(n), Fail::Commit)?;
    log.persist(7_000).map_err(|_| Fail::Persist)?;

    // Power cut: the storage is taken away without a clean shutdown.
    let nor = log.into_flash();
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, rep) = Log::mount_with_scratch(nor, config(), mem, &mut scratch, 8_000)
        .map_err(|_| Fail::CrashMount)?;
    ensure(
        !rep.clean && rep.next_offset >= n && log.durable_offset() == n,
        Fail::CrashMountState,
    )?;
    ensure(
        log.committed(BRIDGE_CONSUMER) == Some(n) && log.committed("dashboard") == Some(2),
        Fail::CrashCommits,
    )?;
    read_back(&mut log, 0, n)?;
    let nor = log.close(9_000).map_err(|_| Fail::Close)?;
    ensure(nor.inner_mut().double_writes == 0, Fail::DoubleWrite)?;

    #[cfg(feature = "defmt")]
    ensure(logger::bytes_written() > 0, Fail::DefmtSilent)?;
    Ok(())
}

/// Called by `_start`: runs the check and exits with its outcome.
extern "C" fn check_main() -> ! {
    rt::exit(match run() {
        Ok(()) => 0,
        Err(fail) => fail as u8,
    })
}

//! Compressed batches (`FORMAT.md` section 4.4) on the simulated flash: what is written
//! compressed reads back exactly, across a remount and record by record; a damaged
//! compressed batch costs exactly its own offsets; a read inside a compressed batch decodes
//! it once, not once per record; a log without a scratch refuses to guess.

mod common;
use common::{Ram, Sim, formatted, nor, read_all};

use spillway_core::MountError;
use spillway_core::log::{Compression, Config, Log, LostRange, LostReason, Record};
use spillway_core::storage::Geometry;

/// 1 MiB of 4 KiB erase blocks, 4 blocks per segment.
const GEO: Geometry = nor(4096, 1 << 20);
const BPS: u32 = 4;
const BUFFER: usize = 4096;
/// Records per flush: one batch each.
const PER_BATCH: u64 = 40;

/// Mounts `flash` with `compression` on `ram` (which has a scratch).
fn mount<'a>(
    ram: &'a mut Ram,
    flash: &'a mut Sim,
    compression: Compression,
) -> Log<'a, &'a mut Sim> {
    let cfg = Config {
        compression,
        ..Config::default()
    };
    let (mem, scratch) = ram.with_scratch_parts();
    Log::mount_with_scratch(flash, cfg, mem, scratch, 0)
        .unwrap()
        .0
}

/// A buoy-like text line: compresses well against its neighbours.
fn payload(i: u64) -> Vec<u8> {
    format!(
        "2025-11-24T16:{:02}:{:02}Z station=41001 sst_c={}.{} qc=good",
        i / 60 % 60,
        i % 60,
        14 + i % 3,
        i % 10
    )
    .into_bytes()
}

fn record(i: u64, p: &[u8]) -> Record<'_> {
    Record {
        topic: "buoy/41001/sst",
        timestamp_us: 1_764_000_000_000_000 + i * 1_000_000,
        producer: None,
        payload: p,
    }
}

/// `n` records appended with `compression`, flushed every [`PER_BATCH`], closed cleanly.
fn write_log(n: u64, compression: Compression) -> (Sim, spillway_core::log::Stats) {
    let mut flash = formatted(GEO, 0x1747, BPS);
    let mut ram = Ram::with_scratch(&GEO, BPS, BUFFER);
    let mut log = mount(&mut ram, &mut flash, compression);
    for i in 0..n {
        let p = payload(i);
        log.append(i, &record(i, &p)).unwrap();
        if (i + 1) % PER_BATCH == 0 {
            log.flush(i).unwrap();
        }
    }
    let stats = log.stats();
    log.close(n).unwrap();
    (flash, stats)
}

/// Reads every offset with a buffer of `buf_len` bytes: the offsets seen (each checked
/// against what was appended) and the lost ranges met.
fn read_back(log: &mut Log<'_, &mut Sim>, buf_len: usize) -> (Vec<u64>, Vec<LostRange>) {
    read_all(log, buf_len, |rec| {
        let p = payload(rec.offset);
        let want = record(rec.offset, &p);
        assert_eq!(rec.payload, want.payload, "record {}", rec.offset);
        assert_eq!(rec.topic, want.topic);
        assert_eq!(rec.timestamp_us, want.timestamp_us);
    })
}

/// Batch positions in the image: `(address, base offset, count, compressed)`.
fn batches(flash: &Sim) -> Vec<(usize, u64, u32, bool)> {
    let b = flash.bytes();
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 33 <= b.len() {
        if &b[at..at + 4] == b"SPWB" {
            let len = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap());
            let check = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap());
            if check == !len {
                let base = u64::from_le_bytes(b[at + 16..at + 24].try_into().unwrap());
                let count = u32::from_le_bytes(b[at + 24..at + 28].try_into().unwrap());
                out.push((at, base, count, b[at + 32] == 0x04));
                at += (len as usize).next_multiple_of(4);
                continue;
            }
        }
        at += 4;
    }
    out
}

#[test]
fn compressed_batches_read_back_exactly_and_take_less_flash() {
    let n = 2000;
    let (mut plain, plain_stats) = write_log(n, Compression::None);
    let (mut lz4, stats) = write_log(n, Compression::Lz4);
    eprintln!(
        "{n} records: {} flash bytes plain, {} with lz4 ({} batches, {} bytes saved)",
        plain_stats.flash_bytes_programmed,
        stats.flash_bytes_programmed,
        stats.batches_compressed,
        stats.compressed_bytes_saved
    );
    assert_eq!(plain_stats.batches_compressed, 0);
    assert_eq!(stats.batches_compressed, stats.batches_written);
    assert!(
        stats.flash_bytes_programmed * 10 < plain_stats.flash_bytes_programmed * 6,
        "lz4 {} bytes, plain {}",
        stats.flash_bytes_programmed,
        plain_stats.flash_bytes_programmed
    );
    for flash in [&mut plain, &mut lz4] {
        let mut ram = Ram::with_scratch(&GEO, BPS, BUFFER);
        let mut log = mount(&mut ram, flash, Compression::None);
        // Whole batches at a time, and one record at a time.
        for buf in [8192, 100] {
            let (seen, lost) = read_back(&mut log, buf);
            assert_eq!(lost, vec![]);
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
    }
}

/// Reading a compressed batch record by record decodes it once: the flash bytes read stay
/// within a small multiple of the image, not the batch size times its record count.
#[test]
fn reading_record_by_record_decodes_each_compressed_batch_once() {
    let n = 2000;
    let (mut flash, stats) = write_log(n, Compression::Lz4);
    let mut ram = Ram::with_scratch(&GEO, BPS, BUFFER);
    let mut log = mount(&mut ram, &mut flash, Compression::None);
    let before = log.stats().flash_bytes_read;
    let (seen, _) = read_back(&mut log, 100);
    assert_eq!(seen.len() as u64, n);
    let read = log.stats().flash_bytes_read - before;
    let written = stats.flash_bytes_programmed;
    eprintln!("read {read} flash bytes of an image of {written} bytes written");
    assert!(
        read < 3 * written,
        "{read} bytes read for an image of {written} bytes written"
    );
}

#[test]
fn a_corrupt_compressed_batch_costs_exactly_its_offsets() {
    let n = 1000;
    let (mut flash, _) = write_log(n, Compression::Lz4);
    let all = batches(&flash);
    assert!(all.iter().all(|b| b.3), "every batch compressed: {all:?}");
    // A batch in the middle of a segment, not the head's last.
    let (addr, base, count, _) = all[all.len() / 2];
    assert_eq!(u64::from(count), PER_BATCH);
    flash.bytes_mut()[addr + 40] ^= 0x10;
    let mut ram = Ram::with_scratch(&GEO, BPS, BUFFER);
    let mut log = mount(&mut ram, &mut flash, Compression::Lz4);
    let (seen, lost) = read_back(&mut log, 8192);
    assert_eq!(
        lost,
        vec![LostRange {
            from: base,
            to: base + u64::from(count),
            reason: LostReason::Corrupt
        }]
    );
    let want: Vec<u64> = (0..n)
        .filter(|o| !(base..base + u64::from(count)).contains(o))
        .collect();
    assert_eq!(seen, want);
    // Damage that passes the CRC is impossible to make by a flip; a body that does not
    // decode with a valid CRC is made by hand in the unit tests of `compact_io`.
}

/// A log mounted without a scratch cannot decode a compressed batch: the mount, which
/// must read the head's last batch, says so rather than guess its records.
#[test]
fn without_a_scratch_a_compressed_log_does_not_mount() {
    let (mut flash, _) = write_log(100, Compression::Lz4);
    let mut ram = Ram::new(&GEO, BPS, BUFFER);
    match Log::mount(&mut flash, Config::default(), ram.memory(), 0) {
        Err(MountError::ScratchTooSmall { needed, len: 0 }) => assert!(needed > 0),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

//! Exact flash-operation counts: bytes programmed per payload byte and erases per MiB of
//! payload, derived by hand from the on-flash sizes and checked to the byte.
//!
//! # Set-up (both tests)
//! - NOR geometry: 4 KiB erase blocks, 4-byte words; 1 erase block per segment, 8
//!   segments after the 2 journal blocks (40 KiB partition).
//! - Records: topic `"t"`, no producer id. In a batch a record takes 14 B of overhead,
//!   1 B of topic and its payload, so a 17-byte payload makes a 32-byte record and a
//!   241-byte payload a 256-byte record.
//! - Batches are buffer-size: the RAM buffer is 800 bytes, which holds a 32-byte batch
//!   header and 24 records of 32 B or 3 records of 256 B exactly (768 B of records
//!   either way). The record after that does not fit, so `append` first writes the
//!   buffer out as one 800-byte batch. Nothing else flushes until the final `flush()`.
//! - 12,000 records are appended; the consumer `bridge` commits the durable offset after
//!   every append (never persisted explicitly), so the ring is always reclaimable.
//! - Counted: everything the simulated flash programs and erases after `mount` returns,
//!   up to and including the final `flush()`.
//!
//! # Why these sizes
//! A segment is 4096 B; its header takes 80 B (a multiple of the word), leaving 4016 B.
//! Five 800-byte batches take 4000 B; the 16 B left cannot hold a batch header plus a
//! record, so a batch never splits across segments and every segment holds exactly five
//! batches. (With other sizes the writer fills the tail of a segment with a partial
//! batch, which makes the count depend on the phase of every segment.)
//!
//! # The journal
//! A journal entry is a 72-byte header + `bridge` (1 B name length + 6 B name + 8 B
//! offset) = 87 B, padded to 88 B. A journal block of 4096 B takes 46 entries
//! (46 × 88 = 4048). Format wrote entry 1 and mount entry 2 into block 0, so the run's
//! 45th entry is the first that does not fit: it erases block 1; after that every 46th
//! entry erases the other block. Erases from the journal, for J entries written in the
//! run: `0` if J < 45, else `(J − 45) / 46 + 1`.
//!
//! Entries are written for the offset lease (the first append after mount takes the
//! lease to 1024, then one entry every 1024 offsets: at offsets 0, 1024, …, 11264, so 12
//! for 12,000 records) and one at the end of every segment roll. No other journal
//! writes happen: the commit reclaiming a segment needs was already persisted by the
//! previous roll's entry (the ring has 8 segments, the reclaimed segment ended 7 rolls
//! ago).

use spillway_core::log::{Config, Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Geometry, SimFlash};

const GEOMETRY: Geometry = Geometry {
    erase_size: 4096,
    write_size: 4,
    capacity: 4096 * (2 + 8),
    erased: 0xFF,
};

const RECORDS: u64 = 12_000;
const MIB: f64 = 1024.0 * 1024.0;

/// What the run cost.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    bytes_programmed: u64,
    erases: u64,
    batches: u64,
    segments_opened: u64,
    journal_writes: u64,
}

/// Appends `RECORDS` records of `payload_len` payload bytes as described in the module
/// docs and returns what the flash counted.
fn run(payload_len: usize) -> Cost {
    let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
    Log::format(&mut sim, 0xC0C0, 1).unwrap();
    let mut buffer = vec![0u8; 800];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&GEOMETRY, 1) as usize];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut sim, Config::default(), mem, 0).unwrap();
    let before = log.flash().counters();
    let payload = vec![0xA5u8; payload_len];
    for i in 0..RECORDS {
        let rec = Record {
            topic: "t",
            timestamp_us: i,
            producer: None,
            payload: &payload,
        };
        assert_eq!(rec.encoded_len(), 15 + payload_len);
        log.append(0, &rec).unwrap();
        log.commit("bridge", log.durable_offset()).unwrap();
    }
    log.flush(0).unwrap();
    let after = log.flash().counters();
    let stats = log.stats();
    let cost = Cost {
        bytes_programmed: after.bytes_written - before.bytes_written,
        erases: after.erases - before.erases,
        batches: stats.batches_written,
        segments_opened: stats.segments_opened,
        // Stats count since mount began: the mount's own journal entry is not ours.
        journal_writes: stats.journal_writes - 1,
    };
    // The log's own count agrees with the flash's (its stats include the mount's entry).
    assert_eq!(stats.flash_bytes_programmed, cost.bytes_programmed + 88);
    assert_eq!(stats.erases, cost.erases);
    let payload_bytes = RECORDS * payload_len as u64;
    eprintln!(
        "counters: {RECORDS} records of {payload_len} B payload: {cost:?}; {:.4} flash bytes per payload byte, {:.1} erases per MiB of payload",
        cost.bytes_programmed as f64 / payload_bytes as f64,
        cost.erases as f64 / (payload_bytes as f64 / MIB)
    );
    cost
}

/// 32-byte records (17-byte payloads), 24 per batch.
///
/// - Batches: 12,000 / 24 = 500 of 800 B (the last one by the final flush) = 400,000 B.
/// - Segments: 5 batches each, so 100 segments; the first was opened by `format`, so 99
///   rolls, each erasing 1 block and writing an 80-byte header = 7,920 B.
/// - Journal: 12 lease entries + 99 roll entries = 111 entries of 88 B = 9,768 B; it
///   erases a block at its 45th and 91st entry: (111 − 45) / 46 + 1 = 2 erases.
/// - Total programmed: 400,000 + 7,920 + 9,768 = 417,688 B for 12,000 × 17 = 204,000
///   payload bytes: 2.0475 flash bytes per payload byte (the 32-byte record is 1.882
///   times its payload, the batch header adds 1/24 of a header per record, headers and
///   journal the rest).
/// - Erases: 99 + 2 = 101, or 519.1 per MiB of payload.
#[test]
fn exact_counts_32_byte_records() {
    let cost = run(17);
    assert_eq!(
        cost,
        Cost {
            bytes_programmed: 417_688,
            erases: 101,
            batches: 500,
            segments_opened: 99,
            journal_writes: 111,
        }
    );
    let per_payload_byte = cost.bytes_programmed as f64 / 204_000.0;
    assert!((per_payload_byte - 2.0475).abs() < 1e-4);
    let per_mib = cost.erases as f64 / (204_000.0 / MIB);
    assert!((per_mib - 519.15).abs() < 0.01);
}

/// 256-byte records (241-byte payloads), 3 per batch.
///
/// - Batches: 12,000 / 3 = 4,000 of 800 B = 3,200,000 B.
/// - Segments: 5 batches each, so 800 segments, 799 rolls: 799 erases and
///   799 × 80 = 63,920 B of headers.
/// - Journal: 12 lease entries + 799 roll entries = 811 entries of 88 B = 71,368 B,
///   erasing a block (811 − 45) / 46 + 1 = 17 times.
/// - Total programmed: 3,200,000 + 63,920 + 71,368 = 3,335,288 B for 12,000 × 241 =
///   2,892,000 payload bytes: 1.1533 flash bytes per payload byte.
/// - Erases: 799 + 17 = 816, or 295.9 per MiB of payload.
#[test]
fn exact_counts_256_byte_records() {
    let cost = run(241);
    assert_eq!(
        cost,
        Cost {
            bytes_programmed: 3_335_288,
            erases: 816,
            batches: 4_000,
            segments_opened: 799,
            journal_writes: 811,
        }
    );
    let per_payload_byte = cost.bytes_programmed as f64 / 2_892_000.0;
    assert!((per_payload_byte - 1.1533).abs() < 1e-4);
    let per_mib = cost.erases as f64 / (2_892_000.0 / MIB);
    assert!((per_mib - 295.86).abs() < 0.01);
}

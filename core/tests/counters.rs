//! Exact flash-operation counts: bytes programmed per payload byte and erases per MiB of
//! payload, derived by hand from the on-flash sizes and checked to the byte.
//!
//! # Set-up (both tests)
//! - NOR geometry: 4 KiB erase blocks, 4-byte words; 1 erase block per segment, 8
//!   segments after the 2 journal blocks (40 KiB partition).
//! - Records: topic `"t"`, no producer id, timestamp `i` µs for record `i`. In the RAM
//!   buffer a record takes its canonical encoding: 14 B of overhead, 1 B of topic and its
//!   payload, so a 17-byte payload makes a 32-byte record and a 241-byte payload a
//!   256-byte record.
//! - On flash (format version 4, compact bodies) a batch is its 32-byte header, a 12-byte
//!   body prefix for 17-byte payloads (flags, base timestamp, topic length, topic `t`, the
//!   fixed payload length as a one-byte varint: every payload has the same length; 13 B
//!   for 241-byte payloads, whose length takes a two-byte varint) and per record a
//!   one-byte timestamp delta and the payload: 18 B per 17-byte payload, 242 B per
//!   241-byte payload.
//! - Batches are buffer-size: the RAM buffer holds a 32-byte reserve and exactly 109
//!   records of 32 B (3,520 B) or 8 records of 256 B (2,080 B). The record after that
//!   does not fit, so `append` first writes the buffer out as one batch. Nothing else
//!   flushes until the final `flush()`.
//! - 12,000 records are appended; the consumer `bridge` commits the durable offset after
//!   every append (never persisted explicitly), so the ring is always reclaimable.
//! - Counted: everything the simulated flash programs and erases after `mount` returns,
//!   up to and including the final `flush()`.
//!
//! # Why these sizes
//! A segment is 4096 B; its header takes 80 B (a multiple of the word), leaving 4016 B.
//! Two batches of 109 records of 32 B (44 + 109 × 18 = 2,006 B, 2,008 B padded) fill it
//! exactly; two batches of 8 records of 256 B (45 + 8 × 242 = 1,981 B, 1,984 B padded)
//! leave 48 B, which
//! cannot hold a batch header, a body prefix and a record. So a batch never splits across
//! segments and every segment holds exactly two batches. (With other sizes the writer
//! fills the tail of a segment with a partial batch, which makes the count depend on the
//! phase of every segment.)
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

mod common;
use common::{Ram, formatted, nor};

use spillway_core::log::{Config, Log, Record};
use spillway_core::storage::Geometry;

const GEOMETRY: Geometry = nor(4096, 4096 * (2 + 8));

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

/// Appends `RECORDS` records of `payload_len` payload bytes through a RAM buffer of
/// `buffer` bytes as described in the module docs and returns what the flash counted.
fn run(payload_len: usize, buffer: usize) -> Cost {
    let mut sim = formatted(GEOMETRY, 0xC0C0, 1);
    let mut ram = Ram::new(&GEOMETRY, 1, buffer);
    let mem = ram.memory();
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
    let (per_byte, per_mib) = cost.rates(payload_len);
    eprintln!(
        "counters: {RECORDS} records of {payload_len} B payload: {cost:?}; {per_byte:.4} flash bytes per payload byte, {per_mib:.1} erases per MiB of payload",
    );
    cost
}

impl Cost {
    /// Flash bytes programmed per payload byte and erases per MiB of payload, for a run
    /// of `RECORDS` records of `payload_len` payload bytes.
    fn rates(&self, payload_len: usize) -> (f64, f64) {
        let payload_bytes = (RECORDS * payload_len as u64) as f64;
        (
            self.bytes_programmed as f64 / payload_bytes,
            self.erases as f64 / (payload_bytes / MIB),
        )
    }
}

/// [`run`] of `payload_len`-byte payloads through a `buffer`-byte RAM buffer: asserts
/// it costs exactly `want`, `per_byte` flash bytes per payload byte (within 1e-4) and
/// `per_mib` erases per MiB of payload (within 0.01).
fn assert_run(payload_len: usize, buffer: usize, want: Cost, per_byte: f64, per_mib: f64) {
    let cost = run(payload_len, buffer);
    assert_eq!(cost, want);
    let (got_per_byte, got_per_mib) = cost.rates(payload_len);
    assert!((got_per_byte - per_byte).abs() < 1e-4, "{got_per_byte}");
    assert!((got_per_mib - per_mib).abs() < 0.01, "{got_per_mib}");
}

/// 32-byte records (17-byte payloads), 109 per batch.
///
/// - Batches: 12,000 = 110 × 109 + 10: 110 batches of 2,008 B = 220,880 B and the final
///   flush's batch of 10 records, 44 + 10 × 18 = 224 B; 111 batches, 221,104 B.
/// - Segments: 2 batches each, so the 111th batch opens the 56th segment; the first was
///   opened by `format`, so 55 rolls, each erasing 1 block and writing an 80-byte header
///   = 4,400 B.
/// - Journal: 12 lease entries + 55 roll entries = 67 entries of 88 B = 5,896 B; it
///   erases a block at its 45th entry: (67 − 45) / 46 + 1 = 1 erase.
/// - Total programmed: 221,104 + 4,400 + 5,896 = 231,400 B for 12,000 × 17 = 204,000
///   payload bytes: 1.1343 flash bytes per payload byte (2.0475 in format version 3,
///   whose records took 15 B besides the payload, against 1 B here).
/// - Erases: 55 + 1 = 56, or 287.8 per MiB of payload.
#[test]
fn exact_counts_32_byte_records() {
    let want = Cost {
        bytes_programmed: 231_400,
        erases: 56,
        batches: 111,
        segments_opened: 55,
        journal_writes: 67,
    };
    assert_run(17, 32 + 109 * 32, want, 1.1343, 287.85);
}

/// 256-byte records (241-byte payloads), 8 per batch.
///
/// - Batches: 12,000 / 8 = 1,500 of 1,984 B = 2,976,000 B.
/// - Segments: 2 batches each, so 750 segments, 749 rolls: 749 erases and
///   749 × 80 = 59,920 B of headers.
/// - Journal: 12 lease entries + 749 roll entries = 761 entries of 88 B = 66,968 B,
///   erasing a block (761 − 45) / 46 + 1 = 16 times.
/// - Total programmed: 2,976,000 + 59,920 + 66,968 = 3,102,888 B for 12,000 × 241 =
///   2,892,000 payload bytes: 1.0729 flash bytes per payload byte (1.1533 in format
///   version 3).
/// - Erases: 749 + 16 = 765, or 277.4 per MiB of payload.
#[test]
fn exact_counts_256_byte_records() {
    let want = Cost {
        bytes_programmed: 3_102_888,
        erases: 765,
        batches: 1_500,
        segments_opened: 749,
        journal_writes: 761,
    };
    assert_run(241, 32 + 8 * 256, want, 1.0729, 277.37);
}

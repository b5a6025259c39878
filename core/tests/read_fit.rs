//! Reads into buffers of every size from every offset: each read returns as many whole
//! records as fit (at least one, else `BufferTooSmall` with the first record's length),
//! across batch boundaries, with the record CRC of the record before the first. Batches of
//! the compact layout are read whole into the end of the buffer when their body fits
//! there and decoded in place; these sizes go through every case of that (the whole batch
//! fits, only its body does, neither does) for plain, mixed and compressed bodies.

mod common;
use common::Ram;

use spillway_core::error::ReadError;
use spillway_core::log::{Compression, Config, Log, Producer, Record};
use spillway_core::storage::{Geometry, SimFlash};

const LOG_ID: u128 = 0x0052_4541_4446_4954;

/// 4 KiB erase blocks, 16 of them, segments of 4 blocks: every record of a test fits in
/// the head segment.
const G: Geometry = Geometry {
    erase_size: 4096,
    write_size: 4,
    capacity: 4096 * 16,
    erased: 0xFF,
};

/// The records of one workload: topic, timestamp, producer, payload.
type Owned = (String, u64, Option<Producer>, Vec<u8>);

fn workload(kind: &str, n: u64) -> Vec<Owned> {
    (0..n)
        .map(|i| {
            let ts = 1_764_000_000_000_000 + i * 997 + (i % 3) * 70_000;
            let (topic, producer, len) = match kind {
                "fixed" => ("s/temp", None, 24),
                "varied" => ("s/temp", None, (i as usize * 7) % 61),
                "mixed" => (
                    if i % 5 == 2 { "other/topic" } else { "s/temp" },
                    (i % 4 == 1).then_some(Producer {
                        id: 0xABCD,
                        seq: i as u32,
                    }),
                    (i as usize * 5) % 40,
                ),
                // Repetitive payloads that LZ4 shrinks.
                _ => ("s/temp", None, 48),
            };
            let mut payload: Vec<u8> = format!("{i:06}|").into_bytes();
            payload.extend((0..len).map(|k| b"abcab"[k % 5]));
            (topic.to_string(), ts, producer, payload)
        })
        .collect()
}

fn encoded_len(r: &Owned) -> usize {
    Record {
        topic: &r.0,
        timestamp_us: r.1,
        producer: r.2,
        payload: &r.3,
    }
    .encoded_len()
}

fn check(kind: &str, compression: Compression) {
    let n = 90;
    let recs = workload(kind, n);
    let mut flash = SimFlash::new_vec(G).unwrap();
    Log::format(&mut flash, LOG_ID, 4).unwrap();
    let mut ram = Ram::with_scratch(&G, 4, 1024);
    let (mem, scratch) = ram.with_scratch_parts();
    let cfg = Config {
        compression,
        ..Config::default()
    };
    let (mut log, _) = Log::mount_with_scratch(&mut flash, cfg, mem, scratch, 0).unwrap();
    for (i, r) in recs.iter().enumerate() {
        let rec = Record {
            topic: &r.0,
            timestamp_us: r.1,
            producer: r.2,
            payload: &r.3,
        };
        log.append(i as u64, &rec).unwrap();
    }
    log.flush(n).unwrap();
    if compression != Compression::None {
        assert!(
            log.stats().batches_compressed > 0,
            "{kind}: nothing compressed"
        );
    }
    // The record CRCs, from reads into a buffer that holds everything.
    let mut big = vec![0u8; 1 << 16];
    let mut crcs = Vec::new();
    let mut at = 0;
    while at < n {
        let r = log.read(at, &mut big).unwrap();
        assert!(r.count > 0 && r.lost.is_none(), "{kind}: {r:?}");
        crcs.extend(r.records(&big).map(|x| x.crc));
        at = r.next_offset;
    }
    let mut out = vec![0u8; 1600];
    for from in 0..n {
        for size in (1..1600).step_by(3) {
            let buf = &mut out[..size];
            // Poison the buffer: nothing may be left over from an earlier read.
            buf.fill(0xA5);
            let first = encoded_len(&recs[from as usize]);
            let r = match log.read(from, buf) {
                Err(ReadError::BufferTooSmall { needed }) => {
                    assert_eq!(needed, first, "{kind} from {from} size {size}");
                    assert!(first > size, "{kind} from {from} size {size}");
                    continue;
                }
                other => other.unwrap(),
            };
            // As many whole records as fit, in order (the log's records share a segment).
            let mut want = 0usize;
            let mut fit = 0u32;
            for rec in &recs[from as usize..] {
                if want + encoded_len(rec) > size {
                    break;
                }
                want += encoded_len(rec);
                fit += 1;
            }
            let at = format!("{kind} from {from} size {size}");
            assert_eq!((r.count, r.len, r.lost), (fit, want, None), "{at}");
            assert_eq!(r.next_offset, from + u64::from(fit), "{at}");
            if from > 0 {
                assert_eq!(r.prev_crc, crcs[from as usize - 1], "{at}");
            }
            for (k, got) in r.records(buf).enumerate() {
                let w = &recs[from as usize + k];
                assert_eq!(got.offset, from + k as u64, "{at}");
                assert_eq!(
                    (got.topic, got.timestamp_us, got.producer, got.payload),
                    (w.0.as_str(), w.1, w.2, w.3.as_slice()),
                    "{at}, record {k}"
                );
                assert_eq!(got.crc, crcs[got.offset as usize], "{at}, record {k}");
            }
        }
    }
}

#[test]
fn plain_fixed_length_batches_read_whole_records_into_every_buffer_size() {
    check("fixed", Compression::None);
}

#[test]
fn plain_varied_length_batches_read_whole_records_into_every_buffer_size() {
    check("varied", Compression::None);
}

#[test]
fn mixed_batches_read_whole_records_into_every_buffer_size() {
    check("mixed", Compression::None);
}

#[test]
fn compressed_batches_read_whole_records_into_every_buffer_size() {
    check("lz4", Compression::Lz4);
}

//! The record CRC chain: every read reports, as `prev_crc`, the record CRC of the record just
//! before its first one, whether the batches were written one record at a time or many, and
//! across a remount. Guards the shortcuts that skip record CRCs nobody needs.

mod common;
use common::{Ram, formatted};

use spillway_core::log::{Config, Log, Record, record_crc};
use spillway_core::storage::Geometry;

fn check_chain(flush_every: u64) {
    let g = Geometry {
        erase_size: 4096,
        write_size: 8,
        capacity: 4096 * 34,
        erased: 0xFF,
    };
    let mut flash = formatted(g, 0x11, 2);
    let mut ram = Ram::new(&g, 2, 1024);
    let total = 600u64;
    for round in 0..2u64 {
        let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
        for i in 0..total / 2 {
            let payload = vec![(i % 251) as u8; 1 + (i % 37) as usize];
            log.append(
                i,
                &Record {
                    topic: "chain",
                    timestamp_us: i,
                    producer: None,
                    payload: &payload,
                },
            )
            .unwrap();
            if (i + 1) % flush_every == 0 {
                log.flush(i).unwrap();
            }
        }
        log.flush(0).unwrap();
        // Read from every offset: the reported prev CRC is the previous record's CRC, from
        // flash and from RAM alike.
        let mut crcs = Vec::new();
        let mut out = vec![0u8; 4096];
        let mut at = log.first_offset();
        while at < log.next_offset() {
            let r = log.read(at, &mut out).unwrap();
            if r.lost.is_some() {
                at = r.next_offset;
                continue;
            }
            for rec in r.records(&out) {
                assert_eq!(rec.crc, record_crc(rec.offset, rec.encoded));
                crcs.push((rec.offset, rec.crc));
            }
            at = r.next_offset;
        }
        assert!(
            crcs.len() as u64 >= total / 2 * (round + 1) - 1,
            "round {round}"
        );
        for w in crcs.windows(2) {
            if w[1].0 != w[0].0 + 1 {
                continue;
            }
            let r = log.read(w[1].0, &mut out).unwrap();
            assert_eq!(r.prev_crc, w[0].1, "prev CRC at offset {}", w[1].0);
        }
        assert_eq!(log.last_crc(), crcs.last().unwrap().1);
        drop(log);
    }
}

#[test]
fn prev_crc_chain_with_one_record_batches() {
    check_chain(1);
}

#[test]
fn prev_crc_chain_with_large_batches() {
    check_chain(1000);
}

#[test]
fn prev_crc_chain_with_mixed_batches() {
    check_chain(7);
}

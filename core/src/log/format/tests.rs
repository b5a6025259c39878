//! Unit tests of the byte layouts: the worked examples in `FORMAT.md` against the encoder,
//! CRCs, erased and zeroed regions, impossible geometries, resume markers and record walks.

use super::*;
use std::vec::Vec;

/// The record of the worked example in `FORMAT.md`.
const EXAMPLE: Record<'static> = Record {
    topic: "sst",
    timestamp_us: 1_764_000_000_000_000,
    producer: None,
    payload: b"18.4",
};
/// Base offset of the example batch.
const EXAMPLE_BASE: u64 = 258;
/// Record CRC of the record before it (offset 257), as given in `FORMAT.md`.
const EXAMPLE_PREV_CRC: u32 = 0x1122_3344;

/// How a batch lays out its records: canonical encodings back to back (segments of
/// format version 3 and before), or the compact body of version 4.
#[derive(Clone, Copy)]
enum Layout {
    Canonical,
    Compact,
}

/// Encodes `records` as one batch the way the log writes it in `layout`: header and body,
/// padded to `write_size` with `erased`.
fn encode_batch(
    layout: Layout,
    base_offset: u64,
    prev_crc: u32,
    records: &[Record<'_>],
    write_size: u32,
    erased: u8,
) -> Vec<u8> {
    let canonical: Vec<u8> = records
        .iter()
        .flat_map(|r| {
            let mut e = std::vec![0u8; r.encoded_len()];
            r.encode_into(&mut e);
            e
        })
        .collect();
    let n = records.len() as u32;
    let mut b = std::vec![0u8; BATCH_HEADER_LEN];
    match layout {
        Layout::Canonical => b.extend_from_slice(&canonical),
        Layout::Compact => {
            let plan = super::super::compact::plan(&canonical, base_offset, n, usize::MAX);
            assert_eq!(plan.count, n);
            super::super::compact::encode::<()>(&canonical, base_offset, &plan, &mut |x| {
                b.extend_from_slice(x);
                Ok(())
            })
            .unwrap();
        }
    }
    let mut h = BatchHeader {
        len: b.len() as u32,
        crc: 0,
        base_offset,
        count: n,
        prev_crc,
    };
    b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
    h.crc = crc32(&b[16..]);
    b[..BATCH_HEADER_LEN].copy_from_slice(&h.encode());
    let padded = align_up(b.len() as u32, write_size) as usize;
    b.resize(padded, erased);
    b
}

/// The bytes of the annotated hex dump that follows `marker` in `FORMAT.md`: the lines
/// of the next ```text block that start with `0x`, each `0xOFFSET BYTES... | comment`,
/// with the offsets checked to be contiguous.
fn dump_in_format_md(marker: &str) -> Vec<u8> {
    let doc = include_str!("../../../FORMAT.md");
    let after = &doc[doc.find(marker).expect("marker in FORMAT.md")..];
    let block = &after[after.find("```text\n").expect("hex block") + 8..];
    let block = &block[..block.find("```").expect("end of the hex block")];
    let mut bytes = Vec::new();
    for line in block.lines().filter(|l| l.starts_with("0x")) {
        let mut tokens = line.split('|').next().unwrap_or("").split_whitespace();
        let offset = tokens.next().expect("offset column");
        let offset =
            usize::from_str_radix(offset.trim_start_matches("0x"), 16).expect("hex offset");
        assert_eq!(offset, bytes.len(), "offset column of {line:?}");
        for t in tokens {
            bytes.push(u8::from_str_radix(t, 16).expect("hex byte"));
        }
    }
    bytes
}

/// The header of `batch`, which must pass the plausibility check of a 4 KiB segment
/// erased to `0xFF`.
fn plausible_header(batch: &[u8]) -> BatchHeader {
    let head = batch[..BATCH_HEADER_LEN].try_into().unwrap();
    assert_eq!(BatchHeader::check(head, 0xFF, 4096), HeadCheck::Plausible);
    BatchHeader::decode(head)
}

#[test]
fn format_md_batch_example_matches_the_encoder() {
    let want = encode_batch(
        Layout::Canonical,
        EXAMPLE_BASE,
        EXAMPLE_PREV_CRC,
        &[EXAMPLE],
        4,
        0xFF,
    );
    let doc = dump_in_format_md("format_md_batch_example_matches_the_encoder");
    assert_eq!(doc, want, "FORMAT.md's example differs from the encoder");

    // The values quoted in the text around the dump.
    assert_eq!(want.len(), 56);
    let h = plausible_header(&want);
    assert_eq!((h.len, h.crc), (53, 0x432C_1522));
    let (rec, n) = parse_record(&want[BATCH_HEADER_LEN..53], EXAMPLE_BASE).unwrap();
    assert_eq!(n, 21);
    assert_eq!(rec.crc, 0x4F6A_CD66);
    assert_eq!((rec.topic, rec.payload), (EXAMPLE.topic, EXAMPLE.payload));
}

#[test]
fn format_md_compact_example_matches_the_encoder() {
    let second = Record {
        timestamp_us: EXAMPLE.timestamp_us + 1_000_000,
        payload: b"18.5",
        ..EXAMPLE
    };
    let want = encode_batch(
        Layout::Compact,
        EXAMPLE_BASE,
        EXAMPLE_PREV_CRC,
        &[EXAMPLE, second],
        4,
        0xFF,
    );
    let doc = dump_in_format_md("format_md_compact_example_matches_the_encoder");
    assert_eq!(
        doc, want,
        "FORMAT.md's compact example differs from the encoder"
    );
    assert_eq!(want.len(), 60);
    let h = plausible_header(&want);
    assert_eq!((h.len, h.crc), (58, 0x4716_80E0));
    // Expanded, the records are their canonical encodings, with the CRCs quoted.
    let mut out = [0u8; 64];
    let n = super::super::compact::expand(&want[BATCH_HEADER_LEN..58], 2, &mut out).unwrap();
    let recs: Vec<_> = RecordIter::new(&out[..n], EXAMPLE_BASE, 2).collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].crc, 0x4F6A_CD66);
    assert_eq!(recs[1].crc, 0xA610_8A7B);
    assert_eq!(
        (recs[1].timestamp_us, recs[1].payload),
        (second.timestamp_us, second.payload)
    );
}

#[test]
fn format_md_short_example_matches_the_encoder() {
    use crate::log::short::{self, Link, SHORT_MAX_LEN};
    let mut out = [0xFFu8; SHORT_MAX_LEN];
    let n = short::encode(
        EXAMPLE_BASE + 1,
        0x4F6A_CD66,
        EXAMPLE.timestamp_us,
        b"sst",
        b"sst",
        EXAMPLE.timestamp_us + 1_000_000,
        None,
        b"18.5",
        &mut out,
    )
    .unwrap();
    assert_eq!(n, 13);
    let mut want = out[..n].to_vec();
    want.resize(16, 0xFF);
    let doc = dump_in_format_md("format_md_short_example_matches_the_encoder");
    assert_eq!(
        doc, want,
        "FORMAT.md's short example differs from the encoder"
    );
    assert_eq!(
        u32::from_le_bytes(want[2..6].try_into().unwrap()),
        0x315B_0858
    );
    let link = Link {
        next: EXAMPLE_BASE + 1,
        prev_crc: 0x4F6A_CD66,
        ts: EXAMPLE.timestamp_us,
        topic_addr: 0,
        topic_len: 3,
        topic_crc: crc32(b"sst"),
    };
    let d = short::decode(&want[..n], &link).unwrap();
    let payload = &want[d.payload_at..n];
    assert_eq!(payload, b"18.5");
    assert_eq!(
        short::record_crc(EXAMPLE_BASE + 1, &d, b"sst", payload),
        0xA610_8A7B
    );
    // The anchor before it: a full batch of one record, 51 bytes.
    let anchor = encode_batch(
        Layout::Compact,
        EXAMPLE_BASE,
        0x1122_3344,
        &[EXAMPLE],
        4,
        0xFF,
    );
    assert_eq!((plausible_header(&anchor).len, anchor.len()), (51, 52));
}

/// A simulated flash of six 4 KiB blocks: the two journal blocks and four one-block
/// segments, the first at byte 8,192.
const SMALL: Geometry = Geometry {
    erase_size: 4096,
    write_size: 4,
    capacity: 4096 * 6,
    erased: 0xFF,
};

/// A log formatted on a [`SMALL`] simulated flash; `id` is the log's id.
fn small_log(id: u128) -> crate::storage::SimFlash<Vec<u8>> {
    let mut flash = crate::storage::SimFlash::new_vec(SMALL).unwrap();
    crate::log::Log::format(&mut flash, id, 1).unwrap();
    flash
}

/// The RAM to mount a [`small_log`] with: a 512-byte write buffer and its four segment
/// slots.
fn small_ram() -> crate::log::tests::Mem {
    crate::log::tests::Mem::with(&SMALL, 1, 512)
}

/// The compressed batch of `FORMAT.md` section 10, as the log writes it: eight readings
/// of `"18.4"` on `sst`, one second apart, flushed as the first batch of a fresh log with
/// LZ4 compression.
#[cfg(feature = "compression")]
fn compressed_example_from_the_log() -> Vec<u8> {
    use crate::log::{Compression, Config, Log};
    use crate::storage::Flash;

    let mut flash = small_log(7);
    let mut ram = small_ram();
    let mut scratch = [0u8; crate::log::scratch_len(512)];
    let mem = ram.memory();
    let cfg = Config {
        compression: Compression::Lz4,
        ..Config::default()
    };
    let (mut log, _) = Log::mount_with_scratch(&mut flash, cfg, mem, &mut scratch, 0).unwrap();
    for i in 0..8 {
        let r = Record {
            timestamp_us: EXAMPLE.timestamp_us + i * 1_000_000,
            ..EXAMPLE
        };
        log.append(0, &r).unwrap();
    }
    log.flush(0).unwrap();
    assert_eq!(log.stats().batches_compressed, 1);
    drop(log);
    let mut hb = [0u8; BATCH_HEADER_LEN];
    flash.read(2 * 4096 + 80, &mut hb).unwrap();
    let len = BatchHeader::decode(&hb).len as usize;
    let mut got = std::vec![0u8; align_up(len as u32, 4) as usize];
    flash.read(2 * 4096 + 80, &mut got).unwrap();
    got
}

#[test]
#[cfg(feature = "compression")]
fn format_md_compressed_example_matches_the_log() {
    let got = compressed_example_from_the_log();
    let doc = dump_in_format_md("format_md_compressed_example_matches_the_log");
    assert_eq!(
        doc, got,
        "FORMAT.md's compressed example differs from the log's batch"
    );
    // The values quoted in the text around the dump.
    let h = BatchHeader::decode(got[..BATCH_HEADER_LEN].try_into().unwrap());
    assert_eq!((h.len, h.crc, h.count), (68, 0xC9E2_1E5E, 8));
    assert_eq!(got[32..34], [0x04, 68]);
    // The block decodes to the compact body of the eight records.
    let mut body = [0u8; 68];
    let mut src = super::super::compact::SliceSource { rest: &got[34..] };
    assert!(super::super::lz4::decompress(&mut src, 34, &mut body).unwrap());
    let mut out = [0u8; 256];
    let n = super::super::compact::expand(&body, 8, &mut out).unwrap();
    let recs: Vec<_> = RecordIter::new(&out[..n], 0, 8).collect();
    assert_eq!(recs.len(), 8);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.timestamp_us, EXAMPLE.timestamp_us + i as u64 * 1_000_000);
        assert_eq!((r.topic, r.payload), ("sst", &b"18.4"[..]));
    }
}

/// Guards against the documented encoding drifting from what the log actually writes:
/// the first batch of a fresh log is read back raw from the flash.
#[test]
fn the_log_writes_batches_as_encoded_here() {
    use crate::log::{Config, Log};
    use crate::storage::Flash;

    let mut flash = small_log(7);
    let mut ram = small_ram();
    let mem = ram.memory();
    let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    log.append(0, &EXAMPLE).unwrap();
    log.flush(0).unwrap();
    drop(log);
    // A freshly formatted log writes version 4 segments: compact bodies.
    let want = encode_batch(Layout::Compact, 0, 0, &[EXAMPLE], 4, 0xFF);
    let mut got = std::vec![0u8; want.len() + 4];
    // Segment 0 starts at block 2; its data at the 80-byte header aligned to W = 4.
    flash.read(2 * 4096 + 80, &mut got).unwrap();
    assert_eq!(got[..want.len()], want[..]);
    assert_eq!(got[want.len()..], [0xFF; 4], "erased after the batch");
}

#[test]
fn crc32_is_the_ieee_crc() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(&[0u8; 76]), 0xE038_A199);
    assert_eq!(crc32(&[0xFFu8; 76]), 0x9A06_CE8C);
}

#[test]
fn erased_and_zeroed_regions_never_validate() {
    for fill in [0x00u8, 0xFF, 0x5A] {
        assert_eq!(SegmentHeader::decode(&[fill; SEGMENT_HEADER_LEN]), None);
        let other = !fill;
        assert_eq!(
            BatchHeader::check(&[fill; BATCH_HEADER_LEN], other, u32::MAX),
            HeadCheck::Invalid,
            "fill {fill:#x}"
        );
        assert_eq!(
            BatchHeader::check(&[fill; BATCH_HEADER_LEN], fill, u32::MAX),
            HeadCheck::Erased
        );
        assert_eq!(super::super::journal::entry_len(&[fill; 16], 4096), None);
        assert!(super::super::journal::decode(&[fill; 1024]).is_none());
        assert_eq!(ResumeMarker::decode(&[fill; RESUME_LEN]), None);
    }
    // A valid header stops validating once its CRC bytes read erased or zeroed.
    let mut b = SegmentHeader {
        version: FORMAT_VERSION,
        erase_size: 4096,
        write_size: 4,
        erased: 0xFF,
        blocks_per_segment: 1,
        segment_count: 4,
        log_id: 1,
        seq: 1,
        base_offset: 0,
        prev_crc: 0,
        erase_count: 1,
        after_unclean: false,
    }
    .encode();
    assert!(SegmentHeader::decode(&b).is_some());
    for fill in [0x00u8, 0xFF] {
        b[76..80].fill(fill);
        assert!(SegmentHeader::decode(&b).is_none());
    }
}

fn header(blocks_per_segment: u32, segment_count: u32, erase_size: u32) -> SegmentHeader {
    SegmentHeader {
        version: FORMAT_VERSION,
        erase_size,
        write_size: 4,
        erased: 0xFF,
        blocks_per_segment,
        segment_count,
        log_id: 3,
        seq: 1,
        base_offset: 0,
        prev_crc: 0,
        erase_count: 1,
        after_unclean: false,
    }
}

/// Segment headers whose numbers cannot describe a partition decode as `None`.
#[test]
fn segment_headers_with_impossible_geometry_are_refused() {
    assert!(SegmentHeader::decode(&header(1, 4, 4096).encode()).is_some());
    for h in [
        header(1 << 20, 4, 4096),
        header(u32::MAX, 4, 4096),
        header(1, u32::MAX, 4096),
        header(0, 4, 4096),
        header(1, 0, 4096),
        header(1, 4, 0),
        SegmentHeader {
            base_offset: u64::MAX,
            ..header(1, 4, 4096)
        },
        SegmentHeader {
            write_size: 0,
            ..header(1, 4, 4096)
        },
        SegmentHeader {
            seq: u64::MAX,
            ..header(1, 4, 4096)
        },
    ] {
        assert_eq!(SegmentHeader::decode(&h.encode()), None, "{h:?}");
    }
}

/// An image whose only segment header claims `2^20` erase blocks of 4 KiB per segment
/// (no journal) mounts as not formatted; before, the mount multiplied the two unchecked
/// (a panic with overflow checks, a wrapped segment size in release).
#[test]
fn a_crafted_segment_size_past_4_gib_does_not_mount() {
    use crate::log::{Config, Log, MountError};
    use crate::storage::Flash;

    let mut flash = small_log(3);
    for block in 0..3 {
        flash.erase(block).unwrap();
    }
    flash
        .write(2 * 4096, &header(1 << 20, 4, 4096).encode())
        .unwrap();
    let mut ram = small_ram();
    let mem = ram.memory();
    let got = Log::mount(&mut flash, Config::default(), mem, 0).map(|_| ());
    assert!(matches!(got, Err(MountError::NotFormatted)), "{got:?}");
}

/// A batch header whose end (one past its last offset) passes [`MAX_NEXT_OFFSET`] is not
/// plausible: the durable end a mount would take from it could not be stored.
#[test]
fn a_batch_header_past_the_offset_range_is_invalid() {
    let h = |base_offset, count| BatchHeader {
        len: 64,
        crc: 0,
        base_offset,
        count,
        prev_crc: 0,
    };
    assert_eq!(
        BatchHeader::check(&h(5, 2).encode(), 0xFF, 4096),
        HeadCheck::Plausible
    );
    assert_eq!(
        BatchHeader::check(&h(MAX_NEXT_OFFSET - 1, 1).encode(), 0xFF, 4096),
        HeadCheck::Plausible
    );
    for (base, count) in [
        (u64::MAX, 2),
        (MAX_OFFSET - 1, 2),
        (u64::MAX - 1, 1),
        (MAX_NEXT_OFFSET, 1),
        (MAX_NEXT_OFFSET - 1, 2),
    ] {
        assert_eq!(
            BatchHeader::check(&h(base, count).encode(), 0xFF, 4096),
            HeadCheck::Invalid,
            "base {base:#x}"
        );
    }
}

/// A resume marker round-trips, and any single bit it loses makes it invalid.
#[test]
fn a_resume_marker_round_trips_and_a_damaged_one_is_refused() {
    let m = ResumeMarker {
        expected: 0x0102_0304_0506_0708,
        torn_from: 4096 + 96,
        torn_bytes: 57,
    };
    let b = m.encode();
    assert_eq!(ResumeMarker::decode(&b), Some(m));
    for bit in 0..RESUME_LEN * 8 {
        let mut d = b;
        d[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(ResumeMarker::decode(&d), None, "bit {bit}");
    }
}

/// A length pair cut short by a power loss (some of its 0 bits still 1) never passes the
/// `len` / `!len` check unless both words are complete.
#[test]
fn a_torn_length_pair_never_matches() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || crate::log::tests::xorshift64(&mut x) as u32;
    for _ in 0..200_000 {
        let len = next() >> (next() % 32);
        let (lost_len, lost_check) = (next() & !len, next() & len);
        if lost_len == 0 && lost_check == 0 {
            continue;
        }
        let (torn_len, torn_check) = (len | lost_len, !len | lost_check);
        assert_ne!(torn_check, !torn_len, "len {len:#x}");
    }
}

/// Encodes records of growing payloads back to back, as in a batch body.
fn body(count: usize) -> std::vec::Vec<u8> {
    let mut out = std::vec::Vec::new();
    for i in 0..count {
        let payload = std::vec![i as u8; 3 + i];
        let rec = Record {
            topic: "topic",
            timestamp_us: 1000 + i as u64,
            producer: (i % 2 == 1).then_some(Producer {
                id: 7,
                seq: i as u32,
            }),
            payload: &payload,
        };
        let at = out.len();
        out.resize(at + rec.encoded_len(), 0);
        rec.encode_into(&mut out[at..]);
    }
    out
}

#[test]
fn walk_records_gives_the_crc_before_the_skipped_prefix_end() {
    let (base, count, prev) = (40u64, 5u32, 0xDEAD_BEEF);
    let b = body(count as usize);
    // Every record's length and CRC, through the public parser.
    let mut recs = std::vec::Vec::new();
    let mut at = 0;
    for i in 0..u64::from(count) {
        let (r, n) = parse_record(&b[at..], base + i).unwrap();
        assert_eq!(r.crc, record_crc(base + i, &b[at..at + n]));
        recs.push((at, r.crc));
        at += n;
    }
    for skip in 0..=u64::from(count) + 1 {
        let (len, crc) = walk_records(&b, base, count, skip, prev).unwrap();
        let k = skip.min(u64::from(count)) as usize;
        let want_len = recs.get(k).map_or(b.len(), |r| r.0);
        let want_crc = if k == 0 { prev } else { recs[k - 1].1 };
        assert_eq!((len, crc), (want_len, want_crc), "skip {skip}");
    }
    // A body longer or shorter than `count` records is refused.
    assert_eq!(walk_records(&b, base, count - 1, 0, prev), None);
    assert_eq!(walk_records(&b[..b.len() - 1], base, count, 0, prev), None);
}

#[test]
fn parse_record_fields_leaves_the_crc_out_only() {
    let b = body(2);
    let (full, n) = parse_record(&b, 9).unwrap();
    let (fields, m) = parse_record_fields(&b, 9).unwrap();
    assert_eq!(n, m);
    assert_eq!(
        RecordRef {
            crc: full.crc,
            ..fields
        },
        full
    );
    assert_eq!(fields.crc, 0);
    assert!(parse_record_fields(&b[..n - 1], 9).is_none());
}

//! Short batches (format version 5, `FORMAT.md` section 3.5) on the simulated flash: a
//! record flushed alone after another in the same segment is stored with 6 bytes of
//! framing; what the log reads back, where it reports losses when one is torn by a power
//! cut or damaged, and what the mount rebuilds from them.

mod common;
use common::{Ram, Shared};
use std::cell::RefCell;

use spillway_core::log::format::FORMAT_VERSION;
use spillway_core::log::{
    Config, FindStep, FullPolicy, Log, LostReason, Producer, Record, RecoveryReport, record_crc,
};
use spillway_core::storage::{Flash, Geometry, SimFlash};

const LOG_ID: u128 = 0x0053_484f_5254;

/// 4 KiB erase blocks, segments of one block, 6 segments, write size `w`.
const fn geometry(w: u32) -> Geometry {
    Geometry {
        erase_size: 4096,
        write_size: w,
        capacity: 4096 * 8,
        erased: 0xFF,
    }
}

/// Record `i` of the tests: two topics, a few producer records, lengths varying.
fn payload(i: u64) -> Vec<u8> {
    format!("r{i:04}-{}", "p".repeat((i % 20) as usize)).into_bytes()
}

fn topic(i: u64) -> &'static str {
    if i % 7 == 3 { "b/other" } else { "a/topic" }
}

fn ts(i: u64) -> u64 {
    1_764_000_000_000_000 + i * 1_000 + (i % 3) * 17
}

fn producer(i: u64) -> Option<Producer> {
    i.is_multiple_of(5).then_some(Producer {
        id: 0xabc,
        seq: i as u32,
    })
}

/// Record `i` as [`read_all`] checks it.
fn expected(i: u64) -> Want {
    (topic(i), ts(i), producer(i), payload(i))
}

fn append<F: Flash>(log: &mut Log<'_, F>, i: u64) -> Result<u64, ()> {
    let p = payload(i);
    let r = Record {
        topic: topic(i),
        timestamp_us: ts(i),
        producer: producer(i),
        payload: &p,
    };
    log.append(i, &r).map(|a| a.offset).map_err(|_| ())
}

/// Appends records `from..to` (record `i` at offset `i`), flushing after each.
fn singles<F: Flash>(log: &mut Log<'_, F>, from: u64, to: u64) {
    flushed_alone(log, from, to, append);
}

/// Appends records `from..to` with `add` (record `i` at offset `i`), flushing after each.
fn flushed_alone<F: Flash>(
    log: &mut Log<'_, F>,
    from: u64,
    to: u64,
    add: fn(&mut Log<'_, F>, u64) -> Result<u64, ()>,
) {
    for i in from..to {
        assert_eq!(add(log, i), Ok(i));
        log.flush(i).unwrap();
    }
}

/// An image of one segment: records `0..a` flushed alone (an anchor, then short batches),
/// `a..b` one full batch, `b..c` flushed alone again, closed cleanly; the long-body
/// records of [`append_long`] if `long`, else those of [`append`].
fn mixed_image_of(g: Geometry, (a, b, c): (u64, u64, u64), long: bool) -> Vec<u8> {
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, LOG_ID, 1).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    let (mut log, _) = mount(&mut sim, &mut ram);
    let add = if long { append_long } else { append };
    flushed_alone(&mut log, 0, a, add);
    for i in a..b {
        add(&mut log, i).unwrap();
    }
    log.flush(0).unwrap();
    flushed_alone(&mut log, b, c, add);
    assert_eq!(log.stats().short_batches_written, (a - 1) + (c - b - 1));
    assert_eq!(log.segments().count(), 1);
    log.close(1).unwrap();
    sim.bytes().to_vec()
}

/// Reads every offset from `from` to the next offset; checks every record against its
/// index and every read's `prev_crc` against the record before; returns the lost ranges.
fn read_all<F: Flash>(log: &mut Log<'_, F>, from: u64) -> Vec<(u64, u64, LostReason)> {
    read_all_as(log, from, expected)
}

/// A record as the tests wrote it: topic, timestamp, producer, payload.
type Want = (&'static str, u64, Option<Producer>, Vec<u8>);

/// [`read_all`] against the records `want` gives for each offset.
fn read_all_as<F: Flash>(
    log: &mut Log<'_, F>,
    from: u64,
    want: impl Fn(u64) -> Want,
) -> Vec<(u64, u64, LostReason)> {
    let mut out = vec![0u8; 4096];
    let mut at = from;
    let mut lost = Vec::new();
    let mut crcs = std::collections::HashMap::new();
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        if let Some(l) = r.lost {
            lost.push((l.from, l.to, l.reason));
        }
        if r.count > 0
            && let Some(c) = r.first_offset.checked_sub(1).and_then(|o| crcs.get(&o))
        {
            assert_eq!(r.prev_crc, *c, "prev_crc at {}", r.first_offset);
        }
        for rec in r.records(&out) {
            let i = rec.offset;
            let (t, ts, producer, payload) = want(i);
            assert_eq!(
                (rec.topic, rec.timestamp_us, rec.producer, rec.payload),
                (t, ts, producer, payload.as_slice()),
                "offset {i}"
            );
            assert_eq!(rec.crc, record_crc(i, rec.encoded));
            crcs.insert(i, rec.crc);
        }
        assert!(r.next_offset > at);
        at = r.next_offset;
    }
    lost
}

/// The position of record `i`'s payload in the image (its bytes are unique).
fn find_payload(image: &[u8], i: u64) -> usize {
    find_bytes(image, &payload(i))
}

/// The position of `p` in the image, which holds it once.
fn find_bytes(image: &[u8], p: &[u8]) -> usize {
    let hits: Vec<usize> = image
        .windows(p.len())
        .enumerate()
        .filter(|(_, w)| *w == p)
        .map(|(k, _)| k)
        .collect();
    assert_eq!(hits.len(), 1, "the payload is in the image once");
    hits[0]
}

fn mount<F: Flash>(flash: F, ram: &mut Ram) -> (Log<'_, F>, RecoveryReport) {
    Log::mount(flash, Config::default(), ram.memory(), 0).unwrap()
}

/// Records flushed one by one are short batches after the first of a segment (a full
/// batch of one record), cost their payload plus 7 bytes here, read back from any offset
/// with the record CRC chain, and survive a clean and an unclean remount, which rebuilds
/// the producers seen in short batches.
#[test]
fn single_flushes_are_short_batches_that_read_back_from_any_offset() {
    assert_eq!(FORMAT_VERSION, 5);
    let g = geometry(4);
    let mut flash = SimFlash::new_vec(g).unwrap();
    Log::format(&mut flash, LOG_ID, 1).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    {
        let (mut log, _) = mount(&mut flash, &mut ram);
        let before = log.stats();
        singles(&mut log, 0, 40);
        let s = log.stats();
        assert_eq!(s.short_batches_written - before.short_batches_written, 39);
        assert_eq!(s.batches_written - before.batches_written, 40);
        assert!(read_all(&mut log, 0).is_empty());
        // One record per read, from every offset: the reader's cursor carries the link.
        let mut small = vec![0u8; 64];
        for o in 0..40 {
            let r = log.read(o, &mut small).unwrap();
            assert!(r.first_offset == o && r.count >= 1, "offset {o}: {r:?}");
            let first = r.records(&small).next().unwrap();
            assert_eq!(first.payload, payload(o));
        }
        let mut tiny = [0u8; 8];
        assert!(
            log.read(7, &mut tiny).is_err(),
            "a record larger than the buffer"
        );
        // Finding by time walks short batches too.
        let mut buf = vec![0u8; 1024];
        assert_eq!(
            log.find_offset(ts(17), 0, &mut buf, usize::MAX).unwrap(),
            FindStep::Found(17)
        );
        log.close(1).unwrap();
    }
    {
        let (mut log, report) = mount(&mut flash, &mut ram);
        assert!(report.clean, "{report:?}");
        assert_eq!(log.next_offset(), 40);
        assert!(read_all(&mut log, 0).is_empty());
        // A resend of a producer record stored in a short batch is known.
        let p = payload(35);
        let a = log
            .append(
                2,
                &Record {
                    topic: topic(35),
                    timestamp_us: ts(35),
                    producer: producer(35),
                    payload: &p,
                },
            )
            .unwrap();
        assert!(a.duplicate && a.offset == 35, "{a:?}");
        // After a mount the first record flushed alone is a full batch again.
        let before = log.stats();
        singles(&mut log, 40, 45);
        assert_eq!(
            log.stats().short_batches_written - before.short_batches_written,
            4
        );
    }
    // Unclean: no close.
    let (mut log, report) = mount(&mut flash, &mut ram);
    assert!(!report.clean && report.head_lost.is_none(), "{report:?}");
    assert!(report.next_offset >= 45);
    for (from, _, reason) in read_all(&mut log, 0) {
        assert!(from >= 45 && reason == LostReason::Skipped);
    }
    let p = payload(40);
    let a = log
        .append(
            3,
            &Record {
                topic: topic(40),
                timestamp_us: ts(40),
                producer: producer(40),
                payload: &p,
            },
        )
        .unwrap();
    assert!(a.duplicate && a.offset == 40, "{a:?}");
}

/// A power cut at every byte of a short batch's write (write sizes 1, 4 and 16): the
/// records acknowledged before read back, nothing is reported corrupt, the head is
/// written on after the torn bytes, and a second mount finds the same.
#[test]
fn a_torn_short_batch_at_the_head_at_every_byte() {
    for w in [1u32, 4, 16] {
        let g = geometry(w);
        let mut cuts = 0;
        for cut in 0..64u64 {
            let mut sim = SimFlash::new_vec(g).unwrap();
            Log::format(&mut sim, LOG_ID, 1).unwrap();
            let flash = RefCell::new(sim);
            let mut ram = Ram::new(&g, 1, 1024);
            let acked;
            {
                let (mut log, _) = mount(Shared(&flash), &mut ram);
                singles(&mut log, 0, 10);
                let shorts = log.stats().short_batches_written;
                flash.borrow_mut().cut_after_bytes(cut);
                let ok = append(&mut log, 10).is_ok() && log.flush(10).is_ok();
                acked = if ok { 11 } else { 10 };
                if ok {
                    assert_eq!(log.stats().short_batches_written, shorts + 1);
                    continue;
                }
                cuts += 1;
            }
            flash.borrow_mut().power_on();
            for round in 0..2 {
                let (mut log, report) = mount(Shared(&flash), &mut ram);
                let ctx = format!("W {w} cut {cut} round {round}: {report:?}");
                assert!(report.head_lost.is_none(), "{ctx}");
                assert!(log.next_offset() >= acked, "{ctx}");
                for (from, to, reason) in read_all(&mut log, 0) {
                    assert_eq!(reason, LostReason::Skipped, "{ctx}");
                    assert!(from >= acked && to <= log.next_offset(), "{ctx}");
                }
                if round == 0 {
                    // Written on after the torn bytes; read back after another mount.
                    let next = log.next_offset();
                    for k in 0..4 {
                        let p = payload(next + k);
                        let r = Record {
                            topic: topic(next + k),
                            timestamp_us: ts(next + k),
                            producer: producer(next + k),
                            payload: &p,
                        };
                        assert_eq!(log.append(k, &r).unwrap().offset, next + k);
                        log.flush(k).unwrap();
                    }
                    assert_eq!(log.stats().segments_opened, 0, "{ctx}");
                }
            }
        }
        assert!(cuts > 10, "W {w}: {cuts} cuts landed in the write");
    }
}

/// A mount of `image` after a clean close: the lost ranges reads report (records checked
/// against `want`, as [`read_all_as`] does).
fn lost_in(
    image: &[u8],
    g: Geometry,
    want: impl Fn(u64) -> Want,
) -> (Vec<(u64, u64, LostReason)>, RecoveryReport) {
    let mut sim = SimFlash::new_vec(g).unwrap();
    sim.load_image(image).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    let (mut log, report) = mount(&mut sim, &mut ram);
    let lost = read_all_as(&mut log, 0, want);
    (lost, report)
}

/// Anchor and short batches 0..10, a full batch 10..13, anchor and short batches 13..20,
/// closed cleanly.
fn mixed_image(g: Geometry) -> Vec<u8> {
    mixed_image_of(g, (10, 13, 20), false)
}

/// A damaged short batch in the middle of a segment: it and the short batches after it
/// (which continue it) are lost as corrupt up to the next full batch, exactly; a damaged
/// anchor loses the short batches after it the same way; a damaged last short batch
/// after a clean close is lost as corrupt, never as never persisted.
#[test]
fn damaged_short_batches_are_lost_as_corrupt_up_to_the_next_full_batch() {
    let g = geometry(4);
    let image = mixed_image(g);
    assert_eq!(lost_in(&image, g, expected).0, vec![]);
    for (damaged, want) in [
        (5u64, (5u64, 10u64)),
        (9, (9, 10)),
        (1, (1, 10)),
        (0, (0, 10)),
        (15, (15, 20)),
        (19, (19, 20)),
    ] {
        let mut bad = image.clone();
        bad[find_payload(&image, damaged) + 1] ^= 0x10;
        let (lost, report) = lost_in(&bad, g, expected);
        assert_eq!(
            lost,
            vec![(want.0, want.1, LostReason::Corrupt)],
            "damage in record {damaged}: {report:?}"
        );
    }
}

/// A version 4 head is written on in version 4 (no short batches) until it is full;
/// the segments after it are version 5, with short batches; everything reads back.
#[test]
fn a_version_4_head_holds_no_short_batches_and_the_next_segment_does() {
    let image = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/format-v4-4k-w4.img"
    ))
    .unwrap();
    let g = Geometry {
        erase_size: 4096,
        write_size: 4,
        capacity: 4096 * 10,
        erased: 0xFF,
    };
    let mut sim = SimFlash::new_vec(g).unwrap();
    sim.load_image(&image).unwrap();
    let mut ram = Ram::new(&g, 2, 1024);
    let (mut log, _) = mount(&mut sim, &mut ram);
    let start = log.next_offset();
    let mut k = 0u64;
    while log.stats().short_batches_written < 20 {
        let p = format!("upgrade {k}").into_bytes();
        let r = Record {
            topic: "up/grade",
            timestamp_us: 1_800_000_000_000_000 + k,
            producer: None,
            payload: &p,
        };
        let o = log.append(k, &r).unwrap().offset;
        assert_eq!(o, start + k);
        log.flush(k).unwrap();
        if log.stats().segments_opened == 0 {
            assert_eq!(log.stats().short_batches_written, 0, "a version 4 head");
        }
        k += 1;
        assert!(k < 1000);
    }
    let versions: Vec<u16> = log
        .segments()
        .map(|(i, ..)| log.segment_version(i).unwrap())
        .collect();
    assert!(
        versions.contains(&4) && versions.contains(&5),
        "{versions:?}"
    );
    let mut out = vec![0u8; 2048];
    let mut at = start;
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        assert!(r.lost.is_none(), "{r:?}");
        for rec in r.records(&out) {
            let k = rec.offset - start;
            assert_eq!(rec.payload, format!("upgrade {k}").as_bytes());
        }
        at = r.next_offset;
    }
}

/// After an unclean shutdown (the journal's durable end lags behind the head), a damaged
/// short batch in a run that goes on to the head's end: it and the short batches after it
/// were durable (each was synced before the next was written), so they are lost as
/// corrupt, never as never persisted; only the last of the run, which a power cut could
/// have torn, is not claimed. A later mount keeps reporting them corrupt.
#[test]
fn a_damaged_short_batch_run_at_the_head_after_an_unclean_shutdown_is_corrupt() {
    let g = geometry(4);
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, LOG_ID, 1).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    {
        let (mut log, _) = mount(&mut sim, &mut ram);
        singles(&mut log, 0, 12);
        // No close: the journal's durable end is the mount's.
    }
    let image = sim.bytes().to_vec();
    let mut bad = image.clone();
    bad[find_payload(&image, 6) + 2] ^= 0x04;
    let (lost, report) = lost_in(&bad, g, expected);
    assert!(!report.clean, "{report:?}");
    assert_eq!(
        lost.first(),
        Some(&(6, 11, LostReason::Corrupt)),
        "{lost:?} {report:?}"
    );
    for &(from, _, reason) in &lost[1..] {
        assert!(from >= 11 && reason == LostReason::Skipped, "{lost:?}");
    }
    // Mounted twice on the same flash (the first mount wrote its journal entry).
    let mut sim = SimFlash::new_vec(g).unwrap();
    sim.load_image(&bad).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    drop(mount(&mut sim, &mut ram));
    let (mut log, report) = mount(&mut sim, &mut ram);
    let again = read_all(&mut log, 0);
    assert_eq!(again.first(), lost.first(), "{again:?} {report:?}");
}

// Bodies of 256 to 511 bytes: bit 8 of the length is tag bit 2.

/// Payload lengths of the long-body records, in turn; their bodies take one step byte
/// more: 256 (tag bit 2 set, length byte 0), 257, 511 (the most), 301, 41 (tag bit 2
/// clear), 510 and 400 bytes.
const LONG_LENS: [usize; 7] = [255, 256, 510, 300, 40, 509, 399];

/// Topic of the long-body records.
const LONG_TOPIC: &str = "long/body";

fn long_len(i: u64) -> usize {
    LONG_LENS[(i % LONG_LENS.len() as u64) as usize]
}

/// 10 µs apart: a one-byte timestamp step.
fn long_ts(i: u64) -> u64 {
    1_770_000_000_000_000 + i * 10
}

/// Payload of long-body record `i`: its index, then bytes that depend on it.
fn long_payload(i: u64) -> Vec<u8> {
    let mut p: Vec<u8> = (0..long_len(i))
        .map(|k| (k as u8).wrapping_mul(29) ^ (i as u8))
        .collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

fn long_record(i: u64) -> Want {
    (LONG_TOPIC, long_ts(i), None, long_payload(i))
}

fn append_long<F: Flash>(log: &mut Log<'_, F>, i: u64) -> Result<u64, ()> {
    let p = long_payload(i);
    let r = Record {
        topic: LONG_TOPIC,
        timestamp_us: long_ts(i),
        producer: None,
        payload: &p,
    };
    log.append(i, &r).map(|a| a.offset).map_err(|_| ())
}

/// Appends long-body records `from..to` (record `i` at offset `i`), flushing after each.
fn long_singles<F: Flash>(log: &mut Log<'_, F>, from: u64, to: u64) {
    flushed_alone(log, from, to, append_long);
}

fn align(n: usize, w: u32) -> usize {
    n.div_ceil(w as usize) * w as usize
}

/// Whether the long-body record `i` whose payload is at `at` in `image` is a short batch:
/// its tag and length bytes, 7 and 6 bytes before its payload (a one-byte step), give
/// its body's length.
fn is_long_short(image: &[u8], i: u64, at: usize) -> bool {
    let (tag, len) = (image[at - 7], image[at - 6]);
    tag & 0xF8 == 0xA0 && usize::from(tag & 0x04) * 64 + usize::from(len) == 1 + long_len(i)
}

/// Records flushed alone whose bodies take 256 to 511 bytes are short batches too (bit 8
/// of the length in tag bit 2), take their payload plus 7 bytes before padding, read back
/// with the record CRC chain, are found by time, and survive a clean and an unclean
/// remount; a body of 512 bytes makes a full batch, and the short batches go on after it.
#[test]
fn bodies_of_256_to_511_bytes_are_short_batches() {
    for w in [1u32, 4, 16] {
        let g = geometry(w);
        let mut flash = SimFlash::new_vec(g).unwrap();
        Log::format(&mut flash, LOG_ID, 1).unwrap();
        let mut ram = Ram::new(&g, 1, 1024);
        let n = 24u64;
        let big = vec![0xC3u8; 511];
        let want = |i: u64| {
            if i == n {
                (LONG_TOPIC, long_ts(n), None, big.clone())
            } else {
                long_record(i)
            }
        };
        let shorts;
        {
            let (mut log, _) = mount(&mut flash, &mut ram);
            long_singles(&mut log, 0, n);
            shorts = log.stats().short_batches_written;
            assert!(shorts >= n - 4, "W {w}: {shorts} short batches");
            // A one-byte step and 511 bytes of payload: 512 bytes, a full batch.
            let r = Record {
                topic: LONG_TOPIC,
                timestamp_us: long_ts(n),
                producer: None,
                payload: &big,
            };
            assert_eq!(log.append(n, &r).unwrap().offset, n);
            log.flush(n).unwrap();
            assert_eq!(log.stats().short_batches_written, shorts);
            long_singles(&mut log, n + 1, n + 4);
            assert_eq!(log.stats().short_batches_written, shorts + 3);
            assert_eq!(read_all_as(&mut log, 0, want), vec![], "W {w}");
            let mut buf = vec![0u8; 1024];
            assert_eq!(
                log.find_offset(long_ts(17), 0, &mut buf, usize::MAX)
                    .unwrap(),
                FindStep::Found(17)
            );
            log.close(1).unwrap();
        }
        // On flash: the tag and length bytes of every short batch give its body's length,
        // and two short batches in a row are 7 bytes plus the payload apart, padded.
        let image = flash.bytes().to_vec();
        let mut found = 0;
        let mut prev = None;
        for i in 0..n {
            let at = find_bytes(&image, &long_payload(i));
            if !is_long_short(&image, i, at) {
                prev = None;
                continue;
            }
            found += 1;
            if let Some(p) = prev {
                assert_eq!(at - p, align(7 + long_len(i - 1), w), "W {w} record {i}");
            }
            prev = Some(at);
        }
        assert_eq!(found, shorts, "W {w}");
        for clean in [true, false] {
            // The first mount does not close: the second one is unclean.
            let (mut log, report) = mount(&mut flash, &mut ram);
            assert_eq!(report.clean, clean, "W {w}: {report:?}");
            assert!(log.next_offset() >= n + 4);
            for (from, _, reason) in read_all_as(&mut log, 0, want) {
                assert!(from >= n + 4 && reason == LostReason::Skipped, "W {w}");
            }
        }
    }
}

/// A power cut at every byte of the write of a short batch whose body takes 256 or 511
/// bytes, at the head (write sizes 1, 4 and 16): the records acknowledged before read
/// back, nothing is reported corrupt, long records are written on after the torn bytes,
/// and a second mount reads them back.
#[test]
fn a_torn_long_short_batch_at_the_head_at_every_byte() {
    for w in [1u32, 4, 16] {
        let g = geometry(w);
        // Record 7's body takes 256 bytes, record 9's 511.
        for last in [7u64, 9] {
            let mut cuts = 0;
            for cut in 0u64.. {
                let mut sim = SimFlash::new_vec(g).unwrap();
                Log::format(&mut sim, LOG_ID, 1).unwrap();
                let flash = RefCell::new(sim);
                let mut ram = Ram::new(&g, 1, 1024);
                let acked;
                {
                    let (mut log, _) = mount(Shared(&flash), &mut ram);
                    long_singles(&mut log, 0, last);
                    let shorts = log.stats().short_batches_written;
                    assert_eq!(shorts, last - 1, "W {w}: one segment, one anchor");
                    flash.borrow_mut().cut_after_bytes(cut);
                    let ok = append_long(&mut log, last).is_ok() && log.flush(last).is_ok();
                    if ok {
                        assert_eq!(log.stats().short_batches_written, shorts + 1);
                        break;
                    }
                    acked = last;
                    cuts += 1;
                }
                flash.borrow_mut().power_on();
                let mut written = None;
                for round in 0..2 {
                    let (mut log, report) = mount(Shared(&flash), &mut ram);
                    let ctx = format!("W {w} record {last} cut {cut} round {round}: {report:?}");
                    assert!(report.head_lost.is_none(), "{ctx}");
                    assert!(log.next_offset() >= acked, "{ctx}");
                    for (from, to, reason) in read_all_as(&mut log, 0, long_record) {
                        assert_eq!(reason, LostReason::Skipped, "{ctx}");
                        assert!(from >= acked, "{ctx}");
                        // Not the records written after the torn bytes.
                        assert!(
                            written.is_none_or(|next| to <= next || from >= next + 3),
                            "{ctx}"
                        );
                    }
                    if round == 0 {
                        let next = log.next_offset();
                        long_singles(&mut log, next, next + 3);
                        written = Some(next);
                    }
                }
            }
            let n = align(7 + long_len(last), w) as u64;
            assert!(
                cuts >= n,
                "W {w} record {last}: {cuts} cuts, a write of {n} bytes"
            );
        }
    }
}

/// Long-body records 0..6 and 8..11 flushed alone (anchors 0 and 8, the others short
/// batches), 6..8 one full batch, in one segment, closed cleanly.
fn long_mixed_image(g: Geometry) -> Vec<u8> {
    mixed_image_of(g, (6, 8, 11), true)
}

/// Tag bit 2 (bit 8 of the length) flipped in a short batch, set (a body of 257 or 511
/// bytes) or clear (41 bytes): the CRC catches it, and the batch and the short batches
/// that continue it are lost as corrupt up to the next full batch, exactly; never handed
/// out. After an unclean shutdown, in a run that goes on to the head's end, the records
/// before it read back and no record from it on is handed out. (There its offsets read as
/// never persisted, not corrupt: with its length damaged the run after it cannot be walked
/// to tell it from a torn last write, as with a flip in its length byte.)
#[test]
fn a_flipped_length_bit_8_fails_the_short_batch_crc() {
    let g = geometry(4);
    let image = long_mixed_image(g);
    let lost_in_long = |bytes: &[u8]| lost_in(bytes, g, long_record);
    assert_eq!(lost_in_long(&image).0, vec![]);
    for (damaged, want) in [
        (1u64, (1u64, 6u64)),
        (4, (4, 6)),
        (9, (9, 11)),
        (10, (10, 11)),
    ] {
        let at = find_bytes(&image, &long_payload(damaged));
        assert!(is_long_short(&image, damaged, at), "record {damaged}");
        let mut bad = image.clone();
        bad[at - 7] ^= 0x04;
        let (lost, report) = lost_in_long(&bad);
        assert_eq!(
            lost,
            vec![(want.0, want.1, LostReason::Corrupt)],
            "tag bit 2 flipped in record {damaged}: {report:?}"
        );
    }
    // Unclean: long records 0..8 flushed alone, no close.
    let mut sim = SimFlash::new_vec(g).unwrap();
    Log::format(&mut sim, LOG_ID, 1).unwrap();
    let mut ram = Ram::new(&g, 1, 1024);
    {
        let (mut log, _) = mount(&mut sim, &mut ram);
        long_singles(&mut log, 0, 8);
    }
    let image = sim.bytes().to_vec();
    for damaged in [1u64, 3, 4] {
        let at = find_bytes(&image, &long_payload(damaged));
        assert!(is_long_short(&image, damaged, at), "record {damaged}");
        let mut bad = image.clone();
        bad[at - 7] ^= 0x04;
        let (lost, report) = lost_in_long(&bad);
        assert!(!report.clean, "{report:?}");
        assert_eq!(
            lost.first().map(|l| l.0),
            Some(damaged),
            "{lost:?} {report:?}"
        );
    }
}

/// Retention counts the records of reclaimed short batches by their tag and length bytes
/// (no CRC check): with bodies of 256 to 511 bytes, under drop-oldest with a consumer that
/// committed nothing, the records counted dropped are exactly those reclaimed.
#[test]
fn reclaimed_long_short_batches_are_counted_exactly() {
    for w in [4u32, 16] {
        let g = geometry(w);
        let mut flash = SimFlash::new_vec(g).unwrap();
        Log::format(&mut flash, LOG_ID, 1).unwrap();
        let mut ram = Ram::new(&g, 1, 1024);
        let cfg = Config {
            full: FullPolicy::DropOldest,
            ..Config::default()
        };
        let (mut log, _) = Log::mount(&mut flash, cfg, ram.memory(), 0).unwrap();
        let mut i = 0u64;
        while log.first_offset() < 60 {
            assert_eq!(append_long(&mut log, i), Ok(i));
            log.flush(i).unwrap();
            i += 1;
            assert!(i < 1000, "the ring never reclaimed");
        }
        let s = log.stats();
        assert!(s.short_batches_written > i * 3 / 4, "W {w}: {s:?}");
        assert_eq!(s.records_dropped, log.first_offset(), "W {w}: {s:?}");
        let first = log.first_offset();
        assert_eq!(read_all_as(&mut log, first, long_record), vec![]);
    }
}

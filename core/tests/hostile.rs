//! Hostile images: random bytes, random bit flips, zeroed and erased segments, interrupted
//! and failing erases. Mount and read must never panic or loop forever; damage must cost
//! exactly the records it touched.

mod common;
use common::small::{ERASE, GEOMETRY, SEGMENTS};
use common::{Hook, Hooked, Ram, Rng, Sim};

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use spillway_core::MountError;
use spillway_core::log::format::{BATCH_HEADER_LEN, BatchHeader, HeadCheck, SegmentHeader};
use spillway_core::log::{Config, FullPolicy, Log, LostReason, Record, RecoveryReport};
use spillway_core::storage::{Flash, SimError, SimFlash};

fn payload_of(off: u64) -> Vec<u8> {
    let len = 8 + (off * 7 % 50) as usize;
    (0..len)
        .map(|i| (off as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

fn record(payload: &[u8]) -> Record<'_> {
    Record {
        topic: "hostile",
        timestamp_us: 99,
        producer: None,
        payload,
    }
}

fn config() -> Config {
    Config {
        full: FullPolicy::RejectNew,
        ..Config::default()
    }
}

/// A valid image with `records` records, flushed every 5 (batches of 5), the consumer
/// committing as it goes, closed cleanly. 150 records wrap the ring of 6 segments.
fn valid_image(records: u64) -> Sim {
    let mut sim = common::formatted(GEOMETRY, 0xF00D, 1);
    let mut mem = Ram::new(&GEOMETRY, 1, 512);
    let (mut log, _) = Log::mount(&mut sim, config(), mem.memory(), 0).unwrap();
    for off in 0..records {
        let a = log.append(0, &record(&payload_of(off))).unwrap();
        assert_eq!(a.offset, off);
        if off % 5 == 4 {
            log.flush(0).unwrap();
            log.commit("bridge", log.durable_offset()).unwrap();
        }
    }
    log.close(0).unwrap();
    sim
}

/// A fresh simulator holding `image`, with zero counters.
fn load(image: &[u8]) -> Sim {
    let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
    sim.load_image(image).unwrap();
    sim
}

/// What a full walk of the log saw.
#[derive(Debug, Default)]
struct Walk {
    records: BTreeMap<u64, Vec<u8>>,
    lost: Vec<(u64, u64, LostReason)>,
}

/// Reads from the first to the next offset following each outcome's `next_offset`,
/// at most `bound` reads.
fn walk<F: Flash>(log: &mut Log<'_, F>, bound: usize) -> Walk {
    let mut w = Walk::default();
    let mut out = vec![0u8; 600];
    let (mut at, next) = (log.first_offset(), log.next_offset());
    let mut reads = 0;
    while at < next {
        reads += 1;
        assert!(reads <= bound, "read loop at {at} of {next} does not end");
        let Ok(r) = log.read(at, &mut out) else {
            // An error (never a panic) ends the walk; the offsets must move on.
            break;
        };
        if let Some(l) = r.lost {
            assert!(l.to > at, "lost range does not advance: {r:?}");
            w.lost.push((l.from, l.to, l.reason));
        } else {
            assert!(
                r.count > 0 && r.next_offset > at,
                "read does not advance: {r:?}"
            );
            for rec in r.records(&out) {
                w.records.insert(rec.offset, rec.payload.to_vec());
            }
        }
        assert!(r.next_offset > at);
        at = r.next_offset;
    }
    w
}

/// Mounts whatever is there; on success walks the log. Never panics on bad data.
fn mount_and_walk(sim: &mut Sim) -> Option<(RecoveryReport, Walk)> {
    let mut mem = Ram::new(&GEOMETRY, 1, 512);
    match Log::mount(&mut *sim, config(), mem.memory(), 0) {
        Ok((mut log, rep)) => {
            let w = walk(&mut log, 100_000);
            Some((rep, w))
        }
        Err(MountError::NotFormatted | MountError::GeometryMismatch { .. }) => None,
        Err(e) => panic!("unexpected mount error {e:?}"),
    }
}

fn seg_addr(seg: u32) -> usize {
    ((2 + seg) * ERASE) as usize
}

/// The batches of segment `seg` in an image: `(address, header)`.
fn batches(image: &[u8], seg: u32) -> Vec<(usize, BatchHeader)> {
    let start = seg_addr(seg);
    let mut pos = 80usize;
    let mut out = Vec::new();
    while pos + BATCH_HEADER_LEN <= ERASE as usize {
        let hb: [u8; BATCH_HEADER_LEN] = image[start + pos..start + pos + BATCH_HEADER_LEN]
            .try_into()
            .unwrap();
        if BatchHeader::check(&hb, 0xFF, ERASE - pos as u32) != HeadCheck::Plausible {
            break;
        }
        let h = BatchHeader::decode(&hb);
        out.push((start + pos, h));
        pos += (h.len as usize).next_multiple_of(4);
    }
    out
}

/// Segments of the image by sequence number: `(physical index, header)`, oldest first.
fn segments(image: &[u8]) -> Vec<(u32, SegmentHeader)> {
    let mut v: Vec<(u32, SegmentHeader)> = (0..SEGMENTS)
        .filter_map(|s| SegmentHeader::decode(&image[seg_addr(s)..]).map(|h| (s, h)))
        .collect();
    v.sort_by_key(|(_, h)| h.seq);
    v
}

#[test]
fn random_images_never_panic() {
    let seed = 0xBAD_1A6E;
    eprintln!("random images: seed {seed:#x}");
    let mut r = Rng(seed);
    let valid = valid_image(150).bytes().to_vec();
    let (mut mounted, mut records) = (0, 0);
    for case in 0..400 {
        let mut image: Vec<u8> = (0..GEOMETRY.capacity).map(|_| r.next() as u8).collect();
        if case % 2 == 1 {
            // A valid image with random runs of random bytes over it: valid headers and
            // journal entries next to garbage.
            image.copy_from_slice(&valid);
            for _ in 0..1 + r.below(6) {
                let at = r.below(GEOMETRY.capacity as u64) as usize;
                let len = (1 + r.below(600) as usize).min(image.len() - at);
                for b in &mut image[at..at + len] {
                    *b = r.next() as u8;
                }
            }
        }
        let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
        sim.load_image(&image).unwrap();
        if let Some((_, w)) = mount_and_walk(&mut sim) {
            mounted += 1;
            records += w.records.len();
            // What reads back is what was written.
            for (off, p) in &w.records {
                assert_eq!(p, &payload_of(*off), "case {case}: record {off}");
            }
        }
    }
    eprintln!("random images: 400 cases, {mounted} mounted, {records} records read");
    assert!(
        mounted >= 150,
        "the damaged valid images should mostly mount"
    );
}

#[test]
fn random_bit_flips_never_panic() {
    let seed = 0xF11B_u64;
    eprintln!("random bit flips: seed {seed:#x}");
    let mut r = Rng(seed);
    let valid = valid_image(150);
    let image = valid.bytes().to_vec();
    let (mut mounted, mut lost) = (0, 0);
    for case in 0..600 {
        let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
        sim.load_image(&image).unwrap();
        let flips = 1 + r.below(64);
        for _ in 0..flips {
            let addr = r.below(GEOMETRY.capacity as u64) as u32;
            sim.flip_bit(addr, r.below(8) as u8).unwrap();
        }
        if let Some((_, w)) = mount_and_walk(&mut sim) {
            mounted += 1;
            lost += w.lost.len();
            for (off, p) in &w.records {
                assert_eq!(
                    p,
                    &payload_of(*off),
                    "case {case} ({flips} flips): record {off}"
                );
            }
            // A second mount of the same damage agrees with the first.
            let (_, w2) = mount_and_walk(&mut sim).expect("second mount");
            assert_eq!(w.records, w2.records, "case {case}");
        }
    }
    eprintln!("random bit flips: 600 cases, {mounted} mounted, {lost} lost ranges");
    assert!(mounted >= 300 && lost > 0);
}

#[test]
fn bit_flip_in_a_sealed_batch_loses_exactly_that_batch() {
    let valid = valid_image(150);
    let image = valid.bytes().to_vec();
    let segs = segments(&image);
    assert!(segs.len() >= 3, "data must span several segments: {segs:?}");
    let first = segs[0].1.base_offset;
    let mut r = Rng(0x5EA1);
    let mut checked = 0;
    // Every batch of every sealed segment (not the head), a few random bits each.
    for &(seg, _) in &segs[..segs.len() - 1] {
        for (addr, h) in batches(&image, seg) {
            for _ in 0..3 {
                let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
                sim.load_image(&image).unwrap();
                let at = addr + r.below(h.len as u64) as usize;
                let bit = r.below(8) as u8;
                sim.flip_bit(at as u32, bit).unwrap();
                let ctx = format!(
                    "segment {seg}, batch {}..{}, bit {bit} of byte {at:#x}",
                    h.base_offset,
                    h.end_offset()
                );
                let (rep, w) = mount_and_walk(&mut sim).expect(&ctx);
                assert_eq!(rep.first_offset, first, "{ctx}");
                assert_eq!(
                    w.lost,
                    vec![(h.base_offset, h.end_offset(), LostReason::Corrupt)],
                    "{ctx}"
                );
                for off in first..150 {
                    if (h.base_offset..h.end_offset()).contains(&off) {
                        assert!(!w.records.contains_key(&off), "{ctx}: {off} read");
                    } else {
                        assert_eq!(w.records.get(&off), Some(&payload_of(off)), "{ctx}: {off}");
                    }
                }
                // Reading from inside the lost batch reports the rest of it.
                let mut mem = Ram::new(&GEOMETRY, 1, 512);
                let (mut log, _) = Log::mount(&mut sim, config(), mem.memory(), 0).unwrap();
                let mut out = vec![0u8; 600];
                let last = h.end_offset() - 1;
                let o = log.read(last, &mut out).unwrap();
                let l = o.lost.expect(&ctx);
                assert_eq!(
                    (l.from, l.to, l.reason),
                    (last, h.end_offset(), LostReason::Corrupt)
                );
                checked += 1;
            }
        }
    }
    eprintln!("bit flips in sealed batches: {checked} cases");
    assert!(checked > 30);
}

#[test]
fn zeroed_and_erased_segments_read_as_empty() {
    let valid = valid_image(150);
    let image = valid.bytes().to_vec();
    let segs = segments(&image);
    // A sealed segment in the middle of the ring.
    let first = segs[0].1.base_offset;
    let (victim, vh) = segs[1];
    let victim_end = segs[2].1.base_offset;
    for fill in [0x00u8, 0xFF] {
        let ctx = format!("segment {victim} filled with {fill:#04x}");
        let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
        sim.load_image(&image).unwrap();
        sim.bytes_mut()[seg_addr(victim)..seg_addr(victim) + ERASE as usize].fill(fill);
        let (rep, w) = mount_and_walk(&mut sim).expect(&ctx);
        assert_eq!(
            rep.segments_valid as usize,
            segs.len() - 1,
            "{ctx}: {rep:?}"
        );
        for off in first..150 {
            let in_victim = (vh.base_offset..victim_end).contains(&off);
            assert_eq!(w.records.contains_key(&off), !in_victim, "{ctx}: {off}");
            if !in_victim {
                assert_eq!(w.records[&off], payload_of(off), "{ctx}");
            }
        }
        // The ring goes on over it: appends wrap around and the segment is reused.
        let mut mem = Ram::new(&GEOMETRY, 1, 512);
        let cfg = Config {
            full: FullPolicy::DropOldest,
            ..Config::default()
        };
        let (mut log, _) = Log::mount(&mut sim, cfg, mem.memory(), 0).unwrap();
        let start = log.next_offset();
        for off in start..start + 250 {
            log.append(0, &record(&payload_of(off))).unwrap();
            if off % 5 == 0 {
                log.flush(0).unwrap();
            }
        }
        log.close(0).unwrap();
        let (_, w) = mount_and_walk(&mut sim).expect(&ctx);
        assert!(w.lost.is_empty(), "{ctx}: {:?}", w.lost);
        let first = *w.records.keys().next().unwrap();
        assert!(first > vh.base_offset, "{ctx}: ring did not wrap");
        for (off, p) in &w.records {
            assert_eq!(p, &payload_of(*off), "{ctx}");
        }
    }
    // A whole partition of zeros or of erased bytes is not a log.
    for fill in [0x00u8, 0xFF] {
        let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
        sim.bytes_mut().fill(fill);
        let mut mem = Ram::new(&GEOMETRY, 1, 512);
        let r = Log::mount(&mut sim, config(), mem.memory(), 0);
        assert!(
            matches!(r, Err(MountError::NotFormatted)),
            "{fill:#x}: {r:?}"
        );
    }
}

/// Records the blocks erased, in order.
struct Recording<'a>(&'a RefCell<Vec<u32>>);

impl Hook for Recording<'_> {
    fn before_erase(&mut self, block: u32) -> Result<bool, SimError> {
        self.0.borrow_mut().push(block);
        Ok(true)
    }
}

/// Appends and flushes records from the image's next offset on until `limit` records or
/// an error; returns the durable offset last acknowledged.
fn append_until_error(sim: &mut Sim, erases: &RefCell<Vec<u32>>, limit: u64) -> u64 {
    let mut mem = Ram::new(&GEOMETRY, 1, 512);
    let flash = Hooked::new(sim, Recording(erases));
    let (mut log, _) = Log::mount(flash, config(), mem.memory(), 0).unwrap();
    let mut acked = log.durable_offset();
    for _ in 0..limit {
        let off = log.next_offset();
        if log.append(0, &record(&payload_of(off))).is_err() || log.flush(0).is_err() {
            break;
        }
        log.commit("bridge", log.durable_offset()).unwrap();
        acked = log.durable_offset();
    }
    acked
}

#[test]
fn interrupted_erase_in_a_roll_is_erased_again() {
    let image = valid_image(40).bytes().to_vec();
    // A dry run finds the first erase of a segment block (the journal's blocks are 0, 1).
    let erases = RefCell::new(Vec::new());
    append_until_error(&mut load(&image), &erases, 100);
    let k = erases
        .borrow()
        .iter()
        .position(|&b| b >= 2)
        .expect("a segment roll");
    let cut_block = erases.borrow()[k];
    let seg = cut_block - 2;

    let mut sim = load(&image);
    sim.set_seed(0xE7A5E);
    sim.cut_after_erases(k as u64);
    let erases = RefCell::new(Vec::new());
    let acked = append_until_error(&mut sim, &erases, 100);
    assert!(sim.is_cut());
    assert_eq!(erases.borrow().last(), Some(&cut_block));
    sim.power_on();
    assert_eq!(sim.erase_count(cut_block), Some(1));
    // The half-erased segment reads as no segment; everything acknowledged is there.
    let (rep, w) = mount_and_walk(&mut sim).unwrap();
    assert!(!rep.clean);
    for o in 0..acked {
        assert_eq!(w.records.get(&o), Some(&payload_of(o)), "{o}");
    }
    // The next roll goes to that segment and erases it again before writing it.
    let mut mem = Ram::new(&GEOMETRY, 1, 512);
    let (mut log, _) = Log::mount(&mut sim, config(), mem.memory(), 0).unwrap();
    assert!(log.segments().all(|s| s.0 != seg));
    let next = log.next_offset();
    log.append(0, &record(&payload_of(next))).unwrap();
    log.flush(0).unwrap();
    assert!(
        log.segments().any(|s| s.0 == seg),
        "{:?}",
        log.segments().collect::<Vec<_>>()
    );
    log.close(0).unwrap();
    assert_eq!(sim.erase_count(cut_block), Some(2));
    let (_, w) = mount_and_walk(&mut sim).unwrap();
    assert_eq!(w.records.get(&next), Some(&payload_of(next)));
    for o in 0..acked {
        assert_eq!(w.records.get(&o), Some(&payload_of(o)), "{o}");
    }
}

/// The first erase of block `block` reports success but leaves it as it was.
struct LazyErase<'a> {
    block: u32,
    skipped: &'a Cell<bool>,
}

impl Hook for LazyErase<'_> {
    fn before_erase(&mut self, block: u32) -> Result<bool, SimError> {
        if block == self.block && !self.skipped.get() {
            self.skipped.set(true);
            return Ok(false);
        }
        Ok(true)
    }
}

#[test]
fn erase_that_leaves_bits_is_verified_and_repeated() {
    let image = valid_image(150).bytes().to_vec();
    let mut sim = load(&image);
    // The next roll reuses the oldest segment (its records committed first).
    let (oldest, _) = segments(&image)[0];
    let block = 2 + oldest;
    let head_count = segments(&image).len();
    assert_eq!(head_count as u32, SEGMENTS, "ring must be full");
    let skipped = Cell::new(false);
    let flash = Hooked::new(
        &mut sim,
        LazyErase {
            block,
            skipped: &skipped,
        },
    );
    let mut mem = Ram::new(&GEOMETRY, 1, 512);
    let (mut log, _) = Log::mount(flash, config(), mem.memory(), 0).unwrap();
    log.commit("bridge", log.next_offset()).unwrap();
    log.persist(0).unwrap();
    let mut off = log.next_offset();
    while !skipped.get() {
        log.append(0, &record(&payload_of(off))).unwrap();
        log.flush(0).unwrap();
        off += 1;
        assert!(off < 1000, "the oldest segment was never reused");
    }
    log.close(0).unwrap();
    // The lazy erase returned Ok on a block full of data: it was checked and erased again.
    assert_eq!(sim.erase_count(block).unwrap(), 1);
    let (_, w) = mount_and_walk(&mut sim).unwrap();
    assert!(w.lost.is_empty(), "{:?}", w.lost);
    assert_eq!(w.records.get(&(off - 1)), Some(&payload_of(off - 1)));
}

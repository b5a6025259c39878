//! Frozen images, one per format version: every later version must keep mounting them and
//! reading the same records, and the current version's image must be what the encoder
//! writes today. `SPILLWAY_REGEN_FIXTURE=1 cargo test -p spillway-core --test fixture`
//! writes the current version's image (only ever when the format version changes, next to
//! the old ones, which are never rewritten). The version 4 image was written again once, in
//! the same format, when a new session's epoch became the journal entry's sequence number
//! (its session's epoch went from 2 to 4); the version 3 image keeps epochs numbered per id.
//! From version 5 on the generator flushes some records one by one, so that the image
//! holds short batches.

mod common;
use common::{Ram, Shared, formatted, nor};
use std::cell::RefCell;

use spillway_core::log::format::FORMAT_VERSION;
use spillway_core::log::{Config, Log, LostReason, Producer, Record};
use spillway_core::storage::{Geometry, SimFlash};

/// The path of the frozen image `name` in `core/tests/fixtures/`.
macro_rules! fixture {
    ($name:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/", $name)
    };
}

const V1_PATH: &str = fixture!("format-v1-4k-w4.img");
const V2_PATH: &str = fixture!("format-v2-4k-w4.img");
const V3_PATH: &str = fixture!("format-v3-4k-w4.img");
const V4_PATH: &str = fixture!("format-v4-4k-w4.img");
/// The image of the current format version ([`FORMAT_VERSION`]).
const CURRENT_PATH: &str = fixture!("format-v5-4k-w4.img");
/// A producer id with a session in the version 3 and 4 images (its second session, nothing
/// stored: epoch 2 in the version 3 image, numbered per id; epoch 4 in the version 4 image,
/// the sequence number of the journal entry that opened it).
const SESSION_ID: u64 = 0x5e55;
const LOG_ID: u128 = 0x5350_494c_4c57_4159_0000_0000_0000_0001;

const GEOMETRY: Geometry = nor(4096, 4096 * 10);

/// The records the fixture holds: offset i has this topic, timestamp and payload.
fn expected(i: u64) -> (String, u64, Vec<u8>, Option<Producer>) {
    let topic = if i.is_multiple_of(3) {
        "buoy/sst".to_string()
    } else {
        "cgm/isig".to_string()
    };
    let payload = format!("{i}:{}", "x".repeat((i % 50) as usize)).into_bytes();
    let producer = i.is_multiple_of(2).then_some(Producer {
        id: 0xfeed,
        seq: i as u32,
    });
    (
        topic,
        1_700_000_000_000_000 + i * 1_000_000,
        payload,
        producer,
    )
}

const RECORDS: u64 = 300;

fn generate() -> Vec<u8> {
    let mut flash = formatted(GEOMETRY, LOG_ID, 2);
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let mem = ram.memory();
    let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    log.open_session(0, SESSION_ID, false).unwrap();
    log.open_session(0, SESSION_ID, false).unwrap();
    for i in 0..RECORDS {
        let (topic, ts, payload, producer) = expected(i);
        let rec = Record {
            topic: &topic,
            timestamp_us: ts,
            producer,
            payload: &payload,
        };
        log.append(i, &rec).unwrap();
        // Records 200 to 230 flushed one by one: short batches (version 5).
        if i % 40 == 39 || (200..=230).contains(&i) {
            log.flush(i).unwrap();
        }
        if i == 120 {
            log.commit("bridge", 100).unwrap();
            log.commit("archive", 50).unwrap();
        }
    }
    log.close(RECORDS).unwrap();
    flash.bytes().to_vec()
}

/// Mounts `image` (made by [`generate`] with some format version) and checks every record,
/// the consumers and the producer table.
fn check_image(image: &[u8], epoch: u32) {
    let log_session = check_records(image);
    assert_eq!(log_session, Some((epoch, 0)), "the session in the image");
}

/// Like [`check_image`], for an image of a version before sessions.
fn check_old_image(image: &[u8]) {
    assert_eq!(check_records(image), None);
}

/// Checks what every version's image holds; returns the session of [`SESSION_ID`].
fn check_records(image: &[u8]) -> Option<(u32, u32)> {
    let mut flash = SimFlash::new_vec(GEOMETRY).unwrap();
    flash.load_image(image).unwrap();
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let mem = ram.memory();
    let (mut log, report) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    assert!(report.clean, "{report:?}");
    assert_eq!(log.log_id(), LOG_ID);
    assert_eq!(log.next_offset(), RECORDS);
    assert_eq!(log.committed("bridge"), Some(100));
    assert_eq!(log.committed("archive"), Some(50));
    read_all_back(&mut log, RECORDS);
    // A resend of a stored producer sequence is recognised from the image alone.
    let (topic, ts, payload, producer) = expected(298);
    let a = log
        .append(
            1,
            &Record {
                topic: &topic,
                timestamp_us: ts,
                producer,
                payload: &payload,
            },
        )
        .unwrap();
    assert!(a.duplicate);
    assert_eq!(a.offset, 298);
    log.producer_session(SESSION_ID)
}

/// Reads offsets `0..end` and checks each record against [`expected`]; offsets reported
/// lost must be `Skipped` (never persisted) and none of `0..RECORDS`.
fn read_all_back<F: spillway_core::storage::Flash>(log: &mut Log<'_, F>, end: u64) {
    let mut out = vec![0u8; 2048];
    let mut at = log.first_offset();
    assert_eq!(at, 0, "nothing was reclaimed in the fixture");
    let mut seen = 0u64;
    while at < end {
        let r = log.read(at, &mut out).unwrap();
        if let Some(lost) = r.lost {
            assert_eq!(lost.reason, LostReason::Skipped, "{r:?}");
            assert!(lost.from >= RECORDS, "{r:?}");
        }
        for rec in r.records(&out) {
            let (topic, ts, payload, producer) = expected(rec.offset);
            assert_eq!(
                (rec.topic, rec.timestamp_us, rec.payload, rec.producer),
                (topic.as_str(), ts, payload.as_slice(), producer)
            );
            seen += 1;
        }
        at = r.next_offset;
    }
    assert!(seen >= RECORDS.min(end), "{seen} records read");
}

#[test]
fn frozen_v1_image_mounts_and_reads_back() {
    check_old_image(&std::fs::read(V1_PATH).expect("fixture image"));
}

/// The version 2 image (journal entries with producer layout 0, no sessions) mounts under
/// version 3, and its producer keeps the legacy rule.
#[test]
fn frozen_v2_image_mounts_and_reads_back() {
    check_old_image(&std::fs::read(V2_PATH).expect("fixture image"));
}

/// The version 3 image (layout 1 bodies, producer sessions) mounts under version 4 with
/// its session.
#[test]
fn frozen_v3_image_mounts_and_reads_back() {
    check_image(&std::fs::read(V3_PATH).expect("fixture image"), 2);
}

/// Epochs numbered per id (the version 3 image: the id's epoch is 2 while the journal has
/// written more entries than that) stay valid, and the next session's epoch is above every
/// one of them: the journal entry's sequence number.
#[test]
fn a_new_session_after_per_id_epochs_takes_the_journal_sequence_number() {
    let image = std::fs::read(V3_PATH).expect("fixture image");
    let mut flash = SimFlash::new_vec(GEOMETRY).unwrap();
    flash.load_image(&image).unwrap();
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let (mut log, report) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    assert_eq!(log.producer_session(SESSION_ID), Some((2, 0)));
    assert!(report.journal_seq > 2, "{report:?}");
    // The mount writes one journal entry (FORMAT.md section 7, step 8), the session the next.
    let s = log.open_session(1, SESSION_ID, false).unwrap();
    assert_eq!(u64::from(s.epoch), report.journal_seq + 2);
    let other = log.open_session(2, 0x0dd, false).unwrap();
    assert_eq!(other.epoch, s.epoch + 1, "a new id's first epoch");
}

/// The version 4 image (compact bodies, no short batches) mounts under version 5.
#[test]
fn frozen_v4_image_mounts_and_reads_back() {
    check_image(&std::fs::read(V4_PATH).expect("fixture image"), 4);
}

#[test]
fn frozen_current_image_mounts_reads_back_and_has_not_drifted() {
    assert_eq!(
        FORMAT_VERSION, 5,
        "a new format version needs its own frozen image"
    );
    if std::env::var_os("SPILLWAY_REGEN_FIXTURE").is_some() {
        std::fs::write(CURRENT_PATH, generate()).unwrap();
    }
    let image = std::fs::read(CURRENT_PATH).expect("fixture image");
    check_image(&image, 4);
    // Records 201 to 230 are short batches (200 opens the run: a full batch).
    let mut flash = SimFlash::new_vec(GEOMETRY).unwrap();
    flash.load_image(&image).unwrap();
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let (mut log, _) = Log::mount(&mut flash, Config::default(), ram.memory(), 0).unwrap();
    read_all_back(&mut log, RECORDS);
    assert!(log.stats().short_batches_read >= 25, "{:?}", log.stats());
    // The image as generated today is byte-identical: the format did not drift.
    assert!(
        generate() == image,
        "format drift: the encoder no longer writes the frozen image"
    );
}

/// A version 1 head segment that ends in a torn write is never resumed in place (a version
/// 1 segment holds no resume marker): the next batch opens a fresh segment, and every
/// record of the old image and the new one reads back.
#[test]
fn a_torn_version_1_head_is_abandoned_for_a_fresh_segment() {
    let image = std::fs::read(V1_PATH).expect("fixture image");
    let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
    sim.load_image(&image).unwrap();
    let flash = RefCell::new(sim);
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let rec = Record {
        topic: "t",
        timestamp_us: 1,
        producer: None,
        payload: b"after the fixture",
    };
    {
        let mem = ram.memory();
        let (mut log, _) = Log::mount(Shared(&flash), Config::default(), mem, 0).unwrap();
        log.append(0, &rec).unwrap();
        // The power fails 20 bytes into the batch.
        flash.borrow_mut().cut_after_bytes(20);
        assert!(log.flush(1).is_err());
    }
    flash.borrow_mut().power_on();
    let mem = ram.memory();
    let (mut log, report) = Log::mount(Shared(&flash), Config::default(), mem, 2).unwrap();
    assert!(!report.clean && report.torn_tail_bytes > 0, "{report:?}");
    let at = log.append(3, &rec).unwrap().offset;
    log.flush(3).unwrap();
    assert_eq!(log.stats().segments_opened, 1, "{:?}", log.stats());
    let mut out = vec![0u8; 2048];
    let r = log.read(at, &mut out).unwrap();
    assert_eq!(r.count, 1);
    assert_eq!(r.records(&out).next().unwrap().payload, rec.payload);
    read_all_back(&mut log, RECORDS);
}

/// Records appended on top of the version 3 image by [`upgrade_run`].
const UPGRADE_RECORDS: u64 = 160;

/// The payload of the `k`-th record appended on top of a fixture image.
fn upgrade_payload(k: u64) -> Vec<u8> {
    format!("upgrade {k}:{}", "y".repeat((k % 23) as usize)).into_bytes()
}

/// What one [`upgrade_run`] did.
struct UpgradeRun {
    /// Bytes programmed after the first mount (the cut positions a sweep walks).
    programmed: u64,
    /// Segment format versions of the ring after the run (oldest first).
    versions: Vec<u16>,
}

/// Mounts `image` (version 3 or 4), appends [`UPGRADE_RECORDS`] records with a flush after
/// every `flush_every` (each flush that returns `Ok` acknowledges its records as durable), enough to
/// fill the version 3 head and open version 4 segments after it. With `cut`, the power
/// fails after that many bytes programmed past the mount. Then mounts again and checks
/// every recovery property: every fixture record and every acknowledged record reads back
/// in order with its bytes; a record past the acknowledged ones is only one that was
/// appended (written before the cut, never acknowledged); a lost range only ever covers
/// offsets past the acknowledged ones; an append after the recovery reads back.
fn upgrade_run(image: &[u8], cut: Option<u64>, flush_every: u64) -> UpgradeRun {
    let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
    sim.load_image(image).unwrap();
    let flash = RefCell::new(sim);
    let mut ram = Ram::new(&GEOMETRY, 2, 1024);
    let ctx = format!("cut {cut:?}");
    let mut acked = RECORDS;
    let programmed;
    {
        let mem = ram.memory();
        let (mut log, _) = Log::mount(Shared(&flash), Config::default(), mem, 0).unwrap();
        let before = flash.borrow().counters().bytes_written;
        if let Some(n) = cut {
            flash.borrow_mut().cut_after_bytes(n);
        }
        let mut appended = 0;
        'run: for k in 0..UPGRADE_RECORDS {
            let payload = upgrade_payload(k);
            let rec = Record {
                topic: "up/grade",
                timestamp_us: 1_800_000_000_000_000 + k * 250_000,
                producer: None,
                payload: &payload,
            };
            match log.append(k, &rec) {
                Ok(a) => assert_eq!(a.offset, RECORDS + k, "{ctx}"),
                Err(_) => break 'run,
            }
            appended += 1;
            if k % flush_every == flush_every - 1 {
                if log.flush(k).is_err() {
                    break 'run;
                }
                acked = RECORDS + appended;
            }
        }
        if cut.is_none() {
            log.flush(UPGRADE_RECORDS).unwrap();
            acked = RECORDS + appended;
        }
        programmed = flash.borrow().counters().bytes_written - before;
    }
    flash.borrow_mut().power_on();
    let mem = ram.memory();
    let (mut log, _) = Log::mount(Shared(&flash), Config::default(), mem, 1)
        .unwrap_or_else(|e| panic!("{ctx}: mount after the cut: {e}"));
    let versions = log
        .segments()
        .map(|(i, ..)| log.segment_version(i).unwrap())
        .collect();
    let mut out = vec![0u8; 2048];
    let mut at = 0u64;
    let mut next_expected = 0u64;
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        if let Some(l) = r.lost {
            assert!(l.from >= acked, "{ctx}: acknowledged offsets lost: {l:?}");
        }
        for rec in r.records(&out) {
            assert!(rec.offset >= next_expected, "{ctx}: order");
            assert_eq!(
                rec.offset, next_expected,
                "{ctx}: a gap before {}",
                rec.offset
            );
            if rec.offset < RECORDS {
                let (topic, ts, payload, producer) = expected(rec.offset);
                assert_eq!(
                    (rec.topic, rec.timestamp_us, rec.payload, rec.producer),
                    (topic.as_str(), ts, payload.as_slice(), producer),
                    "{ctx}"
                );
            } else {
                let k = rec.offset - RECORDS;
                assert!(k < UPGRADE_RECORDS, "{ctx}: phantom record {}", rec.offset);
                assert_eq!(rec.topic, "up/grade", "{ctx}");
                assert_eq!(
                    rec.payload,
                    upgrade_payload(k),
                    "{ctx}: offset {}",
                    rec.offset
                );
            }
            next_expected = rec.offset + 1;
        }
        at = r.next_offset;
    }
    assert!(
        next_expected >= acked,
        "{ctx}: read up to {next_expected}, acknowledged {acked}"
    );
    let after = log
        .append(
            2,
            &Record {
                topic: "up/grade",
                timestamp_us: 2,
                producer: None,
                payload: b"after recovery",
            },
        )
        .unwrap_or_else(|e| panic!("{ctx}: append after recovery: {e}"))
        .offset;
    log.flush(3).unwrap();
    let r = log.read(after, &mut out).unwrap();
    assert_eq!(
        r.records(&out).next().map(|x| x.payload),
        Some(&b"after recovery"[..]),
        "{ctx}"
    );
    UpgradeRun {
        programmed,
        versions,
    }
}

/// A version 3 log mounted by version 4 goes on in its version 3 head (layout 1) and
/// writes version 4 segments (compact bodies) from the next segment on: a mixed image.
/// A power cut at every 3rd byte programmed during the upgrade (and at the last one)
/// keeps every recovery property (see [`upgrade_run`]).
#[test]
fn a_version_3_log_upgrades_at_its_next_segment_and_survives_power_cuts() {
    upgrade_sweep(V3_PATH, 3, 3, 8);
}

/// A version 4 log mounted by version 5 goes on in its version 4 head (no short batches)
/// and writes version 5 segments from the next segment on, where records flushed one by
/// one are short batches: a mixed image. A power cut at every 5th byte programmed during
/// the upgrade (and at the last one) keeps every recovery property (see [`upgrade_run`]).
#[test]
fn a_version_4_log_upgrades_at_its_next_segment_and_survives_power_cuts() {
    upgrade_sweep(V4_PATH, 4, 5, 1);
}

/// The upgrade of the fixture image at `path` (format version `old`): run whole
/// ([`upgrade_run`] with `flush_every`), it leaves a ring of version `old` and
/// [`FORMAT_VERSION`] segments; then a power cut at every `step`th byte programmed during
/// it, and at the last one, each checked by [`upgrade_run`].
fn upgrade_sweep(path: &str, old: u16, step: usize, flush_every: u64) {
    let image = std::fs::read(path).expect("fixture image");
    let full = upgrade_run(&image, None, flush_every);
    assert!(
        full.versions.contains(&old) && full.versions.contains(&FORMAT_VERSION),
        "a mixed ring: {:?}",
        full.versions
    );
    let mut cuts = 0;
    for n in (0..full.programmed)
        .step_by(step)
        .chain([full.programmed - 1])
    {
        upgrade_run(&image, Some(n), flush_every);
        cuts += 1;
    }
    eprintln!(
        "upgrade sweep {old} to {FORMAT_VERSION}: {cuts} power cuts over {} bytes programmed, ring {:?}",
        full.programmed, full.versions
    );
}

//! A frozen format-version-1 image: every later version must keep mounting it and reading
//! the same records. `SPILLWAY_REGEN_FIXTURE=1 cargo test -p spillway-core --test fixture`
//! writes it again (only ever when the format version changes, next to the old one).

use spillway_core::log::{Config, Log, Memory, Producer, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Geometry, SimFlash};

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/format-v1-4k-w4.img"
);
const LOG_ID: u128 = 0x5350_494c_4c57_4159_0000_0000_0000_0001;

const GEOMETRY: Geometry = Geometry {
    erase_size: 4096,
    write_size: 4,
    capacity: 4096 * 10,
    erased: 0xFF,
};

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
    let mut flash = SimFlash::new_vec(GEOMETRY).unwrap();
    Log::format(&mut flash, LOG_ID, 2).unwrap();
    let mut buf = vec![0u8; 1024];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&GEOMETRY, 2) as usize];
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    for i in 0..RECORDS {
        let (topic, ts, payload, producer) = expected(i);
        let rec = Record {
            topic: &topic,
            timestamp_us: ts,
            producer,
            payload: &payload,
        };
        log.append(i, &rec).unwrap();
        if i % 40 == 39 {
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

#[test]
fn frozen_v1_image_mounts_and_reads_back() {
    if std::env::var_os("SPILLWAY_REGEN_FIXTURE").is_some() {
        std::fs::write(PATH, generate()).unwrap();
    }
    let image = std::fs::read(PATH).expect("fixture image");
    let mut flash = SimFlash::new_vec(GEOMETRY).unwrap();
    flash.load_image(&image).unwrap();
    let mut buf = vec![0u8; 1024];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&GEOMETRY, 2) as usize];
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (mut log, report) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    assert!(report.clean, "{report:?}");
    assert_eq!(log.log_id(), LOG_ID);
    assert_eq!(log.next_offset(), RECORDS);
    assert_eq!(log.committed("bridge"), Some(100));
    assert_eq!(log.committed("archive"), Some(50));
    let mut out = vec![0u8; 2048];
    let mut at = log.first_offset();
    assert_eq!(at, 0, "nothing was reclaimed in the fixture");
    while at < RECORDS {
        let r = log.read(at, &mut out).unwrap();
        assert!(r.lost.is_none(), "{r:?}");
        for rec in r.records(&out) {
            let (topic, ts, payload, producer) = expected(rec.offset);
            assert_eq!(
                (rec.topic, rec.timestamp_us, rec.payload, rec.producer),
                (topic.as_str(), ts, payload.as_slice(), producer)
            );
        }
        at = r.next_offset;
    }
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
    // And the image as generated today is byte-identical: the format did not drift.
    assert!(
        generate() == image,
        "format drift: the encoder no longer writes the frozen image"
    );
}

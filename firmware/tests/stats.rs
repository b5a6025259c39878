//! The gateway's `StatsReply` counts what it says: corrupt offsets once however often a
//! consumer fetches them, flash bytes read.

use spillway_core::log::format::{BATCH_MAGIC, SEGMENT_HEADER_LEN};
use spillway_core::log::{Config, Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Geometry, SimFlash};
use spillway_core::wire::{LostReason, PROTOCOL_VERSION, Request, Response, decode_message};
use spillway_firmware::{Conn, Gateway, GatewayConfig, Outcome};

const ERASE: u32 = 4096;

fn geo() -> Geometry {
    Geometry {
        erase_size: ERASE,
        write_size: 4,
        capacity: ERASE * 34,
        erased: 0xFF,
    }
}

/// A consumer that fetches a corrupt range again (as the bridge does, up to 24 times)
/// makes `records_corrupt` count its offsets once, not once per fetch; `flash_bytes_read`
/// counts the reads (it was always 0).
#[test]
fn a_corrupt_range_fetched_again_counts_its_offsets_once_and_reads_are_counted() {
    let mut flash = SimFlash::new_vec(geo()).unwrap();
    Log::format(&mut flash, 0x57A7, 1).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geo(), 1) as usize];
    {
        let mem = Memory {
            buffer: &mut buf,
            segments: &mut slots,
        };
        let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
        for i in 0..30u32 {
            let payload = format!("reading {i}");
            let rec = Record {
                topic: "t",
                timestamp_us: 1,
                producer: None,
                payload: payload.as_bytes(),
            };
            log.append(0, &rec).unwrap();
            if i % 5 == 4 {
                log.flush(0).unwrap();
            }
        }
        log.close(0).unwrap();
    }
    // A bit flip inside the second batch (offsets 5..10) of the first segment.
    let seg = 2 * ERASE as usize;
    let second = (seg + SEGMENT_HEADER_LEN..seg + ERASE as usize)
        .step_by(4)
        .filter(|&p| flash.bytes()[p..p + 4] == BATCH_MAGIC.to_le_bytes())
        .nth(1)
        .expect("second batch");
    flash.flip_bit(second as u32 + 40, 2).unwrap();
    flash.reset_counters();

    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, Config::default(), mem, 0).unwrap();
    let mut gw = Gateway::new(GatewayConfig::new("gw", 1024, 64 * 1024), 0);
    let mut conn = Conn {
        protocol_version: Some(PROTOCOL_VERSION),
        ..Conn::default()
    };
    let (mut scratch, mut out) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    for seq in 0..5 {
        let req = Request::Fetch {
            seq,
            consumer: None,
            from_offset: 5,
            max_bytes: 4096,
            wait_ms: None,
        };
        let Outcome::Reply { len } =
            gw.handle_request(&mut conn, &req, &mut log, 0, 0, &mut scratch, &mut out)
        else {
            panic!("no reply to a fetch");
        };
        let mut frame = out[..len - 1].to_vec();
        let r = decode_message::<Response<'_>>(&mut frame).unwrap();
        let Response::Records { lost, .. } = r else {
            panic!("{r:?}");
        };
        let lost = lost.expect("the flipped batch is reported");
        assert_eq!(
            (lost.from, lost.to, lost.reason),
            (5, 10, LostReason::Corrupt)
        );
    }
    let stats = gw.stats(&log, 0);
    assert_eq!(stats.records_corrupt, 5, "{stats:?}");
    assert!(stats.flash_bytes_read > 0, "{stats:?}");
    let counted = stats.flash_bytes_read;
    drop(log);
    assert_eq!(counted, flash.counters().bytes_read);
}

//! The gateway's `StatsReply` counts what it says: corrupt offsets once however often a
//! consumer fetches them, flash bytes read.

mod common;

use common::{SimLog, geometry};
use spillway_core::log::Record;
use spillway_core::log::format::{BATCH_MAGIC, SEGMENT_HEADER_LEN};
use spillway_core::wire::{LostReason, PROTOCOL_VERSION, Request, Response, decode_message};
use spillway_firmware::{Conn, Gateway, GatewayConfig, Outcome};

const ERASE: u32 = 4096;

/// A consumer that fetches a corrupt range again (as the bridge does, up to 24 times)
/// makes `records_corrupt` count its offsets once, not once per fetch; `flash_bytes_read`
/// counts the reads (it was always 0).
#[test]
fn a_corrupt_range_fetched_again_counts_its_offsets_once_and_reads_are_counted() {
    let mut sim = SimLog::new(geometry(34), 0x57A7, 1);
    {
        let mut log = sim.mount();
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
        .filter(|&p| sim.flash.bytes()[p..p + 4] == BATCH_MAGIC.to_le_bytes())
        .nth(1)
        .expect("second batch");
    sim.flash.flip_bit(second as u32 + 40, 2).unwrap();
    sim.flash.reset_counters();

    let mut log = sim.mount();
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
    assert_eq!(counted, sim.flash.counters().bytes_read);
}

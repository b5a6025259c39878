//! `FindOffset` through the gateway: the answer with stamps out of order, a search longer
//! than one request's budget continued by the client, and the refusals (a version 3
//! connection, an offset past the end).

mod common;

use common::{SimLog, geometry, reply_to};
use spillway_core::log::{Log, Record};
use spillway_core::storage::Flash;
use spillway_core::wire::{ErrorCode, PROTOCOL_VERSION, Request, Response};
use spillway_firmware::{Conn, FIND_STEP_BYTES, Gateway, GatewayConfig};

/// Sends one `FindOffset` and returns the decoded reply.
fn ask<F: Flash>(
    gw: &mut Gateway,
    conn: &mut Conn,
    log: &mut Log<'_, F>,
    timestamp_us: u64,
    from_offset: u64,
) -> Response<'static> {
    let req = Request::FindOffset {
        seq: 7,
        timestamp_us,
        from_offset,
    };
    reply_to(gw, conn, log, &req)
}

/// Asks until done, as a client does: the answer and the number of requests.
fn search<F: Flash>(
    gw: &mut Gateway,
    conn: &mut Conn,
    log: &mut Log<'_, F>,
    timestamp_us: u64,
) -> (u64, u32) {
    let (mut from, mut asked) = (0, 0);
    loop {
        asked += 1;
        match ask(gw, conn, log, timestamp_us, from) {
            Response::FoundOffset {
                seq: 7,
                offset,
                done: true,
            } => return (offset, asked),
            Response::FoundOffset {
                seq: 7,
                offset,
                done: false,
            } => {
                assert!(offset > from, "no progress from {from}");
                from = offset;
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn find_offset_through_the_gateway() {
    let mut sim = SimLog::new(geometry(258), 0x57A7, 1);
    let mut log = sim.mount();
    // 3,000 old records of 120 bytes (more than one request's budget of record bytes),
    // then stamps out of order.
    let old = 3_000u64;
    let payload = [b'x'; 120];
    for i in 0..old {
        let rec = Record {
            topic: "buoy/sst",
            timestamp_us: 1_000 + i,
            producer: None,
            payload: &payload,
        };
        log.append(0, &rec).unwrap();
    }
    for ts in [50_000, 20_000, 60_000, 40_000] {
        let rec = Record {
            topic: "buoy/sst",
            timestamp_us: ts,
            producer: None,
            payload: b"late",
        };
        log.append(0, &rec).unwrap();
    }
    log.flush(0).unwrap();
    assert!(old * 120 > FIND_STEP_BYTES as u64);

    let mut gw = Gateway::new(GatewayConfig::new("gw", 1024, 64 * 1024), 0);
    let mut conn = Conn {
        protocol_version: Some(PROTOCOL_VERSION),
        ..Conn::default()
    };
    // The first step stops at its budget, past offset 0, before the answer.
    let Response::FoundOffset {
        offset,
        done: false,
        ..
    } = ask(&mut gw, &mut conn, &mut log, 30_000, 0)
    else {
        panic!("one request read the whole log");
    };
    assert!(offset > 0 && offset < old, "{offset}");
    for (t, want) in [
        (0, 0),
        (1_000 + 17, 17),
        (30_000, old),
        (45_000, old),
        (55_000, old + 2),
        (60_001, old + 4),
    ] {
        let (got, asked) = search(&mut gw, &mut conn, &mut log, t);
        assert_eq!(got, want, "T {t}");
        if want >= old {
            assert!(asked >= 2, "T {t}: {asked} requests");
        }
    }
    // From an offset past the end.
    let r = ask(&mut gw, &mut conn, &mut log, 0, old + 5);
    assert!(
        matches!(
            r,
            Response::Error {
                seq: 7,
                code: ErrorCode::OffsetOutOfRange,
                ..
            }
        ),
        "{r:?}"
    );
    // A connection that announced version 3 does not have the request.
    let mut v3 = Conn {
        protocol_version: Some(3),
        ..Conn::default()
    };
    let r = ask(&mut gw, &mut v3, &mut log, 0, 0);
    let Response::Error {
        seq: 7,
        code: ErrorCode::BadRequest,
        message,
    } = r
    else {
        panic!("{r:?}");
    };
    assert!(message.contains("protocol version 4"), "{message}");
}

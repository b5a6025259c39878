//! The gateway core and the blocking session over an in-memory transport and a simulated
//! flash.

mod common;

use common::{MemIo, SimLog, frames, geometry};
use spillway_core::log::Log;
use spillway_core::wire::{
    AckLevel, ErrorCode, PROTOCOL_VERSION, Producer, Request, Response, decode_message,
};
use spillway_firmware::{Conn, Gateway, GatewayConfig, Mode, Outcome, Session};

/// Decodes every reply frame and gives each to `f` (responses borrow the frame).
fn replies(bytes: &[u8], mut f: impl FnMut(Response<'_>)) {
    for frame in bytes.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let mut frame = frame.to_vec();
        f(decode_message::<Response<'_>>(&mut frame).unwrap());
    }
}

/// Polls `s` at `now_us` (wall clock `wall_us`) until a poll reads nothing: its input is
/// used up.
fn poll_to_the_end<const N: usize>(
    s: &mut Session<'_, MemIo, N>,
    gw: &mut Gateway,
    log: &mut Log<'_, &mut spillway_core::storage::SimFlash<Vec<u8>>>,
    now_us: u64,
    wall_us: u64,
) {
    let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    while s
        .poll(gw, log, now_us, wall_us, &mut scratch, &mut out)
        .unwrap()
        .bytes_read
        > 0
    {}
}

/// A connection that said `Hello` (this protocol version) to `gw`.
fn handshaken(
    gw: &mut Gateway,
    log: &mut Log<'_, &mut spillway_core::storage::SimFlash<Vec<u8>>>,
) -> Conn {
    let mut conn = Conn::default();
    let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    let hello = Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_name: "t",
    };
    let _ = gw.handle_request(&mut conn, &hello, log, 0, 0, &mut scratch, &mut out);
    conn
}

fn publish(seq: u32, payload: &[u8], ack: AckLevel, producer: Option<Producer>) -> Request<'_> {
    Request::Publish {
        seq,
        topic: "sensor/t",
        timestamp_us: Some(1_000 + u64::from(seq)),
        payload,
        ack,
        producer,
    }
}

#[test]
fn session_serves_frames_with_group_commit() {
    let mut rig = SimLog::new(geometry(34), 42, 2);
    let mut log = rig.mount();
    let mut gw = Gateway::new(GatewayConfig::new("mcu", 512, 4096), 0);
    let p = Some(Producer { id: 5, seq: 1 });
    let mut input = frames(&[
        Request::Stats { seq: 99 },
        Request::Hello {
            protocol_version: PROTOCOL_VERSION,
            client_name: "t",
        },
        publish(1, b"a", AckLevel::Durable, None),
        publish(2, b"b", AckLevel::Durable, p),
        publish(3, b"b", AckLevel::Durable, p),
        publish(4, b"c", AckLevel::Buffered, None),
        publish(5, b"d", AckLevel::None, None),
        publish(6, &[0u8; 600], AckLevel::Buffered, None),
        Request::Fetch {
            seq: 7,
            consumer: None,
            from_offset: 0,
            max_bytes: 1,
            wait_ms: Some(1000),
        },
        Request::Fetch {
            seq: 8,
            consumer: Some("ghost"),
            from_offset: 0,
            max_bytes: 100,
            wait_ms: None,
        },
        Request::Commit {
            seq: 9,
            consumer: "bridge",
            offset: 2,
        },
        Request::Fetch {
            seq: 10,
            consumer: None,
            from_offset: 50,
            max_bytes: 100,
            wait_ms: None,
        },
    ]);
    input.extend_from_slice(&[0x03, 0x11, 0x22, 0x00]); // a bad frame
    let io = MemIo::chunked(input, 10_000);
    let mut s: Session<'_, MemIo, 1024> = Session::new(io, Mode::Frames);
    let mut scratch = vec![0u8; 4096];
    let mut out = vec![0u8; 4096];
    let batches_before = log.stats().batches_written;
    let mut flushed = false;
    loop {
        let rep = s
            .poll(&mut gw, &mut log, 10, 2_000, &mut scratch, &mut out)
            .unwrap();
        flushed |= rep.flushed;
        if rep.bytes_read == 0 {
            break;
        }
    }
    assert!(flushed);
    // The durable publishes arrived in one read: one batch written for all of them.
    assert_eq!(log.stats().batches_written - batches_before, 1);
    assert_eq!(log.durable_offset(), 4);
    let io = s.into_transport();
    let mut seen = Vec::new();
    replies(&io.output, |r| {
        let tag = match r {
            Response::Error { seq, code, .. } => format!("err{seq} {code:?}"),
            Response::Welcome {
                log_id, gateway_id, ..
            } => {
                assert_eq!(log_id, 42);
                assert_eq!(gateway_id, "mcu");
                "welcome".into()
            }
            Response::Ack {
                seq,
                offset,
                duplicate,
            } => format!("ack{seq} {offset} {duplicate}"),
            Response::Records {
                seq,
                records,
                next_offset,
                ..
            } => {
                let recs: Vec<_> = records.iter().map(|r| r.unwrap()).collect();
                assert_eq!(recs[0].payload, b"a");
                assert_eq!(recs[0].timestamp_us, 1_001);
                format!("records{seq} {} {next_offset}", recs.len())
            }
            Response::Committed { seq, offset, .. } => format!("committed{seq} {offset}"),
            other => format!("{other:?}"),
        };
        seen.push(tag);
    });
    // Replies in request order, except the durable acks, which follow the group flush at
    // the end of the read that brought them.
    assert_eq!(
        seen,
        [
            "err0 NotHandshaken",
            "welcome",
            "ack4 2 false",
            "ack1 0 false",
            "ack2 1 false",
            "ack3 1 true",
            "err6 TooLarge",
            "records7 1 1",
            "err8 UnknownConsumer",
            "committed9 2",
            "err10 OffsetOutOfRange",
            "err0 BadFrame",
        ]
    );
}

#[test]
fn session_lines_mode() {
    let mut rig = SimLog::new(geometry(34), 7, 2);
    let mut log = rig.mount();
    let mut cfg = GatewayConfig::new("mcu", 64, 4096);
    cfg.default_ack = AckLevel::Durable;
    let mut gw = Gateway::new(cfg, 0);
    let mut input = b"temp 21.5\r\n\nnopayload\n".to_vec();
    input.extend_from_slice(&[b'x'; 300]);
    input.extend_from_slice(b"\nhum 40\n");
    let io = MemIo::chunked(input, 7);
    let mut s: Session<'_, MemIo, 128> = Session::new(io, Mode::Lines { topic: None });
    poll_to_the_end(&mut s, &mut gw, &mut log, 1, 5_000);
    assert_eq!(log.next_offset(), 2);
    assert_eq!(log.durable_offset(), 2, "durable lines are flushed");
    let c = gw.counters();
    assert_eq!(c.lines_accepted, 2);
    assert_eq!(c.rejected_too_large, 1);
    assert_eq!(c.rejected_invalid, 2);
    assert!(s.into_transport().output.is_empty());
    let mut scratch = vec![0u8; 4096];
    let r = log.read(0, &mut scratch).unwrap();
    let recs: Vec<_> = r.records(&scratch).collect();
    assert_eq!(recs[0].topic, "temp");
    assert_eq!(recs[0].payload, b"21.5");
    assert_eq!(recs[0].timestamp_us, 5_000);
    assert_eq!(recs[1].topic, "hum");
}

#[test]
fn unsupported_version_and_garbage_messages() {
    let mut rig = SimLog::new(geometry(34), 7, 2);
    let mut log = rig.mount();
    let mut gw = Gateway::new(GatewayConfig::new("g", 64, 4096), 0);
    let mut conn = Conn::default();
    let mut scratch = vec![0u8; 4096];
    let mut out = vec![0u8; 4096];
    let hello = Request::Hello {
        protocol_version: 0,
        client_name: "old",
    };
    let o = gw.handle_request(&mut conn, &hello, &mut log, 0, 0, &mut scratch, &mut out);
    let Outcome::Reply { len } = o else {
        panic!("{o:?}")
    };
    let r: Response<'_> = decode_message(&mut out[..len]).unwrap();
    assert!(matches!(
        r,
        Response::Error {
            code: ErrorCode::UnsupportedVersion,
            ..
        }
    ));
    // Message bytes that do not decode: BadFrame, never a panic.
    for garbage in [&[0xffu8, 0xff, 0xff][..], &[1, 200, 200, 200], &[]] {
        let o = gw.handle_message(&mut conn, garbage, &mut log, 0, 0, &mut scratch, &mut out);
        assert!(matches!(o, Outcome::Reply { .. }));
    }
}

/// A publish that leaves the level to the gateway gets the gateway's configured one:
/// durable here (acknowledged only once flushed), buffered with the default config.
#[test]
fn gateway_default_ack_level_follows_the_configuration() {
    for (default, want_durable) in [(AckLevel::Durable, true), (AckLevel::Buffered, false)] {
        let mut rig = SimLog::new(geometry(34), 9, 2);
        let mut log = rig.mount();
        let mut cfg = GatewayConfig::new("mcu", 512, 4096);
        cfg.default_ack = default;
        let mut gw = Gateway::new(cfg, 0);
        let mut conn = handshaken(&mut gw, &mut log);
        let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
        let req = publish(1, b"x", AckLevel::GatewayDefault, None);
        let outcome = gw.handle_request(&mut conn, &req, &mut log, 1, 1, &mut scratch, &mut out);
        match outcome {
            Outcome::ReplyWhenDurable { offset, .. } => {
                assert!(want_durable, "buffered default must answer at once");
                assert_eq!(offset, 0);
            }
            Outcome::Reply { .. } => {
                assert!(!want_durable, "durable default must wait for the flush")
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

/// A resend older than the producer's remembered window is answered "already stored,
/// offset unknown" — for a durable publish only once what it resends is durable — and
/// nothing is appended twice. A sequence the window skips is new and is appended. After a
/// skipped sequence, older resends are "unknown", never "stored".
#[test]
fn resend_older_than_the_window_is_a_duplicate_once_durable() {
    let mut rig = SimLog::new(geometry(34), 11, 2);
    let mut log = rig.mount();
    let mut gw = Gateway::new(GatewayConfig::new("mcu", 512, 4096), 0);
    let mut conn = handshaken(&mut gw, &mut log);
    let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    let id = 0xabc;
    let mut send =
        |gw: &mut Gateway, log: &mut Log<'_, _>, s: u32, ack: AckLevel, out: &mut Vec<u8>| {
            let req = publish(s, b"v", ack, Some(Producer { id, seq: s }));
            gw.handle_request(&mut conn, &req, log, 1, 1, &mut scratch, out)
        };
    let code_of = |o: Outcome, out: &[u8]| {
        let len = match o {
            Outcome::Reply { len } | Outcome::ReplyWhenDurable { len, .. } => len,
            other => panic!("{other:?}"),
        };
        match decode_message::<Response<'_>>(&mut out[..len].to_vec()).unwrap() {
            Response::Error { code, .. } => Some(code),
            Response::Ack { .. } => None,
            other => panic!("{other:?}"),
        }
    };
    for s in 0..10u32 {
        let o = send(&mut gw, &mut log, s, AckLevel::Buffered, &mut out);
        assert_eq!(code_of(o, &out), None);
    }
    assert_eq!(log.next_offset(), 10);
    // Sequence 2 is older than the last four (6..=9) and inside the unbroken run: stored,
    // offset unknown; the durable publish waits until what it resends (below offset 6) is
    // durable.
    let o = send(&mut gw, &mut log, 2, AckLevel::Durable, &mut out);
    let Outcome::ReplyWhenDurable { offset, .. } = o else {
        panic!("{o:?}")
    };
    assert_eq!(offset, 5, "stored below offset 6, the oldest remembered");
    assert_eq!(
        code_of(o, &out),
        Some(ErrorCode::DuplicateSequenceUnknownOffset)
    );
    log.flush(3).unwrap();
    let o = send(&mut gw, &mut log, 2, AckLevel::Durable, &mut out);
    assert!(
        matches!(o, Outcome::Reply { .. }),
        "durable now: answered at once, {o:?}"
    );
    assert_eq!(gw.counters().duplicates_unknown_offset, 2);
    // Sequence 11 arrives before 10 (10 was refused, say): 10, inside the window's range
    // and missing from it, is unknown and not stored, however often it is sent (stored, it
    // could not be remembered, and each resend would be stored once more).
    assert_eq!(
        code_of(
            send(&mut gw, &mut log, 11, AckLevel::Buffered, &mut out),
            &out
        ),
        None
    );
    for resend in 0..2 {
        assert_eq!(
            code_of(
                send(&mut gw, &mut log, 10, AckLevel::Buffered, &mut out),
                &out
            ),
            Some(ErrorCode::SequenceUnknown),
            "late skipped sequence, send {resend}"
        );
    }
    assert_eq!(
        log.next_offset(),
        11,
        "nothing appended twice, the late sequence never"
    );
    // Once the window has moved past the skip, a resend from before it is unknown: the
    // gateway cannot tell whether it was stored, and never says it was.
    for s in 12..16u32 {
        assert_eq!(
            code_of(
                send(&mut gw, &mut log, s, AckLevel::Buffered, &mut out),
                &out
            ),
            None
        );
    }
    for s in [3u32, 10] {
        let o = send(&mut gw, &mut log, s, AckLevel::Buffered, &mut out);
        assert_eq!(
            code_of(o, &out),
            Some(ErrorCode::SequenceUnknown),
            "sequence {s}"
        );
    }
    assert_eq!(log.next_offset(), 15);
}

/// A durable resend older than the producer's window is answered with an `Error` frame
/// too long to be held among the waiting `Ack`s: the session flushes at once and sends it
/// only then, after the acknowledgements that were waiting before it.
#[test]
fn a_long_durable_error_reply_is_sent_after_a_flush_in_order() {
    let mut rig = SimLog::new(geometry(34), 11, 2);
    let mut log = rig.mount();
    let mut gw = Gateway::new(GatewayConfig::new("mcu", 512, 4096), 0);
    let p = |seq| Some(Producer { id: 9, seq });
    let mut reqs = vec![Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_name: "t",
    }];
    // One durable publish waits for the flush; then more than the remembered window.
    reqs.push(publish(1, b"r1", AckLevel::Durable, p(1)));
    for s in 2..=7 {
        reqs.push(publish(s, b"r", AckLevel::Buffered, p(s)));
    }
    // A durable resend of the first one: stored, but its offset is no longer known.
    reqs.push(publish(8, b"r1", AckLevel::Durable, p(1)));
    let io = MemIo::chunked(frames(&reqs), 10_000);
    let mut s: Session<'_, MemIo, 1024> = Session::new(io, Mode::Frames);
    let batches_before = log.stats().batches_written;
    poll_to_the_end(&mut s, &mut gw, &mut log, 10, 2_000);
    assert_eq!(log.durable_offset(), 7);
    assert_eq!(log.stats().batches_written - batches_before, 1, "one flush");
    let mut seen = Vec::new();
    replies(&s.into_transport().output, |r| {
        seen.push(match r {
            Response::Ack { seq, offset, .. } => format!("ack{seq} {offset}"),
            Response::Error { seq, code, .. } => format!("err{seq} {code:?}"),
            Response::Welcome { .. } => "welcome".into(),
            other => format!("{other:?}"),
        })
    });
    assert_eq!(
        seen,
        [
            "welcome",
            "ack2 1",
            "ack3 2",
            "ack4 3",
            "ack5 4",
            "ack6 5",
            "ack7 6",
            "ack1 0",
            "err8 DuplicateSequenceUnknownOffset",
        ]
    );
}

//! Producer sessions over the wire on the real gateway core: the version 3 handshake (the
//! window announced, a credential refused), `OpenSession` and `SessionPublish` with Kafka's
//! next-sequence rule and fencing, and a version 1 client that keeps the version 1 rules.

mod common;

use common::{SimLog, geometry, message, reply_to_message};
use spillway_core::log::Log;
use spillway_core::storage::SimFlash;
use spillway_core::wire::{
    AckLevel, ErrorCode, HelloV3, Producer, Request, Response, SessionProducer, WelcomeV3,
    take_message,
};
use spillway_firmware::{Conn, Gateway, GatewayConfig};

/// A gateway the tests send to.
struct Rig {
    gw: Gateway,
}

impl Rig {
    fn new() -> Self {
        Rig {
            gw: Gateway::new(GatewayConfig::new("g", 256, 4096), 0),
        }
    }

    /// Sends the postcard message `msg` on `conn`; returns the reply's message bytes.
    fn send(
        &mut self,
        conn: &mut Conn,
        log: &mut Log<'_, &mut SimFlash<Vec<u8>>>,
        msg: &[u8],
    ) -> Option<Vec<u8>> {
        reply_to_message(&mut self.gw, conn, log, msg)
    }

    /// Sends `req`; returns the reply's message bytes.
    fn request(
        &mut self,
        conn: &mut Conn,
        log: &mut Log<'_, &mut SimFlash<Vec<u8>>>,
        req: &Request<'_>,
    ) -> Vec<u8> {
        self.send(conn, log, &message(req)).expect("a reply")
    }
}

fn resp(msg: &[u8]) -> Response<'_> {
    take_message::<Response<'_>>(msg).unwrap().0
}

fn session_publish(seq: u32, epoch: u32, pseq: u32, payload: &[u8]) -> Request<'_> {
    Request::SessionPublish {
        seq,
        topic: "t",
        timestamp_us: None,
        payload,
        ack: AckLevel::Buffered,
        producer: SessionProducer {
            id: 7,
            epoch,
            seq: pseq,
        },
    }
}

/// The epoch of a `Session` answer (epochs are journal entry numbers: compare them, never
/// expect a value).
fn session_epoch(msg: &[u8]) -> u32 {
    match resp(msg) {
        Response::Session { epoch, .. } => epoch,
        other => panic!("expected a session, got {other:?}"),
    }
}

/// The offset of an `Ack` answer for a record stored now (not a duplicate).
fn stored(msg: &[u8]) -> u64 {
    match resp(msg) {
        Response::Ack {
            offset,
            duplicate: false,
            ..
        } => offset,
        other => panic!("expected an ack of a new record, got {other:?}"),
    }
}

/// The offset of an `Ack` answer for a resend of a stored record (a duplicate).
fn duplicate_of(msg: &[u8]) -> u64 {
    match resp(msg) {
        Response::Ack {
            offset,
            duplicate: true,
            ..
        } => offset,
        other => panic!("expected an ack of a duplicate, got {other:?}"),
    }
}

fn error_code(msg: &[u8]) -> ErrorCode {
    match resp(msg) {
        Response::Error { code, .. } => code,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The message of the error reply `msg`.
fn error_message(msg: &[u8]) -> String {
    match resp(msg) {
        Response::Error { message, .. } => message.to_string(),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn hello3(credential: Option<&[u8]>) -> Vec<u8> {
    let hello = Request::Hello {
        protocol_version: 3,
        client_name: "v3",
    };
    message(&(hello, HelloV3 { credential }))
}

/// A client that announced version 1 or 2 and sends the version 3 session requests gets
/// `BadRequest` (a code its version knows), never a `Session` answer its decoder does not
/// have, and no session is opened or record stored.
#[test]
fn session_requests_from_a_version_1_or_2_client_are_refused() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    for version in [1u16, 2] {
        let mut c = Conn::default();
        let hello = Request::Hello {
            protocol_version: version,
            client_name: "old",
        };
        rig.send(&mut c, &mut log, &message(&hello)).unwrap();
        let open = Request::OpenSession {
            seq: 1,
            producer_id: 7,
            resume: false,
        };
        let r = rig.request(&mut c, &mut log, &open);
        assert_eq!(error_code(&r), ErrorCode::BadRequest, "version {version}");
        assert!(
            error_message(&r).contains("version 3"),
            "{}",
            error_message(&r)
        );
        assert_eq!(log.producer_session(7), None, "no session opened");
        let next = log.next_offset();
        let r = rig.request(&mut c, &mut log, &session_publish(2, 5, 1, b"x"));
        assert_eq!(error_code(&r), ErrorCode::BadRequest, "version {version}");
        assert_eq!(log.next_offset(), next, "nothing stored");
    }
}

/// A sensor built from the version 1 document (the exact `Hello` bytes of its worked
/// example) is answered in version 1, with nothing appended to the `Welcome`, and keeps the
/// version 1 producer rule; once a session owns its producer id its publishes are refused
/// with a code version 1 knows (`BadRequest`), never stored.
#[test]
fn a_version_1_client_keeps_the_version_1_rules_on_a_version_3_gateway() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    let mut old = Conn::default();
    let hello_v1 = [0x00, 0x01, 0x06, b'b', b'u', b'o', b'y', b'-', b'7'];
    let w = rig.send(&mut old, &mut log, &hello_v1).unwrap();
    let (welcome, rest) = take_message::<Response<'_>>(&w).unwrap();
    assert!(matches!(
        welcome,
        Response::Welcome {
            protocol_version: 1,
            ..
        }
    ));
    assert!(rest.is_empty(), "nothing a version 1 decoder does not know");
    let legacy = |seq: u32, pseq: u32| Request::Publish {
        seq,
        topic: "t",
        timestamp_us: None,
        payload: b"v1",
        ack: AckLevel::Buffered,
        producer: Some(Producer { id: 7, seq: pseq }),
    };
    for pseq in 0..3 {
        let r = rig.request(&mut old, &mut log, &legacy(pseq + 1, pseq));
        stored(&r);
    }
    // Version 1 rule: a resend inside the window is a duplicate; a gap is allowed.
    let r = rig.request(&mut old, &mut log, &legacy(9, 1));
    assert_eq!(duplicate_of(&r), 1);
    let r = rig.request(&mut old, &mut log, &legacy(10, 5));
    stored(&r);
    // A skipped sequence sent late (4, after 5) is unknown, never stored: were it stored,
    // the window (sequences after its last) could not remember it, and each resend would
    // be stored once more.
    let before = log.next_offset();
    for resend in 0..3 {
        let r = rig.request(&mut old, &mut log, &legacy(11 + resend, 4));
        assert_eq!(
            error_code(&r),
            ErrorCode::SequenceUnknown,
            "resend {resend}"
        );
    }
    assert_eq!(
        log.next_offset(),
        before,
        "a late skipped sequence was stored"
    );
    // A version 3 client opens a session for the same id: the old client is fenced, with
    // a code it knows.
    let mut new = Conn::default();
    rig.send(&mut new, &mut log, &hello3(None)).unwrap();
    let s = rig.request(
        &mut new,
        &mut log,
        &Request::OpenSession {
            seq: 1,
            producer_id: 7,
            resume: false,
        },
    );
    assert!(session_epoch(&s) > 0);
    let next = log.next_offset();
    let r = rig.request(&mut old, &mut log, &legacy(11, 6));
    assert_eq!(error_code(&r), ErrorCode::BadRequest);
    assert_eq!(log.next_offset(), next, "nothing stored");
    // The same publish from a version 3 client gets the version 3 code.
    let r = rig.request(&mut new, &mut log, &legacy(2, 6));
    assert_eq!(error_code(&r), ErrorCode::Fenced);
}

/// The version 3 `Welcome` announces the producer window; a `Hello` with a credential is
/// refused (no credentials are configured) and leaves the connection without a handshake.
#[test]
fn the_version_3_handshake_announces_the_window_and_refuses_a_credential() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    for hello in [hello3(None), hello3(Some(b"")), {
        // A version 3 client that appends nothing.
        message(&Request::Hello {
            protocol_version: 3,
            client_name: "bare",
        })
    }] {
        let mut conn = Conn::default();
        let w = rig.send(&mut conn, &mut log, &hello).unwrap();
        let (welcome, rest) = take_message::<Response<'_>>(&w).unwrap();
        assert!(matches!(
            welcome,
            Response::Welcome {
                protocol_version: 3,
                ..
            }
        ));
        let ext: WelcomeV3 = postcard::from_bytes(rest).unwrap();
        assert_eq!(ext.producer_window, 4);
    }
    let mut conn = Conn::default();
    let r = rig
        .send(&mut conn, &mut log, &hello3(Some(b"s3cret")))
        .unwrap();
    match resp(&r) {
        Response::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::Unauthorized);
            assert_eq!(message, "credentials are not configured on this gateway");
        }
        other => panic!("{other:?}"),
    }
    let r = rig.request(&mut conn, &mut log, &Request::Stats { seq: 1 });
    assert_eq!(error_code(&r), ErrorCode::NotHandshaken);
}

/// `OpenSession` and `SessionPublish` over the wire: the next sequence is stored, a gap is
/// refused as out of sequence and stored once resent in order, a resend is a duplicate with
/// its offset, an older epoch is fenced, an unknown one refused, and a resume returns the
/// last stored sequence.
#[test]
fn session_publishes_follow_the_next_sequence_rule_over_the_wire() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    let mut c = Conn::default();
    rig.send(&mut c, &mut log, &hello3(None)).unwrap();
    let open = |seq, resume| Request::OpenSession {
        seq,
        producer_id: 7,
        resume,
    };
    let s = rig.request(&mut c, &mut log, &open(1, false));
    let e1 = session_epoch(&s);
    assert!(matches!(
        resp(&s),
        Response::Session {
            seq: 1,
            producer_id: 7,
            last_seq: 0,
            resumed: false,
            ..
        }
    ));
    let r = rig.request(&mut c, &mut log, &session_publish(2, e1, 1, b"a"));
    assert_eq!(stored(&r), 0);
    let r = rig.request(&mut c, &mut log, &session_publish(3, e1, 3, b"c"));
    assert_eq!(error_code(&r), ErrorCode::OutOfSequence);
    for (seq, pseq, off) in [(4, 2, 1), (5, 3, 2)] {
        let r = rig.request(&mut c, &mut log, &session_publish(seq, e1, pseq, b"x"));
        assert_eq!(stored(&r), off);
    }
    let r = rig.request(&mut c, &mut log, &session_publish(6, e1, 2, b"x"));
    assert_eq!(duplicate_of(&r), 1);
    let r = rig.request(&mut c, &mut log, &open(7, true));
    assert!(matches!(
        resp(&r),
        Response::Session {
            epoch,
            last_seq: 3,
            resumed: true,
            ..
        } if epoch == e1
    ));
    let r = rig.request(&mut c, &mut log, &open(8, false));
    let e2 = session_epoch(&r);
    assert!(e2 > e1, "{e1} then {e2}");
    let r = rig.request(&mut c, &mut log, &session_publish(9, e1, 4, b"zombie"));
    assert_eq!(error_code(&r), ErrorCode::Fenced);
    // Ids in decimal, as every client prints them (`--producer-id 7`), never in hex.
    let m = error_message(&r);
    assert!(
        m.starts_with(&format!("producer 7: session {e1} is fenced")),
        "{m}"
    );
    let r = rig.request(
        &mut c,
        &mut log,
        &session_publish(10, e2 + 5, 1, b"made up"),
    );
    assert_eq!(error_code(&r), ErrorCode::UnknownSession);
    let m = error_message(&r);
    assert!(
        m.starts_with(&format!("producer 7: session {} is unknown", e2 + 5)),
        "{m}"
    );
    let r = rig.request(&mut c, &mut log, &session_publish(11, e2, 1, b"new run"));
    assert_eq!(stored(&r), 3);
    assert_eq!(rig.gw.counters().out_of_sequence, 1);
    assert_eq!(rig.gw.counters().fenced, 2);
}

/// A `SessionPublish` naming epoch 0 (the legacy rule's, never a session's) is refused
/// `BadRequest` "session epoch 0" and stores nothing; with `ack` none it gets no reply and
/// stores nothing either. A plain `Publish` on the same connection is still stored.
#[test]
fn a_session_publish_with_epoch_0_is_refused_and_stores_nothing() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    let mut c = Conn::default();
    rig.send(&mut c, &mut log, &hello3(None)).unwrap();
    let next = log.next_offset();
    let r = rig.request(&mut c, &mut log, &session_publish(1, 0, 1, b"a"));
    assert_eq!(error_code(&r), ErrorCode::BadRequest);
    assert_eq!(error_message(&r), "session epoch 0");
    let mut silent = session_publish(2, 0, 1, b"a");
    if let Request::SessionPublish { ack, .. } = &mut silent {
        *ack = AckLevel::None;
    }
    assert_eq!(rig.send(&mut c, &mut log, &message(&silent)), None);
    assert_eq!(log.next_offset(), next, "nothing stored");
    let plain = Request::Publish {
        seq: 3,
        topic: "t",
        timestamp_us: None,
        payload: b"b",
        ack: AckLevel::Buffered,
        producer: None,
    };
    let r = rig.request(&mut c, &mut log, &plain);
    assert!(
        matches!(resp(&r), Response::Ack { seq: 3, offset, .. } if offset == next),
        "{:?}",
        resp(&r)
    );
    assert_eq!(log.next_offset(), next + 1);
}

/// Producer ids from 2^63 up are the gateway's own (the Linux gateway's MQTT sessions,
/// read back as such at a start): a client's `Publish` with one, a `SessionPublish` with
/// one and an `OpenSession` of one are refused `BadRequest` and store nothing (with `ack`
/// none, no reply); the id just below is a client's like any other.
#[test]
fn producer_ids_of_the_gateway_are_refused_from_clients() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut rig = Rig::new();
    let mut c = Conn::default();
    rig.send(&mut c, &mut log, &hello3(None)).unwrap();
    let next = log.next_offset();
    let reserved = spillway_core::wire::GATEWAY_PRODUCER_BIT;
    let publish = |seq, id, ack| Request::Publish {
        seq,
        topic: "t",
        timestamp_us: None,
        payload: b"p",
        ack,
        producer: Some(spillway_core::log::format::Producer { id, seq: 1 }),
    };
    let mut session = session_publish(2, 1, 1, b"p");
    if let Request::SessionPublish { producer, .. } = &mut session {
        producer.id = u64::MAX;
    }
    let open = Request::OpenSession {
        seq: 3,
        producer_id: reserved,
        resume: false,
    };
    for req in [publish(1, reserved, AckLevel::Durable), session, open] {
        let r = rig.request(&mut c, &mut log, &req);
        assert_eq!(error_code(&r), ErrorCode::BadRequest, "{req:?}");
        assert!(error_message(&r).contains("2^63"), "{}", error_message(&r));
    }
    assert_eq!(
        rig.send(
            &mut c,
            &mut log,
            &message(&publish(4, reserved, AckLevel::None))
        ),
        None
    );
    assert_eq!(log.producer_session(reserved), None, "no session opened");
    assert_eq!(log.next_offset(), next, "nothing stored");
    let r = rig.request(
        &mut c,
        &mut log,
        &publish(5, reserved - 1, AckLevel::Buffered),
    );
    assert!(
        matches!(resp(&r), Response::Ack { seq: 5, offset, .. } if offset == next),
        "{:?}",
        resp(&r)
    );
}

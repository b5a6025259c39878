//! Roles on the real gateway core: a `publish`-only connection (a sensor) cannot fetch,
//! commit, list or delete consumers; a consumer credential commits only the consumers it
//! names; refusals are `Forbidden`, counted, and change nothing; a credential the caller
//! refused fails the handshake with `Unauthorized`.

mod common;

use common::{SimLog, geometry, message, reply_to_message};
use spillway_core::log::Log;
use spillway_core::storage::SimFlash;
use spillway_core::wire::{
    AckLevel, ErrorCode, HelloV3, PROTOCOL_VERSION, Request, Response, take_message,
};
use spillway_firmware::{Auth, Conn, Gateway, GatewayConfig, Roles};

type TestLog<'a> = Log<'a, &'a mut SimFlash<Vec<u8>>>;

/// Sends `msg` (postcard bytes) on `conn`; the reply's decoded message bytes.
fn send(gw: &mut Gateway, conn: &mut Conn, log: &mut TestLog<'_>, msg: &[u8]) -> Vec<u8> {
    reply_to_message(gw, conn, log, msg).expect("a reply")
}

fn hello(credential: Option<&[u8]>) -> Vec<u8> {
    let h = Request::Hello {
        protocol_version: PROTOCOL_VERSION,
        client_name: "t",
    };
    message(&(h, HelloV3 { credential }))
}

fn error(msg: &[u8]) -> (ErrorCode, String) {
    match take_message::<Response<'_>>(msg).unwrap().0 {
        Response::Error { code, message, .. } => (code, message.to_string()),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn publish(seq: u32) -> Vec<u8> {
    message(&Request::Publish {
        seq,
        topic: "t",
        timestamp_us: None,
        payload: b"reading",
        ack: AckLevel::Buffered,
        producer: None,
    })
}

fn commit(consumer: &str, offset: u64) -> Vec<u8> {
    message(&Request::Commit {
        seq: 5,
        consumer,
        offset,
    })
}

#[test]
fn a_publish_only_connection_cannot_fetch_commit_list_or_delete_and_nothing_changes() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut gw = Gateway::new(GatewayConfig::new("g", 256, 4096), 0);
    // An admin commits "kafka" at 0 first, so a sensor's commit would move it.
    let mut admin = Conn::default();
    send(&mut gw, &mut admin, &mut log, &hello(None));
    send(&mut gw, &mut admin, &mut log, &publish(1));
    send(&mut gw, &mut admin, &mut log, &publish(2));
    send(&mut gw, &mut admin, &mut log, &commit("kafka", 0));

    let mut sensor = Conn::with_roles(Roles::PUBLISH);
    send(&mut gw, &mut sensor, &mut log, &hello(None));
    let r = send(&mut gw, &mut sensor, &mut log, &publish(3));
    assert!(matches!(
        take_message::<Response<'_>>(&r).unwrap().0,
        Response::Ack { offset: 2, .. }
    ));
    let next = log.next_offset();
    for (req, role) in [
        (commit("kafka", 2), "consume"),
        (commit("new", 1), "consume"),
        (
            message(&Request::Fetch {
                seq: 5,
                consumer: None,
                from_offset: 0,
                max_bytes: 1024,
                wait_ms: None,
            }),
            "consume",
        ),
        (message(&Request::ListConsumers { seq: 5 }), "consume"),
        (message(&Request::Stats { seq: 5 }), "consume"),
        (
            message(&Request::DeleteConsumer {
                seq: 5,
                consumer: "kafka",
            }),
            "admin",
        ),
    ] {
        let (code, message) = error(&send(&mut gw, &mut sensor, &mut log, &req));
        assert_eq!(code, ErrorCode::Forbidden);
        assert_eq!(
            message,
            format!("this connection lacks the {role} role for this request")
        );
    }
    assert_eq!(gw.counters().forbidden, 6);
    assert_eq!(log.committed("kafka"), Some(0), "the commit moved nothing");
    assert_eq!(log.committed("new"), None, "no consumer was created");
    assert_eq!(log.next_offset(), next, "nothing was appended");

    // A consumer credential that names "kafka": it commits that one only; deleting it
    // needs admin.
    let mut bridge = Conn::with_roles(Roles {
        publish: false,
        consume: true,
        admin: false,
        consumers: Some(&["kafka"]),
    });
    send(&mut gw, &mut bridge, &mut log, &hello(None));
    let r = send(&mut gw, &mut bridge, &mut log, &commit("kafka", 2));
    assert!(matches!(
        take_message::<Response<'_>>(&r).unwrap().0,
        Response::Committed { offset: 2, .. }
    ));
    let (code, _) = error(&send(&mut gw, &mut bridge, &mut log, &commit("other", 1)));
    assert_eq!(code, ErrorCode::Forbidden);
    assert_eq!(log.committed("other"), None);
    let r = send(&mut gw, &mut bridge, &mut log, &publish(4));
    assert_eq!(error(&r).0, ErrorCode::Forbidden);
    assert_eq!(gw.counters().forbidden, 8);
    assert_eq!(log.next_offset(), next);

    // A version 1 client knows no `Forbidden`: it gets `BadRequest`.
    let mut old = Conn::with_roles(Roles::PUBLISH);
    let v1 = message(&Request::Hello {
        protocol_version: 1,
        client_name: "v1",
    });
    send(&mut gw, &mut old, &mut log, &v1);
    let (code, _) = error(&send(&mut gw, &mut old, &mut log, &commit("kafka", 3)));
    assert_eq!(code, ErrorCode::BadRequest);
    assert_eq!(log.committed("kafka"), Some(2));
}

#[test]
fn a_refused_credential_fails_the_handshake_and_is_counted() {
    let mut sim = SimLog::new(geometry(18), 1, 2);
    let mut log = sim.mount();
    let mut gw = Gateway::new(GatewayConfig::new("g", 256, 4096), 0);
    let mut conn = Conn {
        auth: Auth::Refused("credential not accepted"),
        ..Conn::default()
    };
    let (code, message) = error(&send(&mut gw, &mut conn, &mut log, &hello(Some(b"wrong"))));
    assert_eq!(
        (code, message.as_str()),
        (ErrorCode::Unauthorized, "credential not accepted")
    );
    assert_eq!(conn.protocol_version, None, "no handshake");
    let (code, _) = error(&send(&mut gw, &mut conn, &mut log, &publish(1)));
    assert_eq!(code, ErrorCode::NotHandshaken);
    assert_eq!(log.next_offset(), 0, "nothing stored");
    assert_eq!(gw.counters().unauthorized, 1);

    let mut ok = Conn {
        auth: Auth::Accepted,
        roles: Roles::PUBLISH,
        ..Conn::default()
    };
    let w = send(&mut gw, &mut ok, &mut log, &hello(Some(b"right")));
    assert!(matches!(
        take_message::<Response<'_>>(&w).unwrap().0,
        Response::Welcome { .. }
    ));
}

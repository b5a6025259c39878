//! `DeleteConsumerIfNotLast` through the gateway: the only consumer is kept (and its
//! committed offset named), any other is deleted, a connection of version 4 does not have
//! the request, and a `publish`-only connection may not send it.

mod common;

use common::{SimLog, geometry, reply_to};
use spillway_core::log::Log;
use spillway_core::storage::Flash;
use spillway_core::wire::{ErrorCode, PROTOCOL_VERSION, Request, Response};
use spillway_firmware::{Conn, Gateway, GatewayConfig, Roles};

fn guarded(consumer: &str) -> Request<'_> {
    Request::DeleteConsumerIfNotLast { seq: 3, consumer }
}

/// The answer `Deleted` to request `seq`.
fn deleted(seq: u32, existed: bool) -> Response<'static> {
    Response::Deleted { seq, existed }
}

/// The code of an error answer.
fn error_code(r: &Response<'_>) -> ErrorCode {
    match r {
        Response::Error { code, .. } => *code,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The names of the log's consumers.
fn names<F: Flash>(log: &Log<'_, F>) -> Vec<String> {
    log.consumers().map(|(n, _)| n.to_owned()).collect()
}

#[test]
fn the_only_consumer_is_kept_and_any_other_deleted() {
    let mut sim = SimLog::new(geometry(18), 0xDE1, 2);
    let mut log = sim.mount();
    let mut gw = Gateway::new(GatewayConfig::new("gw", 256, 4096), 0);
    let mut conn = Conn {
        protocol_version: Some(PROTOCOL_VERSION),
        ..Conn::default()
    };
    // A fresh log has one consumer, `bridge`: it stays, and nothing is written.
    assert_eq!(names(&log), ["bridge"]);
    let r = reply_to(&mut gw, &mut conn, &mut log, &guarded("bridge"));
    let Response::Error {
        seq: 3,
        code: ErrorCode::LastConsumer,
        message,
    } = r
    else {
        panic!("{r:?}");
    };
    assert_eq!(
        message,
        "consumer \"bridge\" is the gateway's last consumer (committed offset 0)"
    );
    assert_eq!(names(&log), ["bridge"]);

    // With a second consumer, either may go, but not both.
    log.commit("audit", 0).unwrap();
    let r = reply_to(&mut gw, &mut conn, &mut log, &guarded("bridge"));
    assert_eq!(r, deleted(3, true));
    let r = reply_to(&mut gw, &mut conn, &mut log, &guarded("audit"));
    assert_eq!(error_code(&r), ErrorCode::LastConsumer);
    assert_eq!(names(&log), ["audit"]);
    // A name that is not the last consumer's: nothing to keep, nothing deleted.
    let r = reply_to(&mut gw, &mut conn, &mut log, &guarded("nobody"));
    assert_eq!(r, deleted(3, false));
    // The unguarded request still deletes the last one.
    let r = reply_to(
        &mut gw,
        &mut conn,
        &mut log,
        &Request::DeleteConsumer {
            seq: 4,
            consumer: "audit",
        },
    );
    assert_eq!(r, deleted(4, true));
    assert!(names(&log).is_empty());
}

#[test]
fn a_version_4_or_publish_only_connection_is_refused_and_nothing_changes() {
    let mut sim = SimLog::new(geometry(18), 0xDE2, 2);
    let mut log = sim.mount();
    log.commit("audit", 0).unwrap();
    let mut gw = Gateway::new(GatewayConfig::new("gw", 256, 4096), 0);
    let mut v4 = Conn {
        protocol_version: Some(4),
        ..Conn::default()
    };
    let r = reply_to(&mut gw, &mut v4, &mut log, &guarded("audit"));
    let Response::Error {
        seq: 3,
        code: ErrorCode::BadRequest,
        message,
    } = r
    else {
        panic!("{r:?}");
    };
    assert!(message.contains("protocol version 5"), "{message}");
    let mut sensor = Conn {
        protocol_version: Some(PROTOCOL_VERSION),
        ..Conn::with_roles(Roles::PUBLISH)
    };
    let r = reply_to(&mut gw, &mut sensor, &mut log, &guarded("audit"));
    assert_eq!(error_code(&r), ErrorCode::Forbidden);
    assert_eq!(names(&log), ["bridge", "audit"]);
}

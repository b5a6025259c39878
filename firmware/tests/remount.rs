//! A microcontroller gateway after a failed sync: the session answers the waiting durable
//! publishes `StorageFailed`, [`serve_remounting`] mounts the simulated flash again in
//! place, and a publisher that resends what was refused (same producer id and sequence)
//! ends with every record stored once, in order.

mod common;

use std::cell::Cell;
use std::collections::VecDeque;
use std::ops::ControlFlow;

use common::{MemIo, frames, geometry};
use spillway_core::log::{Config, Log, LostReason, Memory, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, Geometry, SimError, SimFlash};
use spillway_core::wire::{
    AckLevel, ErrorCode, PROTOCOL_VERSION, Producer, Request, Response, decode_message,
};
use spillway_firmware::{Gateway, GatewayConfig, Mode, Session, serve_remounting};

/// Why [`SyncFails`] failed.
#[derive(Debug)]
enum FaultError {
    Sim(#[allow(dead_code)] SimError),
    /// The injected sync failure.
    SyncFailed,
}

/// A simulated flash whose `fail_at`th sync fails and loses every write and erase since the
/// last successful sync (a write-back cache that never reached the cells).
struct SyncFails<'s> {
    sim: &'s mut SimFlash<Vec<u8>>,
    synced: Vec<u8>,
    syncs: u32,
    fail_at: u32,
    /// Fails the next sync (settable through `Log::flash`).
    fail_next: Cell<bool>,
    failed: u32,
}

impl<'s> SyncFails<'s> {
    fn new(sim: &'s mut SimFlash<Vec<u8>>, fail_at: u32) -> Self {
        let synced = sim.bytes().to_vec();
        SyncFails {
            sim,
            synced,
            syncs: 0,
            fail_at,
            fail_next: Cell::new(false),
            failed: 0,
        }
    }
}

impl Flash for SyncFails<'_> {
    type Error = FaultError;
    fn geometry(&self) -> Geometry {
        self.sim.geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), FaultError> {
        self.sim.read(addr, buf).map_err(FaultError::Sim)
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), FaultError> {
        self.sim.write(addr, data).map_err(FaultError::Sim)
    }
    fn erase(&mut self, block: u32) -> Result<(), FaultError> {
        self.sim.erase(block).map_err(FaultError::Sim)
    }
    fn sync(&mut self) -> Result<(), FaultError> {
        self.syncs += 1;
        if self.syncs == self.fail_at || self.fail_next.replace(false) {
            self.failed += 1;
            self.sim.load_image(&self.synced).map_err(FaultError::Sim)?;
            return Err(FaultError::SyncFailed);
        }
        self.sim.sync().map_err(FaultError::Sim)?;
        self.synced.copy_from_slice(self.sim.bytes());
        Ok(())
    }
}

/// Every record of the log on `sim`, as payload strings in offset order.
fn stored(sim: &mut SimFlash<Vec<u8>>) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geometry(34), 2) as usize];
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(sim, Config::default(), mem, 0).unwrap();
    let mut scratch = vec![0u8; 4096];
    let mut out = Vec::new();
    let mut off = log.first_offset();
    while off < log.next_offset() {
        let r = log.read(off, &mut scratch).unwrap();
        // The rest of the offset lease the remount skipped is a range never persisted.
        if let Some(l) = r.lost {
            assert_eq!(l.reason, LostReason::Skipped, "{l:?}");
        }
        for rec in r.records(&scratch) {
            out.push(String::from_utf8_lossy(rec.payload).into_owned());
        }
        off = r.next_offset;
    }
    out
}

#[test]
fn failed_sync_remounts_in_place_and_resends_are_stored_once_in_order() {
    const RECORDS: u32 = 300;
    const WINDOW: usize = 8;
    let mut sim = SimFlash::new_vec(geometry(34)).unwrap();
    Log::format(&mut sim, 9, 2).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geometry(34), 2) as usize];
    let mut gw = Gateway::new(GatewayConfig::new("mcu", 512, 4096), 0);
    let mut session: Session<'_, MemIo, 1024> = Session::new(MemIo::default(), Mode::Frames);
    let mut scratch = vec![0u8; 4096];
    let mut out = vec![0u8; 4096];
    // The publisher: producer 7, sequences 1..=RECORDS, resent from the first unacknowledged.
    let mut unacked: VecDeque<u32> = (1..=RECORDS).collect();
    let mut refused = 0u32;
    let mut poisoned_polls = 0u32;
    let mut handshaken = false;
    let payloads: Vec<String> = (0..=RECORDS).map(|i| format!("r{i:04}")).collect();

    let (remounts, flash) = serve_remounting(
        SyncFails::new(&mut sim, 6),
        Config::default(),
        &mut buf,
        &mut slots,
        || 0,
        |log, mounted| {
            if unacked.is_empty() {
                return ControlFlow::Break(mounted.remounts);
            }
            assert!(mounted.remounts < 5, "remounting again and again");
            let mut reqs = Vec::new();
            if !handshaken {
                reqs.push(Request::Hello {
                    protocol_version: PROTOCOL_VERSION,
                    client_name: "sensor",
                });
            }
            for &seq in unacked.iter().take(WINDOW) {
                reqs.push(Request::Publish {
                    seq,
                    topic: "t",
                    timestamp_us: Some(1),
                    payload: payloads[seq as usize].as_bytes(),
                    ack: AckLevel::Durable,
                    producer: Some(Producer { id: 7, seq }),
                });
            }
            let io = session.transport();
            io.input = frames(&reqs);
            io.pos = 0;
            io.output.clear();
            while session.transport().pos < session.transport().input.len() {
                let report = session
                    .poll(&mut gw, log, 0, 0, &mut scratch, &mut out)
                    .unwrap();
                if report.storage_failed {
                    poisoned_polls += 1;
                }
            }
            let output = std::mem::take(&mut session.transport().output);
            for frame in output.split(|&b| b == 0).filter(|f| !f.is_empty()) {
                let mut frame = frame.to_vec();
                match decode_message::<Response<'_>>(&mut frame).unwrap() {
                    Response::Welcome { .. } => handshaken = true,
                    Response::Ack { seq, .. } => {
                        assert_eq!(unacked.front(), Some(&seq), "acknowledged out of order");
                        unacked.pop_front();
                    }
                    Response::Error {
                        code: ErrorCode::StorageFailed,
                        ..
                    } => refused += 1,
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    assert_eq!(flash.failed, 1, "the sync failure never fired");
    drop(flash);
    assert_eq!(remounts, 1);
    assert!(refused >= 1, "no publish was answered StorageFailed");
    assert!(poisoned_polls >= 1);
    let expected: Vec<String> = (1..=RECORDS)
        .map(|i| payloads[i as usize].clone())
        .collect();
    assert_eq!(stored(&mut sim), expected);
}

/// A client that announced protocol version 1 does not know `StorageFailed`: its durable
/// publish waiting on a failed sync is answered `Internal`.
#[test]
fn a_version_1_client_gets_internal_for_a_failed_durable_publish() {
    let mut sim = SimFlash::new_vec(geometry(34)).unwrap();
    Log::format(&mut sim, 9, 2).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geometry(34), 2) as usize];
    let mem = Memory {
        buffer: &mut buf,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(
        SyncFails::new(&mut sim, u32::MAX),
        Config::default(),
        mem,
        0,
    )
    .unwrap();
    log.flash().fail_next.set(true);
    let mut gw = Gateway::new(GatewayConfig::new("mcu", 512, 4096), 0);
    let mut session: Session<'_, MemIo, 1024> = Session::new(MemIo::default(), Mode::Frames);
    session.transport().input = frames(&[
        Request::Hello {
            protocol_version: 1,
            client_name: "old",
        },
        Request::Publish {
            seq: 5,
            topic: "t",
            timestamp_us: Some(1),
            payload: b"x",
            ack: AckLevel::Durable,
            producer: None,
        },
    ]);
    let (mut scratch, mut out) = (vec![0u8; 4096], vec![0u8; 4096]);
    let report = session
        .poll(&mut gw, &mut log, 0, 0, &mut scratch, &mut out)
        .unwrap();
    assert!(report.storage_failed);
    let output = std::mem::take(&mut session.transport().output);
    let codes: Vec<Option<ErrorCode>> = output
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(
            |f| match decode_message::<Response<'_>>(&mut f.to_vec()).unwrap() {
                Response::Error { seq: 5, code, .. } => Some(code),
                _ => None,
            },
        )
        .collect();
    assert_eq!(codes, [None, Some(ErrorCode::Internal)]);
}

//! The glucose monitor's TCP publishers: durable, idempotent publishes over producer lanes,
//! reconnecting and resending what is unacknowledged after a gateway kill.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_core::log::PRODUCER_WINDOW;
use spillway_core::wire::{AckLevel, ErrorCode, Producer, Request};

use super::serial::due;
use super::series::CgmValue;
use crate::client::{Client, GatewayAddr, PublishAck, Reply, Wait};

/// One record a TCP publisher sends.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    /// Input row, for pacing.
    pub(super) row: usize,
    /// Payload.
    pub(super) payload: Vec<u8>,
    /// Reading time, µs.
    pub(super) timestamp_us: u64,
    /// Producer id and sequence (fixed: a resend uses the same).
    pub(super) producer: Producer,
}

/// An acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Acked {
    pub(super) offset: u64,
    pub(super) duplicate: bool,
}

/// A publisher's progress, read by the scenario while the publisher runs.
#[derive(Debug)]
pub(super) struct PubState {
    /// Wire seq → record index, on the current connection.
    pub(super) inflight: HashMap<u32, usize>,
    /// Records sent (on any connection) and not acknowledged.
    pub(super) unacked: BTreeSet<usize>,
    /// Unacknowledged records per producer lane.
    pub(super) lane_unacked: Vec<usize>,
    /// Per record, its acknowledgement.
    pub(super) acks: Vec<Option<Acked>>,
    /// Acknowledged records.
    pub(super) acked: usize,
    /// First record never sent.
    pub(super) next: usize,
    /// Resends after a reconnect.
    pub(super) resent: u64,
    /// Acknowledgements with `duplicate: true`.
    pub(super) duplicate_acks: u64,
    /// `StorageFailed` answers (each ends the connection; its records are resent).
    pub(super) storage_failures: u64,
    /// Connections after the first.
    pub(super) reconnects: u64,
    /// Log id of the first `Welcome`.
    pub(super) log_id: Option<u128>,
    /// A failure that stops the publisher.
    pub(super) error: Option<String>,
    /// Finished (everything acknowledged, or stopped by `error`).
    pub(super) finished: bool,
}

pub(super) struct Publisher {
    pub(super) topic: String,
    pub(super) records: Vec<Outgoing>,
    pub(super) lanes: usize,
    pub(super) state: Arc<Mutex<PubState>>,
}

impl Publisher {
    pub(super) fn new(topic: &str, values: &[CgmValue], lanes: usize, id_base: u64) -> Publisher {
        let lanes = lanes.max(1);
        let records: Vec<Outgoing> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Outgoing {
                row: v.row,
                payload: v.value.as_bytes().to_vec(),
                timestamp_us: v.timestamp_us,
                producer: Producer {
                    id: id_base + (i % lanes) as u64,
                    seq: u32::try_from(i / lanes + 1).unwrap_or(u32::MAX),
                },
            })
            .collect();
        let st = PubState {
            inflight: HashMap::new(),
            unacked: BTreeSet::new(),
            lane_unacked: vec![0; lanes],
            acks: vec![None; records.len()],
            acked: 0,
            next: 0,
            resent: 0,
            duplicate_acks: 0,
            storage_failures: 0,
            reconnects: 0,
            log_id: None,
            error: None,
            finished: false,
        };
        Publisher {
            topic: topic.to_string(),
            records,
            lanes,
            state: Arc::new(Mutex::new(st)),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, PubState> {
        lock(&self.state)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connects and says hello, retrying until `deadline`.
pub(super) fn connect_hello(addr: &str, deadline: Instant) -> Result<Client, String> {
    let uri: GatewayAddr = format!("tcp://{addr}")
        .parse()
        .map_err(|e| format!("bad address {addr}: {e}"))?;
    loop {
        match Client::connect(&uri, "spillway-demo", Duration::from_secs(5)).wait() {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot connect to the gateway at {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

/// What the publisher does next on its connection.
enum Step {
    /// Send record `idx` (its first send).
    Send(usize),
    /// Take replies for up to this long (nothing may be sent yet).
    Wait(Duration),
    /// Everything is acknowledged, or an error stopped the publisher.
    Done,
}

/// Takes the replies that come within `wait` into `st`. False when the connection is over:
/// it failed, or the gateway's storage failed (nothing waiting was made durable: reconnect
/// and resend every unacknowledged record once it has recovered; the producer ids
/// deduplicate what did reach flash), or the gateway refused a publish (`st.error`).
fn take_replies(c: &mut Client, p: &Publisher, wait: Duration) -> bool {
    let reply = c.next_reply(wait).wait();
    let mut st = p.lock();
    match reply {
        Ok(None) => true,
        Ok(Some((seq, Reply::Ack(PublishAck { offset, duplicate })))) => {
            if let Some(idx) = seq.and_then(|s| st.inflight.remove(&s))
                && st.acks[idx].is_none()
            {
                st.acks[idx] = Some(Acked { offset, duplicate });
                st.acked += 1;
                st.unacked.remove(&idx);
                st.lane_unacked[idx % p.lanes] -= 1;
                if duplicate {
                    st.duplicate_acks += 1;
                }
            }
            true
        }
        // `Internal` is what a version 1 connection gets in place of `StorageFailed`.
        Ok(Some((
            _,
            Reply::Error {
                code: ErrorCode::StorageFailed | ErrorCode::Internal,
                ..
            },
        ))) => {
            st.storage_failures += 1;
            false
        }
        Ok(Some((seq, Reply::Error { code, message }))) => {
            st.error = Some(format!(
                "the gateway refused publish {}: {code:?}: {message}",
                seq.unwrap_or(0)
            ));
            false
        }
        Ok(Some(_)) => true,
        Err(_) => false,
    }
}

/// Sends record `idx` as a durable, idempotent publish; false if the connection failed.
fn send_record(c: &mut Client, p: &Publisher, idx: usize, resend: bool) -> bool {
    let r = &p.records[idx];
    let sent = c
        .send_request(|seq| Request::Publish {
            seq,
            topic: &p.topic,
            timestamp_us: Some(r.timestamp_us),
            payload: &r.payload,
            ack: AckLevel::Durable,
            producer: Some(r.producer),
        })
        .wait();
    let Ok(seq) = sent else { return false };
    let mut st = p.lock();
    st.inflight.insert(seq, idx);
    if resend {
        st.resent += 1;
    }
    true
}

/// Publishes every record of `p` as a durable, idempotent publish, paced over `replay`
/// by input row (of `rows` rows), keeping at most [`PRODUCER_WINDOW`] unacknowledged per
/// producer lane, reconnecting and resending the unacknowledged after a failure.
pub(super) fn run_publisher(
    p: &Publisher,
    addr: &str,
    t0: Instant,
    replay: Duration,
    rows: usize,
    reconnect_for: Duration,
) {
    let n = p.records.len();
    let finish = |err: Option<String>| {
        let mut st = p.lock();
        if st.error.is_none() {
            st.error = err;
        }
        st.finished = true;
    };
    let mut first = true;
    loop {
        {
            let st = p.lock();
            if st.error.is_some() || (st.next == n && st.unacked.is_empty()) {
                break;
            }
        }
        let mut c = match connect_hello(addr, Instant::now() + reconnect_for) {
            Ok(c) => c,
            Err(e) => return finish(Some(e)),
        };
        let log_id = c.welcome().log_id;
        let resend = {
            let mut st = p.lock();
            match st.log_id {
                None => st.log_id = Some(log_id),
                Some(l) if l != log_id => {
                    drop(st);
                    return finish(Some(format!(
                        "the gateway's log id changed from {l:032x} to {log_id:032x}"
                    )));
                }
                Some(_) => {}
            }
            st.inflight.clear();
            if !first {
                st.reconnects += 1;
            }
            st.unacked.iter().copied().collect::<Vec<_>>()
        };
        first = false;
        let mut ok = resend.iter().all(|&idx| send_record(&mut c, p, idx, true));
        while ok {
            let step = {
                let mut st = p.lock();
                let next = st.next;
                let tick = Duration::from_millis(50);
                if st.error.is_some() || (next == n && st.unacked.is_empty()) {
                    Step::Done
                } else if next == n || st.lane_unacked[next % p.lanes] >= PRODUCER_WINDOW {
                    Step::Wait(tick)
                } else {
                    let at = due(t0, replay, p.records[next].row, rows);
                    let now = Instant::now();
                    if at > now {
                        Step::Wait((at - now).min(tick))
                    } else {
                        st.next += 1;
                        st.unacked.insert(next);
                        st.lane_unacked[next % p.lanes] += 1;
                        Step::Send(next)
                    }
                }
            };
            ok = match step {
                Step::Send(idx) => send_record(&mut c, p, idx, false),
                Step::Wait(d) => take_replies(&mut c, p, d),
                Step::Done => break,
            };
        }
    }
    finish(None);
}

//! The glucose monitor's TCP publishers: durable, idempotent publishes over producer lanes,
//! reconnecting and resending what is unacknowledged after a gateway kill.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use spillway_core::log::PRODUCER_WINDOW;
use spillway_core::wire::{AckLevel, Producer, Request};

use super::serial::due;
use super::series::CgmValue;
use crate::client::{Client, Reply};

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

/// What a publisher and its reply reader share.
#[derive(Debug)]
pub(super) struct PubState {
    /// Connection generation; replies of older connections are ignored.
    pub(super) generation: u64,
    /// The current connection failed.
    pub(super) dead: bool,
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
    pub(super) shared: Arc<(Mutex<PubState>, Condvar)>,
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
            generation: 0,
            dead: true,
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
            shared: Arc::new((Mutex::new(st), Condvar::new())),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, PubState> {
        lock(&self.shared.0)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Connects and says hello, retrying until `deadline`.
pub(super) fn connect_hello(addr: &str, deadline: Instant) -> Result<(TcpStream, Reply), String> {
    loop {
        let attempt = (|| -> io::Result<(TcpStream, Reply)> {
            let sa: std::net::SocketAddr = addr
                .parse()
                .map_err(|_| io::Error::other(format!("bad address {addr}")))?;
            let s = TcpStream::connect_timeout(&sa, Duration::from_secs(1))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut c = Client::new(Box::new(s.try_clone()?));
            let w = c.hello("spillway-demo")?;
            s.set_read_timeout(None)?;
            Ok((s, w))
        })();
        match attempt {
            Ok(x) => return Ok(x),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot connect to the gateway at {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
}

/// Reads replies of connection `generation` until it fails.
pub(super) fn reply_reader(
    stream: TcpStream,
    generation: u64,
    pubr: Arc<(Mutex<PubState>, Condvar)>,
    lanes: usize,
) {
    let mut c = Client::new(Box::new(stream));
    loop {
        let r = c.recv();
        let (m, cv) = &*pubr;
        let mut st = lock(m);
        if st.generation != generation {
            return;
        }
        match r {
            Ok(Reply::Ack {
                seq,
                offset,
                duplicate,
            }) => {
                if let Some(idx) = st.inflight.remove(&seq)
                    && st.acks[idx].is_none()
                {
                    st.acks[idx] = Some(Acked { offset, duplicate });
                    st.acked += 1;
                    st.unacked.remove(&idx);
                    st.lane_unacked[idx % lanes] -= 1;
                    if duplicate {
                        st.duplicate_acks += 1;
                    }
                }
            }
            // The gateway's storage failed: nothing waiting was made durable. Reconnect
            // and resend every unacknowledged record once it has recovered (the producer
            // ids deduplicate what did reach flash).
            Ok(ref e @ Reply::Error { .. }) if e.is_storage_failure() => {
                st.storage_failures += 1;
                st.dead = true;
                cv.notify_all();
                return;
            }
            Ok(Reply::Error { seq, code, message }) => {
                st.error = Some(format!(
                    "the gateway refused publish {seq}: {code:?}: {message}"
                ));
                st.dead = true;
                cv.notify_all();
                return;
            }
            Ok(_) => {}
            Err(_) => {
                st.dead = true;
                cv.notify_all();
                return;
            }
        }
        cv.notify_all();
    }
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
        p.shared.1.notify_all();
    };
    let mut first = true;
    loop {
        {
            let st = p.lock();
            if st.error.is_some() || (st.next == n && st.unacked.is_empty()) {
                break;
            }
        }
        let (stream, welcome) = match connect_hello(addr, Instant::now() + reconnect_for) {
            Ok(x) => x,
            Err(e) => return finish(Some(e)),
        };
        let Reply::Welcome { log_id, .. } = welcome else {
            return finish(Some(format!("the gateway answered hello with {welcome:?}")));
        };
        let reader_stream = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => return finish(Some(format!("socket clone: {e}"))),
        };
        let mut w = Client::new(Box::new(match stream.try_clone() {
            Ok(s) => s,
            Err(e) => return finish(Some(format!("socket clone: {e}"))),
        }));
        let (generation, resend) = {
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
            st.generation += 1;
            st.dead = false;
            st.inflight.clear();
            if !first {
                st.reconnects += 1;
            }
            (
                st.generation,
                st.unacked.iter().copied().collect::<Vec<_>>(),
            )
        };
        first = false;
        let reader = {
            let shared = p.shared.clone();
            let lanes = p.lanes;
            std::thread::spawn(move || reply_reader(reader_stream, generation, shared, lanes))
        };
        let mut wire_seq: u32 = 0;
        let mut send = |w: &mut Client, idx: usize, resend: bool| -> bool {
            wire_seq = wire_seq.wrapping_add(1).max(1);
            let r = &p.records[idx];
            {
                let mut st = p.lock();
                st.inflight.insert(wire_seq, idx);
                if resend {
                    st.resent += 1;
                }
            }
            w.send(&Request::Publish {
                seq: wire_seq,
                topic: &p.topic,
                timestamp_us: Some(r.timestamp_us),
                payload: &r.payload,
                ack: AckLevel::Durable,
                producer: Some(r.producer),
            })
            .is_ok()
        };
        let mut ok = true;
        for idx in resend {
            if !send(&mut w, idx, true) {
                ok = false;
                break;
            }
        }
        while ok {
            let idx = {
                let (m, cv) = &*p.shared;
                let mut st = lock(m);
                if st.dead || st.error.is_some() {
                    break;
                }
                if st.next == n {
                    if st.unacked.is_empty() {
                        break;
                    }
                    let _ = cv.wait_timeout(st, Duration::from_millis(50));
                    continue;
                }
                let next = st.next;
                if st.lane_unacked[next % p.lanes] >= PRODUCER_WINDOW {
                    let _ = cv.wait_timeout(st, Duration::from_millis(50));
                    continue;
                }
                let at = due(t0, replay, p.records[next].row, rows);
                let now = Instant::now();
                if at > now {
                    let _ = cv.wait_timeout(st, (at - now).min(Duration::from_millis(50)));
                    continue;
                }
                st.next += 1;
                st.unacked.insert(next);
                st.lane_unacked[next % p.lanes] += 1;
                next
            };
            ok = send(&mut w, idx, false);
        }
        let _ = stream.shutdown(std::net::Shutdown::Both);
        let _ = reader.join();
        {
            let mut st = p.lock();
            st.dead = true;
        }
    }
    finish(None);
}

//! A small in-process gateway for tests: speaks the wire protocol over TCP, backed by a real
//! `spillway_core::log::Log` on a simulated flash. One thread per connection; the log sits
//! behind a mutex. Test controls: cut every connection and refuse new ones for a while
//! (outage), replace the log (a reflashed gateway), pretend offsets below a mark are
//! gone (a drop-oldest gap), pretend a range of offsets is lost for a given reason
//! (corrupt, or never persisted after a crash), and make one byte of the flash a flaky
//! cell.
#![allow(dead_code, missing_docs)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_core::log::{Config, Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, Geometry, SimFlash};
use spillway_core::wire::{
    self, ConsumerEntry, ErrorCode, GatewayStats, ListWriter, RecordView, RecordsWriter, Request,
    Response,
};

type TheLog = Log<'static, SimFlash<Vec<u8>>>;

const MAX_FRAME: usize = 64 * 1024;
/// The largest payload accepted (announced in the `Welcome`); larger ones get `TooLarge`.
const MAX_RECORD: u32 = 4096;

fn new_log(log_id: u128) -> TheLog {
    let g = Geometry {
        erase_size: 4096,
        write_size: 4,
        capacity: 4096 * 258,
        erased: 0xFF,
    };
    let mut flash = SimFlash::new_vec(g).unwrap();
    Log::format(&mut flash, log_id, 2).unwrap();
    mount_log(flash)
}

fn mount_log(flash: SimFlash<Vec<u8>>) -> TheLog {
    let g = flash.geometry();
    let buf: &'static mut [u8] = Box::leak(vec![0u8; 16 * 1024].into_boxed_slice());
    let slots: &'static mut [SegmentSlot] =
        Box::leak(vec![SegmentSlot::EMPTY; segments_for(&g, 2) as usize].into_boxed_slice());
    let (log, _) = Log::mount(
        flash,
        Config::default(),
        Memory {
            buffer: buf,
            segments: slots,
        },
        0,
    )
    .unwrap();
    log
}

struct State {
    log: TheLog,
    log_id: u128,
    gateway_id: String,
    /// Offsets below this are answered as dropped.
    gone_below: u64,
    /// A range answered as `lost` with this reason instead of its records.
    lost: Option<(u64, u64, wire::LostReason)>,
}

pub struct FakeGateway {
    pub addr: String,
    state: Arc<Mutex<State>>,
    down_until: Arc<Mutex<Option<Instant>>>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    pub fetches: Arc<AtomicU64>,
    pub commits: Arc<Mutex<Vec<(String, u64)>>>,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

impl FakeGateway {
    pub fn start(gateway_id: &str, log_id: u128) -> FakeGateway {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let state = Arc::new(Mutex::new(State {
            log: new_log(log_id),
            log_id,
            gateway_id: gateway_id.to_string(),
            gone_below: 0,
            lost: None,
        }));
        let gw = FakeGateway {
            addr,
            state,
            down_until: Arc::new(Mutex::new(None)),
            conns: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            fetches: Arc::new(AtomicU64::new(0)),
            commits: Arc::new(Mutex::new(Vec::new())),
        };
        let (state, down, conns, stop, fetches, commits) = (
            gw.state.clone(),
            gw.down_until.clone(),
            gw.conns.clone(),
            gw.stop.clone(),
            gw.fetches.clone(),
            gw.commits.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let is_down = down.lock().unwrap().is_some_and(|t| Instant::now() < t);
                        if is_down {
                            let _ = s.shutdown(Shutdown::Both);
                            continue;
                        }
                        s.set_nonblocking(false).unwrap();
                        conns.lock().unwrap().push(s.try_clone().unwrap());
                        let (state, fetches, commits) =
                            (state.clone(), fetches.clone(), commits.clone());
                        std::thread::spawn(move || serve(s, state, fetches, commits));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        gw
    }

    pub fn uri(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Appends records durably; returns their offsets.
    pub fn publish(&self, topic: &str, payloads: &[&[u8]]) -> Vec<u64> {
        let mut st = self.state.lock().unwrap();
        let mut out = Vec::new();
        for p in payloads {
            let a = st
                .log
                .append(
                    0,
                    &Record {
                        topic,
                        timestamp_us: now_us(),
                        producer: None,
                        payload: p,
                    },
                )
                .unwrap();
            out.push(a.offset);
        }
        st.log.flush(0).unwrap();
        out
    }

    pub fn next_offset(&self) -> u64 {
        self.state.lock().unwrap().log.next_offset()
    }

    pub fn committed(&self, consumer: &str) -> Option<u64> {
        self.state.lock().unwrap().log.committed(consumer)
    }

    /// Cuts every connection and refuses new ones for `d`.
    pub fn outage(&self, d: Duration) {
        *self.down_until.lock().unwrap() = Some(Instant::now() + d);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Replaces the log with a fresh one (a reflashed gateway), cutting connections.
    pub fn replace_log(&self, log_id: u128) {
        {
            let mut st = self.state.lock().unwrap();
            st.log = new_log(log_id);
            st.log_id = log_id;
            st.gone_below = 0;
            st.lost = None;
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Makes the byte `at` bytes into the first copy of `needle` on the flash a flaky cell
    /// (`SimFlash::set_flaky`: wrong on `percent`% of reads): the log is closed cleanly, the
    /// cell armed, and the log mounted again. Returns the cell's flash address.
    pub fn flaky_cell(&self, needle: &[u8], at: usize, percent: u8) -> u32 {
        let mut st = self.state.lock().unwrap();
        let log = std::mem::replace(&mut st.log, new_log(0));
        let mut flash = log.close(now_us()).unwrap();
        let pos = flash
            .bytes()
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("needle on the flash");
        let addr = u32::try_from(pos + at).unwrap();
        flash.set_flaky(addr, 0x01, percent);
        st.log = mount_log(flash);
        addr
    }

    /// Reads of the flaky cell that returned it wrong so far (the simulated flash's count).
    pub fn flaky_reads(&self) -> u64 {
        self.state.lock().unwrap().log.flash().faults().flaky_reads
    }

    /// Pretends every offset below `o` is gone (drop-oldest).
    pub fn drop_below(&self, o: u64) {
        self.state.lock().unwrap().gone_below = o;
    }

    /// Pretends offsets `from..to` cannot be read for `reason`: a fetch from inside the
    /// range gets a `Records` reply with that `lost` range and no records, and a fetch from
    /// before it stops at `from`.
    pub fn pretend_lost(&self, from: u64, to: u64, reason: wire::LostReason) {
        self.state.lock().unwrap().lost = Some((from, to, reason));
    }
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn serve(
    mut s: TcpStream,
    state: Arc<Mutex<State>>,
    fetches: Arc<AtomicU64>,
    commits: Arc<Mutex<Vec<(String, u64)>>>,
) {
    let mut frames = wire::FrameDecoder::new(wire::GrowingFrameBuffer::new(MAX_FRAME));
    let mut tmp = vec![0u8; 8192];
    let mut out = vec![0u8; MAX_FRAME];
    let mut handshaken = false;
    loop {
        let n = match s.read(&mut tmp) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut input = &tmp[..n];
        loop {
            let message = match frames.feed(input) {
                wire::FeedResult::Consumed => break,
                wire::FeedResult::Frame { message, remaining } => {
                    input = remaining;
                    message
                }
                wire::FeedResult::Error { remaining, .. } => {
                    input = remaining;
                    continue;
                }
            };
            let req: Request<'_> = match postcard::from_bytes(message) {
                Ok(r) => r,
                Err(_) => continue,
            };
            let len = handle(req, &state, &mut out, &mut handshaken, &fetches, &commits);
            if let Some(len) = len
                && s.write_all(&out[..len]).is_err()
            {
                return;
            }
        }
    }
}

fn err(out: &mut [u8], seq: u32, code: ErrorCode, message: &str) -> Option<usize> {
    wire::encode_frame(&Response::Error { seq, code, message }, out).ok()
}

fn handle(
    req: Request<'_>,
    state: &Mutex<State>,
    out: &mut [u8],
    handshaken: &mut bool,
    fetches: &AtomicU64,
    commits: &Mutex<Vec<(String, u64)>>,
) -> Option<usize> {
    if let Request::Hello { .. } = req {
        *handshaken = true;
        let st = state.lock().unwrap();
        return wire::encode_frame(
            &Response::Welcome {
                protocol_version: 1,
                log_id: st.log_id,
                gateway_id: &st.gateway_id,
                max_record_bytes: MAX_RECORD,
                max_frame_bytes: MAX_FRAME as u32,
            },
            out,
        )
        .ok();
    }
    if !*handshaken {
        return err(out, 0, ErrorCode::NotHandshaken, "");
    }
    match req {
        Request::Hello { .. } => None,
        Request::Publish {
            seq,
            topic,
            timestamp_us,
            payload,
            ack,
            producer,
        } => {
            if payload.len() > MAX_RECORD as usize {
                let m = format!("payload of {} bytes exceeds {MAX_RECORD}", payload.len());
                return err(out, seq, ErrorCode::TooLarge, &m);
            }
            let mut st = state.lock().unwrap();
            let r = st.log.append(
                0,
                &Record {
                    topic,
                    timestamp_us: timestamp_us.unwrap_or_else(now_us),
                    producer,
                    payload,
                },
            );
            let a = match r {
                Ok(a) => a,
                Err(e @ spillway_core::AppendError::BadTopic { .. }) => {
                    return err(out, seq, ErrorCode::BadRequest, &e.to_string());
                }
                Err(e) => return err(out, seq, ErrorCode::Internal, &e.to_string()),
            };
            if ack == wire::AckLevel::Durable {
                st.log.flush(0).unwrap();
            }
            if ack == wire::AckLevel::None {
                return None;
            }
            wire::encode_frame(
                &Response::Ack {
                    seq,
                    offset: a.offset,
                    duplicate: a.duplicate,
                },
                out,
            )
            .ok()
        }
        Request::Fetch {
            seq,
            from_offset,
            max_bytes,
            wait_ms,
            ..
        } => {
            fetches.fetch_add(1, Ordering::Relaxed);
            let deadline = Instant::now() + Duration::from_millis(u64::from(wait_ms.unwrap_or(0)));
            loop {
                let mut st = state.lock().unwrap();
                if from_offset < st.gone_below {
                    let first_available = st.gone_below;
                    return wire::encode_frame(
                        &Response::Dropped {
                            seq,
                            first_available,
                        },
                        out,
                    )
                    .ok();
                }
                if from_offset == st.log.next_offset() && Instant::now() < deadline {
                    drop(st);
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                if let Some((lf, lt, reason)) = st.lost
                    && (lf..lt).contains(&from_offset)
                {
                    let w = RecordsWriter::new(out, seq, 0, max_bytes);
                    let lost = wire::LostRange {
                        from: lf,
                        to: lt,
                        reason,
                    };
                    return w.finish(lt, Some(lost)).ok();
                }
                let lost_from = st.lost.map(|l| l.0).filter(|&lf| lf > from_offset);
                let mut buf = vec![0u8; 32 * 1024];
                let r = match st.log.read(from_offset, &mut buf) {
                    Ok(r) => r,
                    Err(spillway_core::ReadError::OffsetOutOfRange { .. }) => {
                        return err(out, seq, ErrorCode::OffsetOutOfRange, "beyond the end");
                    }
                    Err(spillway_core::ReadError::Dropped {
                        first_available, ..
                    }) => {
                        return wire::encode_frame(
                            &Response::Dropped {
                                seq,
                                first_available,
                            },
                            out,
                        )
                        .ok();
                    }
                    Err(e) => return err(out, seq, ErrorCode::Internal, &e.to_string()),
                };
                let mut w = RecordsWriter::new(out, seq, r.prev_crc, max_bytes);
                let mut next = r.next_offset;
                for rec in r.records(&buf) {
                    if lost_from.is_some_and(|lf| rec.offset >= lf) {
                        next = rec.offset;
                        break;
                    }
                    let view = RecordView::from(rec);
                    if w.push(&view).is_err() {
                        next = rec.offset;
                        break;
                    }
                }
                let lost = r.lost.map(|l| wire::LostRange {
                    from: l.from,
                    to: l.to,
                    reason: wire::LostReason::Corrupt,
                });
                return w.finish(next, lost).ok();
            }
        }
        Request::Commit {
            seq,
            consumer,
            offset,
        } => {
            commits.lock().unwrap().push((consumer.to_string(), offset));
            let mut st = state.lock().unwrap();
            match st.log.commit(consumer, offset) {
                Ok(o) => wire::encode_frame(
                    &Response::Committed {
                        seq,
                        consumer,
                        offset: o,
                    },
                    out,
                )
                .ok(),
                Err(e) => err(out, seq, ErrorCode::OffsetOutOfRange, &e.to_string()),
            }
        }
        Request::ListConsumers { seq } => {
            let st = state.lock().unwrap();
            let mut scratch = vec![0u8; 4096];
            let mut lw = ListWriter::<ConsumerEntry<'_>>::new(&mut scratch);
            for (name, committed_offset) in st.log.consumers() {
                let _ = lw.push(&ConsumerEntry {
                    name,
                    committed_offset,
                });
            }
            let list = lw.finish();
            wire::encode_frame(&Response::Consumers { seq, list }, out).ok()
        }
        Request::DeleteConsumer { seq, consumer } => {
            let mut st = state.lock().unwrap();
            let existed = st.log.delete_consumer(consumer).unwrap_or(false);
            wire::encode_frame(&Response::Deleted { seq, existed }, out).ok()
        }
        Request::Stats { seq } => {
            let st = state.lock().unwrap();
            let stats = GatewayStats {
                first_offset: st.log.first_offset().max(st.gone_below),
                next_offset: st.log.next_offset(),
                durable_offset: st.log.durable_offset(),
                consumers: st.log.consumers().count() as u64,
                ..GatewayStats::default()
            };
            wire::encode_frame(&Response::StatsReply { seq, stats }, out).ok()
        }
        // This fake speaks protocol version 1: no producer sessions.
        Request::OpenSession { seq, .. } | Request::SessionPublish { seq, .. } => {
            err(out, seq, ErrorCode::BadRequest, "no sessions in version 1")
        }
    }
}

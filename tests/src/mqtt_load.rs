//! The load generator of the MQTT fan-in benchmark ([`bench_mqtt`](crate::bench_mqtt)):
//! [`bench_mqtt::PUBLISHERS`](crate::bench_mqtt::PUBLISHERS) MQTT 3.1.1 publishers, one
//! thread and connection each, QoS 1 with a window of unacknowledged messages, timed with
//! their PUBACK latencies ([`fan_in`]); and the discard server that measures its ceiling
//! ([`Discard`]). Packets are encoded and decoded by `mqtt-protocol-core`, the codec of the
//! gateway's listener, over blocking std TCP sockets.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mqtt_protocol_core::mqtt::common::Cursor;
use mqtt_protocol_core::mqtt::connection::Event;
use mqtt_protocol_core::mqtt::packet::{
    GenericPacket, GenericPacketTrait, Packet, Qos, SubEntry, SubOpts, v3_1_1,
};
use mqtt_protocol_core::mqtt::result_code::ConnectReturnCode;
use mqtt_protocol_core::mqtt::{Connection, Version, role};

use crate::bench_gateway::cpu_us;
use crate::bench_mqtt::{PUBLISHERS, TOPIC, WINDOW};
/// What one timed run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Messages acknowledged per second, first PUBLISH to last PUBACK.
    pub msgs_per_s: f64,
    /// Median PUBACK latency, ms.
    pub p50_ms: f64,
    /// 99th percentile PUBACK latency, ms.
    pub p99_ms: f64,
    /// CPU time (user + system) of the server process in that window, µs per message (0
    /// for the discard server, which runs in this process).
    pub server_cpu_us: f64,
}

/// The payload of message `seq` of publisher `publisher`, `len` bytes (at least 8).
pub fn payload(publisher: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0x5au8; len.max(8)];
    p[..4].copy_from_slice(&publisher.to_le_bytes());
    p[4..8].copy_from_slice(&seq.to_le_bytes());
    p
}

/// The publisher and message number a payload carries.
pub fn parse_payload(p: &[u8]) -> Option<(u32, u32)> {
    let a = u32::from_le_bytes(p.get(..4)?.try_into().ok()?);
    let b = u32::from_le_bytes(p.get(4..8)?.try_into().ok()?);
    Some((a, b))
}

/// An MQTT 3.1.1 client connection: the codec's state machine over a blocking socket.
pub struct MqttConn {
    /// The socket.
    pub s: TcpStream,
    mq: Connection<role::Client>,
    buf: Vec<u8>,
    out: Vec<u8>,
    /// Packets that came in the read of the CONNACK (a persistent session's queued
    /// messages follow it at once), handed out by the next [`MqttConn::read_packets`].
    early: Vec<Packet>,
}

impl MqttConn {
    /// Connects as `client_id` (clean session 0 unless `clean`) and waits for a CONNACK
    /// that accepts.
    pub fn connect(addr: &str, client_id: &str, clean: bool) -> io::Result<MqttConn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut mq = Connection::<role::Client>::new(Version::V3_1_1);
        mq.set_auto_pub_response(true);
        mq.set_auto_ping_response(true);
        let mut c = MqttConn {
            s,
            mq,
            buf: vec![0u8; 64 * 1024],
            out: Vec::with_capacity(64 * 1024),
            early: Vec::new(),
        };
        let connect = v3_1_1::Connect::builder()
            .client_id(client_id)
            .map_err(codec)?
            .clean_session(clean)
            .keep_alive(0)
            .build()
            .map_err(codec)?;
        c.send(connect.into())?;
        c.flush()?;
        let mut accepted = None;
        let mut early = Vec::new();
        while accepted.is_none() {
            c.read_packets(|p| match p {
                GenericPacket::V3_1_1Connack(a) if accepted.is_none() => {
                    accepted = Some(a.return_code());
                }
                other => early.push(other),
            })?;
        }
        c.early = early;
        match accepted {
            Some(ConnectReturnCode::Accepted) => Ok(c),
            other => Err(io::Error::other(format!("CONNACK refused: {other:?}"))),
        }
    }

    /// Queues `packet` through the codec (written by [`MqttConn::flush`]).
    fn send(&mut self, packet: Packet) -> io::Result<()> {
        let events = self.mq.send(packet);
        self.carry_out(events, &mut |_| {})
    }

    /// Writes what is queued.
    fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.s.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    fn carry_out(&mut self, events: Vec<Event>, on: &mut impl FnMut(Packet)) -> io::Result<()> {
        for ev in events {
            match ev {
                Event::RequestSendPacket { packet, .. } => {
                    self.out.extend_from_slice(&packet.to_continuous_buffer());
                }
                Event::NotifyPacketReceived(p) => on(p),
                Event::NotifyError(e) => {
                    return Err(io::Error::other(format!("MQTT protocol error: {e:?}")));
                }
                Event::RequestClose => {
                    return Err(io::Error::other("the codec closed the connection"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One read from the socket: hands every complete packet to `on`, then writes what
    /// the codec answered (PUBACKs of received QoS 1 messages).
    pub fn read_packets(&mut self, mut on: impl FnMut(Packet)) -> io::Result<()> {
        if !self.early.is_empty() {
            self.early.drain(..).for_each(&mut on);
            return Ok(());
        }
        let n = self.s.read(&mut self.buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        let data = std::mem::take(&mut self.buf);
        let mut cursor = Cursor::new(&data[..n]);
        let mut res = Ok(());
        while (cursor.position() as usize) < n {
            let before = cursor.position();
            let events = self.mq.recv(&mut cursor);
            res = self.carry_out(events, &mut on);
            if res.is_err() || cursor.position() == before {
                break;
            }
        }
        self.buf = data;
        res?;
        self.flush()
    }

    /// Queues a QoS 1 PUBLISH; returns its packet id.
    fn publish(&mut self, topic: &str, payload: Vec<u8>) -> io::Result<u16> {
        let pid = self.mq.acquire_packet_id().map_err(codec)?;
        let p = v3_1_1::Publish::builder()
            .topic_name(topic)
            .map_err(codec)?
            .qos(Qos::AtLeastOnce)
            .packet_id(pid)
            .payload(payload)
            .build()
            .map_err(codec)?;
        self.send(p.into())?;
        Ok(pid)
    }

    /// Sends a QoS 1 PUBLISH of `payload` on `topic` at once (without waiting for its
    /// PUBACK); returns its packet id.
    ///
    /// # Errors
    /// The codec's (no packet id free) or the socket's.
    pub fn publish_qos1(&mut self, topic: &str, payload: Vec<u8>) -> io::Result<u16> {
        let pid = self.publish(topic, payload)?;
        self.flush()?;
        Ok(pid)
    }

    /// Reads until at least `n` PUBACKs have come; returns how many came (a read can bring
    /// more than `n`).
    ///
    /// # Errors
    /// Another packet than a PUBACK, or the socket's.
    pub fn wait_pubacks(&mut self, n: usize) -> io::Result<usize> {
        let mut got = 0;
        let mut stray = None;
        while got < n {
            self.read_packets(|p| match p {
                GenericPacket::V3_1_1Puback(_) => got += 1,
                other => stray = Some(format!("expected PUBACK, got {other:?}")),
            })?;
            if let Some(e) = stray.take() {
                return Err(io::Error::other(e));
            }
        }
        Ok(got)
    }

    /// Counts the PUBLISH packets the server sends until none comes for `quiet` (what it
    /// had queued for this persistent session; the codec acknowledges each).
    ///
    /// # Errors
    /// The socket's, other than the timeout that ends the count.
    pub fn count_publishes(&mut self, quiet: Duration) -> io::Result<usize> {
        self.s.set_read_timeout(Some(quiet))?;
        let mut n = 0;
        loop {
            match self.read_packets(|p| {
                if matches!(p, GenericPacket::V3_1_1Publish(_)) {
                    n += 1;
                }
            }) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Subscribes to `topic` at QoS 1 and waits for a SUBACK that grants it.
    pub fn subscribe(&mut self, topic: &str) -> io::Result<()> {
        let pid = self.mq.acquire_packet_id().map_err(codec)?;
        let entry =
            SubEntry::new(topic, SubOpts::new().set_qos(Qos::AtLeastOnce)).map_err(codec)?;
        let sub = v3_1_1::Subscribe::builder()
            .entries(vec![entry])
            .packet_id(pid)
            .build()
            .map_err(codec)?;
        self.send(sub.into())?;
        self.flush()?;
        let mut granted = None;
        while granted.is_none() {
            self.read_packets(|p| {
                if let GenericPacket::V3_1_1Suback(a) = p {
                    granted = Some(format!("{:?}", a.return_codes()));
                }
            })?;
        }
        match granted {
            Some(g) if !g.contains("Failure") => Ok(()),
            other => Err(io::Error::other(format!("SUBACK refused: {other:?}"))),
        }
    }

    /// Sends DISCONNECT (the session stays on the server when it is persistent).
    pub fn disconnect(mut self) -> io::Result<()> {
        let d = v3_1_1::Disconnect::builder().build().map_err(codec)?;
        for ev in self.mq.send(d.into()) {
            // The codec asks to close after a DISCONNECT: that is the point here.
            if let Event::RequestSendPacket { packet, .. } = ev {
                self.out.extend_from_slice(&packet.to_continuous_buffer());
            }
        }
        self.flush()
    }
}

fn codec(e: impl fmt::Debug) -> io::Error {
    io::Error::other(format!("MQTT codec: {e:?}"))
}

/// Client id of publisher `i`.
fn publisher_id(i: usize) -> String {
    format!("bench-pub-{i}")
}

/// One publisher: `n` QoS 1 messages of `len` bytes, [`WINDOW`] in flight at most; returns
/// the PUBACK latencies, µs.
fn publisher(mut c: MqttConn, index: u32, n: usize, len: usize) -> io::Result<Vec<u32>> {
    let mut sent_at: Vec<Option<Instant>> = vec![None; 1 << 16];
    let mut latencies = Vec::with_capacity(n);
    let (mut sent, mut acked) = (0usize, 0usize);
    while acked < n {
        if sent < n && sent - acked < WINDOW {
            let mut pids = Vec::with_capacity(WINDOW);
            while sent < n && sent - acked < WINDOW {
                pids.push(c.publish(TOPIC, payload(index, sent as u32, len))?);
                sent += 1;
            }
            let now = Instant::now();
            for pid in pids {
                sent_at[usize::from(pid)] = Some(now);
            }
            c.flush()?;
        }
        let mut stray = None;
        c.read_packets(|p| match p {
            GenericPacket::V3_1_1Puback(a) => {
                let now = Instant::now();
                match sent_at[usize::from(a.packet_id())].take() {
                    Some(t) => {
                        latencies
                            .push(now.duration_since(t).as_micros().min(u32::MAX as u128) as u32);
                        acked += 1;
                    }
                    None => stray = Some(format!("PUBACK for unknown packet id {}", a.packet_id())),
                }
            }
            other => stray = Some(format!("unexpected packet {other:?}")),
        })?;
        if let Some(e) = stray {
            return Err(io::Error::other(e));
        }
    }
    Ok(latencies)
}

/// Runs the [`PUBLISHERS`] against `addr` with `len`-byte payloads; `pid` is the server
/// process (for its CPU time; `None` for the discard server).
///
/// # Panics
/// If a connection or publisher fails.
pub fn fan_in(addr: &str, pid: Option<u32>, per_publisher: usize, len: usize) -> Measured {
    let conns: Vec<MqttConn> = (0..PUBLISHERS)
        .map(|i| MqttConn::connect(addr, &publisher_id(i), false).expect("connect a publisher"))
        .collect();
    let gate = Arc::new(Barrier::new(PUBLISHERS + 1));
    let handles: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.wait();
                publisher(c, i as u32, per_publisher, len)
            })
        })
        .collect();
    let cpu0 = pid.map_or(0, cpu_us);
    gate.wait();
    let start = Instant::now();
    let mut lat: Vec<u32> = Vec::with_capacity(PUBLISHERS * per_publisher);
    for h in handles {
        lat.extend(
            h.join()
                .expect("publisher thread")
                .unwrap_or_else(|e| panic!("MQTT publisher against {addr}: {e}")),
        );
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = pid.map_or(0, |p| cpu_us(p).saturating_sub(cpu0));
    let msgs = PUBLISHERS * per_publisher;
    assert_eq!(lat.len(), msgs, "PUBACKs received against {addr}");
    lat.sort_unstable();
    let pct = |q: f64| f64::from(lat[((lat.len() - 1) as f64 * q).round() as usize]) / 1000.0;
    Measured {
        msgs_per_s: msgs as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        server_cpu_us: cpu as f64 / msgs as f64,
    }
}

/// An MQTT server in this process that PUBACKs every QoS 1 PUBLISH and keeps nothing:
/// the load generator's ceiling. Counts the PUBLISHes it received.
pub struct Discard {
    /// Its address, `127.0.0.1:PORT`.
    pub addr: String,
    /// PUBLISH packets received so far.
    pub received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Discard {
    /// Starts on a free port of 127.0.0.1.
    ///
    /// # Errors
    /// If it cannot listen.
    pub fn start() -> io::Result<Discard> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                for s in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let received = received.clone();
                    std::thread::spawn(move || {
                        // Ends when the client closes.
                        let _ = discard_conn(s, &received);
                    });
                }
            })
        };
        Ok(Discard {
            addr,
            received,
            stop,
            accept: Some(accept),
        })
    }
}

impl Drop for Discard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop up.
        let _ = TcpStream::connect(&self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

/// Serves one connection of the discard server.
fn discard_conn(mut s: TcpStream, received: &AtomicU64) -> io::Result<()> {
    s.set_nodelay(true)?;
    let mut mq = Connection::<role::Server>::new(Version::Undetermined);
    mq.set_auto_pub_response(true);
    mq.set_auto_ping_response(true);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let mut cursor = Cursor::new(&buf[..n]);
        let mut pending = Vec::new();
        while (cursor.position() as usize) < n {
            let before = cursor.position();
            pending.extend(mq.recv(&mut cursor));
            if cursor.position() == before {
                break;
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let ev = std::mem::replace(&mut pending[i], Event::RequestClose);
            i += 1;
            match ev {
                Event::RequestSendPacket { packet, .. } => {
                    out.extend_from_slice(&packet.to_continuous_buffer());
                }
                Event::NotifyPacketReceived(GenericPacket::V3_1_1Connect(_)) => {
                    let ack = v3_1_1::Connack::builder()
                        .session_present(false)
                        .return_code(ConnectReturnCode::Accepted)
                        .build()
                        .map_err(codec)?;
                    pending.extend(mq.send(ack.into()));
                }
                Event::NotifyPacketReceived(GenericPacket::V3_1_1Publish(_)) => {
                    received.fetch_add(1, Ordering::Relaxed);
                }
                Event::NotifyPacketReceived(GenericPacket::V3_1_1Disconnect(_)) => {
                    s.write_all(&out)?;
                    return Ok(());
                }
                Event::NotifyError(e) => return Err(codec(e)),
                _ => {}
            }
        }
        s.write_all(&out)?;
        out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_publisher_and_number() {
        for len in crate::bench_mqtt::PAYLOADS {
            let p = payload(49, 1999, len);
            assert_eq!(p.len(), len);
            assert_eq!(parse_payload(&p), Some((49, 1999)));
        }
    }
}

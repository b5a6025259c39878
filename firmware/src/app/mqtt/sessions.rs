//! The MQTT sessions, kept by the log thread: which client ids have a session, which
//! connection owns each, and what each session needs to tell a resend from a new message.
//!
//! ## Session ids, and sessions on the producer table
//! A client id is never stored: its session is named by a **session id**, SipHash-1-3 of
//! the client id keyed with the log id (top bit set), so two client ids do not share state
//! and a client cannot pick another one's. A persistent session's QoS 1 and 2 records carry
//! the session id as their producer id and a sequence `counter << 17 | qos2 << 16 | packet
//! id`: the log's producer table (the idempotent producers' rule of protocol versions 1
//! and 2, every sequence after the last) remembers each session's last sequence across
//! restarts, and the records themselves say which packet ids a session stored. At start
//! the gateway reads the last [`RECOVER_RECORDS`] records back to rebuild what each
//! session stored.
//!
//! ## Dedup rules
//! A redelivery always has DUP=1 (MQTT 3.1.1 §3.3.1.1, MQTT 5 §3.3.1.1); a PUBLISH with
//! DUP=0 is always a new message.
//! - QoS 2: a stored PUBLISH keeps its packet id **reserved** until the client's PUBREL; a
//!   PUBLISH with a reserved id is the same message sent again and is answered (PUBREC once
//!   the session's records are durable) without storing it twice. Every packet id can be
//!   reserved at once (a bitmap of 8 KiB per session): an MQTT 3.1.1 client has no receive
//!   maximum, and one that reconnects may send its whole queue before the PUBRELs of the
//!   first ones, so a quota would refuse it on every reconnect.
//! - After a restart, PUBRELs received before it are not known: a PUBLISH with DUP=1 is a
//!   resend when the **newest** record the session stored with its packet id, among the
//!   records read back at start ([`RECOVER_RECORDS`]), has the same QoS, topic and payload
//!   CRC (an older record with that id was completed: the client reuses an id only after
//!   PUBACK or PUBCOMP).
//! - QoS 1: a PUBLISH with DUP=1 whose packet id matches the newest of the session's last
//!   [`REMEMBERED`] stored records with that id, **with the same topic and payload CRC**, is
//!   a resend: answered with PUBACK, not stored again. Anything else is new (after a PUBACK
//!   the client may reuse the id for another message).
//!
//! ## Admission
//! At most [`MAX_SESSIONS`] persistent sessions (MQTT 3.1.1 `clean session = 0`, MQTT 5 a
//! session expiry above 0). A session whose client could still resend is never evicted:
//! the gateway cannot know which PUBACKs reached a client, so once a session stored a QoS 1
//! or 2 message (in this process, or among the records read back at start), a reconnect
//! may resend it with DUP=1, and only the session's memory of what it stored tells that
//! resend from a new message. A new persistent session beyond the limit therefore takes
//! the place of a disconnected session that has stored no QoS 1 or 2 message (one that
//! connected and published nothing, or only QoS 0); with none, the CONNECT is refused
//! (MQTT 5 reason code 0x89 server busy, MQTT 3.1.1 return code 3 server unavailable) and
//! counted (`spillway_ingest_errors_total{reason="mqtt_sessions_full"}`). A client that
//! wants a full table to make room connects once with a clean session (MQTT 5: clean start
//! and session expiry 0), which discards its session. A clean session lives as long as its
//! connection, needs no room in the table, and its records carry no producer (its client
//! never resends after a reconnect).

use std::collections::{HashMap, VecDeque};
use std::hash::Hasher as _;
use std::sync::Arc;

use async_channel::Sender;
use spillway_core::log::{Log, Producer, Record, RecordIter};
use spillway_core::storage::Flash;
use spillway_core::wire::ErrorCode;
use spillway_firmware::gateway::Gateway;

use super::super::engine::ConnId;
use super::super::metrics::Metrics;

/// Most persistent sessions kept at once (the benchmark's 50 publishers fit); each takes
/// one id of the log's producer table.
pub const MAX_SESSIONS: usize = 64;

/// QoS 1 and 2 publishes one connection may have waiting for the log before its socket is
/// no longer read (not announced as an MQTT 5 Receive Maximum: see the listener's docs).
pub const RECEIVE_MAXIMUM: u16 = 32;

/// Stored QoS 1 and 2 records remembered per session for the DUP check.
pub const REMEMBERED: usize = 2 * RECEIVE_MAXIMUM as usize;

/// Records read back at start to rebuild what the persistent sessions stored (at most
/// this many remembered in all, about 32 bytes each).
pub const RECOVER_RECORDS: u64 = 8192;

/// The top bit of every session id (the producer ids of MQTT sessions): the ids the
/// protocol keeps for the gateway, which it refuses from clients.
pub const SESSION_ID_BIT: u64 = spillway_core::wire::GATEWAY_PRODUCER_BIT;

/// The producer sequence of a session's record: a 15-bit counter, the QoS 2 flag and the
/// packet id. Consecutive records' sequences always increase (RFC 1982), as the
/// producers' rule wants, and the wrap of the counter is one more step.
pub fn record_seq(counter: u16, qos: u8, pid: u16) -> u32 {
    (u32::from(counter & 0x7FFF) << 17) | (u32::from(qos == 2) << 16) | u32::from(pid)
}

/// The QoS (1 or 2) and packet id a session's record sequence carries.
pub fn seq_parts(seq: u32) -> (u8, u16) {
    (if seq & (1 << 16) != 0 { 2 } else { 1 }, seq as u16)
}

/// A request of an MQTT connection to the log thread.
pub enum MqttCmd {
    /// A CONNECT: claim (or create) the client id's session; answered with
    /// [`MqttReply::Connected`] or [`MqttReply::Busy`].
    Connect {
        /// The connection.
        conn: ConnId,
        /// The client id (assigned by the listener when the client sent none).
        client: Arc<str>,
        /// Discard any session state the client id had (3.1.1 clean session, 5 clean
        /// start).
        clean: bool,
        /// Keep the session after the connection closes.
        persistent: bool,
        /// Where the answers of this connection go.
        replies: Sender<MqttReply>,
    },
    /// A PUBLISH: one record (topic as is, payload as is, the gateway's wall clock).
    Publish(Box<MqttPublish>),
    /// A PUBREL: the QoS 2 packet id is free again.
    Release {
        /// The connection (only its own session's ids are released).
        conn: ConnId,
        /// The client id.
        client: Arc<str>,
        /// Packet id.
        pid: u16,
    },
    /// The connection closed.
    Closed {
        /// The connection.
        conn: ConnId,
        /// The client id.
        client: Arc<str>,
    },
}

/// One PUBLISH for the log thread.
pub struct MqttPublish {
    /// The connection.
    pub conn: ConnId,
    /// The client id.
    pub client: Arc<str>,
    /// QoS 0, 1 or 2.
    pub qos: u8,
    /// Packet id (0 for QoS 0).
    pub pid: u16,
    /// The DUP flag.
    pub dup: bool,
    /// The MQTT topic, the record's topic.
    pub topic: String,
    /// The payload, the record's payload.
    pub payload: Vec<u8>,
    /// Answer only once the record is durable (`ack=durable`).
    pub durable: bool,
    /// Where the answer goes.
    pub replies: Sender<MqttReply>,
}

/// Why a publish was not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The log is full (`reject-new`).
    Full,
    /// The payload is above `--max-record-bytes`.
    TooLarge,
    /// The topic is empty or longer than the log allows.
    BadTopic,
    /// A storage failure: the gateway restarts.
    Storage,
    /// The listener's roles lack `publish` (`mqtt://…?roles=`).
    NotAuthorized,
}

/// An answer of the log thread to an MQTT connection.
pub enum MqttReply {
    /// The session is the connection's.
    Connected {
        /// The client id had a session before (CONNACK session present).
        session_present: bool,
    },
    /// Refused: every persistent session is in use and none can be evicted.
    Busy,
    /// Another connection took this client id's session over.
    TakenOver,
    /// The publish is stored (durable when the listener asked for it); send PUBACK or
    /// PUBREC.
    Stored {
        /// QoS of the publish.
        qos: u8,
        /// Packet id.
        pid: u16,
    },
    /// The publish was not stored.
    Refused {
        /// QoS of the publish.
        qos: u8,
        /// Packet id.
        pid: u16,
        /// Why.
        why: Refusal,
        /// The publish itself when the log was full, for a 3.1.1 listener to send again
        /// later (it cannot say "full").
        back: Option<Box<MqttPublish>>,
    },
}

/// What the log thread lends an MQTT command ([`MqttSessions::handle`]): the gateway and
/// the log a publish is stored through, the monotonic and wall clocks (µs), the metrics,
/// and the replies that wait for durability (a publish adds to them).
pub struct LogSide<'a, 'l, F: Flash> {
    /// The gateway.
    pub gw: &'a mut Gateway,
    /// The log.
    pub log: &'a mut Log<'l, F>,
    /// The monotonic clock, µs.
    pub now_us: u64,
    /// The wall clock, µs since the Unix epoch (a stored record's timestamp).
    pub wall_us: u64,
    /// The gateway's metrics.
    pub metrics: &'a Metrics,
    /// Replies waiting for their records to be durable.
    pub pending: &'a mut Vec<MqttPending>,
}

/// An acknowledgement that waits for the group flush.
pub struct MqttPending {
    /// The offset that must be durable.
    pub offset: u64,
    /// The answer.
    pub reply: MqttReply,
    /// Where it goes.
    pub replies: Sender<MqttReply>,
}

/// One stored QoS 1 or 2 message of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    pid: u16,
    qos: u8,
    offset: u64,
    /// CRC-32 of topic and payload ([`message_crc`]).
    crc: u32,
}

/// A set of MQTT packet ids, one bit each (8 KiB once the first id is added).
#[derive(Default)]
struct PidSet {
    bits: Option<Box<[u64; 1024]>>,
    len: usize,
}

impl PidSet {
    fn contains(&self, pid: u16) -> bool {
        let (word, bit) = (usize::from(pid >> 6), pid & 63);
        self.bits.as_ref().is_some_and(|b| b[word] >> bit & 1 != 0)
    }

    fn insert(&mut self, pid: u16) {
        let (word, bit) = (usize::from(pid >> 6), pid & 63);
        let w = &mut self.bits.get_or_insert_with(|| Box::new([0; 1024]))[word];
        if *w >> bit & 1 == 0 {
            *w |= 1 << bit;
            self.len += 1;
        }
    }

    fn remove(&mut self, pid: u16) {
        let (word, bit) = (usize::from(pid >> 6), pid & 63);
        if let Some(b) = self.bits.as_mut()
            && b[word] >> bit & 1 != 0
        {
            b[word] &= !(1 << bit);
            self.len -= 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct Session {
    /// The session id (the records' producer id).
    id: u64,
    persistent: bool,
    /// The connection serving the session now.
    owner: Option<(ConnId, Sender<MqttReply>)>,
    /// QoS 2 packet ids stored (or answered as stored) and not yet released by this process.
    reserved: PidSet,
    /// Offset of the newest record the session stored in this process: a resend of a
    /// reserved id is answered once it is durable.
    last_offset: u64,
    /// The last stored QoS 1 and 2 messages, oldest first, at most [`REMEMBERED`].
    recent: VecDeque<Stored>,
    /// The newest record per packet id among those read back at start; an id leaves when
    /// the session stores a new record with it.
    recovered: HashMap<u16, Stored>,
    /// Counter of the next record's sequence ([`record_seq`]).
    counter: u16,
}

impl Session {
    /// Whether forgetting the session loses nothing a resend could need: it is persistent,
    /// no connection serves it, and it has stored no QoS 1 or 2 message (none in this
    /// process, none among the records read back at start), so no QoS 2 id is reserved
    /// either.
    fn evictable(&self) -> bool {
        self.persistent
            && self.owner.is_none()
            && self.reserved.is_empty()
            && self.recent.is_empty()
            && self.recovered.is_empty()
    }

    fn remember(&mut self, st: Stored) {
        if self.recent.len() >= REMEMBERED {
            self.recent.pop_front();
        }
        self.recovered.remove(&st.pid);
        self.last_offset = st.offset;
        self.recent.push_back(st);
    }

    /// The offset of the record a PUBLISH with DUP=1 resends, if it is one: the newest
    /// record the session stored with `pid` must have the same QoS and CRC.
    fn resent(&self, pid: u16, qos: u8, crc: u32) -> Option<u64> {
        let newest = match self.recent.iter().rev().find(|e| e.pid == pid) {
            Some(e) => Some(e),
            None => self.recovered.get(&pid),
        };
        newest
            .filter(|e| e.qos == qos && e.crc == crc)
            .map(|e| e.offset)
    }
}

/// The sessions of every MQTT listener.
pub struct MqttSessions {
    /// Key of the session ids: the log id.
    key: u128,
    sessions: HashMap<Arc<str>, Session>,
    /// What the records read back at start say each session id stored (the newest record
    /// per packet id), until its client connects again.
    recovered: HashMap<u64, HashMap<u16, Stored>>,
}

/// CRC-32 of `topic`, a 0 byte and `payload`: what a QoS 1 resend must match.
fn message_crc(topic: &str, payload: &[u8]) -> u32 {
    let mut h = spillway_core::crc::Hasher::new();
    h.update(topic.as_bytes());
    h.update(&[0]);
    h.update(payload);
    h.finalize()
}

impl MqttSessions {
    /// No sessions yet, for the log `log_id`.
    pub fn new(log_id: u128) -> Self {
        MqttSessions {
            key: log_id,
            sessions: HashMap::new(),
            recovered: HashMap::new(),
        }
    }

    /// The session id of `client` ([module docs](self)).
    pub fn session_id(&self, client: &str) -> u64 {
        let mut h = siphasher::sip::SipHasher13::new_with_key(&self.key.to_le_bytes());
        h.write(client.as_bytes());
        h.finish() | SESSION_ID_BIT
    }

    /// Persistent sessions kept now.
    pub fn persistent(&self) -> usize {
        self.sessions.values().filter(|s| s.persistent).count()
    }

    /// Reads the last [`RECOVER_RECORDS`] offsets below `records_end` (the end of the
    /// records found at mount: after an unclean shutdown the next offset is past a lease of
    /// offsets that hold nothing) back and notes the QoS 1 and 2 messages the sessions
    /// stored (producer ids with [`SESSION_ID_BIT`]). `buf` must hold the largest record.
    /// Returns how many messages were found; a read error ends the scan (what was not read
    /// is not deduplicated).
    pub fn recover<F: Flash>(
        &mut self,
        log: &mut Log<'_, F>,
        buf: &mut [u8],
        records_end: u64,
    ) -> usize {
        let next = records_end.min(log.next_offset());
        let mut at = next.saturating_sub(RECOVER_RECORDS).max(log.first_offset());
        let mut found = 0;
        while at < next {
            let out = match log.read(at, buf) {
                Ok(o) => o,
                Err(e) => {
                    log::warn!("mqtt: reading records back from offset {at} failed: {e}");
                    break;
                }
            };
            for r in RecordIter::new(&buf[..out.len], out.first_offset, out.count) {
                let Some(p) = r.producer.filter(|p| p.id & SESSION_ID_BIT != 0) else {
                    continue;
                };
                let (qos, pid) = seq_parts(p.seq);
                let stored = Stored {
                    pid,
                    qos,
                    offset: r.offset,
                    crc: message_crc(r.topic, r.payload),
                };
                self.recovered.entry(p.id).or_default().insert(pid, stored);
                found += 1;
            }
            if out.next_offset <= at {
                break;
            }
            at = out.next_offset;
        }
        found
    }

    /// Applies one command. Replies that must wait for durability go to `env.pending`.
    pub fn handle<F: Flash>(&mut self, cmd: MqttCmd, env: LogSide<'_, '_, F>) {
        match cmd {
            MqttCmd::Connect {
                conn,
                client,
                clean,
                persistent,
                replies,
            } => {
                let reply = self.connect(conn, client, clean, persistent, replies.clone(), env.log);
                let _ = replies.try_send(reply);
            }
            MqttCmd::Release { conn, client, pid } => {
                if let Some(s) = self.sessions.get_mut(&client)
                    && s.owner.as_ref().is_some_and(|o| o.0 == conn)
                {
                    s.reserved.remove(pid);
                }
            }
            MqttCmd::Closed { conn, client } => {
                if let Some(s) = self.sessions.get_mut(&client)
                    && s.owner.as_ref().is_some_and(|o| o.0 == conn)
                {
                    s.owner = None;
                    if !s.persistent {
                        self.sessions.remove(&client);
                    }
                }
            }
            MqttCmd::Publish(p) => self.publish(p, env),
        }
    }

    fn connect<F: Flash>(
        &mut self,
        conn: ConnId,
        client: Arc<str>,
        clean: bool,
        persistent: bool,
        replies: Sender<MqttReply>,
        log: &Log<'_, F>,
    ) -> MqttReply {
        let id = self.session_id(&client);
        if let Some(old) = self.sessions.get_mut(&client) {
            if let Some((_, tx)) = old.owner.take() {
                let _ = tx.try_send(MqttReply::TakenOver);
            }
            if clean {
                self.sessions.remove(&client);
            }
        }
        let recovered = self.recovered.remove(&id).filter(|_| !clean);
        let session_present = self.sessions.contains_key(&client) || recovered.is_some();
        if !self.sessions.contains_key(&client) && persistent && self.persistent() >= MAX_SESSIONS {
            let victim = self
                .sessions
                .iter()
                .find(|(_, s)| s.evictable())
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    log::info!("mqtt: session of client {k:?} forgotten to admit {client:?}");
                    self.sessions.remove(&k);
                }
                None => {
                    if let Some(r) = recovered {
                        self.recovered.insert(id, r);
                    }
                    return MqttReply::Busy;
                }
            }
        }
        // The next sequence goes on after the last the log remembers for the id.
        let counter = match log.producer_session(id) {
            Some((0, last)) => ((last >> 17) as u16).wrapping_add(1) & 0x7FFF,
            _ => 0,
        };
        let s = self.sessions.entry(client).or_insert_with(|| Session {
            id,
            persistent,
            owner: None,
            reserved: PidSet::default(),
            last_offset: 0,
            recent: VecDeque::new(),
            recovered: recovered.unwrap_or_default(),
            counter,
        });
        s.persistent = persistent;
        s.owner = Some((conn, replies));
        MqttReply::Connected { session_present }
    }

    fn publish<F: Flash>(&mut self, p: Box<MqttPublish>, env: LogSide<'_, '_, F>) {
        let LogSide {
            gw,
            log,
            now_us,
            wall_us,
            metrics,
            pending,
        } = env;
        let (qos, pid) = (p.qos, p.pid);
        let mut session = self
            .sessions
            .get_mut(&p.client)
            .filter(|s| s.owner.as_ref().is_some_and(|o| o.0 == p.conn));
        let crc = message_crc(&p.topic, &p.payload);
        // A resend of a stored message: answered once the original is durable (for a
        // reserved id, once every record of the session is).
        let earlier = session.as_ref().and_then(|s| {
            if qos == 2 && s.reserved.contains(pid) {
                Some(s.last_offset)
            } else if p.dup {
                s.resent(pid, qos, crc)
            } else {
                None
            }
        });
        if let Some(offset) = earlier {
            metrics.mqtt_duplicates.inc();
            if qos == 2
                && let Some(s) = session.as_mut()
            {
                s.reserved.insert(pid);
                s.last_offset = s.last_offset.max(offset);
            }
            let reply = MqttReply::Stored { qos, pid };
            if p.durable && log.durable_offset() <= offset {
                pending.push(MqttPending {
                    offset,
                    reply,
                    replies: p.replies,
                });
            } else {
                let _ = p.replies.try_send(reply);
            }
            return;
        }
        // A persistent session's QoS 1/2 records name the session and the packet id.
        let producer = match &session {
            Some(s) if s.persistent && qos > 0 => Some(Producer {
                id: s.id,
                seq: record_seq(s.counter, qos, pid),
            }),
            _ => None,
        };
        let rec = Record {
            topic: &p.topic,
            timestamp_us: wall_us,
            producer,
            payload: &p.payload,
        };
        match gw.append_record(&rec, log, now_us) {
            Ok(a) => {
                metrics.mqtt_publish(qos);
                if let Some(s) = session {
                    if producer.is_some() {
                        s.counter = s.counter.wrapping_add(1) & 0x7FFF;
                    }
                    if qos > 0 {
                        s.remember(Stored {
                            pid,
                            qos,
                            offset: a.offset,
                            crc,
                        });
                    }
                    if qos == 2 {
                        s.reserved.insert(pid);
                    }
                }
                let reply = MqttReply::Stored { qos, pid };
                if qos == 0 {
                    // No acknowledgement in MQTT; durability comes with the next flush.
                } else if p.durable && log.durable_offset() <= a.offset {
                    pending.push(MqttPending {
                        offset: a.offset,
                        reply,
                        replies: p.replies,
                    });
                } else {
                    let _ = p.replies.try_send(reply);
                }
            }
            Err(code) => {
                let why = match code {
                    ErrorCode::Full => Refusal::Full,
                    ErrorCode::TooLarge => Refusal::TooLarge,
                    ErrorCode::BadRequest => Refusal::BadTopic,
                    _ => Refusal::Storage,
                };
                if why == Refusal::Storage {
                    log::warn!("mqtt: publish of client {:?} refused: {code:?}", p.client);
                }
                let replies = p.replies.clone();
                let back = (why == Refusal::Full).then_some(p);
                let _ = replies.try_send(MqttReply::Refused {
                    qos,
                    pid,
                    why,
                    back,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sequences_increase_and_carry_qos_and_packet_id() {
        use spillway_core::log::seq_before;
        let mut prev = record_seq(0, 2, 65_535);
        assert_eq!(seq_parts(prev), (2, 65_535));
        // Every step of the counter, through its wrap, with the worst packet ids.
        for c in 1..=0x8001u32 {
            let (qos, pid) = if c % 2 == 0 { (1, 1) } else { (2, 65_535) };
            let next = record_seq(c as u16, qos, pid);
            assert!(seq_before(prev, next), "{c}: {prev:#x} then {next:#x}");
            assert_eq!(seq_parts(next), (qos, pid));
            prev = next;
        }
    }

    #[test]
    fn every_packet_id_can_be_reserved_at_once() {
        let mut set = PidSet::default();
        assert!(set.is_empty() && !set.contains(7));
        for pid in 0..=u16::MAX {
            set.insert(pid);
            set.insert(pid);
        }
        assert_eq!(set.len, 65_536);
        assert!(set.contains(0) && set.contains(u16::MAX));
        for pid in (0..=u16::MAX).step_by(2) {
            set.remove(pid);
            set.remove(pid);
        }
        assert_eq!(set.len, 32_768);
        assert!(!set.contains(64) && set.contains(65));
    }

    #[test]
    fn a_resend_matches_only_the_newest_record_with_its_packet_id() {
        let st = |pid, qos, offset, crc| Stored {
            pid,
            qos,
            offset,
            crc,
        };
        let mut s = Session {
            id: SESSION_ID_BIT,
            persistent: true,
            owner: None,
            reserved: PidSet::default(),
            last_offset: 0,
            recent: VecDeque::new(),
            recovered: HashMap::from([(5, st(5, 2, 10, 0xA)), (6, st(6, 1, 11, 0xB))]),
            counter: 0,
        };
        // Read back at start: the newest record per id.
        assert_eq!(s.resent(5, 2, 0xA), Some(10));
        assert_eq!(s.resent(5, 1, 0xA), None, "another QoS");
        assert_eq!(s.resent(5, 2, 0xC), None, "another message");
        // A new message with id 5: the record read back was completed before it.
        s.remember(st(5, 2, 20, 0xC));
        assert_eq!(s.resent(5, 2, 0xA), None);
        assert_eq!(s.resent(5, 2, 0xC), Some(20));
        assert_eq!(s.last_offset, 20);
        // In this process too, only the newest with an id counts.
        s.remember(st(5, 1, 21, 0xD));
        assert_eq!(s.resent(5, 2, 0xC), None);
        assert_eq!(s.resent(5, 1, 0xD), Some(21));
        assert_eq!(s.resent(6, 1, 0xB), Some(11));
    }

    #[test]
    fn session_ids_depend_on_the_log_and_the_client() {
        let a = MqttSessions::new(1);
        let b = MqttSessions::new(2);
        assert_eq!(a.session_id("pump-1"), a.session_id("pump-1"));
        assert_ne!(a.session_id("pump-1"), a.session_id("pump-2"));
        assert_ne!(a.session_id("pump-1"), b.session_id("pump-1"));
        assert_ne!(a.session_id("pump-1") & SESSION_ID_BIT, 0);
    }

    #[test]
    fn a_resend_must_match_topic_and_payload() {
        assert_eq!(message_crc("a", b"x"), message_crc("a", b"x"));
        assert_ne!(message_crc("a", b"x"), message_crc("a", b"y"));
        // The separator keeps topic and payload apart.
        assert_ne!(message_crc("ab", b"c"), message_crc("a", b"bc"));
    }
}

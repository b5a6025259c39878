//! The MQTT listener (`--listen mqtt://IP:PORT`): MQTT 3.1.1 and 5.0 clients publish into
//! the log. Publish only: each PUBLISH becomes one record (the MQTT topic is the record's
//! topic, the payload is kept as is); SUBSCRIBE and UNSUBSCRIBE are answered with the
//! protocol's failure codes. The retain flag, MQTT 5 content type and user properties are
//! dropped (records have no headers in this format).
//!
//! The packets are decoded and encoded by `mqtt-protocol-core`, a sans-I/O codec and
//! connection state machine (keep-alive, receive maximum, maximum packet size, QoS 2
//! packet-id state); this module only feeds it bytes, writes what it asks to send, and
//! turns its PUBLISH, PUBREL and CONNECT events into commands for the log thread.
//!
//! ## What each QoS means here
//! - QoS 0: stored once it reaches the log; no acknowledgement (MQTT has none). Durable
//!   with the next group flush.
//! - QoS 1: PUBACK once the record is durable (on flash and synced), whatever the
//!   gateway's `--ack`; `mqtt://…?ack=buffered` sends it once the record is in the log's
//!   RAM buffer instead. A resend (DUP=1) of one of the session's last stored records, same
//!   packet id, topic and payload, is acknowledged without being stored again.
//! - QoS 2: PUBREC once the record is durable; its packet id stays reserved until PUBREL,
//!   so a resend is not stored twice; PUBCOMP answers the PUBREL.
//!
//! ## Files of this module
//! - `mod.rs`: [`serve`], one connection's loop, and the codec's events and packets.
//! - `connect`: CONNECT (credentials, refusals, the session the log thread opens).
//! - `publish`: PUBLISH and PUBREL, the log thread's answers, reason codes.
//! - `sessions`: the log thread's side: persistent sessions and QoS 2 packet ids.
//!
//! Group commit is shared with every other listener: the log thread flushes once for all
//! that waits.
//!
//! ## Backpressure and limits
//! - A connection has at most [`RECEIVE_MAXIMUM`] QoS 1/2 publishes waiting for the log
//!   (plus what one read of the socket holds): its socket is not read beyond that (TCP
//!   backpressure), for MQTT 3.1.1 and 5 alike. No Receive Maximum is announced to MQTT 5
//!   clients: the codec would then disconnect a client that sends more, and paho-mqtt 2.x
//!   resends its whole queue after a reconnect whatever it was told, so every reconnect
//!   would end the same way (and store its first resends again).
//! - Log full (`reject-new`): MQTT 5 publishes get PUBACK/PUBREC with reason code 0x97
//!   (quota exceeded); for MQTT 3.1.1, which has no such code, the publish is kept, no
//!   PUBACK is sent and the socket is not read until the log takes it (TCP backpressure).
//! - Maximum packet size: the record limit plus room for topic and properties (MQTT 5
//!   clients are told in the CONNACK); a larger packet closes the connection (MQTT 5 with
//!   DISCONNECT 0x95).
//! - A topic of more than 255 bytes: PUBACK/PUBREC 0x90 (topic name invalid) for MQTT 5,
//!   the connection closed for MQTT 3.1.1; nothing stored.
//! - Keep-alive: a client silent for 1.5 times its keep-alive is disconnected; a
//!   connection that sends no CONNECT within [`CONNECT_TIMEOUT`] is closed, and one whose
//!   first bytes do not decode as a packet is closed at once.
//! - An empty client id gets one assigned (MQTT 5: sent back in the CONNACK); MQTT 3.1.1
//!   allows that only with a clean session.
//! - MQTT connections count toward `--max-connections`.
//!
//! ## Roles
//! MQTT connections only publish, so of a listener's `roles=` only `publish` matters
//! (the default). A listener whose roles lack it refuses every PUBLISH and counts it
//! (`spillway_refused_total{reason="forbidden"}`): MQTT 5 QoS 1 and 2 get PUBACK/PUBREC
//! with reason code 0x87 (not authorized), QoS 0 a DISCONNECT with 0x87; MQTT 3.1.1, which
//! has no such code, is disconnected (its §3.3.5 allows only that or a false
//! acknowledgement). Nothing is stored.
//!
//! ## Credentials
//! The CONNECT's password is a token of the config file's `[[credential]]` entries, checked
//! exactly as a `Hello`'s token ([`Access::check`]: its SHA-256 looked up among the
//! configured hashes, surrounding white space ignored). The user name must be the
//! credential's `name`, or empty: then the token alone names the credential, as in a
//! `Hello`. A password needs a user name (MQTT 3.1.1 [MQTT-3.1.2-22]; `mqtt-protocol-core`
//! holds MQTT 5 CONNECTs to the same rule, although MQTT 5 allows a password alone): a
//! CONNECT with a password and no user name is a protocol error and closes the connection
//! (counted as `mqtt_protocol`). A user name without a password is not a credential and
//! is ignored. An accepted connection
//! publishes under the listener's roles ∩ the credential's, and a credential without
//! `publish` is refused at once. A password is checked wherever it is given, loopback
//! listeners included (a client that sends one expects it to count); on a listener that
//! requires credentials (non-loopback, see `config::security::token_required`) a CONNECT
//! without a password is refused unless the peer has a client certificate verified
//! against `--tls-client-ca`, which admits it with the listener's roles.
//!
//! A refused CONNECT gets a CONNACK and the connection is closed, counted in
//! `spillway_refused_total{reason="unauthorized"}`, nothing stored: a wrong token, a user
//! name that is not the credential's, or a password where no credential is configured get
//! MQTT 5 reason code 0x86 (bad user name or password) / MQTT 3.1.1 return code 4; no
//! credential where one is required, or a credential without `publish`, get 0x87 (not
//! authorized) / return code 5. The password is never logged.

pub mod sessions;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_channel::Receiver;
use mqtt_protocol_core::mqtt::common::Cursor;
use mqtt_protocol_core::mqtt::connection::{ConnectionOptions, Event, TimerKind};
use mqtt_protocol_core::mqtt::packet::{
    AssignedClientIdentifier, GenericPacket, GenericPacketTrait, Packet, Property, Qos, v3_1_1,
    v5_0,
};
use mqtt_protocol_core::mqtt::result_code::{
    ConnectReasonCode, ConnectReturnCode, PubackReasonCode, PubrecReasonCode, SubackReasonCode,
    SubackReturnCode, UnsubackReasonCode,
};
use mqtt_protocol_core::mqtt::{Connection, Version, role::Server};
use smol::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use spillway_core::log::format::MAX_TOPIC_LEN;

use super::auth::{Access, Verdict, WRONG_TOKEN};
use super::config::MqttAck;
use super::engine::{Cmd, ConnId};
use super::net::Ctx;
mod connect;
mod publish;

pub use sessions::{MqttCmd, MqttPublish, MqttReply, RECEIVE_MAXIMUM, Refusal};

/// Time a connection has to send its CONNECT after it is accepted.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a write to a client may take; a client that does not read its acknowledgements for
/// that long is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a MQTT 3.1.1 publish refused by a full log waits before it is offered again.
pub const FULL_RETRY: Duration = Duration::from_millis(100);

/// Bytes a packet may have beyond the record limit: fixed header, topic (at most 255
/// bytes here) and properties.
pub const PACKET_OVERHEAD: u32 = 1024;

/// Bytes read from the socket at a time.
const READ_BUF: usize = 8 * 1024;

/// Longest client id accepted, bytes.
pub const MAX_CLIENT_ID_LEN: usize = 256;

/// What woke the connection up.
enum Wake {
    Read(std::io::Result<usize>),
    Reply(MqttReply),
    Timer,
}

/// One MQTT connection's state beside the codec's.
struct Link {
    conn: ConnId,
    peer: String,
    ack: MqttAck,
    /// The connection may publish: the listener's roles (∩ the credential's) include
    /// `publish`. Set when its CONNECT is admitted.
    may_publish: bool,
    /// The listener's roles, whether it requires a credential, the peer's certificate.
    access: Access,
    ctx: Ctx,
    mq: Connection<Server>,
    replies: async_channel::Sender<MqttReply>,
    /// The session's client id, once CONNECT was answered.
    client: Option<Arc<str>>,
    /// The client id assigned by the gateway (MQTT 5 CONNACK property).
    assigned: bool,
    /// A CONNECT waits for the log thread's answer: nothing else is read meanwhile.
    connecting: bool,
    connected: bool,
    /// QoS 1/2 publishes sent to the log thread and not answered.
    in_flight: usize,
    /// Keep-alive deadline.
    keep_alive: Option<Instant>,
    /// A 3.1.1 publish refused by a full log, offered again at this time.
    held: Option<(Instant, Box<MqttPublish>)>,
    /// Close after writing what is queued.
    closing: bool,
}

/// Serves one MQTT connection on `stream` until the client disconnects, an I/O or protocol
/// error, a keep-alive timeout, a takeover of its session, or a write that takes longer
/// than [`WRITE_TIMEOUT`]. Generic over the byte stream (TCP or TLS). `access` holds the
/// listener's roles, whether it requires a credential, and the peer's verified client
/// certificate: the CONNECT's user name and password are judged against it, and without
/// `publish` every PUBLISH is refused ([module docs](self)).
pub async fn serve<S>(mut stream: S, ack: MqttAck, access: Access, ctx: Ctx, peer: String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let conn: ConnId = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.metrics.connections.inc();
    ctx.metrics.listener_connection("mqtt");
    log::debug!("mqtt connection {conn} from {peer}");
    let max_packet = u32::try_from(ctx.max_record)
        .unwrap_or(u32::MAX)
        .saturating_add(PACKET_OVERHEAD);
    // No receive maximum is announced (module docs): clients of both versions are held
    // back by not being read.
    let opts = ConnectionOptions::new().maximum_packet_size_recv(max_packet);
    let mut mq = Connection::<Server>::with_options(Version::Undetermined, opts);
    mq.set_auto_ping_response(true);
    mq.set_auto_pub_response(false);
    // Unbounded as a channel, bounded by the receive maximum: one answer per publish.
    let (tx, rx) = async_channel::unbounded::<MqttReply>();
    let mut link = Link {
        conn,
        peer,
        ack,
        may_publish: false,
        access,
        ctx,
        mq,
        replies: tx,
        client: None,
        assigned: false,
        connecting: false,
        connected: false,
        in_flight: 0,
        keep_alive: None,
        held: None,
        closing: false,
    };
    let connect_by = Instant::now() + CONNECT_TIMEOUT;
    let mut buf = vec![0u8; READ_BUF];
    while !link.closing {
        let now = Instant::now();
        let readable = !link.connecting
            && link.held.is_none()
            && link.in_flight < usize::from(RECEIVE_MAXIMUM);
        let mut deadline = link.keep_alive;
        if !link.connected {
            deadline = Some(deadline.map_or(connect_by, |d| d.min(connect_by)));
        }
        if let Some((at, _)) = &link.held {
            deadline = Some(deadline.map_or(*at, |d| d.min(*at)));
        }
        let wake = wait(&mut stream, &mut buf, readable, &rx, deadline).await;
        match wake {
            Wake::Read(Ok(0)) | Wake::Read(Err(_)) => break,
            Wake::Read(Ok(n)) => {
                let mut cursor = Cursor::new(&buf[..n]);
                while (cursor.position() as usize) < n && !link.closing {
                    let before = cursor.position();
                    // The codec answers a QoS 2 PUBLISH whose packet id it saw on this
                    // connection with a PUBREC of its own, at once, before the record is
                    // durable. Forget those ids: the log thread's reserved ids decide, and
                    // it answers when the record is durable.
                    link.mq.restore_qos2_publish_handled(Default::default());
                    let events = link.mq.recv(&mut cursor);
                    link.events(&mut stream, events).await;
                    if cursor.position() == before {
                        break;
                    }
                }
            }
            Wake::Reply(r) => link.reply(&mut stream, r).await,
            Wake::Timer => {
                let now = Instant::now().max(now);
                if !link.connected && now >= connect_by {
                    log::warn!(
                        "mqtt connection {conn} from {}: no CONNECT within {CONNECT_TIMEOUT:?}; closing",
                        link.peer
                    );
                    break;
                }
                if link.keep_alive.is_some_and(|k| now >= k) {
                    link.keep_alive = None;
                    log::info!(
                        "mqtt connection {conn} from {}: keep-alive expired; closing",
                        link.peer
                    );
                    let events = link.mq.notify_timer_fired(TimerKind::PingreqRecv);
                    link.events(&mut stream, events).await;
                    break;
                }
                if let Some((at, _)) = &link.held
                    && now >= *at
                    && let Some((_, p)) = link.held.take()
                {
                    link.in_flight += 1;
                    if link
                        .ctx
                        .cmds
                        .send(Cmd::Mqtt(MqttCmd::Publish(p)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    }
    if let Some(client) = link.client.take() {
        let _ = link
            .ctx
            .cmds
            .send(Cmd::Mqtt(MqttCmd::Closed { conn, client }))
            .await;
    }
    log::debug!("mqtt connection {conn} from {} closed", link.peer);
}

/// Waits for bytes from the client (only when `readable`), an answer of the log thread,
/// or `deadline`.
async fn wait<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    readable: bool,
    rx: &Receiver<MqttReply>,
    deadline: Option<Instant>,
) -> Wake {
    let reply = async {
        match rx.recv().await {
            Ok(r) => Wake::Reply(r),
            // Never: the link holds a sender.
            Err(_) => std::future::pending().await,
        }
    };
    let timer = async {
        match deadline {
            Some(at) => {
                smol::Timer::at(at).await;
                Wake::Timer
            }
            None => std::future::pending().await,
        }
    };
    // Answers first: they free the budget that reading needs.
    let others = smol::future::or(reply, timer);
    if readable {
        smol::future::or(others, async { Wake::Read(stream.read(buf).await) }).await
    } else {
        others.await
    }
}

impl Link {
    fn v5(&self) -> bool {
        self.mq.get_protocol_version() == Version::V5_0
    }

    /// Writes `packet` (bounded by [`WRITE_TIMEOUT`]); a failure closes the connection.
    async fn write<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, packet: &Packet) {
        let bytes = packet.to_continuous_buffer();
        let write = async {
            stream.write_all(&bytes).await?;
            stream.flush().await
        };
        let timeout = async {
            smol::Timer::after(WRITE_TIMEOUT).await;
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client does not read",
            ))
        };
        if let Err(e) = smol::future::or(write, timeout).await {
            log::info!(
                "mqtt connection {} from {}: write failed: {e}; closing",
                self.conn,
                self.peer
            );
            self.closing = true;
        }
    }

    /// Hands `packet` to the codec and carries out what it asks.
    async fn send<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, packet: Packet) {
        let events = self.mq.send(packet);
        Box::pin(self.events(stream, events)).await;
    }

    /// Carries out the codec's events.
    async fn events<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, events: Vec<Event>) {
        for ev in events {
            if self.closing && !matches!(ev, Event::NotifyError(_)) {
                continue;
            }
            match ev {
                Event::RequestSendPacket { packet, .. } => self.write(stream, &packet).await,
                Event::RequestClose => self.closing = true,
                Event::NotifyError(e) => {
                    self.ctx.metrics.ingest_error("mqtt_protocol");
                    log::info!("mqtt connection {} from {}: {e:?}", self.conn, self.peer);
                    // The first packet must be a CONNECT (MQTT 3.1.1 [MQTT-3.1.0-1], 5.0
                    // 3.1): bytes that do not decode as one come from a client of another
                    // protocol (a Spillway client, an HTTP request), which is told so by
                    // the close at once rather than by the CONNECT timeout.
                    if !self.connected && !self.connecting {
                        self.closing = true;
                    }
                }
                Event::RequestTimerReset {
                    kind: TimerKind::PingreqRecv,
                    duration_ms,
                } => {
                    self.keep_alive = Some(Instant::now() + Duration::from_millis(duration_ms));
                }
                Event::RequestTimerCancel(TimerKind::PingreqRecv) => self.keep_alive = None,
                Event::NotifyPacketReceived(p) => self.packet(stream, p).await,
                _ => {}
            }
        }
    }

    /// A packet the codec decoded and checked.
    async fn packet<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, p: Packet) {
        match p {
            GenericPacket::V3_1_1Connect(c) => {
                let id = c.client_id().to_string();
                if self.admit(stream, c.user_name(), c.password()).await {
                    self.connect(stream, id, c.clean_session(), !c.clean_session())
                        .await;
                }
            }
            GenericPacket::V5_0Connect(c) => {
                let expiry = c.props().iter().find_map(|p| match p {
                    Property::SessionExpiryInterval(v) => Some(v.val()),
                    _ => None,
                });
                let id = c.client_id().to_string();
                if self.admit(stream, c.user_name(), c.password()).await {
                    self.connect(stream, id, c.clean_start(), expiry.unwrap_or(0) > 0)
                        .await;
                }
            }
            GenericPacket::V3_1_1Publish(p) => {
                let (qos, pid, dup) = (p.qos(), p.packet_id(), p.dup());
                let payload = p.payload().as_slice().to_vec();
                self.publish(stream, qos, pid, dup, p.topic_name(), payload)
                    .await;
            }
            GenericPacket::V5_0Publish(p) => {
                let (qos, pid, dup) = (p.qos(), p.packet_id(), p.dup());
                let payload = p.payload().as_slice().to_vec();
                self.publish(stream, qos, pid, dup, p.topic_name(), payload)
                    .await;
            }
            GenericPacket::V3_1_1Pubrel(r) => self.release(stream, r.packet_id()).await,
            GenericPacket::V5_0Pubrel(r) => self.release(stream, r.packet_id()).await,
            GenericPacket::V3_1_1Subscribe(s) => {
                let codes = vec![SubackReturnCode::Failure; s.entries().len()];
                if let Ok(ack) = v3_1_1::Suback::builder()
                    .packet_id(s.packet_id())
                    .return_codes(codes)
                    .build()
                {
                    self.send(stream, ack.into()).await;
                }
            }
            GenericPacket::V5_0Subscribe(s) => {
                let codes = vec![SubackReasonCode::ImplementationSpecificError; s.entries().len()];
                if let Ok(ack) = v5_0::Suback::builder()
                    .packet_id(s.packet_id())
                    .reason_codes(codes)
                    .build()
                {
                    self.send(stream, ack.into()).await;
                }
            }
            GenericPacket::V3_1_1Unsubscribe(u) => {
                if let Ok(ack) = v3_1_1::Unsuback::builder().packet_id(u.packet_id()).build() {
                    self.send(stream, ack.into()).await;
                }
            }
            GenericPacket::V5_0Unsubscribe(u) => {
                let codes = vec![UnsubackReasonCode::NoSubscriptionExisted; u.entries().len()];
                if let Ok(ack) = v5_0::Unsuback::builder()
                    .packet_id(u.packet_id())
                    .reason_codes(codes)
                    .build()
                {
                    self.send(stream, ack.into()).await;
                }
            }
            GenericPacket::V3_1_1Disconnect(_) | GenericPacket::V5_0Disconnect(_) => {
                self.closing = true;
            }
            _ => {}
        }
    }
}

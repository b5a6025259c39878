//! A connection's PUBLISH and PUBREL: records handed to the log thread, the log thread's
//! answers turned into PUBACK, PUBREC and PUBCOMP, and refusals with their reason codes.

use super::*;

/// The reason code of a refused QoS 1 publish for MQTT 5.
fn puback_code(why: Refusal) -> PubackReasonCode {
    match why {
        Refusal::Full => PubackReasonCode::QuotaExceeded,
        Refusal::BadTopic => PubackReasonCode::TopicNameInvalid,
        Refusal::TooLarge => PubackReasonCode::ImplementationSpecificError,
        Refusal::Storage => PubackReasonCode::UnspecifiedError,
        Refusal::NotAuthorized => PubackReasonCode::NotAuthorized,
    }
}

/// The reason code of a refused QoS 2 publish for MQTT 5.
fn pubrec_code(why: Refusal) -> PubrecReasonCode {
    match why {
        Refusal::Full => PubrecReasonCode::QuotaExceeded,
        Refusal::BadTopic => PubrecReasonCode::TopicNameInvalid,
        Refusal::TooLarge => PubrecReasonCode::ImplementationSpecificError,
        Refusal::Storage => PubrecReasonCode::UnspecifiedError,
        Refusal::NotAuthorized => PubrecReasonCode::NotAuthorized,
    }
}

/// The acknowledgement of the publish `pid` of QoS `qos` for an MQTT 5 (`v5`) or 3.1.1
/// client: a PUBACK (QoS 1) or PUBREC (QoS 2), carrying the reason code of `refused`
/// (MQTT 5 only) or none for a stored publish; `None` for QoS 0, which has none.
fn acknowledgement(qos: u8, v5: bool, pid: u16, refused: Option<Refusal>) -> Option<Packet> {
    match (qos, v5) {
        (1, true) => {
            let b = v5_0::Puback::builder().packet_id(pid);
            match refused {
                Some(why) => b.reason_code(puback_code(why)),
                None => b,
            }
            .build()
            .ok()
            .map(Into::into)
        }
        (2, true) => {
            let b = v5_0::Pubrec::builder().packet_id(pid);
            match refused {
                Some(why) => b.reason_code(pubrec_code(why)),
                None => b,
            }
            .build()
            .ok()
            .map(Into::into)
        }
        (1, false) => v3_1_1::Puback::builder()
            .packet_id(pid)
            .build()
            .ok()
            .map(Into::into),
        (2, false) => v3_1_1::Pubrec::builder()
            .packet_id(pid)
            .build()
            .ok()
            .map(Into::into),
        _ => None,
    }
}

impl Link {
    /// A PUBLISH: checked here (topic length), stored by the log thread.
    pub(super) async fn publish<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        qos: Qos,
        pid: Option<u16>,
        dup: bool,
        topic: &str,
        payload: Vec<u8>,
    ) {
        let Some(client) = self.client.clone() else {
            self.closing = true;
            return;
        };
        let qos = match qos {
            Qos::AtMostOnce => 0,
            Qos::AtLeastOnce => 1,
            Qos::ExactlyOnce => 2,
        };
        let pid = pid.unwrap_or(0);
        if !self.may_publish {
            self.ctx.metrics.refused_forbidden();
            log::info!(
                "mqtt connection {} from {}: PUBLISH refused: the connection's roles lack publish",
                self.conn,
                self.peer
            );
            self.refused(stream, qos, pid, Refusal::NotAuthorized).await;
            return;
        }
        if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
            self.ctx.metrics.ingest_error("mqtt_topic");
            log::info!(
                "mqtt connection {} from {}: topic of {} bytes refused (1 to {MAX_TOPIC_LEN})",
                self.conn,
                self.peer,
                topic.len()
            );
            self.refused(stream, qos, pid, Refusal::BadTopic).await;
            return;
        }
        if qos > 0 {
            self.in_flight += 1;
        }
        let p = MqttPublish {
            conn: self.conn,
            client,
            qos,
            pid,
            dup,
            topic: topic.to_string(),
            payload,
            durable: self.ack == MqttAck::Durable,
            replies: self.replies.clone(),
        };
        if self
            .ctx
            .cmds
            .send(Cmd::Mqtt(MqttCmd::Publish(Box::new(p))))
            .await
            .is_err()
        {
            self.closing = true;
        }
    }

    /// A PUBREL: frees the packet id in the session and answers PUBCOMP.
    pub(super) async fn release<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, pid: u16) {
        if let Some(client) = self.client.clone() {
            let cmd = MqttCmd::Release {
                conn: self.conn,
                client,
                pid,
            };
            if self.ctx.cmds.send(Cmd::Mqtt(cmd)).await.is_err() {
                self.closing = true;
                return;
            }
        }
        let packet: Packet = if self.v5() {
            v5_0::Pubcomp::builder()
                .packet_id(pid)
                .build()
                .map(Into::into)
        } else {
            v3_1_1::Pubcomp::builder()
                .packet_id(pid)
                .build()
                .map(Into::into)
        }
        .expect("a PUBCOMP with a packet id always builds");
        self.send(stream, packet).await;
    }

    /// An answer of the log thread.
    pub(super) async fn reply<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, r: MqttReply) {
        match r {
            MqttReply::Connected { session_present } => {
                self.connecting = false;
                self.connected = true;
                let packet: Packet = if self.v5() {
                    let mut props = Vec::new();
                    if self.assigned
                        && let Some(c) = &self.client
                        && let Ok(p) = AssignedClientIdentifier::new(c.to_string())
                    {
                        props.push(Property::AssignedClientIdentifier(p));
                    }
                    v5_0::Connack::builder()
                        .session_present(session_present)
                        .reason_code(ConnectReasonCode::Success)
                        .props(props)
                        .build()
                        .map(Into::into)
                } else {
                    v3_1_1::Connack::builder()
                        .session_present(session_present)
                        .return_code(ConnectReturnCode::Accepted)
                        .build()
                        .map(Into::into)
                }
                .expect("a CONNACK always builds");
                self.send(stream, packet).await;
            }
            MqttReply::Busy => {
                self.client = None;
                log::warn!(
                    "mqtt connection {} from {}: refused: {} persistent sessions in use",
                    self.conn,
                    self.peer,
                    sessions::MAX_SESSIONS
                );
                self.ctx.metrics.ingest_error("mqtt_sessions_full");
                let (v5, v3) = (
                    ConnectReasonCode::ServerBusy,
                    ConnectReturnCode::ServerUnavailable,
                );
                self.refuse_connect(stream, v5, v3).await;
            }
            MqttReply::TakenOver => {
                // The session is another connection's now: nothing of ours to release.
                self.client = None;
                if self.v5()
                    && let Ok(d) = v5_0::Disconnect::builder()
                        .reason_code(
                            mqtt_protocol_core::mqtt::result_code::DisconnectReasonCode::SessionTakenOver,
                        )
                        .build()
                {
                    self.send(stream, d.into()).await;
                }
                self.closing = true;
            }
            MqttReply::Stored { qos, pid } => {
                self.in_flight = self.in_flight.saturating_sub(1);
                if let Some(p) = acknowledgement(qos, self.v5(), pid, None) {
                    self.send(stream, p).await;
                }
            }
            MqttReply::Refused {
                qos,
                pid,
                why,
                back,
            } => {
                if qos > 0 {
                    self.in_flight = self.in_flight.saturating_sub(1);
                }
                // The gateway counted them (full, too_large, invalid, internal).
                if why == Refusal::Full && !self.v5() {
                    // MQTT 3.1.1 cannot say "full": keep the publish (QoS 1 and 2), stop
                    // reading, offer it again later.
                    if let Some(p) = back
                        && qos > 0
                    {
                        self.held = Some((Instant::now() + FULL_RETRY, p));
                    } else {
                        // QoS 0: lost, as QoS 0 allows; still hold the client back.
                        self.held = None;
                        smol::Timer::after(FULL_RETRY).await;
                    }
                    return;
                }
                self.refused(stream, qos, pid, why).await;
            }
        }
    }

    /// Tells the client a publish was not stored: MQTT 5 by reason code, MQTT 3.1.1 (which
    /// has none) by closing the connection.
    pub(super) async fn refused<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        qos: u8,
        pid: u16,
        why: Refusal,
    ) {
        if !self.v5() {
            log::info!(
                "mqtt connection {} from {}: publish refused ({why:?}); closing (MQTT 3.1.1 has no reason codes)",
                self.conn,
                self.peer
            );
            self.closing = true;
            return;
        }
        let packet: Option<Packet> = match qos {
            1 | 2 => acknowledgement(qos, true, pid, Some(why)),
            // QoS 0 has no acknowledgement to carry a reason code: a publish the listener
            // does not allow ends the connection, so the client learns of it.
            _ if why == Refusal::NotAuthorized => v5_0::Disconnect::builder()
                .reason_code(
                    mqtt_protocol_core::mqtt::result_code::DisconnectReasonCode::NotAuthorized,
                )
                .build()
                .ok()
                .map(Into::into),
            _ => None,
        };
        if let Some(p) = packet {
            self.send(stream, p).await;
        }
        if qos == 0 && why == Refusal::NotAuthorized {
            self.closing = true;
        }
    }
}

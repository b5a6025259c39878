//! A connection's CONNECT: the credential check, the refusing CONNACKs, and the session
//! opened by the log thread.

use super::*;

impl Link {
    /// Judges a CONNECT's user name and password ([module docs](self)): true if the
    /// connection is admitted (and `may_publish` set); else the CONNACK refusal is sent,
    /// counted, and the connection closes.
    pub(super) async fn admit<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> bool {
        let user = user.filter(|u| !u.is_empty());
        // (bad user name or password, not authorized) and why.
        let refused: (bool, &str) = match self.access.check(password) {
            Verdict::Anonymous => {
                self.may_publish = self.access.roles.publish;
                return true;
            }
            Verdict::Credential(c) if user.is_some_and(|u| u != c.name) => (
                true,
                "the user name is not the name of the token's credential",
            ),
            Verdict::Credential(c) if !c.roles.publish => {
                (false, "the credential's roles lack publish")
            }
            Verdict::Credential(c) => {
                log::debug!(
                    "mqtt connection {} from {}: credential {:?}",
                    self.conn,
                    self.peer,
                    c.name
                );
                self.may_publish = self.access.roles.intersect(c.roles).publish;
                return true;
            }
            Verdict::NotConfigured => (
                true,
                "a password is given and no credential is configured on this gateway",
            ),
            Verdict::Wrong => (true, WRONG_TOKEN),
            Verdict::Missing => (
                false,
                "this listener requires a credential: a token as the password, or a client certificate",
            ),
        };
        let (bad_password, why) = refused;
        log::warn!(
            "mqtt connection {} from {}: CONNECT refused: {why}",
            self.conn,
            self.peer
        );
        self.ctx.metrics.refused_unauthorized();
        let (v5, v3) = if bad_password {
            (
                ConnectReasonCode::BadUserNameOrPassword,
                ConnectReturnCode::BadUserNameOrPassword,
            )
        } else {
            (
                ConnectReasonCode::NotAuthorized,
                ConnectReturnCode::NotAuthorized,
            )
        };
        self.refuse_connect(stream, v5, v3).await;
        false
    }

    /// Refuses the CONNECT with `v5` (an MQTT 5 client) or `v3` (MQTT 3.1.1) in a CONNACK
    /// without a session, and closes the connection once it is written.
    pub(super) async fn refuse_connect<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        v5: ConnectReasonCode,
        v3: ConnectReturnCode,
    ) {
        let packet: Packet = if self.v5() {
            v5_0::Connack::builder()
                .session_present(false)
                .reason_code(v5)
                .build()
                .map(Into::into)
        } else {
            v3_1_1::Connack::builder()
                .session_present(false)
                .return_code(v3)
                .build()
                .map(Into::into)
        }
        .expect("a CONNACK without properties always builds");
        self.send(stream, packet).await;
        self.closing = true;
    }

    /// A CONNECT: checks the client id (assigning one if empty) and asks the log thread
    /// for the session; the CONNACK goes out with its answer.
    pub(super) async fn connect<S: AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        mut id: String,
        clean: bool,
        persistent: bool,
    ) {
        let v5 = self.v5();
        let refuse = if id.len() > MAX_CLIENT_ID_LEN {
            true
        } else if id.is_empty() {
            if !v5 && !clean {
                // MQTT 3.1.1: a server may assign an id only to a clean session.
                true
            } else {
                id = format!("spillway-{:016x}", rand::random::<u64>());
                self.assigned = true;
                false
            }
        } else {
            false
        };
        if refuse {
            self.ctx.metrics.ingest_error("mqtt_client_id");
            let (v5, v3) = (
                ConnectReasonCode::ClientIdentifierNotValid,
                ConnectReturnCode::IdentifierRejected,
            );
            self.refuse_connect(stream, v5, v3).await;
            return;
        }
        let client: Arc<str> = Arc::from(id);
        self.client = Some(client.clone());
        self.connecting = true;
        let cmd = MqttCmd::Connect {
            conn: self.conn,
            client,
            clean,
            persistent,
            replies: self.replies.clone(),
        };
        if self.ctx.cmds.send(Cmd::Mqtt(cmd)).await.is_err() {
            self.closing = true;
        }
    }
}

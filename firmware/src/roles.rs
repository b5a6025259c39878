//! Roles: what one connection may ask of the gateway, checked per request by
//! [`Gateway`](crate::Gateway) before anything is read or changed.
//!
//! | role | requests |
//! |---|---|
//! | `publish` | `Publish`, `OpenSession`, `SessionPublish` (and text lines) |
//! | `consume` | `Fetch`, `Stats`, `ListConsumers`, and `Commit` for the consumers the role names ([`Roles::consumers`]; a first commit creates the consumer) |
//! | `admin` | `DeleteConsumer`, and `Commit` for any consumer |
//!
//! `Hello` is always allowed. A refused request gets
//! [`ErrorCode::Forbidden`](spillway_core::wire::ErrorCode::Forbidden) (a version 1 or 2
//! client gets `BadRequest`), is counted in
//! [`GatewayCounters::forbidden`](crate::GatewayCounters::forbidden) and changes nothing.
//!
//! A role set is `Copy` and allocates nothing: the consumer names are a `'static` slice
//! (constants on a microcontroller; on Linux the credential table, loaded once at start,
//! lives as long as the process). Checking credentials and deciding which roles a
//! connection gets is the caller's business (the Linux binary hashes tokens; nothing here
//! hashes).

use spillway_core::wire::Request;

/// The role a refused request needed, for the error message and the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `publish`.
    Publish,
    /// `consume`.
    Consume,
    /// `admin`.
    Admin,
}

impl Role {
    /// The role's name as the configuration spells it (`publish`, `consume`, `admin`).
    pub const fn name(self) -> &'static str {
        match self {
            Role::Publish => "publish",
            Role::Consume => "consume",
            Role::Admin => "admin",
        }
    }
}

/// A set of roles; see the [module documentation](self) for what each allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// May publish records.
    pub publish: bool,
    /// May fetch, read statistics, list consumers and commit the consumers of
    /// [`Roles::consumers`].
    pub consume: bool,
    /// May delete consumers and commit any consumer.
    pub admin: bool,
    /// The consumers `consume` may commit: `None` for any name, `Some(&[])` for none.
    pub consumers: Option<&'static [&'static str]>,
}

impl Default for Roles {
    /// [`Roles::ALL`]: what a connection could do before roles existed.
    fn default() -> Self {
        Roles::ALL
    }
}

impl Roles {
    /// Every role, any consumer.
    pub const ALL: Roles = Roles {
        publish: true,
        consume: true,
        admin: true,
        consumers: None,
    };

    /// Publishing only (what a sensor needs).
    pub const PUBLISH: Roles = Roles {
        publish: true,
        consume: false,
        admin: false,
        consumers: None,
    };

    /// No role: every request but `Hello` is refused.
    pub const NONE: Roles = Roles {
        publish: false,
        consume: false,
        admin: false,
        consumers: None,
    };

    /// What both `self` and `other` allow (a listener's roles and a credential's). The
    /// consumer names are those of whichever side names some (a listener names none); if
    /// both do, `other`'s.
    pub fn intersect(self, other: Roles) -> Roles {
        Roles {
            publish: self.publish && other.publish,
            consume: self.consume && other.consume,
            admin: self.admin && other.admin,
            consumers: other.consumers.or(self.consumers),
        }
    }

    /// Whether `consume` may commit the consumer `name`.
    fn names(&self, name: &str) -> bool {
        self.consumers.is_none_or(|list| list.contains(&name))
    }

    /// Checks one request against the set: `Ok` or the role it lacks.
    pub fn check(&self, req: &Request<'_>) -> Result<(), Role> {
        let allowed = |yes: bool, role: Role| if yes { Ok(()) } else { Err(role) };
        match *req {
            Request::Hello { .. } => Ok(()),
            Request::Publish { .. }
            | Request::OpenSession { .. }
            | Request::SessionPublish { .. } => allowed(self.publish, Role::Publish),
            Request::Fetch { .. }
            | Request::FindOffset { .. }
            | Request::Stats { .. }
            | Request::ListConsumers { .. } => allowed(self.consume, Role::Consume),
            Request::Commit { consumer, .. } => {
                if self.admin || (self.consume && self.names(consumer)) {
                    Ok(())
                } else if self.consume {
                    // Consuming, but not this consumer: only an admin may.
                    Err(Role::Admin)
                } else {
                    Err(Role::Consume)
                }
            }
            Request::DeleteConsumer { .. } | Request::DeleteConsumerIfNotLast { .. } => {
                allowed(self.admin, Role::Admin)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::wire::AckLevel;

    fn commit(consumer: &str) -> Request<'_> {
        Request::Commit {
            seq: 1,
            consumer,
            offset: 0,
        }
    }

    #[test]
    fn a_consumer_list_limits_commits_but_not_admins() {
        let r = Roles {
            consumers: Some(&["kafka"]),
            ..Roles {
                admin: false,
                ..Roles::ALL
            }
        };
        assert_eq!(r.check(&commit("kafka")), Ok(()));
        assert_eq!(r.check(&commit("other")), Err(Role::Admin));
        assert_eq!(Roles::ALL.check(&commit("other")), Ok(()));
        assert_eq!(
            r.check(&Request::DeleteConsumer {
                seq: 1,
                consumer: "kafka"
            }),
            Err(Role::Admin)
        );
    }

    #[test]
    fn publish_only_may_not_consume_commit_or_delete() {
        let p = Roles::PUBLISH;
        let publish = Request::Publish {
            seq: 1,
            topic: "t",
            timestamp_us: None,
            payload: b"x",
            ack: AckLevel::Buffered,
            producer: None,
        };
        assert_eq!(p.check(&publish), Ok(()));
        assert_eq!(p.check(&commit("c")), Err(Role::Consume));
        assert_eq!(p.check(&Request::Stats { seq: 1 }), Err(Role::Consume));
        // A search by time reads the log as a fetch does.
        let find = Request::FindOffset {
            seq: 1,
            timestamp_us: 0,
            from_offset: 0,
        };
        assert_eq!(p.check(&find), Err(Role::Consume));
        assert_eq!(Roles::ALL.check(&find), Ok(()));
        assert_eq!(
            p.check(&Request::DeleteConsumer {
                seq: 1,
                consumer: "c"
            }),
            Err(Role::Admin)
        );
    }

    #[test]
    fn intersection_keeps_what_both_allow_and_the_credentials_names() {
        let listener = Roles {
            admin: false,
            ..Roles::ALL
        };
        let cred = Roles {
            publish: false,
            consume: true,
            admin: true,
            consumers: Some(&["a"]),
        };
        let both = listener.intersect(cred);
        assert_eq!(
            both,
            Roles {
                publish: false,
                consume: true,
                admin: false,
                consumers: Some(&["a"]),
            }
        );
    }
}

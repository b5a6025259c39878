//! # spillway-firmware
//!
//! The Spillway gateway: the logic that turns protocol requests into log operations, with
//! no I/O of its own, plus (feature `std`) the Linux binary `spillway`.
//!
//! - [`gateway`]: the sans-IO core. [`Gateway`] takes one decoded request (or one text line),
//!   a `&mut` [`Log`](spillway_core::log::Log) and the clocks, and writes the reply frame
//!   into the caller's buffer; durable publishes tell the caller to wait for the next
//!   group flush ([`Outcome::ReplyWhenDurable`]).
//! - [`session`]: [`Session`], a blocking server of one `embedded_io` transport for
//!   microcontrollers, with bounded (heapless) buffers and flush-on-durable.
//! - [`roles`]: [`Roles`], what one connection may ask (publish, consume, admin), checked
//!   per request without allocation.
//! - [`mount`]: [`serve_remounting`], which mounts the log and, after a storage failure
//!   poisons it, mounts it again in place (a microcontroller has no supervisor to restart
//!   it).
//!
//! Without the `std` feature the crate is `#![no_std]` and allocates nothing.
//!
//! ## Features
//! - `std` (default): the `spillway` binary and its modules; logs through `log`.
//! - `defmt`: log through `defmt` (wins over `log`).
//! - `log`: log through the `log` facade.
//!
//! ## Exit codes of `spillway`
//! | code | meaning |
//! |---|---|
//! | 0 | success; `run` stopped by SIGTERM/SIGINT after a clean shutdown |
//! | 1 | run-time failure: flash I/O (a failed write, erase or sync of the image: a supervisor restarts the gateway, which remounts it), a listener that cannot be served |
//! | 2 | usage or configuration error (bad flag, bad config file, bad URI) |
//! | 3 | the image cannot be used: locked by another gateway, geometry disagrees, not a Spillway image |
//! | 4 | `inspect` found corruption in the records (a segment or batch CRC that does not verify, a corrupt lost range); a `not_persisted` range (offsets reserved before a crash and never persisted) and a damaged journal entry (a warning) are not |
#![cfg_attr(not(feature = "std"), no_std)]

// The logging macros (`trace!` .. `error!`): spillway-core's shim, see its `fmt.rs`.
#[macro_use]
extern crate spillway_core;

pub mod gateway;
pub mod mount;
pub mod roles;
pub mod session;

pub use gateway::{
    Auth, Conn, FIND_STEP_BYTES, Gateway, GatewayConfig, GatewayCounters, LineAccepted,
    LineRejected, Outcome,
};
pub use mount::{Mounted, ServeError, serve_remounting};
pub use roles::{Role, Roles};
pub use session::{Mode, PollReport, Session, SessionError};

//! # spillway-core
//!
//! The storage engine and the wire types of Spillway, a store-and-forward message queue for
//! edge gateways: `#![no_std]`, no allocation, sans-IO (the caller passes the time and the
//! log id; nothing here reads a clock, spawns a thread or draws a random number).
//!
//! - [`storage`]: the flash partition the log lives on, with adapters for any
//!   `embedded_storage::nor_flash::NorFlash`, a simulated NOR flash (feature `sim`) and a
//!   flash image file (feature `std`).
//! - [`log`]: the power-cut-safe segmented log: RAM buffer with group commit and spill
//!   policy, recovery, retention, committed offsets per consumer. The on-flash format is
//!   documented in `FORMAT.md`.
//! - [`wire`]: the framed protocol spoken between sensors, gateway and bridge
//!   (`PROTOCOL.md`).
//!
//! ## Features
//! - `std`: file image storage and `std::error::Error` on the error types.
//! - `cli`: what the Linux binaries share about their command lines ([`cli`]: URIs,
//!   sizes, durations, the config file under the flags).
//! - `sim`: the simulated flash used by tests and benchmarks.
//! - `small-crc`: CRC-32 through a 1 KiB table instead of `crc32fast`'s 16 KiB ones
//!   ([`crc`]), for microcontrollers with little flash; same values, slower.
//! - `defmt` / `log`: where the engine's log lines go (`defmt` wins if both are on).
#![no_std]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "std")]
extern crate std;

#[macro_use]
mod fmt;

#[cfg(feature = "cli")]
pub mod cli;
pub mod crc;
pub mod error;
pub mod log;
pub mod storage;
pub mod wire;

pub use error::{
    AppendError, CommitError, FlushError, FormatError, MountError, ReadError, SeqSpace,
    SessionError, StorageOp,
};
pub use log::{Config, FullPolicy, Log, Memory, Record, SegmentSlot, SpillPolicy};

//! Shared helpers for Spillway's end-to-end tests and benchmarks: a blocking protocol
//! [`client`] and a [`gateway`] process harness that builds and starts the real `spillway`
//! binary.

pub mod bridge;
pub mod client;
pub mod gateway;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, FetchedRecord, Reply};
pub use gateway::{GatewayProcess, spillway_bin};

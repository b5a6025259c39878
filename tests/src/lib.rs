//! Shared helpers for Spillway's end-to-end tests and benchmarks: a blocking protocol
//! [`client`], a [`gateway`] process harness that builds and starts the real `spillway`
//! binary, the bridge harness, the core benchmark's measuring functions, and the NATS
//! JetStream peer of the gateway benchmark ([`nats`]).

pub mod bench_core;
pub mod bridge;
pub mod client;
pub mod gateway;
pub mod nats;
pub mod ram_nor;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, FetchedRecord, Reply};
pub use gateway::{GatewayProcess, spillway_bin};

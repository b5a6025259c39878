//! Shared helpers for Spillway's end-to-end tests and benchmarks: a blocking protocol
//! [`client`], a [`gateway`] process harness that builds and starts the real `spillway`
//! binary, the same for the [`bridge`], the core benchmark's measuring functions, the NATS
//! JetStream peer of the gateway benchmark ([`nats`]), a [`kafka`] broker (real or mock) with
//! a whole-topic consumer, and the [`demo`] scenario (also the `spillway-demo` binary).

pub mod bench_core;
pub mod bridge;
pub mod client;
pub mod demo;
pub mod gateway;
pub mod kafka;
pub mod nats;
pub mod ram_nor;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, FetchedRecord, Reply};
pub use gateway::{GatewayProcess, spillway_bin};

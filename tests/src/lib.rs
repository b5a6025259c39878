//! Shared helpers for Spillway's end-to-end tests and benchmarks: a blocking protocol
//! [`client`], a [`gateway`] process harness that builds and starts the real `spillway`
//! binary, the bridge harness, the NATS JetStream peer ([`nats`]), and the benchmarks'
//! measuring code: the core against `sequential-storage` ([`bench_core`]), gateway ingest
//! against NATS ([`bench_gateway`]), bridge drain against a plain Kafka producer
//! ([`bench_kafka`]), footprint beside nats-server and mosquitto ([`bench_footprint`]), and
//! the report's [`plot`]s.

pub mod bench_all;
pub mod bench_core;
pub mod bench_footprint;
pub mod bench_gateway;
pub mod bench_kafka;
pub mod bridge;
pub mod client;
pub mod gateway;
pub mod nats;
pub mod plot;
pub mod ram_nor;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, FetchedRecord, Reply};
pub use gateway::{GatewayProcess, spillway_bin};

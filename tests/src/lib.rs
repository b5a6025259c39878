//! Shared helpers for Spillway's end-to-end tests and benchmarks: the bridge's protocol
//! client called from blocking code ([`client`]), a [`gateway`] process harness that builds and starts the real `spillway`
//! binary, the same for the [`bridge`], signals and bounded waits for both ([`process`]),
//! bounded waits on observable state ([`wait`]), the [`faultfs`] fault-injection shim for
//! them, certificates and tokens made at run time ([`pki`]), a file sink's files read back
//! in record order ([`sink_files`]), the NATS JetStream peer ([`nats`]), a [`kafka`] broker
//! (real or mock) with a whole-topic consumer, a [`mosquitto`] broker, the [`demo`]
//! scenario (also the `spillway-demo` binary), and the benchmarks' measuring code: the core
//! against `sequential-storage` ([`bench_core`], the peer's flash in RAM [`ram_nor`]),
//! compression on the real series ([`bench_compression`]), gateway ingest against NATS
//! ([`bench_gateway`]), bridge drain against a plain Kafka producer ([`bench_kafka`]) and
//! into files against a plain writer ([`bench_file_sink`]), one bridge for many gateways
//! and its uplink cap ([`bench_fleet`]), footprint beside nats-server and mosquitto
//! ([`bench_footprint`]), MQTT QoS 1 fan-in against Mosquitto ([`bench_mqtt`], its load
//! generator [`mqtt_load`]), all of them in one report ([`bench_all`]) with its [`plot`]s;
//! both sides of a comparison and what they report alike ([`sides`]); how the reports and
//! the demo write numbers ([`figures`]).

pub mod bench_all;
pub mod bench_compression;
pub mod bench_core;
pub mod bench_file_sink;
pub mod bench_fleet;
pub mod bench_footprint;
pub mod bench_gateway;
pub mod bench_kafka;
pub mod bench_mqtt;
pub mod bridge;
pub mod client;
pub mod demo;
pub mod faultfs;
pub mod figures;
pub mod gateway;
pub mod kafka;
pub mod mosquitto;
pub mod mqtt_load;
pub mod nats;
pub mod pki;
pub mod plot;
pub mod process;
pub mod proxy;
pub mod ram_nor;
pub mod sides;
pub mod sink_files;
pub mod wait;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, Wait, connect, read_log};

/// The number in environment variable `name` (white space trimmed); `None` if it is unset
/// or does not parse as a `T`. The tests' knobs (`SPILLWAY_SEED`, `SPILLWAY_KILL_LOOPS`,
/// …) are read with it.
pub fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.trim().parse().ok()
}
pub use gateway::{GatewayProcess, spillway_bin};

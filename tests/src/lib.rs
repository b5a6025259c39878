//! Shared helpers for Spillway's end-to-end tests and benchmarks: a blocking protocol
//! [`client`], a [`gateway`] process harness that builds and starts the real `spillway`
//! binary, the same for the [`bridge`], and a [`kafka`] broker (real or mock) with a
//! whole-topic consumer.

pub mod bridge;
pub mod client;
pub mod gateway;
pub mod kafka;

pub use bridge::{bridge_bin, run_bridge};
pub use client::{Client, FetchedRecord, Reply};
pub use gateway::{GatewayProcess, spillway_bin};

/// The machine a benchmark ran on: CPU model, logical cores, OS.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores, {}", std::env::consts::OS)
}

//! Shared helpers for Spillway's end-to-end tests and benchmarks.

pub mod bench_core;
pub mod ram_nor;

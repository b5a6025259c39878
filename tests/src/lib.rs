//! Shared helpers for Spillway's end-to-end tests and benchmarks.

//! A small partition, so that a few dozen records fill the ring: two journal blocks and
//! six one-block segments of 1 KiB.

use spillway_core::storage::Geometry;

use super::nor;

/// The erase block size: 1 KiB.
pub const ERASE: u32 = 1024;
/// The segments, one erase block each.
pub const SEGMENTS: u32 = 6;
/// The partition: the two journal blocks and [`SEGMENTS`] blocks of [`ERASE`] bytes,
/// written in 4-byte words, erased to `0xFF`.
pub const GEOMETRY: Geometry = nor(ERASE, ERASE * (2 + SEGMENTS));

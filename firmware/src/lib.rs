//! Spillway gateway logic (no_std): a sans-IO session that speaks the Spillway protocol over
//! an `embedded-io` transport and applies each request to a `&mut` log.
#![no_std]

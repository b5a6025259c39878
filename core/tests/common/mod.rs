//! Helpers shared by the log's integration tests.
#![allow(dead_code)]

pub mod faults;
mod hooked;
mod ram;
mod sim;
// Not every test uses every helper.
#[allow(unused_imports)]
pub use {
    hooked::{Hook, Hooked, io_error},
    ram::Ram,
    sim::{Rng, Shared, Sim, mix},
};

//! Helpers shared by the log's integration tests.
#![allow(dead_code)]

pub mod faults;
mod hooked;
mod ram;
mod read;
mod sim;
pub mod small;
// Not every test uses every helper.
#[allow(unused_imports)]
pub use {
    hooked::{Hook, Hooked, io_error},
    ram::{Ram, formatted},
    read::read_all,
    sim::{Rec, Rng, Shared, Sim, mix, nor},
};

//! What the Linux binaries (`spillway`, `spillway-bridge`) and the tests share about their
//! command lines (feature `cli`): one parser of the URIs they take ([`uri`]), of byte sizes
//! and durations ([`units`]), and the TOML config file laid under the flags ([`layer`]).
//! The no_std engine never uses any of it.

pub mod layer;
pub mod units;
pub mod uri;

//! Starting the real `spillway-bridge` binary, built on first use like
//! [`spillway_bin`](crate::gateway::spillway_bin).

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::gateway::workspace_bin;
use std::sync::OnceLock;

/// Path of the `spillway-bridge` binary, built on first use (or `SPILLWAY_BRIDGE_BIN`).
pub fn bridge_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("SPILLWAY_BRIDGE_BIN", "spillway-bridge", "spillway-bridge"))
        .clone()
}

/// Runs `spillway-bridge ARGS` to completion.
pub fn run_bridge(args: &[&str]) -> Output {
    Command::new(bridge_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("run spillway-bridge")
}

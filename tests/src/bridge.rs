//! Starting the real `spillway-bridge` binary, built on first use like
//! [`spillway_bin`](crate::gateway::spillway_bin).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Path of the `spillway-bridge` binary, built on first use (or `SPILLWAY_BRIDGE_BIN`).
pub fn bridge_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("SPILLWAY_BRIDGE_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("current exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile> directory")
            .to_path_buf();
        let target_dir = profile_dir
            .parent()
            .expect("target directory")
            .to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "spillway-bridge",
            "--bin",
            "spillway-bridge",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "building spillway-bridge failed");
        profile_dir.join("spillway-bridge")
    })
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

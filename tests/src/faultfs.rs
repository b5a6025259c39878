//! The fault-injection shim (`tests/faultfs`, package `spillway-faultfs`) for the real
//! binaries: its path, the environment that arms it, and the "reboot" that applies what the
//! disk lacks. The variables are documented in `tests/faultfs/src/lib.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::gateway::workspace_artifact;

/// What the kernel keeps of the writes a failed sync covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Undone in the page cache and on disk at once.
    Dropped,
    /// Still shown by the page cache, absent on disk (until the cache is dropped or the
    /// machine reboots).
    Kept,
}

impl Kept {
    /// The `FAULTFS_MODE` value.
    pub fn mode(self) -> &'static str {
        match self {
            Kept::Dropped => "dropped",
            Kept::Kept => "kept",
        }
    }
}

/// Path of `libspillway_faultfs.so`, built on first use into the running test's target
/// directory and profile (or `SPILLWAY_FAULTFS_LIB`).
///
/// # Panics
/// If the build fails.
pub fn faultfs_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        workspace_artifact(
            "SPILLWAY_FAULTFS_LIB",
            "spillway-faultfs",
            &["--lib"],
            "libspillway_faultfs.so",
        )
    })
    .clone()
}

/// The environment that loads the shim for files ending with `suffix`, with its state in
/// `state`, failing the `fail_sync`th sync (once per state file) when set.
pub fn faultfs_env(
    suffix: &str,
    state: &Path,
    kept: Kept,
    fail_sync: Option<u32>,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("LD_PRELOAD".into(), faultfs_lib().display().to_string()),
        ("FAULTFS_PATH_SUFFIX".into(), suffix.into()),
        ("FAULTFS_MODE".into(), kept.mode().into()),
        ("FAULTFS_STATE".into(), state.display().to_string()),
    ];
    if let Some(n) = fail_sync {
        env.push(("FAULTFS_FAIL_SYNC".into(), n.to_string()));
    }
    env
}

/// The environment that loads the shim for files ending with `suffix`, with its state in
/// `state`, failing their `fail_write`th write with EIO (once per state file).
pub fn faultfs_write_env(suffix: &str, state: &Path, fail_write: u32) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), faultfs_lib().display().to_string()),
        ("FAULTFS_PATH_SUFFIX".into(), suffix.into()),
        ("FAULTFS_STATE".into(), state.display().to_string()),
        ("FAULTFS_FAIL_WRITE".into(), fail_write.to_string()),
    ]
}

/// The environment that loads the shim for files ending with `suffix` and makes every
/// sync of theirs never return once the file `when` exists.
pub fn faultfs_hang_env(suffix: &str, when: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), faultfs_lib().display().to_string()),
        ("FAULTFS_PATH_SUFFIX".into(), suffix.into()),
        ("FAULTFS_HANG_WHEN".into(), when.display().to_string()),
    ]
}

/// "Reboots": applies every undo pending in `state` to its file, so the file holds what the
/// disk holds. Returns the shim's report line.
///
/// # Panics
/// If the helper process cannot run or fails.
pub fn reboot(state: &Path) -> String {
    let out = Command::new("true")
        .env("LD_PRELOAD", faultfs_lib())
        .env("FAULTFS_STATE", state)
        .env("FAULTFS_REBOOT", "1")
        .output()
        .expect("run the reboot helper");
    assert!(out.status.success(), "reboot helper failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

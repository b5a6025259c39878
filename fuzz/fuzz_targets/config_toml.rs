//! The gateway's configuration file: arbitrary TOML given to `spillway run --config`,
//! parsed and checked by the binary's own config module (compiled in from its sources:
//! it lives in the binary, not in the library).
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use clap::Parser;
use libfuzzer_sys::fuzz_target;

/// The binary's error type, as far as the config and image modules use it.
#[allow(dead_code)]
#[derive(Debug)]
enum AppError {
    Usage(String),
    Image(String),
    Runtime(String),
    Stopped(String),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

#[allow(dead_code, unused_imports)]
#[path = "../../firmware/src/app/config/mod.rs"]
mod config;
// The config module checks credentials and TLS settings with these two.
#[allow(dead_code, unused_imports)]
#[path = "../../firmware/src/app/auth.rs"]
mod auth;
#[allow(dead_code)]
#[path = "../../firmware/src/app/image.rs"]
mod image;
#[allow(dead_code, unused_imports)]
#[path = "../../firmware/src/app/tls.rs"]
mod tls;

use config::{Cli, Command, settings};

/// The file the config is written to (one per fuzzing process).
fn config_path() -> &'static std::path::Path {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // RAM-backed where there is one: a file system that syncs on truncate costs
        // milliseconds per execution. `scripts/fuzz.sh` names a directory of its own
        // (SPILLWAY_FUZZ_TMP), which it removes afterwards: the process's directory is not
        // removed by the process, which libFuzzer ends without running destructors.
        let shm = std::path::Path::new("/dev/shm");
        let base = if let Some(dir) = std::env::var_os("SPILLWAY_FUZZ_TMP") {
            std::path::PathBuf::from(dir)
        } else if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("spillway-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("spillway.toml")
    })
}

/// `spillway run --config FILE --image NONEXISTENT`, parsed once.
fn run_args() -> &'static config::RunArgs {
    static ARGS: OnceLock<Box<config::RunArgs>> = OnceLock::new();
    ARGS.get_or_init(|| {
        let cli = Cli::try_parse_from([
            "spillway".as_ref(),
            "run".as_ref(),
            "--config".as_ref(),
            config_path().as_os_str(),
            // An image that does not exist: `settings` checks the geometry it would create.
            "--image".as_ref(),
            "/nonexistent/spillway-fuzz.img".as_ref(),
        ])
        .expect("fixed flags parse");
        match cli.command {
            Some(Command::Run(args)) => args,
            _ => unreachable!("the run command"),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    std::fs::File::create(config_path())
        .and_then(|mut f| f.write_all(data))
        .expect("write the config file");
    let _ = settings(run_args());
});

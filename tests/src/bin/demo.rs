//! `spillway-demo`: the whole Spillway scenario on real sensor data, with the gateway and
//! the bridge killed on the way (see [`spillway_tests::demo`]).
//!
//! Uses the `spillway` and `spillway-bridge` binaries next to its own (build them with
//! `cargo build --release --bins`). Prints progress, then a summary table; exits 0 when
//! every check passed, 1 when a check failed, 2 on a usage error, 3 when the scenario could
//! not run.

use std::path::PathBuf;
use std::time::Duration;

use spillway_tests::demo::{self, Options};

const USAGE: &str = "\
usage: spillway-demo [options]
  --rows N            replay only the first N rows of each series (default: all)
  --replay-secs S     how long the replay takes (default: 40)
  --down-ms MS        how long the gateway stays down after its SIGKILL (default: 1500)
  --work-dir DIR      image, sink files, logs; a previous run's is emptied first
                      (default: target/spillway-demo)
  --data-dir DIR      the two series (default: the source tree's tests/data)
  --seed N            seed of the kill-time jitter (default: random)
  --quiet             print only the summary";

fn usage(msg: &str) -> ! {
    eprintln!("spillway-demo: {msg}\n{USAGE}");
    std::process::exit(2)
}

fn value<T: std::str::FromStr>(args: &mut impl Iterator<Item = String>, flag: &str) -> T {
    let v = args
        .next()
        .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
    v.parse()
        .unwrap_or_else(|_| usage(&format!("{flag}: bad value {v:?}")))
}

fn main() {
    let exe = std::env::current_exe().unwrap_or_else(|e| {
        eprintln!("spillway-demo: cannot find my own path: {e}");
        std::process::exit(3)
    });
    let bin_dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    // target/<profile>/spillway-demo → target/spillway-demo
    let default_work = bin_dir.parent().map_or_else(
        || PathBuf::from("spillway-demo"),
        |t| t.join("spillway-demo"),
    );
    let mut opts = Options::new(
        bin_dir.join("spillway"),
        bin_dir.join("spillway-bridge"),
        default_work,
    );
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rows" => opts.rows = Some(value(&mut args, "--rows")),
            "--replay-secs" => {
                opts.replay =
                    Duration::from_secs_f64(value::<f64>(&mut args, "--replay-secs").max(1.0));
            }
            "--down-ms" => opts.gateway_down = Duration::from_millis(value(&mut args, "--down-ms")),
            "--work-dir" => opts.work_dir = PathBuf::from(value::<String>(&mut args, "--work-dir")),
            "--data-dir" => opts.data_dir = PathBuf::from(value::<String>(&mut args, "--data-dir")),
            "--seed" => opts.seed = value(&mut args, "--seed"),
            "--quiet" => opts.quiet = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    for bin in [&opts.spillway_bin, &opts.bridge_bin] {
        if !bin.exists() {
            eprintln!(
                "spillway-demo: {} not found; build everything first: cargo build --release --bins",
                bin.display()
            );
            std::process::exit(3);
        }
    }
    match demo::run(&opts) {
        Ok(summary) => {
            println!();
            print!("{summary}");
            std::process::exit(if summary.passed() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("spillway-demo: the scenario could not run: {e}");
            std::process::exit(3);
        }
    }
}

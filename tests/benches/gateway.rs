//! Publish throughput of the real `spillway` binary over TCP loopback, side by side with
//! NATS JetStream on the same machine in the same run, and the disk's own sync bandwidth.
//! See `spillway_tests::bench_gateway` for what is measured and how.
//!
//! The NATS peer needs nats-server 2.10 or later (`sync_interval: always`):
//! `scripts/nats-server.sh` installs the pinned one under `target/tools/`; the bench also
//! takes `$SPILLWAY_NATS_SERVER`. Without either it prints that the peer was skipped.
//!
//! `cargo bench -p spillway-tests --bench gateway`. Environment: `SPILLWAY_BENCH_RECORDS`
//! (buffered records per publisher, default 20000), `SPILLWAY_BENCH_DURABLE_RECORDS`
//! (durable records per publisher, default 2000), `SPILLWAY_BENCH_REPS` (default 5). Under
//! `cargo test` (no `--bench` argument) it does a short smoke run.

use std::io::Write;

use spillway_tests::bench_gateway::{Options, run};
use spillway_tests::nats::nats_server_bin;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let opts = if smoke {
        Options::smoke()
    } else {
        let d = Options::default();
        Options {
            per_buffered: env_usize("SPILLWAY_BENCH_RECORDS").unwrap_or(d.per_buffered),
            per_durable: env_usize("SPILLWAY_BENCH_DURABLE_RECORDS").unwrap_or(d.per_durable),
            reps: env_usize("SPILLWAY_BENCH_REPS").unwrap_or(d.reps).max(1),
            disk_budget: d.disk_budget,
        }
    };
    let nats_bin = nats_server_bin();
    let report = run(&opts, nats_bin.as_deref(), |what| eprintln!("… {what}"));
    println!("{report}");
    let _ = std::io::stdout().flush();
}

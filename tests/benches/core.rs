//! Core benchmark: spillway-core against the `sequential-storage` queue, measured in one run
//! and printed as Markdown tables. See `spillway_tests::bench_core` for what is measured.
//!
//! `cargo bench -p spillway-tests --bench core` (append `-- --reps N` for other repetition
//! counts). Under `cargo test` (no `--bench` argument) it does a short smoke run instead.

use spillway_tests::bench_core::{Options, run};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = if args.iter().any(|a| a == "--bench") {
        Options::default()
    } else {
        Options::smoke()
    };
    if let Some(n) = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
    {
        opts.reps = n;
    }
    let report = run(&opts, |what| eprintln!("… {what}"));
    println!("{report}");
}

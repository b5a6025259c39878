//! Core benchmark: spillway-core against the `sequential-storage` queue, measured in one run
//! and printed as Markdown tables. See `spillway_tests::bench_core` for what is measured.
//!
//! `cargo bench -p spillway-tests --bench core` (append `-- --reps N` for other repetition
//! counts, `--case PAYLOAD:WRITE_SIZE` (repeatable, e.g. `--case 32:4`) for only those
//! append rows, `--no-mount` to leave out the mount rows, `--compression-only` for only the
//! compression rows on the real series, `--no-compression` to leave them out). Under `cargo test` (no `--bench` argument) it does a
//! short smoke run instead.

use spillway_tests::bench_core::{Options, WriteCase, run};

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
    let cases: Vec<WriteCase> = args
        .windows(2)
        .filter(|w| w[0] == "--case")
        .map(|w| {
            let (p, ws) = w[1].split_once(':').expect("--case PAYLOAD:WRITE_SIZE");
            WriteCase {
                payload_len: p.parse().expect("payload bytes"),
                write_size: ws.parse().expect("write size"),
            }
        })
        .collect();
    if !cases.is_empty() {
        opts.write_cases = cases;
    }
    if args.iter().any(|a| a == "--no-mount") {
        opts.mount_cases.clear();
    }
    if args.iter().any(|a| a == "--no-compression") {
        opts.compression_rows = Some(0);
    }
    if args.iter().any(|a| a == "--compression-only") {
        let runs = spillway_tests::bench_core::compression_runs(&opts, &mut |what: &str| {
            eprintln!("… {what}")
        });
        println!("{}", spillway_tests::bench_compression::Section(&runs));
        return;
    }
    let report = run(&opts, |what| eprintln!("… {what}"));
    println!("{report}");
}

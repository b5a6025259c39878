//! Every Spillway benchmark against its peers in one run: writes `BENCH.md` and SVG plots
//! into a results folder. See `spillway_tests::bench_all` for what is compared; run it
//! through `scripts/bench.sh`, which installs and starts the peers first.
//!
//! `cargo bench -p spillway-tests --bench all -- [--out DIR] [--only 1,2,...]
//! [--kafka-records N]` (default `bench-results` in the workspace root; `--only` runs some
//! comparisons, by number; `--kafka-records` sets the records of comparison 4, 300,000
//! unless given, e.g. 3000000 for the second size). The peers: nats-server from `$SPILLWAY_NATS_SERVER` or
//! `scripts/nats-server.sh`'s install; the Kafka-protocol broker at
//! `$SPILLWAY_KAFKA_BROKER` (`host:port`); mosquitto from `$SPILLWAY_MOSQUITTO` or
//! `/usr/sbin/mosquitto`. A missing peer is skipped and the report says so. Under
//! `cargo test` (no `--bench` argument) it does a smoke run of seconds into a temporary
//! folder.

use std::path::{Path, PathBuf};
use std::time::Instant;

use spillway_tests::bench_all::{Options, run};
use spillway_tests::nats::nats_server_bin;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = !args.iter().any(|a| a == "--bench");
    let broker = std::env::var("SPILLWAY_KAFKA_BROKER")
        .ok()
        .filter(|b| !b.is_empty());
    let nats = nats_server_bin();
    let mut opts = if smoke {
        Options::smoke(nats, broker)
    } else {
        Options::full(nats, broker)
    };
    if let Some(i) = args.iter().position(|a| a == "--only") {
        let only: Vec<u8> = args
            .get(i + 1)
            .expect("--only N,N")
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        opts = opts.only(&only);
    }
    if let Some(i) = args.iter().position(|a| a == "--kafka-records") {
        let n: usize = args
            .get(i + 1)
            .and_then(|n| n.replace(['_', ','], "").parse().ok())
            .expect("--kafka-records N (a number of records)");
        if let Some((k, _)) = opts.kafka.as_mut() {
            k.records = n;
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out: PathBuf = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).expect("--out DIR")),
        None if smoke => tmp.path().to_path_buf(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench-results"),
    };
    let begun = Instant::now();
    let report = run(&opts, |what| {
        eprintln!("[{:>5.0} s] {what}", begun.elapsed().as_secs_f64())
    });
    report.write(&out).expect("write the results");
    let bench = out.join("BENCH.md");
    eprintln!(
        "[{:>5.0} s] wrote {} and its plots",
        begun.elapsed().as_secs_f64(),
        bench.display()
    );
    let failures = report.failures();
    if !failures.is_empty() {
        eprintln!(
            "BENCHMARK FAILED: {} check(s) failed, the figures in {} are not valid:",
            failures.len(),
            bench.display()
        );
        for e in &failures {
            eprintln!("  {e}");
        }
        std::process::exit(1);
    }
    if smoke {
        let text = std::fs::read_to_string(&bench).expect("BENCH.md");
        assert!(text.contains("## Headline ratios"), "{text}");
    }
}

//! Records/s drained into Kafka by `spillway-bridge drain --once` from a real `spillway`
//! gateway, side by side with a plain rdkafka producer sending the same records: the
//! ceiling. See `spillway_tests::bench_kafka` for what is measured and how.
//!
//! The broker is the one of `SPILLWAY_KAFKA_BROKER=host:port` (`scripts/kafka-broker.sh
//! start` runs tansu in memory on 127.0.0.1:19092), or librdkafka's in-process mock
//! cluster when it is not set (said in the output).
//!
//! `cargo bench -p spillway-tests --bench bridge_kafka`; `SPILLWAY_BENCH_RECORDS=N`
//! (default 300000), `SPILLWAY_BENCH_RUNS=N` (default 3).

use spillway_tests::bench_kafka::{Options, run};
use spillway_tests::kafka::Broker;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn main() {
    let d = Options::default();
    let opts = Options {
        records: env_usize("SPILLWAY_BENCH_RECORDS").unwrap_or(d.records),
        runs: env_usize("SPILLWAY_BENCH_RUNS").unwrap_or(d.runs).max(1),
    };
    let broker = match Broker::real() {
        Some(b) => b,
        None => {
            println!(
                "SPILLWAY_KAFKA_BROKER not set: no broker process, using librdkafka's mock cluster"
            );
            Broker::mock()
        }
    };
    let report = run(&opts, &broker, |what| println!("{what}"));
    println!("machine: {}", report.machine);
    println!();
    print!("{report}");
    let failures = report.failures();
    if !failures.is_empty() {
        eprintln!(
            "BENCHMARK FAILED: {} run(s) did not deliver every record:",
            failures.len()
        );
        for e in &failures {
            eprintln!("  {e}");
        }
        std::process::exit(1);
    }
}

//! Publish throughput of the real `spillway` binary over TCP loopback: 100-byte records,
//! several publishers, each with many publishes in flight (pipelined), with buffered and
//! with durable acknowledgements. Prints records/s beside the machine it ran on.
//!
//! `cargo bench -p spillway-tests --bench gateway`; `SPILLWAY_BENCH_RECORDS=N` sets the
//! records per publisher (default 20000).

use std::collections::VecDeque;
use std::time::Instant;

use spillway_core::wire::AckLevel;
use spillway_tests::client::{Client, Reply};
use spillway_tests::gateway::{GatewayProcess, free_port};
use spillway_tests::machine;

const PUBLISHERS: usize = 8;
const WINDOW: usize = 64;
const PAYLOAD: usize = 100;

fn run(ack: AckLevel, per_publisher: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = [
        "--image",
        &dir.path().join("bench.img").display().to_string(),
        "--size",
        "256M",
        "--erase-size",
        "64K",
        "--buffer-bytes",
        "256K",
        "--full",
        "drop-oldest",
        "--listen",
        &format!("tcp://{addr}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _g = GatewayProcess::start(&args, 1);
    let start = Instant::now();
    let handles: Vec<_> = (0..PUBLISHERS)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = Client::tcp(&addr).expect("connect");
                let payload = [0x5au8; PAYLOAD];
                let mut inflight = VecDeque::new();
                for _ in 0..per_publisher {
                    let seq = c.send_publish("bench", &payload, ack, None).expect("send");
                    inflight.push_back(seq);
                    if inflight.len() >= WINDOW {
                        let r = c.recv().expect("reply");
                        assert!(matches!(r, Reply::Ack { .. }), "{r:?}");
                        inflight.pop_front();
                    }
                }
                while inflight.pop_front().is_some() {
                    let r = c.recv().expect("reply");
                    assert!(matches!(r, Reply::Ack { .. }), "{r:?}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("publisher");
    }
    (PUBLISHERS * per_publisher) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let per: usize = std::env::var("SPILLWAY_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    println!("machine: {}", machine());
    println!(
        "{PUBLISHERS} publishers x {per} records of {PAYLOAD} bytes, {WINDOW} in flight each, TCP loopback"
    );
    let buffered = run(AckLevel::Buffered, per);
    let durable = run(AckLevel::Durable, per);
    println!("| ack | records/s |");
    println!("|---|---|");
    println!("| buffered | {buffered:.0} |");
    println!("| durable (group commit + fdatasync) | {durable:.0} |");
    println!("durable / buffered = {:.2}", durable / buffered);
}

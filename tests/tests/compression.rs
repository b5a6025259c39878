//! `spillway run --compression lz4` against the real gateway: compressible records
//! published over TCP read back exactly, `inspect` counts the compressed batches and the
//! bytes they saved per segment, and the image mounts and serves the same records after a
//! restart with `--compression none`.

use std::path::Path;

use spillway_core::wire::AckLevel;
use spillway_tests::client::{Wait, connect, read_log};
use spillway_tests::gateway::{GatewayProcess, free_port, run_cli};

/// Starts the gateway on `img` with `--compression MODE`; returns it and its address.
fn gateway(img: &Path, mode: &str) -> (GatewayProcess, String) {
    let port = free_port();
    let args: Vec<String> = [
        "--image",
        &img.display().to_string(),
        "--size",
        "1M",
        "--erase-size",
        "4K",
        "--listen",
        &format!("tcp://127.0.0.1:{port}"),
        "--compression",
        mode,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    (GatewayProcess::start(&args, 1), format!("127.0.0.1:{port}"))
}

/// A sea-surface temperature line like the buoy series the demo stores.
fn line(i: u64) -> Vec<u8> {
    format!(
        "41001 2025 11 24 {:02} {:02} WTMP {}.{} ATMP 18.{} WSPD 7.{}",
        i / 60 % 24,
        i % 60,
        14 + i % 3,
        i % 10,
        i % 7,
        i % 5
    )
    .into_bytes()
}

/// Every record from offset 0, checked against what was published.
fn read_back(addr: &str, n: u64) {
    let mut c = connect(addr).unwrap();
    let got = read_log(&mut c, 0).unwrap();
    assert_eq!(got.len() as u64, n);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        assert_eq!(r.topic, "buoy/41001/sst");
        assert_eq!(r.payload, line(i as u64), "record {i}");
    }
}

#[test]
fn lz4_batches_read_back_exactly_and_mount_without_compression() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let n = 800u64;
    let (mut g, addr) = gateway(&img, "lz4");
    let mut c = connect(&addr).unwrap();
    for i in 0..n {
        // Durable every 50 records: 16 batches at least, whatever the linger.
        let ack = if i % 50 == 49 {
            AckLevel::Durable
        } else {
            AckLevel::Buffered
        };
        c.publish("buoy/41001/sst", None, &line(i), ack, None)
            .wait()
            .unwrap();
    }
    read_back(&addr, n);
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());

    let (code, out, err) = run_cli(&["inspect", &img.display().to_string(), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records_verified"], n, "{out}");
    let segs = v["segments"].as_array().unwrap();
    let batches: u64 = segs
        .iter()
        .map(|s| s["compressed_batches"].as_u64().unwrap())
        .sum();
    let saved: u64 = segs
        .iter()
        .map(|s| s["compressed_bytes_saved"].as_u64().unwrap())
        .sum();
    assert!(batches >= 16, "{out}");
    let payload = v["payload_bytes"].as_u64().unwrap();
    assert!(
        saved * 3 > payload,
        "{saved} bytes saved of {payload}: {out}"
    );

    // The same image under `--compression none`: read as it is.
    let (mut g, addr) = gateway(&img, "none");
    read_back(&addr, n);
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
}

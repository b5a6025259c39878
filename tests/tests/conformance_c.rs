//! The independent C client of `tests/c/conformance.c`, written from `core/PROTOCOL.md`
//! alone, against the real gateway binary: if the gateway and the document drift apart,
//! this fails.
//!
//! `SPILLWAY_C_CONFORMANCE` names a prebuilt client (what `scripts/test.sh` builds with the
//! system C compiler); without it the test builds one with `cc` into the target directory.

use std::path::PathBuf;
use std::process::Command;

use spillway_tests::gateway::{GatewayProcess, free_port, image_in};

/// The client binary: `SPILLWAY_C_CONFORMANCE`, else built with `cc` (strict C99, warnings
/// are errors).
fn client() -> PathBuf {
    if let Ok(p) = std::env::var("SPILLWAY_C_CONFORMANCE") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("c/conformance.c");
    let out = std::env::current_exe()
        .expect("current exe")
        .parent()
        .expect("deps directory")
        .join(format!("spillway-conformance-c-{}", std::process::id()));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-O2",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run the C compiler (cc)");
    assert!(status.success(), "building {} failed", src.display());
    out
}

#[test]
fn a_c_client_written_from_the_protocol_document_passes_against_the_gateway() {
    let bin = client();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("tcp://127.0.0.1:{port}");
    let _g = GatewayProcess::start(
        &image_in(dir.path(), &["--size", "1M", "--listen", &listen]),
        1,
    );
    let out = Command::new(&bin)
        .args(["127.0.0.1", &port.to_string()])
        .output()
        .expect("run the C client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if std::env::var_os("SPILLWAY_C_CONFORMANCE").is_none() {
        let _ = std::fs::remove_file(&bin);
    }
    assert!(
        out.status.success(),
        "the C client failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 10,
        "{stdout}"
    );
}

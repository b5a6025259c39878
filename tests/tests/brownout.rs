//! End-to-end tests of the real `spillway` binary on a flaky supply: hundreds of boots
//! ended by SIGKILL, each after one durable record, must not fill the image; and a first
//! boot stopped while it creates the image (SIGTERM, SIGKILL) must leave nothing that keeps
//! the next start from working.
//!
//! `SPILLWAY_BROWNOUT_BOOTS=N` sets the number of SIGKILLed boots (default 300).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_core::wire::AckLevel;
use spillway_tests::client::{Wait, connect, read_log};
use spillway_tests::gateway::{GatewayProcess, free_port, run_cli, spillway_bin};

const DEFAULT_BOOTS: usize = 300;

fn boots() -> usize {
    spillway_tests::env_number("SPILLWAY_BROWNOUT_BOOTS").unwrap_or(DEFAULT_BOOTS)
}

/// A 4 MiB image with 4 KiB erase blocks (31 segments of 128 KiB with the default buffer):
/// before unclean boots cost bytes instead of segments, it was full after 32 boots.
fn args(img: &Path, port: u16) -> Vec<String> {
    [
        "--image",
        &img.display().to_string(),
        "--size",
        "4M",
        "--erase-size",
        "4K",
        "--gateway-id",
        "brownout-gw",
        "--listen",
        &format!("tcp://127.0.0.1:{port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `boots` times: start the gateway, publish one durable record, SIGKILL. Then every record
/// reads back once, in order, `inspect` finds no corruption, and the image is far from full.
#[test]
fn hundreds_of_sigkilled_boots_keep_every_record_and_do_not_fill_the_image() {
    let boots = boots();
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let port = free_port();
    let args = args(&img, port);
    for boot in 0..boots {
        let mut g = GatewayProcess::start(&args, 1);
        let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
        let r = c
            .publish(
                "boot",
                None,
                format!("boot {boot}").as_bytes(),
                AckLevel::Durable,
                None,
            )
            .wait();
        assert!(
            r.is_ok(),
            "boot {boot}: publish refused: {r:?}\n{}",
            g.log_text()
        );
        g.kill();
    }
    let booted = start.elapsed();

    let (code, out, err) = run_cli(&["inspect", &img.display().to_string(), "--json"]);
    assert_eq!(code, 0, "a crash is not corruption: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records_verified"], boots as u64, "{out}");
    for l in v["lost"].as_array().unwrap() {
        assert_eq!(l["reason"], "not_persisted", "{out}");
    }
    // Each boot wrote one small batch into the head segment: a few segments at most, not
    // one per boot.
    let segments = v["segments"].as_array().unwrap().len();
    assert!(
        segments <= 3,
        "{segments} segments in use after {boots} boots: {out}"
    );
    // The consumer's lag counts the records waiting, not the offsets the crashes skipped.
    let bridge = &v["consumers"][0];
    assert_eq!(bridge["name"], "bridge", "{out}");
    assert_eq!(bridge["lag_records"], boots as u64, "{out}");

    // One more boot: every record reads back in order, and the image takes more.
    let g = GatewayProcess::start(&args, 1);
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    let recs = read_log(&mut c, 0).unwrap();
    let payloads: Vec<String> = recs
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect();
    let want: Vec<String> = (0..boots).map(|b| format!("boot {b}")).collect();
    assert_eq!(payloads, want);
    assert!(recs.windows(2).all(|w| w[0].offset < w[1].offset));
    let r = c
        .publish("boot", None, b"after", AckLevel::Durable, None)
        .wait();
    assert!(r.is_ok(), "{r:?}\n{}", g.log_text());
    eprintln!(
        "brownout: {boots} SIGKILLed boots in {booted:.2?}, {segments} segments in use, {} \
         offsets skipped",
        v["lost"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["to"].as_u64().unwrap() - l["from"].as_u64().unwrap())
            .sum::<u64>()
    );
}

/// Size of the image the creation tests make: large enough that creating it takes a
/// while, so the signal lands while the file is being filled.
const BIG: &str = "128M";

/// `--image IMG --size 128M --listen tcp://127.0.0.1:PORT`: the creation tests' gateway.
fn big_image_args(img: &Path, port: u16) -> Vec<String> {
    vec![
        "--image".into(),
        img.display().to_string(),
        "--size".into(),
        BIG.into(),
        "--listen".into(),
        format!("tcp://127.0.0.1:{port}"),
    ]
}

fn start_creating(img: &Path, port: u16) -> Child {
    Command::new(spillway_bin())
        .arg("run")
        .args(big_image_args(img, port))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start spillway")
}

/// The file the image is built in before it is renamed into place.
fn aside(img: &Path) -> PathBuf {
    img.with_file_name(format!(
        ".{}.creating",
        img.file_name().unwrap().to_string_lossy()
    ))
}

/// Waits until the image is being built (its file aside has data, the image is not in
/// place yet).
fn wait_creating(child: &mut Child, img: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::metadata(aside(img)).is_ok_and(|m| m.len() > 0) {
            assert!(!img.exists(), "the image appeared before it was complete");
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "spillway exited before creating the image"
        );
        assert!(Instant::now() < deadline, "the image is not being created");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A first boot on `DIR/big.img` (on a free port) caught while it builds the image: the
/// image's path, the port and the gateway process.
fn caught_creating(dir: &Path) -> (PathBuf, u16, Child) {
    let img = dir.join("big.img");
    let port = free_port();
    let mut child = start_creating(&img, port);
    wait_creating(&mut child, &img);
    (img, port, child)
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "spillway did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A first boot stopped by SIGTERM while it creates the image exits 0 and leaves neither
/// the image nor a partial file; the next start creates the image and serves.
#[test]
fn sigterm_while_creating_the_image_cleans_up_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let (img, port, mut child) = caught_creating(dir.path());
    spillway_tests::process::signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(!img.exists(), "a partial image was left in place");
    assert!(!aside(&img).exists(), "the partial file aside was left");
    started_fine(&img, port);
}

/// A first boot killed (SIGKILL, like a power cut) while it creates the image leaves no
/// image in place; the next start removes the partial file, creates the image and serves.
#[test]
fn sigkill_while_creating_the_image_then_the_next_start_works() {
    let dir = tempfile::tempdir().unwrap();
    let (img, port, mut child) = caught_creating(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!img.exists(), "a partial image was left in place");
    assert!(aside(&img).exists(), "the partial file is aside");
    started_fine(&img, port);
    assert!(!aside(&img).exists(), "the partial file aside was removed");
}

/// Starts on the image path as a new gateway would, publishes, stops, and checks the image.
fn started_fine(img: &Path, port: u16) {
    let mut g = GatewayProcess::start(&big_image_args(img, port), 1);
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    let r = c
        .publish("t", None, b"first", AckLevel::Durable, None)
        .wait();
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
    assert_eq!(
        std::fs::metadata(img).unwrap().len(),
        128 << 20,
        "the image has its full size"
    );
    let (code, out, err) = run_cli(&["inspect", &img.display().to_string(), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records_verified"], 1, "{out}");
}

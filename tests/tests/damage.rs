//! Damage is reported as what it is, on the real `spillway` binary: an image whose first
//! segment header is damaged is still a Spillway image and costs that segment's records
//! (an exact corrupt range, exit 4); a damaged header in the middle of a cleanly shut
//! down image is corruption, never "not persisted".

use std::path::{Path, PathBuf};

use spillway_core::wire::AckLevel;
use spillway_tests::client::{Client, Wait, connect, read_log};
use spillway_tests::gateway::{GatewayProcess, free_port, run_cli};

/// Starts a gateway on a new image of `size` with 4 KiB erase blocks, publishes `n`
/// records of about 300 bytes, stops it with SIGTERM (a clean shutdown) and returns
/// `inspect --json`'s report.
fn filled_image(img: &Path, size: &str, n: u64) -> serde_json::Value {
    let port = free_port();
    let args: Vec<String> = [
        "--image",
        &img.display().to_string(),
        "--size",
        size,
        "--erase-size",
        "4K",
        "--listen",
        &format!("tcp://127.0.0.1:{port}"),
        // The records are alike: compressed, they would not spread over the segments the
        // damage is put into.
        "--compression",
        "none",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut g = GatewayProcess::start(&args, 1);
    let mut c = connect(&format!("127.0.0.1:{port}")).unwrap();
    for i in 0..n {
        let payload = format!("{i:08} {}", "x".repeat(290));
        c.publish(
            "damage/t",
            None,
            payload.as_bytes(),
            AckLevel::Buffered,
            None,
        )
        .wait()
        .unwrap();
    }
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
    inspect_json(img, 0).0
}

/// [`filled_image`] `gw.img` in a new directory: the directory (the image lives as long
/// as it), the image's path and `inspect --json`'s report.
fn new_filled_image(size: &str, n: u64) -> (tempfile::TempDir, PathBuf, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let report = filled_image(&img, size, n);
    (dir, img, report)
}

/// The end (the next segment's base offset) of the oldest segment of `report`'s image,
/// after checking the image has `min_segments` segments or more and the oldest is
/// physical segment 0 from offset 0.
fn oldest_segment_end(report: &serde_json::Value, min_segments: usize) -> u64 {
    let segs = segments(report);
    assert!(segs.len() >= min_segments, "{report}");
    assert_eq!(segs[0], (0, 0));
    segs[1].1
}

/// `(physical index, base offset)` of the segments, in ring order.
fn segments(v: &serde_json::Value) -> Vec<(u64, u64)> {
    v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["index"].as_u64().unwrap(),
                s["base_offset"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn segment_addr(v: &serde_json::Value, index: u64) -> u64 {
    let bps = v["geometry"]["blocks_per_segment"].as_u64().unwrap();
    (2 + index * bps) * 4096
}

fn patch(img: &Path, at: u64, f: impl FnOnce(&mut [u8])) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8; 80];
    file.read_exact_at(&mut b, at).unwrap();
    f(&mut b);
    file.write_all_at(&b, at).unwrap();
}

/// `inspect --json` of `img`: asserts it exits `code` and returns the report and its text.
fn inspect_json(img: &Path, code: i32) -> (serde_json::Value, String) {
    let (got, out, err) = run_cli(&["inspect", &img.display().to_string(), "--json"]);
    assert_eq!(got, code, "{out}{err}");
    (serde_json::from_str(&out).unwrap(), out)
}

/// `inspect --json` of `img`: exits 4 (damage is corruption), names exactly `from..to` lost
/// as corrupt and nothing as never persisted; returns the report and its text.
fn inspect_corrupt(img: &Path, from: u64, to: u64) -> (serde_json::Value, String) {
    let (v, out) = inspect_json(img, 4);
    assert_eq!(
        v["lost"],
        serde_json::json!([{"from": from, "to": to, "reason": "corrupt"}]),
        "{out}"
    );
    assert!(!out.contains("not_persisted"), "{out}");
    (v, out)
}

/// A gateway started on the existing image `img` (one TCP listener) and a client
/// connected to it.
fn serve(img: &Path) -> (GatewayProcess, Client) {
    let (g, addr) = start_on(img);
    let c = connect(&addr).unwrap();
    (g, c)
}

/// A gateway started on the existing image `img` with one TCP listener, and its
/// `127.0.0.1:PORT`.
fn start_on(img: &Path) -> (GatewayProcess, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = vec![
        "--image".into(),
        img.display().to_string(),
        "--listen".into(),
        format!("tcp://{addr}"),
    ];
    (GatewayProcess::start(&args, 1), addr)
}

/// Whether one of `report`'s warnings contains `needle`.
fn warns(report: &serde_json::Value, needle: &str) -> bool {
    report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains(needle))
}

#[test]
fn first_segment_header_erased_is_a_lost_range_not_a_foreign_image() {
    let n = 4000;
    let (_dir, img, before) = new_filled_image("32M", n);
    let lost_to = oldest_segment_end(&before, 2);
    // The first segment's header reads erased.
    patch(&img, segment_addr(&before, 0), |b| b.fill(0xFF));
    let (v, out) = inspect_corrupt(&img, 0, lost_to);
    assert_eq!(v["records_verified"], n - lost_to, "{out}");
    assert_eq!(v["next_offset"], n);
    // The gateway starts on it and serves the rest.
    let (mut g, mut c) = serve(&img);
    let recs = read_log(&mut c, lost_to).unwrap();
    assert_eq!(recs.len() as u64, n - lost_to);
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
}

#[test]
fn a_damaged_middle_segment_header_is_corruption_not_never_persisted() {
    let n = 6000;
    let (_dir, img, before) = new_filled_image("4M", n);
    let segs = segments(&before);
    assert!(segs.len() >= 4, "{before}");
    assert_eq!(before["clean"], true);
    let (mid, next) = (segs[1], segs[2]);
    // One flipped bit in the header's CRC.
    patch(&img, segment_addr(&before, mid.0), |b| b[77] ^= 0x08);
    // Damage below the durable end is corruption.
    let (v, out) = inspect_corrupt(&img, mid.1, next.1);
    assert_eq!(v["records_verified"], n - (next.1 - mid.1), "{out}");
}

/// Journal entries damaged after they were written (a flipped bit in the first entry of
/// every journal block that has newer entries after it) are skipped and reported as a
/// warning: `inspect` exits 0 (nothing acknowledged is lost), names them, and the committed
/// offsets and entry are those of the undamaged journal. Before, a damaged entry ended the
/// scan of its block: the mount fell back to an older entry, committed offsets went back,
/// and `inspect` said "result ok" with no word about the journal.
#[test]
fn damaged_journal_entries_are_skipped_and_reported_as_a_warning() {
    let (_dir, img, before) = new_filled_image("1M", 20);
    assert_eq!(before["journal"]["damaged_entries"], 0, "{before:#}");
    assert_eq!(before["journal"]["torn_entries"], 0, "{before:#}");

    let bytes = std::fs::read(&img).unwrap();
    let mut flipped = 0;
    for block in 0..2usize {
        let journal = &bytes[block * 4096..(block + 1) * 4096];
        let starts: Vec<usize> = (0..4096 - 4)
            .step_by(4)
            .filter(|&i| &journal[i..i + 4] == b"SPWJ")
            .collect();
        if starts.len() >= 2 {
            patch(&img, (block * 4096 + starts[0] + 20) as u64, |b| {
                b[0] ^= 0x10
            });
            flipped += 1;
        }
    }
    assert!(flipped > 0, "a journal block with two entries or more");

    let (after, _) = inspect_json(&img, 0);
    assert_eq!(after["journal"]["damaged_entries"], flipped, "{after:#}");
    assert_eq!(
        after["journal"]["entry_seq"],
        before["journal"]["entry_seq"]
    );
    assert_eq!(after["consumers"], before["consumers"]);
    assert!(warns(&after, "damaged"), "{after:#}");

    let (code, out, _) = run_cli(&["inspect", &img.display().to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("warning      journal:"), "{out}");
}

/// Found by a break-it run: both journal blocks erased (0xFF) on an image holding records
/// was silent (`result ok`, no warning), although committed offsets fell back to 0 and
/// producer sessions were forgotten. `inspect` and the gateway now warn.
#[test]
fn an_erased_journal_under_stored_records_is_warned_about() {
    let (_dir, img, before) = new_filled_image("1M", 20);
    assert!(
        before["warnings"].as_array().unwrap().is_empty(),
        "{before:#}"
    );
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[..2 * 4096].fill(0xFF);
    std::fs::write(&img, &bytes).unwrap();

    // The records are all there: exit 0.
    let (after, _) = inspect_json(&img, 0);
    assert_eq!(after["next_offset"], 20, "{after:#}");
    assert!(
        warns(&after, "journal: its blocks hold no entry"),
        "{after:#}"
    );
    // The gateway says so at start too.
    let (mut g, _) = start_on(&img);
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
    assert!(
        g.log_text().contains("journal: its blocks hold no entry"),
        "{}",
        g.log_text()
    );
}

/// Found by a break-it run: after a clean shutdown, segment 0 (the oldest, its records
/// never drained) zeroed whole: `inspect` said `result ok` and reads began at segment 1's
/// base without a word. No segment was ever reclaimed, so those durable records were lost
/// to damage: an exact corrupt range, exit 4, and the gateway counts them at start.
#[test]
fn a_zeroed_oldest_segment_after_a_clean_shutdown_is_corruption() {
    let n = 6000;
    let (_dir, img, before) = new_filled_image("4M", n);
    let lost_to = oldest_segment_end(&before, 4);
    let bps = before["geometry"]["blocks_per_segment"].as_u64().unwrap();
    let mut bytes = std::fs::read(&img).unwrap();
    let (from, to) = (
        segment_addr(&before, 0),
        segment_addr(&before, 0) + bps * 4096,
    );
    bytes[from as usize..to as usize].fill(0x00);
    std::fs::write(&img, &bytes).unwrap();

    let (v, out) = inspect_corrupt(&img, 0, lost_to);
    assert_eq!(v["first_offset"], 0, "{out}");
    assert_eq!(v["records_verified"], n - lost_to, "{out}");
    let (code, out, _) = run_cli(&["inspect", &img.display().to_string()]);
    assert_eq!(code, 4);
    assert!(out.contains("result       CORRUPT"), "{out}");

    // The gateway counts them at start, before anyone reads, and reads name the range.
    let (mut g, mut c) = serve(&img);
    let stats = c.stats().wait().unwrap();
    assert_eq!(stats.records_corrupt, lost_to, "{stats:?}");
    assert_eq!(stats.records_dropped, 0, "{stats:?}");
    let recs = read_log(&mut c, lost_to).unwrap();
    assert_eq!(recs.len() as u64, n - lost_to);
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
}

/// Found by a break-it run: after a clean shutdown (the journal's durable end at the
/// head's data end), one bit flipped inside the head's last batch: its durable,
/// acknowledged records were reported as `not_persisted` (skipped after a crash) and
/// nothing counted as corrupt. A batch that fails its CRC below the journal's durable end
/// is corruption.
#[test]
fn a_bit_flip_in_the_head_s_last_batch_after_a_clean_shutdown_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let (_, _, last, base) = clean_image_and_head(&img);
    patch(&img, last + 40, |b| b[0] ^= 0x04);
    let (v, out) = inspect_corrupt(&img, base, 3000);
    assert_eq!(v["records_verified"], base, "{out}");
}

/// Found by a break-it run: an image file cut short was called "not a Spillway image".
/// It is named truncated, with what its geometry needs, whether the cut falls inside an
/// erase block or on a block boundary (then the segment headers' count says the length).
#[test]
fn a_truncated_image_is_called_truncated() {
    let (_dir, img, v) = new_filled_image("1M", 20);
    let img_s = img.display().to_string();
    let len = std::fs::metadata(&img).unwrap().len();
    let bps = v["geometry"]["blocks_per_segment"].as_u64().unwrap();
    let segments = v["geometry"]["segments"].as_u64().unwrap();
    // The bytes the segments take (a file may have a few unused blocks after them).
    let used = (2 + segments * bps) * 4096;
    for (cut, expect) in [
        (len - 1000, "erase blocks of 4096 bytes".to_string()),
        (used - 8192, format!("its segments need {used} bytes")),
    ] {
        let file = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        file.set_len(cut).unwrap();
        drop(file);
        let (code, out, err) = run_cli(&["inspect", &img_s]);
        assert_eq!(code, 3, "{out}{err}");
        assert!(err.contains("is truncated"), "{err}");
        assert!(err.contains(&expect), "{err}");
        assert!(!err.contains("not a Spillway image"), "{err}");
    }
}

/// Found by a break-it run: a segment header (valid CRC) whose base offset is just below
/// 2^62 mounted, and the next publishes were acknowledged at offsets at and past the
/// limit, which the bridge refused and resent (one record stored about six times). The
/// gateway now warns at start, refuses every publish with `StorageFailed` saying the
/// offsets are exhausted, and never hands out such an offset; `inspect` warns too.
#[test]
fn a_segment_base_at_the_offset_limit_refuses_publishes_and_says_why() {
    use spillway_core::log::format::{FORMAT_VERSION, MAX_OFFSET, SegmentHeader};
    let (_dir, img, before) = new_filled_image("1M", 20);
    let segs = before["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 1, "{before:#}");
    let g = &before["geometry"];
    let hdr = SegmentHeader {
        version: FORMAT_VERSION,
        erase_size: 4096,
        write_size: g["write_size"].as_u64().unwrap() as u32,
        erased: 0xFF,
        blocks_per_segment: g["blocks_per_segment"].as_u64().unwrap() as u32,
        segment_count: g["segments"].as_u64().unwrap() as u32,
        log_id: u128::from_str_radix(before["log_id"].as_str().unwrap(), 16).unwrap(),
        seq: segs[0]["seq"].as_u64().unwrap() + 1,
        base_offset: MAX_OFFSET - 1,
        prev_crc: 0,
        erase_count: 1,
        after_unclean: false,
    };
    let at = segment_addr(&before, segs[0]["index"].as_u64().unwrap() + 1);
    patch(&img, at, |b| b.copy_from_slice(&hdr.encode()));

    let (v, out) = inspect_json(&img, 0);
    assert_eq!(v["next_offset"], MAX_OFFSET - 1, "{out}");
    assert!(warns(&v, "every publish is refused"), "{out}");

    let (mut gw, mut c) = serve(&img);
    for _ in 0..3 {
        let r = c
            .publish("limit/t", None, b"x", AckLevel::Buffered, None)
            .wait();
        match r {
            Err(spillway_tests::client::ClientError::Gateway { code, message }) => {
                assert_eq!(code, spillway_core::wire::ErrorCode::StorageFailed);
                assert!(message.contains("offsets are exhausted"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // The records stored before stay readable.
    assert_eq!(read_log(&mut c, 0).unwrap().len(), 20);
    assert_eq!(gw.terminate().code(), Some(0), "{}", gw.log_text());
    assert!(
        gw.log_text().contains("every publish is refused"),
        "{}",
        gw.log_text()
    );
}

/// A cleanly stopped gateway's image of 3000 records, the head segment's
/// `(index, base offset)` and the address and base offset of the head's last batch.
fn clean_image_and_head(img: &Path) -> (serde_json::Value, (u64, u64), u64, u64) {
    use spillway_core::log::format::SEGMENT_HEADER_LEN;
    let before = filled_image(img, "4M", 3000);
    assert_eq!(before["clean"], true);
    let ws = before["geometry"]["write_size"].as_u64().unwrap();
    let head = *segments(&before).last().unwrap();
    let bytes = std::fs::read(img).unwrap();
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let mut at =
        (segment_addr(&before, head.0) + (SEGMENT_HEADER_LEN as u64).next_multiple_of(ws)) as usize;
    let mut last = None;
    while bytes[at..at + 4] != [0xFF; 4] {
        last = Some(at);
        at += u64::from(u32_at(at + 4)).next_multiple_of(ws) as usize;
    }
    let last = last.expect("the head holds batches");
    let base = u64::from_le_bytes(bytes[last + 16..last + 24].try_into().unwrap());
    assert_eq!(base + u64::from(u32_at(last + 24)), 3000);
    (before, head, last as u64, base)
}

/// Found by a QA run: a bit flipped in the base offset of the head's last batch after a
/// clean shutdown made `inspect` call its records never persisted (exit 0 or a split
/// range). After a clean shutdown they are corrupt, whatever the damaged header says.
#[test]
fn a_flipped_base_offset_in_the_head_s_last_batch_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let (_, _, last, base) = clean_image_and_head(&img);
    patch(&img, last, |b| b[20] ^= 0x10);
    inspect_corrupt(&img, base, 3000);
}

/// Found by a QA run: the head segment's header zeroed after a clean shutdown made
/// `inspect` say "shutdown clean", its records never persisted, exit 0.
#[test]
fn a_zeroed_head_segment_header_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("gw.img");
    let (before, head, _, _) = clean_image_and_head(&img);
    patch(&img, segment_addr(&before, head.0), |b| b.fill(0));
    inspect_corrupt(&img, head.1, 3000);
}

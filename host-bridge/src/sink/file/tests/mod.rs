//! Unit tests of the file sink: layout, rotation, torn lines, the duplicate check and the
//! cut back to synced lengths.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use super::recovery::{cut_torn_tail, foreign_line, last_line, line_key};
use super::*;
use crate::client::{OwnedRecord, log_id_hex};
use crate::sink::JsonRecord;

mod restore;

fn rec(offset: u64, topic: &str, payload: &[u8]) -> OwnedRecord {
    OwnedRecord {
        offset,
        record_crc: 0,
        topic: topic.into(),
        timestamp_us: 1_700_000_000_000_000 + offset,
        producer: None,
        payload: bytes::Bytes::copy_from_slice(payload),
    }
}

fn src() -> Source {
    Source {
        gateway_id: "gw".into(),
        log_id: 42,
    }
}

/// `out/<stem>/<first>.jsonl.open`.
fn open_file(out: &Path, stem: &str, first: u64) -> PathBuf {
    out.join(stem).join(file_name(first, true))
}

/// `out/<stem>/<first>.jsonl`.
fn closed_file(out: &Path, stem: &str, first: u64) -> PathBuf {
    out.join(stem).join(file_name(first, false))
}

/// Every file under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// A temporary directory and the sink directory `out` in it (not created).
fn out_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    (dir, out)
}

/// Files closed `interval` after they were created, whatever their size.
fn every(interval: Duration) -> Rotation {
    Rotation {
        interval: Some(interval),
        ..Rotation::default()
    }
}

fn rot(bytes: u64) -> Rotation {
    Rotation::bytes(bytes)
}

/// The files of topic `t` once records 0 to 6 (or up to 8) were written in files of
/// [`three_lines`] and the two full files were closed: 0 and 3 closed, 6 open.
const ROTATED_AT_3_AND_6: [&str; 3] = [
    "t/00000000000000000000.jsonl",
    "t/00000000000000000003.jsonl",
    "t/00000000000000000006.jsonl.open",
];

/// Records `0..n` of topic `t`, each with the payload `x`.
fn xs(n: u64) -> Vec<OwnedRecord> {
    (0..n).map(|i| rec(i, "t", b"x")).collect()
}

/// The length of a line of [`xs`], bytes (the same for offsets under 10).
fn x_line_len() -> u64 {
    JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64
}

/// Files of three lines of [`xs`] each.
fn three_lines() -> Rotation {
    rot(x_line_len() * 3)
}

/// The sink on `out` opened (a start, or a restart after a crash).
async fn open(out: &Path, rotate: Rotation) -> FileSink {
    FileSink::open_async(out.to_path_buf(), rotate)
        .await
        .unwrap()
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn stems_are_percent_encoded_and_bounded() {
    assert_eq!(topic_stem("buoy/sst"), "buoy%2Fsst");
    assert_eq!(topic_stem(".."), "%2E%2E");
    assert_eq!(topic_stem("a b_c-d"), "a%20b_c-d");
    assert_eq!(topic_stem("température"), "temp%C3%A9rature");
    assert_eq!(topic_stem(""), "%");
    let long = "/".repeat(255);
    let s = topic_stem(&long);
    assert!(s.len() <= MAX_STEM + 9, "{}", s.len());
    assert!(!s.contains('/'));
    let long2 = format!("{}x", "/".repeat(254));
    assert_ne!(topic_stem(&long2), s);
    assert_eq!(file_name(3, false), "00000000000000000003.jsonl");
    assert_eq!(file_name(3, true), "00000000000000000003.jsonl.open");
    assert_eq!(file_name(u64::MAX, false), "18446744073709551615.jsonl");
    assert_eq!(parse_name("00000000000000000003.jsonl"), Some((3, false)));
    assert_eq!(
        parse_name("00000000000000000003.jsonl.open"),
        Some((3, true))
    );
    assert_eq!(parse_name("0000000000000000003.jsonl"), None);
    assert_eq!(parse_name("buoy%2Fsst.00000003.jsonl"), None);
    assert_eq!(parse_name("00000000000000000003.json"), None);
    assert!(names::is_date_dir("2023-11-14"));
    assert!(!names::is_date_dir("2023-11-1x"));
    assert_eq!(utc_date(1_700_000_000_000_000), "2023-11-14");
}

#[test]
fn writes_exact_lines_per_topic() {
    let (_dir, out) = out_dir();
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        let recs = vec![
            rec(0, "buoy/sst", b"21.5"),
            rec(1, "cgm", b"\xff\xfe"),
            rec(2, "buoy/sst", b"21.6"),
        ];
        s.deliver(&src(), &recs).await.unwrap();
    });
    let sst = lines(&open_file(&out, "buoy%2Fsst", 0));
    assert_eq!(sst.len(), 2);
    assert_eq!(sst[0]["offset"], 0);
    assert_eq!(sst[1]["offset"], 2);
    assert_eq!(sst[1]["payload"], "21.6");
    assert_eq!(sst[0]["log_id"], "0000000000000000000000000000002a");
    let keys: Vec<&String> = sst[0].as_object().unwrap().keys().collect();
    let mut want = vec![
        "gateway_id",
        "log_id",
        "offset",
        "topic",
        "timestamp",
        "timestamp_us",
        "payload",
        "payload_encoding",
    ];
    want.sort();
    let mut got: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    got.sort();
    assert_eq!(got, want);
    let cgm = lines(&open_file(&out, "cgm", 1));
    assert_eq!(cgm[0]["payload_encoding"], "base64");
    assert_eq!(cgm[0]["payload"], "//4=");
    // Only the two topic files, nothing named after a raw topic.
    assert_eq!(
        tree(&out),
        vec![
            "buoy%2Fsst/00000000000000000000.jsonl.open",
            "cgm/00000000000000000001.jsonl.open"
        ]
    );
}

/// Every line the sink writes reads with `serde_json`'s defaults (as a `jq` or
/// `serde_json` pipeline reads it), whatever JSON-like payload it holds: a lone surrogate
/// escape, a number past an `f64`'s range and nesting 2,000 deep are `utf8` strings, not
/// raw `json` that breaks the reader.
#[test]
fn every_line_reads_back_whatever_json_like_payload_it_holds() {
    let (_dir, out) = out_dir();
    let deep = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
    let payloads: [&[u8]; 4] = [br#"{"a":"\ud800"}"#, b"[1e400]", deep.as_bytes(), b"[1,{}]"];
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        let recs: Vec<OwnedRecord> = (0u64..)
            .zip(payloads)
            .map(|(i, p)| rec(i, "t", p))
            .collect();
        s.deliver(&src(), &recs).await.unwrap();
    });
    let got = lines(&open_file(&out, "t", 0));
    assert_eq!(got.len(), 4);
    for (v, p) in got.iter().zip(payloads).take(3) {
        assert_eq!(v["payload_encoding"], "utf8");
        assert_eq!(v["payload"].as_str().map(str::as_bytes), Some(p));
    }
    assert_eq!(got[3]["payload_encoding"], "json");
    assert_eq!(got[3]["payload"], serde_json::json!([1, {}]));
}

#[test]
fn rotates_by_size_renaming_the_open_file_and_continues_it_after_a_reopen() {
    let (_dir, out) = out_dir();
    smol::block_on(async {
        let mut s = open(&out, three_lines()).await;
        let recs = xs(7);
        s.deliver(&src(), &recs).await.unwrap();
        // Full files keep their open name until the checkpoint covers them.
        assert_eq!(
            tree(&out),
            vec![
                "t/00000000000000000000.jsonl.open",
                "t/00000000000000000003.jsonl.open",
                "t/00000000000000000006.jsonl.open"
            ]
        );
        assert_eq!(s.checkpointed(42, u64::MAX).await.unwrap(), 2);
    });
    // Each rotation closed the full file; one open file is left, named by its first offset.
    assert_eq!(tree(&out), ROTATED_AT_3_AND_6);
    assert_eq!(offsets(&closed_file(&out, "t", 3)), vec![3, 4, 5]);
    assert_eq!(lines(&open_file(&out, "t", 6)).len(), 1);
    // Reopen (a clean stop left the open file open-named): appends to it, then rotates on.
    smol::block_on(async {
        let mut s = open(&out, three_lines()).await;
        let recs: Vec<_> = (7..10).map(|i| rec(i, "t", b"x")).collect();
        s.deliver(&src(), &recs).await.unwrap();
        s.checkpointed(42, u64::MAX).await.unwrap();
    });
    assert_eq!(offsets(&closed_file(&out, "t", 6)), vec![6, 7, 8]);
    assert_eq!(offsets(&open_file(&out, "t", 9)), vec![9]);
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

#[test]
fn torn_last_line_is_cut_back_on_open() {
    let (_dir, out) = out_dir();
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        s.deliver(&src(), &[rec(0, "t", b"a"), rec(1, "t", b"b")])
            .await
            .unwrap();
    });
    let path = open_file(&out, "t", 0);
    let good = std::fs::read(&path).unwrap();
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"{\"gateway_id\":\"gw\",\"log_i").unwrap();
    drop(f);
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        assert_eq!(std::fs::read(&path).unwrap(), good);
        s.deliver(&src(), &[rec(2, "t", b"c")]).await.unwrap();
    });
    let offs: Vec<u64> = lines(&path)
        .iter()
        .map(|v| v["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offs, vec![0, 1, 2]);

    // An open file with no newline at all is emptied, and removed.
    let p2 = open_file(&out, "u", 5);
    std::fs::create_dir_all(p2.parent().unwrap()).unwrap();
    std::fs::write(&p2, b"{\"torn").unwrap();
    FileSink::open(out.clone(), rot(DEFAULT_ROTATE_BYTES)).unwrap();
    assert!(!p2.exists());
}

fn offsets(path: &Path) -> Vec<u64> {
    lines(path)
        .iter()
        .map(|v| v["offset"].as_u64().unwrap())
        .collect()
}

/// Opens the sink, delivers `recs` and reports the checkpoint saved, as a drain does;
/// returns the duplicates skipped.
fn deliver(out: &Path, rotate: Rotation, src: &Source, recs: &[OwnedRecord]) -> u64 {
    smol::block_on(async {
        let mut s = FileSink::open_async(out.to_path_buf(), rotate)
            .await
            .unwrap();
        s.deliver(src, recs).await.unwrap();
        s.checkpointed(42, u64::MAX).await.unwrap();
        s.skipped_duplicates()
    })
}

#[test]
fn resent_records_are_acknowledged_without_a_second_line() {
    let (_dir, out) = out_dir();
    let recs = xs(8);
    assert_eq!(
        deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs[..5]),
        0
    );
    // The bridge died before its checkpoint: it resends from 3 after the restart.
    assert_eq!(
        deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs[3..]),
        2
    );
    assert_eq!(
        offsets(&open_file(&out, "t", 0)),
        (0..8).collect::<Vec<_>>()
    );
    // The same within one open sink (a retried batch).
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        s.deliver(&src(), &recs[6..]).await.unwrap();
        s.deliver(&src(), &recs[6..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 4);
    });
    assert_eq!(offsets(&open_file(&out, "t", 0)).len(), 8);
}

/// What the uplink cap leaves out: the payload bytes of the records the files hold
/// already, per topic, for the log they were written for.
#[test]
fn held_bytes_are_the_payloads_of_the_records_the_files_hold() {
    let (_dir, out) = out_dir();
    let batch: Vec<_> = (0..6)
        .map(|i| rec(i, if i < 3 { "a" } else { "b" }, b"xyz"))
        .collect();
    // Topic a holds 0..=2, topic b only 3.
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &batch[..4]);
    smol::block_on(async {
        let s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        assert_eq!(s.held_bytes(&src(), &batch), 4 * 3);
        assert_eq!(s.held_bytes(&src(), &batch[4..]), 0);
        let other_log = Source {
            log_id: 43,
            ..src()
        };
        assert_eq!(s.held_bytes(&other_log, &batch), 0);
    });
}

/// Guards against one high-water mark per log: offsets are global across topics and a
/// batch is written topic by topic, so a crash can leave one topic's part of a batch
/// on disk and not another's. The later topic's records must still be written.
#[test]
fn crash_between_the_topics_of_one_batch_loses_nothing() {
    let (_dir, out) = out_dir();
    let batch: Vec<_> = (0..6)
        .map(|i| rec(i, if i % 2 == 0 { "a" } else { "b" }, b"x"))
        .collect();
    // What the crash left: topic a's lines of the batch (0, 2, 4), none of b's.
    let a_only: Vec<_> = batch.iter().filter(|r| r.topic == "a").cloned().collect();
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &a_only);
    // The drain resends the whole batch.
    assert_eq!(deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &batch), 3);
    assert_eq!(offsets(&open_file(&out, "a", 0)), vec![0, 2, 4]);
    assert_eq!(offsets(&open_file(&out, "b", 1)), vec![1, 3, 5]);
}

#[test]
fn mark_survives_rotation_and_an_empty_newest_file() {
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(10);
    deliver(&out, rotate, &src(), &recs[..6]);
    assert_eq!(offsets(&open_file(&out, "t", 3)), vec![3, 4, 5]);
    // A crash right after a rotation closed the file and created the next one, with one
    // torn line in it.
    std::fs::rename(open_file(&out, "t", 3), closed_file(&out, "t", 3)).unwrap();
    std::fs::write(open_file(&out, "t", 6), b"{\"gateway_id\":").unwrap();
    assert_eq!(deliver(&out, rotate, &src(), &recs[2..]), 4);
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

#[test]
fn another_log_id_is_never_skipped() {
    let (_dir, out) = out_dir();
    let recs = xs(4);
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs);
    let new_log = Source {
        gateway_id: "gw".into(),
        log_id: 43,
    };
    // A reflashed gateway starts again at offset 0 with a new log id.
    assert_eq!(
        deliver(&out, rot(DEFAULT_ROTATE_BYTES), &new_log, &recs[..2]),
        0
    );
    let v = lines(&open_file(&out, "t", 0));
    assert_eq!(v.len(), 6);
    assert_eq!(v[5]["log_id"], "0000000000000000000000000000002b");
    // And the old log's mark is kept in memory while the sink stays open.
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        s.deliver(&new_log, &recs[..3]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 2);
    });
}

#[test]
fn a_foreign_last_line_disables_skipping_for_its_topic() {
    let (_dir, out) = out_dir();
    std::fs::create_dir_all(out.join("t")).unwrap();
    std::fs::write(open_file(&out, "t", 0), b"not json\n").unwrap();
    let recs = xs(2);
    assert_eq!(deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs), 0);
    let text = std::fs::read_to_string(open_file(&out, "t", 0)).unwrap();
    assert_eq!(text.lines().count(), 3);
}

#[test]
fn last_line_longer_than_the_scan_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.00000000.jsonl");
    let long = vec![b'y'; 150_000];
    let mut data = b"first\n".to_vec();
    data.extend_from_slice(&long);
    data.push(b'\n');
    std::fs::write(&p, &data).unwrap();
    assert_eq!(last_line(&p).unwrap(), Some(long.clone()));
    std::fs::write(&p, [&long[..], b"\n"].concat()).unwrap();
    assert_eq!(last_line(&p).unwrap(), Some(long));
    std::fs::write(&p, b"\n").unwrap();
    assert_eq!(last_line(&p).unwrap(), Some(Vec::new()));
    std::fs::write(&p, b"").unwrap();
    assert_eq!(last_line(&p).unwrap(), None);
    assert_eq!(
        line_key(br#"{"log_id":"0000000000000000000000000000002a","offset":7}"#),
        Some((42, 7))
    );
    assert_eq!(line_key(br#"{"log_id":"2a","offset":7}"#), None);
}

/// The offsets of every file under `out`, in name order (topic, then first offset).
fn all_offsets(out: &Path) -> Vec<u64> {
    tree(out)
        .iter()
        .flat_map(|n| offsets(&out.join(n)))
        .collect()
}

/// Guards against reused names: the earlier layout counted files from `00000000` again
/// once the files were moved away, and a downstream job that had taken them got new files
/// under old names.
#[test]
fn names_never_repeat_after_closed_files_were_moved_away() {
    let (dir, out) = out_dir();
    let picked = dir.path().join("picked");
    std::fs::create_dir_all(&picked).unwrap();
    let rotate = rot(x_line_len() * 2);
    // Offsets of one digit: every line is as long as the first.
    let recs = xs(10);
    let mut taken: Vec<String> = Vec::new();
    for part in [&recs[..5], &recs[5..8], &recs[8..]] {
        deliver(&out, rotate, &src(), part);
        // A downstream job takes every closed file.
        for name in tree(&out) {
            if name.ends_with(SUFFIX) {
                let base = name.rsplit('/').next().unwrap().to_string();
                assert!(!taken.contains(&base), "{base} written twice");
                std::fs::rename(out.join(&name), picked.join(&base)).unwrap();
                taken.push(base);
            }
        }
    }
    assert_eq!(taken.len(), 4);
    let mut got: Vec<u64> = taken
        .iter()
        .flat_map(|n| offsets(&picked.join(n)))
        .collect();
    got.extend(all_offsets(&out));
    got.sort_unstable();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
}

#[test]
fn rotate_interval_closes_files_at_a_write_and_when_idle() {
    let (_dir, out) = out_dir();
    let interval = Duration::from_millis(200);
    let r = every(interval);
    smol::block_on(async {
        let mut s = open(&out, r).await;
        s.deliver(&src(), &[rec(0, "t", b"a"), rec(1, "u", b"b")])
            .await
            .unwrap();
        assert_eq!(s.close_expired().await.unwrap(), 0, "not open long enough");
        // The interval is what is tested: let it pass.
        smol::Timer::after(interval).await;
        s.deliver(&src(), &[rec(2, "t", b"c")]).await.unwrap();
        s.checkpointed(42, u64::MAX).await.unwrap();
        assert_eq!(
            tree(&out),
            vec![
                "t/00000000000000000000.jsonl",
                "t/00000000000000000002.jsonl.open",
                "u/00000000000000000001.jsonl.open"
            ]
        );
        // Idle: the drain asks the sink to close what is due; u is, t's new file is not.
        assert_eq!(s.close_expired().await.unwrap(), 1);
        assert!(closed_file(&out, "u", 1).exists());
        smol::Timer::after(interval).await;
        assert_eq!(s.close_expired().await.unwrap(), 1);
        assert_eq!(
            tree(&out),
            vec![
                "t/00000000000000000000.jsonl",
                "t/00000000000000000002.jsonl",
                "u/00000000000000000001.jsonl"
            ]
        );
        // The next record begins a new file.
        s.deliver(&src(), &[rec(3, "u", b"d")]).await.unwrap();
        s.checkpointed(42, u64::MAX).await.unwrap();
        assert_eq!(offsets(&open_file(&out, "u", 3)), vec![3]);
    });
}

/// An open file left by an earlier run counts as open since it was created (its birth
/// time), so a drain restarted on a quiet gateway closes it without writing first.
#[test]
fn rotate_interval_counts_from_the_files_creation_across_a_restart() {
    let (_dir, out) = out_dir();
    let interval = Duration::from_millis(200);
    let r = every(interval);
    deliver(&out, r, &src(), &[rec(0, "t", b"a")]);
    std::thread::sleep(interval);
    smol::block_on(async {
        let mut s = open(&out, r).await;
        let created = std::fs::metadata(open_file(&out, "t", 0))
            .unwrap()
            .created();
        if created.is_err() {
            eprintln!("this file system reports no birth time: counted from the reopen");
            std::thread::sleep(interval);
        }
        assert_eq!(s.close_expired().await.unwrap(), 1);
    });
    assert_eq!(tree(&out), vec!["t/00000000000000000000.jsonl"]);
}

#[test]
fn partition_by_date_puts_files_under_the_first_records_utc_date() {
    let (_dir, out) = out_dir();
    let r = Rotation {
        by_date: true,
        ..Rotation::default()
    };
    let day = 86_400_000_000u64;
    // 2023-11-14T22:13:20Z, 23:59:59.999999Z, then the next day.
    let t0 = 1_700_000_000_000_000u64;
    let at = |offset: u64, ts: u64| OwnedRecord {
        timestamp_us: ts,
        ..rec(offset, "t", b"x")
    };
    let end_of_day = t0 - t0 % day + day - 1;
    deliver(
        &out,
        r,
        &src(),
        &[at(0, t0), at(1, end_of_day), at(2, end_of_day + 1)],
    );
    // Stamped a day earlier (a clock set back): stays in the open file.
    deliver(&out, r, &src(), &[at(3, t0), at(4, end_of_day + 1 + day)]);
    assert_eq!(
        tree(&out),
        vec![
            "t/2023-11-14/00000000000000000000.jsonl",
            "t/2023-11-15/00000000000000000002.jsonl",
            "t/2023-11-16/00000000000000000004.jsonl.open"
        ]
    );
    assert_eq!(
        offsets(&out.join("t/2023-11-15/00000000000000000002.jsonl")),
        vec![2, 3]
    );
    // A reopen finds the open file in its date directory and continues it.
    deliver(&out, r, &src(), &[at(5, end_of_day + 1 + day)]);
    assert_eq!(
        offsets(&out.join("t/2023-11-16/00000000000000000004.jsonl.open")),
        vec![4, 5]
    );
}

#[test]
fn foreign_lines_are_found_across_buffer_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.00000000.jsonl");
    let ours = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line();
    let theirs = JsonRecord::new(
        &Source {
            gateway_id: "gw2".into(),
            log_id: 43,
        },
        &rec(0, "t", &vec![b'y'; 100_000]),
    )
    .to_line();
    std::fs::write(
        &p,
        [ours.as_bytes(), b"garbage\n", theirs.as_bytes()].concat(),
    )
    .unwrap();
    assert_eq!(foreign_line(&p, 0, 42).unwrap(), Some(43));
    let theirs_at = (ours.len() + b"garbage\n".len()) as u64;
    assert_eq!(foreign_line(&p, theirs_at, 43).unwrap(), None);
    assert_eq!(foreign_line(&p, 0, 43).unwrap(), Some(42));
    // A torn copy of their line (no newline) is nobody's.
    std::fs::write(&p, &theirs.as_bytes()[..50_000]).unwrap();
    assert_eq!(foreign_line(&p, 0, 42).unwrap(), None);
}

#[test]
fn torn_line_longer_than_the_scan_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.00000000.jsonl");
    let mut data = b"{\"ok\":1}\n".to_vec();
    data.extend(std::iter::repeat_n(b'x', 200_000));
    std::fs::write(&p, &data).unwrap();
    assert_eq!(cut_torn_tail(&p).unwrap(), 9);
    assert_eq!(std::fs::read(&p).unwrap(), b"{\"ok\":1}\n");
}

/// Batches under `WRITE_BEHIND_BYTES` are held back in memory: nothing reaches the files
/// until the sync, which writes them in order before it fsyncs; a gap line goes after the
/// records held back; a batch that takes the held-back lines past the size makes the trip.
#[test]
fn small_batches_are_held_back_until_the_sync() {
    let (_dir, out) = out_dir();
    let recs = xs(6);
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        s.write(&src(), &recs[..2]).await.unwrap();
        s.write(&src(), &recs[2..4]).await.unwrap();
        assert!(tree(&out).is_empty(), "{:?}", tree(&out));
        s.sync().await.unwrap();
        assert_eq!(offsets(&open_file(&out, "t", 0)), [0, 1, 2, 3]);
        assert_eq!(s.synced_files().unwrap().files["t"].len, x_line_len() * 4);
        s.write(&src(), &recs[4..]).await.unwrap();
        s.deliver_gap(&src(), &GapNotice::new(6, 9, "dropped"))
            .await
            .unwrap();
        let text = std::fs::read_to_string(open_file(&out, "t", 0)).unwrap();
        let last: Vec<&str> = text.lines().skip(4).collect();
        assert_eq!(last.len(), 3, "{text}");
        assert!(last[0].contains("\"offset\":4") && last[1].contains("\"offset\":5"));
        assert!(last[2].starts_with("{\"gap\":{\"from\":6"), "{}", last[2]);
        // Past the size: written at once (not synced).
        let big: Vec<OwnedRecord> = (9..9 + 1 + (WRITE_BEHIND_BYTES as u64) / 4000)
            .map(|i| rec(i, "t", &[b'y'; 4000]))
            .collect();
        s.write(&src(), &big).await.unwrap();
        let written: Vec<u64> = lines(&open_file(&out, "t", 0))
            .iter()
            .filter_map(|v| v["offset"].as_u64())
            .collect();
        assert_eq!(written.last(), big.last().map(|r| r.offset).as_ref());
    });
}

/// Batches past several [`writer::WRITE_BACK_BYTES`] (the write-back started as they are
/// written, also after a reopen that continues a file) end up in the file whole and in
/// order, and the sync counts the whole file as synced.
#[test]
fn write_back_while_writing_leaves_every_line_in_place() {
    let (_dir, out) = out_dir();
    let payload = vec![b'p'; 1000];
    let batch = |from: u64| -> Vec<OwnedRecord> {
        (from..from + 500).map(|i| rec(i, "t", &payload)).collect()
    };
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        // 6 batches of about 0.5 MiB: the write-back starts about twice per MiB.
        for b in 0..6 {
            s.write(&src(), &batch(b * 500)).await.unwrap();
        }
        s.sync().await.unwrap();
        let file = open_file(&out, "t", 0);
        let len = std::fs::metadata(&file).unwrap().len();
        assert!(len > 2 * writer::WRITE_BACK_BYTES, "{len}");
        let synced = s.synced_files().unwrap();
        assert_eq!(synced.files["t"].len, len);
    });
    // A reopen continues the file from its length: the write-back counts from there.
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        for b in 6..9 {
            s.write(&src(), &batch(b * 500)).await.unwrap();
        }
        s.sync().await.unwrap();
        let len = std::fs::metadata(open_file(&out, "t", 0)).unwrap().len();
        assert_eq!(s.synced_files().unwrap().files["t"].len, len);
    });
    assert_eq!(all_offsets(&out), (0..4500).collect::<Vec<_>>());
}

/// Starting the write-back of a file that cannot have one (a pipe: `ESPIPE`) is not an
/// error: the fsync does all the work then.
#[test]
fn write_back_where_unsupported_is_not_an_error() {
    let (r, w) = std::io::pipe().unwrap();
    let w = std::fs::File::from(std::os::fd::OwnedFd::from(w));
    assert!(writer::start_write_back(&w, 0, 1 << 20).is_ok());
    drop(r);
}

//! Tests of the state file and the resume check.

use super::store::{CHECKPOINTS, Db, GAPS_V1};
use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&dir.path().join("state.redb")).unwrap();
    (dir, s)
}

#[test]
fn save_load_survives_reopen() {
    let (dir, s) = store();
    assert_eq!(s.load("gw", "bridge").unwrap(), None);
    let mut cp = Checkpoint::new(0xABCD, 10);
    cp.last_crc = Some(0xDEAD_BEEF);
    cp.records = 10;
    s.save("gw", "bridge", &cp).unwrap();
    drop(s);
    let s = Store::open(&dir.path().join("state.redb")).unwrap();
    let got = s.load("gw", "bridge").unwrap().unwrap();
    assert_eq!(got, cp);
    assert_eq!(got.log_id(), Some(0xABCD));
    assert_eq!(got.log_id, "0000000000000000000000000000abcd");
    assert_eq!(s.load("gw", "other").unwrap(), None);
    assert_eq!(s.load("gw2", "bridge").unwrap(), None);
    assert_eq!(s.list().unwrap().len(), 1);
}

#[test]
fn gaps_and_resets_are_recorded_with_the_checkpoint() {
    let (_dir, s) = store();
    let mut cp = Checkpoint::new(7, 0);
    let gap = Gap {
        gateway_id: "gw".into(),
        from: 0,
        to: 40,
        reason: "dropped-oldest".into(),
        at_unix_ms: 1,
    };
    cp.offset = 40;
    cp.gaps = 1;
    cp.lost = 40;
    s.save_with_gap("bridge", 7, &gap, &cp).unwrap();
    assert_eq!(s.gaps(7, "bridge").unwrap(), vec![gap]);
    assert!(s.gaps(8, "bridge").unwrap().is_empty());
    assert!(s.gaps(7, "other").unwrap().is_empty());
    assert_eq!(s.load("gw", "bridge").unwrap().unwrap().offset, 40);

    let mut new = Checkpoint::new(9, 0);
    new.resets = cp.resets + 1;
    let reset = Reset {
        old_log_id: cp.log_id.clone(),
        old_offset: 40,
        new_log_id: new.log_id.clone(),
        new_offset: 0,
        reason: "log id".into(),
        at_unix_ms: 2,
    };
    s.save_with_reset("gw", "bridge", &reset, &new).unwrap();
    assert_eq!(s.resets("gw", "bridge").unwrap(), vec![reset]);
    assert_eq!(s.load("gw", "bridge").unwrap().unwrap().log_id(), Some(9));
}

fn gap(gateway_id: &str, from: u64, to: u64) -> Gap {
    Gap {
        gateway_id: gateway_id.into(),
        from,
        to,
        reason: "dropped-oldest".into(),
        at_unix_ms: 1,
    }
}

/// Two consumers of one gateway in one state file that meet a gap at the same offset
/// each keep their own row (they were keyed without the consumer: the second
/// overwrote the first).
#[test]
fn gaps_of_two_consumers_at_the_same_offset_are_both_kept() {
    let (_dir, s) = store();
    let (a, b) = (gap("gw", 10, 20), gap("gw", 10, 35));
    s.save_with_gap("archive", 7, &a, &Checkpoint::new(7, 20))
        .unwrap();
    s.save_with_gap("bridge", 7, &b, &Checkpoint::new(7, 35))
        .unwrap();
    assert_eq!(s.gaps(7, "archive").unwrap(), vec![a]);
    assert_eq!(s.gaps(7, "bridge").unwrap(), vec![b]);
}

/// A state file of the previous release (gaps keyed by log id and offset) opens: its
/// gap rows move under the consumer that file drained the gateway with, or under ""
/// when several consumers drained it; nothing is lost, and opening again changes
/// nothing.
#[test]
fn a_previous_release_state_file_opens_with_its_gaps_keyed_by_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let one = gap("gw-1", 5, 9);
    let shared = gap("gw-2", 3, 4);
    {
        let db = Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut cps = tx.open_table(CHECKPOINTS).unwrap();
            let cp = serde_json::to_string(&Checkpoint::new(1, 9)).unwrap();
            cps.insert(("gw-1", "bridge"), cp.as_str()).unwrap();
            let cp = serde_json::to_string(&Checkpoint::new(2, 4)).unwrap();
            cps.insert(("gw-2", "bridge"), cp.as_str()).unwrap();
            cps.insert(("gw-2", "audit"), cp.as_str()).unwrap();
            let mut gaps = tx.open_table(GAPS_V1).unwrap();
            let j = serde_json::to_string(&one).unwrap();
            gaps.insert((1u128, 5u64), j.as_str()).unwrap();
            let j = serde_json::to_string(&shared).unwrap();
            gaps.insert((2u128, 3u64), j.as_str()).unwrap();
        }
        tx.commit().unwrap();
    }
    for _ in 0..2 {
        let s = Store::open(&path).unwrap();
        assert_eq!(s.gaps(1, "bridge").unwrap(), vec![one.clone()]);
        assert_eq!(s.gaps(2, "").unwrap(), vec![shared.clone()]);
        assert!(s.gaps(2, "bridge").unwrap().is_empty());
        assert_eq!(s.load("gw-1", "bridge").unwrap().unwrap().offset, 9);
    }
}

#[test]
fn sink_resumes_are_recorded_with_the_checkpoint() {
    let (_dir, s) = store();
    let mut cp = Checkpoint::new(0x77, 10);
    s.save("gw", "bridge", &cp).unwrap();
    let r = SinkResume {
        gateway_id: "gw".into(),
        consumer: "bridge".into(),
        log_id: cp.log_id.clone(),
        from: 10,
        to: 14,
        highest_in_sink: 13,
        verified: 4,
        sink: "kafka topic \"t\" (1 partitions)".into(),
        at_unix_ms: 5,
    };
    cp.offset = 14;
    cp.last_crc = Some(9);
    s.save_with_sink_resume(&r, &cp).unwrap();
    assert_eq!(s.sink_resumes(0x77).unwrap(), vec![r]);
    assert!(s.sink_resumes(0x78).unwrap().is_empty());
    assert_eq!(s.load("gw", "bridge").unwrap().unwrap(), cp);
}

#[test]
fn resume_check_log_id() {
    let cp = Checkpoint::new(1, 5);
    assert!(check_log_id(&cp, "gw", 1).is_ok());
    let e = check_log_id(&cp, "gw", 2).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("00000000000000000000000000000001"), "{msg}");
    assert!(msg.contains("00000000000000000000000000000002"), "{msg}");
    assert!(msg.contains("reflashed or replaced"), "{msg}");
    // A checkpoint with a mangled log id never matches.
    let mut bad = cp.clone();
    bad.log_id = "zz".into();
    assert!(check_log_id(&bad, "gw", 1).is_err());
}

#[test]
fn resume_check_crc() {
    let mut cp = Checkpoint::new(1, 5);
    // Unknown CRC: nothing to compare.
    assert!(check_prev_crc(&cp, "gw", 1, 1234).is_ok());
    cp.last_crc = Some(1234);
    assert!(check_prev_crc(&cp, "gw", 1, 1234).is_ok());
    let e = check_prev_crc(&cp, "gw", 1, 4321).unwrap_err();
    assert!(matches!(
        e,
        ResumeMismatch::Crc {
            offset: 5,
            stored: 1234,
            gateway: 4321,
            ..
        }
    ));
    assert!(e.to_string().contains("00000000000000000000000000000001"));
}

/// A checkpoint saved by an earlier version (no `sink_files`) still loads, and one
/// with it round-trips.
#[test]
fn checkpoints_without_sink_files_still_load() {
    let (dir, s) = store();
    let path = dir.path().join("state.redb");
    let old = r#"{"log_id":"0000000000000000000000000000abcd","offset":10,"last_crc":7,"records":10,"bytes":40,"gaps":0,"lost":0,"resets":0,"updated_unix_ms":1}"#;
    {
        let Db::ReadWrite(db) = s.db.as_ref() else {
            panic!("read-write")
        };
        let tx = db.begin_write().unwrap();
        tx.open_table(CHECKPOINTS)
            .unwrap()
            .insert(("gw", "bridge"), old)
            .unwrap();
        tx.commit().unwrap();
    }
    drop(s);
    let s = Store::open(&path).unwrap();
    let mut cp = s.load("gw", "bridge").unwrap().unwrap();
    assert_eq!((cp.offset, cp.sink_files.clone()), (10, None));
    let mut files = BTreeMap::new();
    files.insert("t".to_string(), SyncedFile { first: 2, len: 300 });
    cp.sink_files = Some(SinkFiles {
        dir: "/var/spool/out".into(),
        layout: crate::sink::file::LAYOUT,
        log_id: cp.log_id.clone(),
        files,
    });
    s.save("gw", "bridge", &cp).unwrap();
    assert_eq!(s.load("gw", "bridge").unwrap().unwrap(), cp);
}

/// After a failed transaction the drain reopens the state file: the handle is
/// released first (redb refuses a second open in one process), and the last durable
/// checkpoint is there.
#[test]
fn reopen_releases_the_handle_and_keeps_the_checkpoint() {
    let (dir, mut s) = store();
    let path = dir.path().join("state.redb");
    let cp = Checkpoint::new(5, 99);
    s.save("gw", "bridge", &cp).unwrap();
    match Store::open(&path) {
        Err(StoreError::Locked { path: p, holder }) => {
            assert_eq!(p, path);
            assert_eq!(holder, Some(std::process::id()), "held by this handle");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened twice"),
    }
    s.reopen(&path).unwrap();
    assert_eq!(s.load("gw", "bridge").unwrap(), Some(cp));
    // A clone still alive keeps the file held: the reopen fails and the store is
    // closed until a later reopen succeeds.
    let clone = s.clone();
    let e = s.reopen(&path).unwrap_err();
    assert!(e.is_storage(), "{e}");
    assert!(matches!(s.load("gw", "bridge"), Err(StoreError::Closed)));
    drop(clone);
    s.reopen(&path).unwrap();
    assert_eq!(s.load("gw", "bridge").unwrap().unwrap().offset, 99);
}

#[test]
fn async_wrappers_work() {
    let dir = tempfile::tempdir().unwrap();
    smol::block_on(async {
        let s = Store::open_async(&dir.path().join("s.redb")).await.unwrap();
        let cp = Checkpoint::new(3, 3);
        s.save_async("g", "c", &cp).await.unwrap();
        assert_eq!(s.load_async("g", "c").await.unwrap(), Some(cp));
    });
}

/// `status` opens the state file read-only: while a drain holds it, it is `Locked`
/// (naming the process); a copy taken while it was open (what a killed drain leaves) is
/// `NeedsRepair`, until a drain's open repairs it and the checkpoint reads back.
#[test]
fn read_only_open_tells_a_held_file_from_one_left_unclean() {
    let (dir, s) = store();
    let path = dir.path().join("state.redb");
    let cp = Checkpoint::new(5, 42);
    s.save("gw", "bridge", &cp).unwrap();
    match Store::open_existing(&path) {
        Err(StoreError::Locked { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened beside the writer"),
    }
    let left = dir.path().join("left.redb");
    std::fs::copy(&path, &left).unwrap();
    drop(s);
    match Store::open_existing(&left) {
        Err(e @ StoreError::NeedsRepair(_)) => {
            assert!(e.to_string().contains("not closed cleanly"), "{e}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a file left open read without a repair"),
    }
    let repaired = Store::open(&left).unwrap();
    assert_eq!(repaired.load("gw", "bridge").unwrap(), Some(cp.clone()));
    drop(repaired);
    let again = Store::open_existing(&left).unwrap().unwrap();
    assert_eq!(again.load("gw", "bridge").unwrap(), Some(cp));
}

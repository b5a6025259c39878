//! Tests of the file sink after a crash or a failed write: the cut back to a checkpoint's
//! synced lengths, full files and their closing, renames cut short.

use super::*;

/// Lines written after the checkpoint (their fsync may have failed, yet Linux can still
/// show them) are cut off at a start, so the duplicate check cannot take them for
/// written records; the resent records are written again, once.
#[test]
fn restore_cuts_back_to_the_checkpoints_synced_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recs: Vec<_> = (0..8).map(|i| rec(i, "t", b"x")).collect();
    let synced = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rot(DEFAULT_ROTATE_BYTES))
            .await
            .unwrap();
        assert_eq!(s.synced_files(), None);
        s.deliver(&src(), &recs[..5]).await.unwrap();
        let synced = s.synced_files().unwrap();
        // Written after the checkpoint was saved (not in it).
        s.deliver(&src(), &recs[5..7]).await.unwrap();
        synced
    });
    assert_eq!(synced.log_id, log_id_hex(42));
    assert_eq!(synced.layout, LAYOUT);
    assert_eq!(synced.files["t"].first, 0);
    let path = open_file(&out, "t", 0);
    let at_checkpoint = synced.files["t"].len;
    assert!(std::fs::metadata(&path).unwrap().len() > at_checkpoint);
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rot(DEFAULT_ROTATE_BYTES))
            .await
            .unwrap();
        let cut = s.restore(&synced, Some((42, 5))).await.unwrap().unwrap();
        assert_eq!(cut.files, 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), at_checkpoint);
        // The drain resends from the checkpoint: nothing is skipped.
        s.deliver(&src(), &recs[5..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 0);
    });
    assert_eq!(offsets(&path), (0..8).collect::<Vec<_>>());
}

#[test]
fn restore_cuts_open_files_and_removes_topics_created_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len * 3);
    let recs: Vec<_> = (0..10).map(|i| rec(i, "t", b"x")).collect();
    let synced = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        s.deliver(&src(), &recs[..4]).await.unwrap();
        let synced = s.synced_files().unwrap();
        s.deliver(&src(), &recs[4..5]).await.unwrap();
        s.deliver(&src(), &[rec(5, "new", b"y")]).await.unwrap();
        synced
    });
    assert_eq!(
        synced.files["t"],
        SyncedFile {
            first: 3,
            len: line_len
        }
    );
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        let cut = s.restore(&synced, Some((42, 4))).await.unwrap().unwrap();
        assert_eq!(cut.files, 2, "t/3 cut, new/5 removed");
        assert!(!out.join("new").join(file_name(5, true)).exists());
        assert_eq!(all_offsets(&out), vec![0, 1, 2, 3]);
        s.deliver(&src(), &recs[4..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 0);
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// A file closed after the checkpoint (as an earlier version closed files at rotation) is
/// final: a downstream job may have taken it. It is never cut; its records are skipped
/// when the drain resends them, and the open file created after it is removed and written
/// again.
#[test]
fn restore_keeps_files_closed_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len * 3);
    let recs: Vec<_> = (0..10).map(|i| rec(i, "t", b"x")).collect();
    let synced = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        s.deliver(&src(), &recs[..4]).await.unwrap();
        let synced = s.synced_files().unwrap();
        s.deliver(&src(), &recs[4..8]).await.unwrap();
        synced
    });
    // Closed by hand, as an earlier version did at the rotation.
    std::fs::rename(open_file(&out, "t", 3), closed_file(&out, "t", 3)).unwrap();
    let closed = closed_file(&out, "t", 3);
    let before = std::fs::read(&closed).unwrap();
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        let cut = s.restore(&synced, Some((42, 4))).await.unwrap().unwrap();
        assert_eq!(cut.files, 1, "t/6 removed");
        assert_eq!(std::fs::read(&closed).unwrap(), before);
        assert_eq!(all_offsets(&out), (0..6).collect::<Vec<_>>());
        s.deliver(&src(), &recs[4..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 2);
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// Another drain writing into the same directory: its lines are never cut.
#[test]
fn restore_leaves_lines_of_another_log() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recs: Vec<_> = (0..4).map(|i| rec(i, "t", b"x")).collect();
    let other = Source {
        gateway_id: "gw2".into(),
        log_id: 43,
    };
    let synced = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rot(DEFAULT_ROTATE_BYTES))
            .await
            .unwrap();
        s.deliver(&src(), &recs[..2]).await.unwrap();
        s.synced_files().unwrap()
    });
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &other, &recs);
    let before = std::fs::read(open_file(&out, "t", 0)).unwrap();
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rot(DEFAULT_ROTATE_BYTES))
            .await
            .unwrap();
        assert_eq!(
            s.restore(&synced, Some((42, 2)))
                .await
                .unwrap()
                .unwrap()
                .files,
            0
        );
    });
    assert_eq!(std::fs::read(open_file(&out, "t", 0)).unwrap(), before);
    // A checkpoint taken for another directory is not applied.
    let mut elsewhere = synced.clone();
    elsewhere.dir = "/nonexistent/out".into();
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rot(DEFAULT_ROTATE_BYTES))
            .await
            .unwrap();
        assert_eq!(s.restore(&elsewhere, None).await.unwrap(), None);
    });
}

/// A batch that fails half-way (here: the next file of a rotation cannot be created,
/// after the current one was written, synced and set aside as full) is cut back before the
/// resend: the full file was not closed, so it is cut back like an open one, and every
/// record lands once.
#[test]
fn a_failed_batch_is_cut_back_before_it_is_resent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len * 3);
    let recs: Vec<_> = (0..6).map(|i| rec(i, "t", b"x")).collect();
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        s.deliver(&src(), &recs[..1]).await.unwrap();
        let blocker = open_file(&out, "t", 3);
        std::fs::create_dir(&blocker).unwrap();
        assert!(s.deliver(&src(), &recs[1..]).await.is_err());
        // Written and synced by the failed attempt, not closed.
        assert_eq!(offsets(&open_file(&out, "t", 0)), vec![0, 1, 2]);
        assert!(!closed_file(&out, "t", 0).exists());
        std::fs::remove_dir(&blocker).unwrap();
        s.deliver(&src(), &recs[1..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 0);
        s.checkpointed(42, u64::MAX).await.unwrap();
    });
    assert_eq!(all_offsets(&out), (0..6).collect::<Vec<_>>());
    assert_eq!(
        tree(&out),
        vec![
            "t/00000000000000000000.jsonl",
            "t/00000000000000000003.jsonl.open"
        ]
    );
}

/// A crash between the link to the closed name and the removal of the open name leaves
/// one file under both: the open name goes, the closed file is kept as it is.
#[test]
fn a_rename_cut_short_keeps_the_closed_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let recs: Vec<_> = (0..4).map(|i| rec(i, "t", b"x")).collect();
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs[..2]);
    std::fs::hard_link(open_file(&out, "t", 0), closed_file(&out, "t", 0)).unwrap();
    assert_eq!(deliver(&out, rot(DEFAULT_ROTATE_BYTES), &src(), &recs), 2);
    assert_eq!(
        tree(&out),
        vec![
            "t/00000000000000000000.jsonl",
            "t/00000000000000000002.jsonl.open"
        ]
    );
    assert_eq!(all_offsets(&out), vec![0, 1, 2, 3]);
}

/// The bridge killed after a batch filled a file, before its checkpoint was saved: the
/// full file was not closed, so no downstream job could take records that the drain sends
/// again; the restart cuts it back, and every record arrives once across the files taken
/// away and the files left.
#[test]
fn a_file_filled_by_a_batch_is_closed_only_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let picked = dir.path().join("picked");
    std::fs::create_dir_all(&picked).unwrap();
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len * 3);
    let recs: Vec<_> = (0..8).map(|i| rec(i, "t", b"x")).collect();
    // A downstream job that takes every closed file.
    let take = || {
        for name in tree(&out) {
            if name.ends_with(SUFFIX) {
                let base = name.rsplit('/').next().unwrap().to_string();
                std::fs::rename(out.join(&name), picked.join(base)).unwrap();
            }
        }
    };
    let at_checkpoint = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        s.deliver(&src(), &recs[..2]).await.unwrap();
        let cp = s.synced_files().unwrap();
        s.checkpointed(42, u64::MAX).await.unwrap();
        // Fills t/0 and t/3; killed before the checkpoint is saved.
        s.deliver(&src(), &recs[2..]).await.unwrap();
        cp
    });
    take();
    assert_eq!(
        tree(&picked),
        Vec::<String>::new(),
        "nothing closed past the checkpoint"
    );
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        let cut = s
            .restore(&at_checkpoint, Some((42, 2)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(cut.files, 3, "t/0 cut back, t/3 and t/6 removed");
        s.deliver(&src(), &recs[2..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 0);
        s.checkpointed(42, u64::MAX).await.unwrap();
    });
    take();
    let mut got = all_offsets(&picked);
    got.extend(all_offsets(&out));
    assert_eq!(got, (0..8).collect::<Vec<_>>());
}

/// Killed after the checkpoint was saved and before the full files were renamed: the
/// restore closes them (the checkpoint covers them), and nothing is sent twice.
#[test]
fn full_files_left_by_a_crash_after_their_checkpoint_are_closed_at_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len * 3);
    let recs: Vec<_> = (0..10).map(|i| rec(i, "t", b"x")).collect();
    let cp = smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        s.deliver(&src(), &recs[..8]).await.unwrap();
        s.synced_files().unwrap()
    });
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        assert_eq!(
            s.restore(&cp, Some((42, 8))).await.unwrap().unwrap().files,
            0
        );
        assert_eq!(
            tree(&out),
            vec![
                "t/00000000000000000000.jsonl",
                "t/00000000000000000003.jsonl",
                "t/00000000000000000006.jsonl.open"
            ]
        );
        s.deliver(&src(), &recs[8..]).await.unwrap();
        assert_eq!(s.skipped_duplicates(), 0);
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// Open files found at a start are closed only once a checkpoint of their own log covers
/// their last line: files of a log past its checkpoint, or of another log (one that started
/// over in the same directory reuses offsets), are never handed downstream on a guess.
#[test]
fn found_open_files_close_only_under_a_checkpoint_of_their_log() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line_len = JsonRecord::new(&src(), &rec(0, "t", b"x")).to_line().len() as u64;
    let rotate = rot(line_len);
    let recs: Vec<_> = (0..3).map(|i| rec(i, "t", b"x")).collect();
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        // Killed before the checkpoint: t/0 and t/1 full, t/2 open.
        s.deliver(&src(), &recs).await.unwrap();
    });
    smol::block_on(async {
        let mut s = FileSink::open_async(out.clone(), rotate).await.unwrap();
        assert_eq!(s.checkpointed(43, 100).await.unwrap(), 0, "another log");
        assert_eq!(s.checkpointed(42, 0).await.unwrap(), 0, "not covered");
        assert_eq!(s.checkpointed(42, 1).await.unwrap(), 1, "t/0 covered");
        assert_eq!(s.checkpointed(42, 2).await.unwrap(), 1, "t/1 covered");
    });
    assert_eq!(
        tree(&out),
        vec![
            "t/00000000000000000000.jsonl",
            "t/00000000000000000001.jsonl",
            "t/00000000000000000002.jsonl.open"
        ]
    );
}

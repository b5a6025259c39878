//! Tests of the file sink after a crash or a failed write: the cut back to a checkpoint's
//! synced lengths, full files and their closing, renames cut short.

use super::*;

/// A fresh sink on `out` that delivered `before`, saved its synced files with the
/// checkpoint, then delivered each batch of `after` before it was killed: the files of
/// that checkpoint.
fn checkpoint_then_more(
    out: &Path,
    rotate: Rotation,
    before: &[OwnedRecord],
    after: &[&[OwnedRecord]],
) -> SinkFiles {
    smol::block_on(async {
        let mut s = open(out, rotate).await;
        assert_eq!(s.synced_files(), None);
        s.deliver(&src(), before).await.unwrap();
        let synced = s.synced_files().unwrap();
        for batch in after {
            s.deliver(&src(), batch).await.unwrap();
        }
        synced
    })
}

/// The sink on `out` opened again after a crash and restored to `synced` under log 42's
/// checkpoint at `offset`: the sink, and how many files the restore cut back or removed.
async fn restart(out: &Path, rotate: Rotation, synced: &SinkFiles, offset: u64) -> (FileSink, u64) {
    let mut s = open(out, rotate).await;
    let cut = s
        .restore(synced, Some((42, offset)))
        .await
        .unwrap()
        .unwrap();
    (s, cut.files)
}

/// The drain's resend from the checkpoint: delivers `recs` to `s`, which must skip
/// `skipped` of them as already written.
async fn resend(s: &mut FileSink, recs: &[OwnedRecord], skipped: u64) {
    s.deliver(&src(), recs).await.unwrap();
    assert_eq!(s.skipped_duplicates(), skipped);
}

/// Lines written after the checkpoint (their fsync may have failed, yet Linux can still
/// show them) are cut off at a start, so the duplicate check cannot take them for
/// written records; the resent records are written again, once.
#[test]
fn restore_cuts_back_to_the_checkpoints_synced_lengths() {
    let (_dir, out) = out_dir();
    let recs = xs(8);
    // 5..7 written after the checkpoint was saved (not in it).
    let synced = checkpoint_then_more(&out, rot(DEFAULT_ROTATE_BYTES), &recs[..5], &[&recs[5..7]]);
    assert_eq!(synced.log_id, log_id_hex(42));
    assert_eq!(synced.layout, LAYOUT);
    assert_eq!(synced.files["t"].first, 0);
    let path = open_file(&out, "t", 0);
    let at_checkpoint = synced.files["t"].len;
    assert!(std::fs::metadata(&path).unwrap().len() > at_checkpoint);
    smol::block_on(async {
        let (mut s, cut) = restart(&out, rot(DEFAULT_ROTATE_BYTES), &synced, 5).await;
        assert_eq!(cut, 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), at_checkpoint);
        // The drain resends from the checkpoint: nothing is skipped.
        resend(&mut s, &recs[5..], 0).await;
    });
    assert_eq!(offsets(&path), (0..8).collect::<Vec<_>>());
}

#[test]
fn restore_cuts_open_files_and_removes_topics_created_after_the_checkpoint() {
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(10);
    let synced = checkpoint_then_more(
        &out,
        rotate,
        &recs[..4],
        &[&recs[4..5], &[rec(5, "new", b"y")]],
    );
    assert_eq!(
        synced.files["t"],
        SyncedFile {
            first: 3,
            len: x_line_len()
        }
    );
    smol::block_on(async {
        let (mut s, cut) = restart(&out, rotate, &synced, 4).await;
        assert_eq!(cut, 2, "t/3 cut, new/5 removed");
        assert!(!out.join("new").join(file_name(5, true)).exists());
        assert_eq!(all_offsets(&out), vec![0, 1, 2, 3]);
        resend(&mut s, &recs[4..], 0).await;
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// A file closed after the checkpoint (as an earlier version closed files at rotation) is
/// final: a downstream job may have taken it. It is never cut; its records are skipped
/// when the drain resends them, and the open file created after it is removed and written
/// again.
#[test]
fn restore_keeps_files_closed_after_the_checkpoint() {
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(10);
    let synced = checkpoint_then_more(&out, rotate, &recs[..4], &[&recs[4..8]]);
    // Closed by hand, as an earlier version did at the rotation.
    std::fs::rename(open_file(&out, "t", 3), closed_file(&out, "t", 3)).unwrap();
    let closed = closed_file(&out, "t", 3);
    let before = std::fs::read(&closed).unwrap();
    smol::block_on(async {
        let (mut s, cut) = restart(&out, rotate, &synced, 4).await;
        assert_eq!(cut, 1, "t/6 removed");
        assert_eq!(std::fs::read(&closed).unwrap(), before);
        assert_eq!(all_offsets(&out), (0..6).collect::<Vec<_>>());
        resend(&mut s, &recs[4..], 2).await;
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// Another drain writing into the same directory: its lines are never cut.
#[test]
fn restore_leaves_lines_of_another_log() {
    let (_dir, out) = out_dir();
    let recs = xs(4);
    let other = Source {
        gateway_id: "gw2".into(),
        log_id: 43,
    };
    let synced = checkpoint_then_more(&out, rot(DEFAULT_ROTATE_BYTES), &recs[..2], &[]);
    deliver(&out, rot(DEFAULT_ROTATE_BYTES), &other, &recs);
    let before = std::fs::read(open_file(&out, "t", 0)).unwrap();
    let (_, cut) = smol::block_on(restart(&out, rot(DEFAULT_ROTATE_BYTES), &synced, 2));
    assert_eq!(cut, 0);
    assert_eq!(std::fs::read(open_file(&out, "t", 0)).unwrap(), before);
    // A checkpoint taken for another directory is not applied.
    let mut elsewhere = synced.clone();
    elsewhere.dir = "/nonexistent/out".into();
    smol::block_on(async {
        let mut s = open(&out, rot(DEFAULT_ROTATE_BYTES)).await;
        assert_eq!(s.restore(&elsewhere, None).await.unwrap(), None);
    });
}

/// A batch that fails half-way (here: the next file of a rotation cannot be created,
/// after the current one was written, synced and set aside as full) is cut back before the
/// resend: the full file was not closed, so it is cut back like an open one, and every
/// record lands once.
#[test]
fn a_failed_batch_is_cut_back_before_it_is_resent() {
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(6);
    smol::block_on(async {
        let mut s = open(&out, rotate).await;
        s.deliver(&src(), &recs[..1]).await.unwrap();
        let blocker = open_file(&out, "t", 3);
        std::fs::create_dir(&blocker).unwrap();
        assert!(s.deliver(&src(), &recs[1..]).await.is_err());
        // Written and synced by the failed attempt, not closed.
        assert_eq!(offsets(&open_file(&out, "t", 0)), vec![0, 1, 2]);
        assert!(!closed_file(&out, "t", 0).exists());
        std::fs::remove_dir(&blocker).unwrap();
        resend(&mut s, &recs[1..], 0).await;
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
    let (_dir, out) = out_dir();
    let recs = xs(4);
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
    let (dir, out) = out_dir();
    let picked = dir.path().join("picked");
    std::fs::create_dir_all(&picked).unwrap();
    let rotate = three_lines();
    let recs = xs(8);
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
        let mut s = open(&out, rotate).await;
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
        let (mut s, cut) = restart(&out, rotate, &at_checkpoint, 2).await;
        assert_eq!(cut, 3, "t/0 cut back, t/3 and t/6 removed");
        resend(&mut s, &recs[2..], 0).await;
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
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(10);
    let cp = checkpoint_then_more(&out, rotate, &recs[..8], &[]);
    smol::block_on(async {
        let (mut s, cut) = restart(&out, rotate, &cp, 8).await;
        assert_eq!(cut, 0);
        assert_eq!(tree(&out), ROTATED_AT_3_AND_6);
        resend(&mut s, &recs[8..], 0).await;
    });
    assert_eq!(all_offsets(&out), (0..10).collect::<Vec<_>>());
}

/// Open files found at a start are closed only once a checkpoint of their own log covers
/// their last line: files of a log past its checkpoint, or of another log (one that started
/// over in the same directory reuses offsets), are never handed downstream on a guess.
#[test]
fn found_open_files_close_only_under_a_checkpoint_of_their_log() {
    let (_dir, out) = out_dir();
    let rotate = rot(x_line_len());
    let recs = xs(3);
    smol::block_on(async {
        let mut s = open(&out, rotate).await;
        // Killed before the checkpoint: t/0 and t/1 full, t/2 open.
        s.deliver(&src(), &recs).await.unwrap();
    });
    smol::block_on(async {
        let mut s = open(&out, rotate).await;
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

/// A group checkpoint: batches written without an fsync do not count as synced (a file
/// filled meanwhile is set aside, still open-named) until [`FileSink::sync`]; a crash
/// before the sync cuts every one of them off at the restart, the full file included, and
/// the resent records are written once.
#[test]
fn batches_written_before_the_sync_are_cut_back_together() {
    let (_dir, out) = out_dir();
    let rotate = three_lines();
    let recs = xs(9);
    let synced = smol::block_on(async {
        let mut s = open(&out, rotate).await;
        s.deliver(&src(), &recs[..2]).await.unwrap();
        let checkpoint = s.synced_files().unwrap();
        s.write(&src(), &recs[2..5]).await.unwrap();
        s.write(&src(), &recs[5..7]).await.unwrap();
        // Into the files, as a later batch's write would take them.
        s.flush(&src()).await.unwrap();
        assert_eq!(s.synced_files().unwrap(), checkpoint, "nothing synced yet");
        assert_eq!(
            tree(&out),
            [
                "t/00000000000000000000.jsonl.open",
                "t/00000000000000000003.jsonl.open",
                "t/00000000000000000006.jsonl.open",
            ]
        );
        checkpoint
    });
    assert_eq!(
        synced.files["t"],
        SyncedFile {
            first: 0,
            len: x_line_len() * 2
        }
    );
    smol::block_on(async {
        let (mut s, cut) = restart(&out, rotate, &synced, 2).await;
        assert_eq!(cut, 3);
        assert_eq!(tree(&out), ["t/00000000000000000000.jsonl.open"]);
        assert_eq!(offsets(&open_file(&out, "t", 0)), [0, 1]);
        s.write(&src(), &recs[2..5]).await.unwrap();
        s.write(&src(), &recs[5..]).await.unwrap();
        s.sync().await.unwrap();
        assert_eq!(
            s.synced_files().unwrap().files["t"],
            SyncedFile {
                first: 6,
                len: x_line_len() * 3
            },
            "the sync covers every batch written"
        );
        assert_eq!(s.skipped_duplicates(), 0);
        assert_eq!(s.checkpointed(42, 9).await.unwrap(), 2);
    });
    assert_eq!(tree(&out), ROTATED_AT_3_AND_6.to_vec());
    assert_eq!(all_offsets(&out), (0..9).collect::<Vec<_>>());
}

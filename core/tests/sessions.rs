//! Producer sessions on the real log: a stable producer id never turns new data into
//! duplicates, a session takes only its next sequence, resends are answered with their
//! original offsets across power cuts and clean restarts, older epochs are fenced, and a
//! record refused `Full` is stored (in order) once it is resent.

mod common;
use common::{Ram, Sim, nor};

use spillway_core::AppendError;
use spillway_core::log::{BRIDGE_CONSUMER, Config, FullPolicy, Log, Producer, Record};
use spillway_core::storage::Geometry;

const G: Geometry = nor(1024, 1024 * 8);

/// Asserts that `result` is an error matching the pattern (with an optional guard), and
/// shows the error when it is not.
macro_rules! assert_refused {
    ($result:expr, $($pattern:tt)+) => {{
        let err = $result.unwrap_err();
        assert!(matches!(err, $($pattern)+), "{err:?}");
    }};
}

fn formatted() -> Sim {
    common::formatted(G, 11, 1)
}

fn mount<'a>(flash: &'a mut Sim, mem: &'a mut Ram, cfg: Config) -> Log<'a, &'a mut Sim> {
    Log::mount(flash, cfg, mem.memory(), 0).unwrap().0
}

fn rec(id: u64, seq: u32, payload: &[u8]) -> Record<'_> {
    Record {
        topic: "t",
        timestamp_us: 1,
        producer: Some(Producer { id, seq }),
        payload,
    }
}

/// The payloads of every record in the log, in offset order.
fn payloads(log: &mut Log<'_, &mut Sim>) -> Vec<Vec<u8>> {
    let mut out = vec![0u8; 1024];
    let mut at = log.first_offset();
    let mut all = Vec::new();
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        all.extend(r.records(&out).map(|r| r.payload.to_vec()));
        at = r.next_offset;
    }
    all
}

fn lines(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// The first-day report: producer 7 published a1..a3, then a second run with the same id
/// published b1..b4, numbered from 1 again. Before sessions b1..b3 were answered as
/// duplicates of a1..a3 and lost; in a new session every one is stored.
#[test]
fn a_new_session_of_a_stable_id_never_takes_new_records_for_duplicates() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let mut log = mount(&mut flash, &mut mem, Config::default());
    let s1 = log.open_session(0, 7, false).unwrap();
    assert_eq!((s1.last_seq, s1.resumed), (0, false));
    for (i, p) in ["a1", "a2", "a3"].iter().enumerate() {
        let a = log
            .append_in_session(0, &rec(7, i as u32 + 1, p.as_bytes()), s1.epoch)
            .unwrap();
        assert!(!a.duplicate);
    }
    let s2 = log.open_session(0, 7, false).unwrap();
    assert_eq!(s2.last_seq, 0);
    assert!(s2.epoch > s1.epoch, "{s1:?} {s2:?}");
    for (i, p) in ["b1", "b2", "b3", "b4"].iter().enumerate() {
        let a = log
            .append_in_session(0, &rec(7, i as u32 + 1, p.as_bytes()), s2.epoch)
            .unwrap();
        assert!(!a.duplicate, "{p} taken for a duplicate");
    }
    assert_eq!(
        payloads(&mut log),
        lines(&["a1", "a2", "a3", "b1", "b2", "b3", "b4"])
    );
}

/// A resumed session answers with the last sequence stored durably; resending what
/// follows stores each record once, and resends of what was stored are duplicates.
#[test]
fn a_resumed_session_goes_on_from_the_last_stored_sequence() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    {
        let mut log = mount(&mut flash, &mut mem, Config::default());
        let s = log.open_session(0, 31337, false).unwrap();
        for seq in 1..=5u32 {
            log.append_in_session(0, &rec(31337, seq, format!("l{seq}").as_bytes()), s.epoch)
                .unwrap();
        }
        // Records 1..=5 were appended (buffered); the publisher is interrupted here.
        let r = log.open_session(0, 31337, true).unwrap();
        assert_eq!((r.epoch, r.last_seq, r.resumed), (s.epoch, 5, true));
        assert_eq!(
            log.durable_offset(),
            log.next_offset(),
            "resume flushes first"
        );
        // The same input again, from line 1: the first 5 are skipped by the publisher; a
        // publisher that resends them anyway gets duplicates.
        for seq in 1..=8u32 {
            let a = log
                .append_in_session(0, &rec(31337, seq, format!("l{seq}").as_bytes()), r.epoch)
                .or_else(|e| match e {
                    AppendError::SequenceTooOld { .. } => Ok(spillway_core::log::Appended {
                        offset: u64::MAX,
                        duplicate: true,
                    }),
                    e => Err(e),
                })
                .unwrap();
            assert_eq!(a.duplicate, seq <= 5, "seq {seq}");
        }
        log.close(0).unwrap();
    }
    let mut log = mount(&mut flash, &mut mem, Config::default());
    let want: Vec<String> = (1..=8).map(|i| format!("l{i}")).collect();
    let want: Vec<&str> = want.iter().map(|s| s.as_str()).collect();
    assert_eq!(payloads(&mut log), lines(&want));
    // A resume of an id without a session opens one.
    let fresh = log.open_session(0, 99, true).unwrap();
    assert_eq!((fresh.last_seq, fresh.resumed), (0, false));
    assert!(fresh.epoch > 0);
}

/// Resends within a session are answered with their original offsets after a power cut
/// (records made durable by a flush, no clean shutdown) and after a clean restart.
#[test]
fn dedup_within_a_session_survives_a_power_cut_and_a_clean_restart() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let mut offsets = Vec::new();
    let epoch;
    {
        let mut log = mount(&mut flash, &mut mem, Config::default());
        epoch = log.open_session(0, 5, false).unwrap().epoch;
        for seq in 1..=10u32 {
            offsets.push(
                log.append_in_session(0, &rec(5, seq, b"x"), epoch)
                    .unwrap()
                    .offset,
            );
        }
        log.flush(0).unwrap();
        let _ = log.into_flash(); // power cut
    }
    for round in 0..2 {
        let mut log = mount(&mut flash, &mut mem, Config::default());
        assert_eq!(
            log.producer_session(5),
            Some((epoch, 10 + round)),
            "round {round}"
        );
        // The last record is always remembered with its offset (after the power cut the
        // records found past the journal's snapshot refill the window; a clean shutdown's
        // snapshot keeps the last one).
        let last = 10 + round;
        let a = log
            .append_in_session(0, &rec(5, last, b"x"), epoch)
            .unwrap();
        assert_eq!((a.offset, a.duplicate), (offsets[last as usize - 1], true));
        assert_refused!(
            log.append_in_session(0, &rec(5, 2, b"x"), epoch),
            AppendError::SequenceTooOld { stored_below, .. } if stored_below > offsets[1]
        );
        if round == 0 {
            let a = log.append_in_session(0, &rec(5, 11, b"y"), epoch).unwrap();
            assert!(!a.duplicate);
            offsets.push(a.offset);
            log.close(0).unwrap();
        } else {
            assert_refused!(
                log.append_in_session(0, &rec(5, 10, b"x"), epoch),
                AppendError::SequenceTooOld { .. }
            );
            assert!(
                !log.append_in_session(0, &rec(5, 12, b"z"), epoch)
                    .unwrap()
                    .duplicate
            );
        }
    }
}

/// Kafka's rule: a record that is neither the next sequence nor a stored one is refused
/// as out of sequence, and stored once the producer resends in order.
#[test]
fn an_out_of_order_record_is_refused_then_stored_once_resent_in_order() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let mut log = mount(&mut flash, &mut mem, Config::default());
    let e = log.open_session(0, 3, false).unwrap().epoch;
    log.append_in_session(0, &rec(3, 1, b"1"), e).unwrap();
    // 2 was lost on the way; 3 and 4 arrive.
    for seq in [3u32, 4] {
        assert_refused!(
            log.append_in_session(0, &rec(3, seq, b"late"), e),
            AppendError::OutOfSequence { expected: 2, .. }
        );
    }
    // The producer resends in order from its first unacknowledged record.
    for seq in 2..=4u32 {
        assert!(
            !log.append_in_session(0, &rec(3, seq, format!("{seq}").as_bytes()), e)
                .unwrap()
                .duplicate
        );
    }
    // A second resend of 3 (before, an out-of-order resend was stored but not remembered,
    // and a second one stored it twice) is a duplicate.
    assert!(
        log.append_in_session(0, &rec(3, 3, b"3"), e)
            .unwrap()
            .duplicate
    );
    assert_eq!(payloads(&mut log), lines(&["1", "2", "3", "4"]));
}

/// A record refused `Full` is never abandoned while later ones are stored: the smaller
/// records after it are refused as out of sequence until it is resent, and once a consumer
/// has made room the producer resends it and the rest in order.
#[test]
fn a_record_refused_full_is_resent_in_order_later() {
    let cfg = Config {
        full: FullPolicy::RejectNew,
        ..Config::default()
    };
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let mut log = mount(&mut flash, &mut mem, cfg);
    let e = log.open_session(0, 8, false).unwrap().epoch;
    let big = vec![b'B'; 300];
    let mut seq = 0u32;
    let full_at = loop {
        match log.append_in_session(0, &rec(8, seq + 1, &big), e) {
            Ok(_) => seq += 1,
            Err(AppendError::Full) => break seq + 1,
            Err(err) => panic!("{err:?}"),
        }
        assert!(seq < 100, "the log never filled");
    };
    // A small record after it would fit, but it is out of sequence.
    assert_refused!(
        log.append_in_session(0, &rec(8, full_at + 1, b"small"), e),
        AppendError::OutOfSequence { expected, .. } if expected == full_at
    );
    log.flush(0).unwrap();
    log.commit(BRIDGE_CONSUMER, log.durable_offset()).unwrap();
    log.persist(0).unwrap();
    let a = log.append_in_session(0, &rec(8, full_at, &big), e).unwrap();
    let b = log
        .append_in_session(0, &rec(8, full_at + 1, b"small"), e)
        .unwrap();
    assert!(!a.duplicate && !b.duplicate && b.offset == a.offset + 1);
}

/// A publish under an older epoch, or without a session while the id has one, is fenced,
/// also after a restart; an epoch the log never handed out is unknown.
#[test]
fn an_older_epoch_is_fenced_across_a_restart() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let (old, current) = {
        let mut log = mount(&mut flash, &mut mem, Config::default());
        let old = log.open_session(0, 4, false).unwrap().epoch;
        log.append_in_session(0, &rec(4, 1, b"old"), old).unwrap();
        let current = log.open_session(0, 4, false).unwrap().epoch;
        assert!(current > old);
        let _ = log.into_flash(); // power cut: the epoch was written at open
        (old, current)
    };
    let mut log = mount(&mut flash, &mut mem, Config::default());
    assert_refused!(
        log.append_in_session(0, &rec(4, 2, b"zombie"), old),
        AppendError::Fenced { epoch, current: c, .. } if epoch == old && c == current
    );
    assert_refused!(
        log.append(0, &rec(4, 2, b"no session")),
        AppendError::Fenced { epoch: 0, .. }
    );
    assert_refused!(
        log.append_in_session(0, &rec(4, 1, b"made up"), current + 7),
        AppendError::UnknownSession { current: c, .. } if c == current
    );
    assert_refused!(
        log.append_in_session(0, &rec(77, 1, b"never opened"), 1),
        AppendError::UnknownSession { current: 0, .. }
    );
    assert!(
        !log.append_in_session(0, &rec(4, 1, b"new"), current)
            .unwrap()
            .duplicate
    );
    assert!(matches!(
        log.open_session(0, 4, false),
        Ok(s) if s.epoch > current
    ));
}

/// An id pushed out of the producer table by other ids, then opened again by a new
/// publisher, gets an epoch its forgotten session never had: the old publisher's resends
/// (same sequences, old epoch) are fenced, not taken for the new session's records. (When
/// every id's epochs began at 1 the new session got the forgotten one's epoch again and
/// stored the resends twice.)
#[test]
fn a_forgotten_id_opened_again_fences_its_old_session() {
    let g = Geometry {
        erase_size: 4096,
        capacity: 4096 * 8,
        ..G
    };
    let mut flash = common::formatted(g, 11, 1);
    let mut mem = Ram::new(&g, 1, 512);
    let mut log = Log::mount(&mut flash, Config::default(), mem.memory(), 0)
        .unwrap()
        .0;
    let old = log.open_session(0, 7, false).unwrap().epoch;
    for seq in 1..=2u32 {
        log.append_in_session(0, &rec(7, seq, format!("b{seq}").as_bytes()), old)
            .unwrap();
    }
    for other in 100..100 + spillway_core::log::MAX_PRODUCERS as u64 {
        log.open_session(1, other, false).unwrap();
    }
    assert_eq!(log.producer_session(7), None, "id 7 was forgotten");
    // The old publisher, still running, resends before anyone reopens the id.
    assert_refused!(
        log.append_in_session(2, &rec(7, 1, b"b1"), old),
        AppendError::UnknownSession { current: 0, .. }
    );
    let new = log.open_session(3, 7, false).unwrap();
    assert!(new.epoch > old, "{new:?}");
    for seq in 1..=2u32 {
        assert_refused!(
            log.append_in_session(4, &rec(7, seq, format!("b{seq}").as_bytes()), old),
            AppendError::Fenced { epoch, current, .. } if epoch == old && current == new.epoch
        );
    }
    log.append_in_session(5, &rec(7, 1, b"c1"), new.epoch)
        .unwrap();
    assert_eq!(payloads(&mut log), lines(&["b1", "b2", "c1"]));
}

/// A journal snapshot taken while none of the producer's remembered records is durable,
/// after records that rolled out of the window became durable: the next mount reads the
/// records from the snapshot's last durable one, so resends of the ones in between are
/// duplicates, not stored twice.
#[test]
fn a_snapshot_behind_the_window_still_finds_the_records_in_between() {
    let mut flash = formatted();
    let mut mem = Ram::new(&G, 1, 512);
    let e;
    {
        let mut log = mount(&mut flash, &mut mem, Config::default());
        e = log.open_session(0, 6, false).unwrap().epoch;
        for seq in 1..=3u32 {
            log.append_in_session(0, &rec(6, seq, b"a"), e).unwrap();
        }
        log.flush(0).unwrap();
        log.persist(0).unwrap(); // snapshot: last durable 3
        for seq in 4..=6u32 {
            log.append_in_session(0, &rec(6, seq, b"b"), e).unwrap();
        }
        log.flush(0).unwrap(); // 4..=6 durable, no snapshot
        for seq in 7..=10u32 {
            log.append_in_session(0, &rec(6, seq, b"c"), e).unwrap();
        }
        // Snapshot with the window (7..=10) all in RAM: it keeps 3 and is marked behind.
        log.persist(0).unwrap();
        let _ = log.into_flash(); // power cut: 7..=10 lost
    }
    let mut log = mount(&mut flash, &mut mem, Config::default());
    assert_eq!(log.producer_session(6), Some((e, 6)));
    assert!(
        log.append_in_session(0, &rec(6, 5, b"b"), e)
            .unwrap()
            .duplicate
    );
    assert!(
        !log.append_in_session(0, &rec(6, 7, b"c"), e)
            .unwrap()
            .duplicate
    );
}

//! Unit tests of the producer rules: sequence comparison, the session and legacy verdicts,
//! snapshots.

use super::*;

#[test]
fn serial_comparison_follows_rfc_1982() {
    assert!(seq_before(0, 1));
    assert!(!seq_before(1, 0));
    assert!(seq_before(u32::MAX, 0));
    assert!(seq_before(u32::MAX - 5, 3));
    assert!(!seq_before(3, u32::MAX - 5));
    assert!(!seq_before(7, 7));
    assert!(seq_before(0, SERIAL_HALF - 1));
    // Exactly half the space apart: undefined in RFC 1982, ordered neither way here.
    assert!(!seq_before(0, SERIAL_HALF) && !seq_before(SERIAL_HALF, 0));
    assert_eq!(seq_steps_back(u32::MAX, 2), Some(3));
    assert_eq!(seq_steps_back(3, 2), None);
}

fn session_with(epoch: u32, seqs: core::ops::RangeInclusive<u32>) -> ProducerState {
    let mut st = ProducerState::session(9, epoch, 100);
    for (i, s) in seqs.enumerate() {
        st.push(s, 100 + i as u64);
    }
    st
}

#[test]
fn a_session_takes_only_the_next_sequence_or_a_known_duplicate() {
    let st = session_with(2, 1..=10);
    assert_eq!(st.check(2, 11), Verdict::Append);
    assert_eq!(st.check(2, 10), Verdict::Duplicate { offset: 109 });
    assert_eq!(st.check(2, 7), Verdict::Duplicate { offset: 106 });
    assert_eq!(
        st.check(2, 2),
        Verdict::StoredBelow {
            stored_below: 106,
            last_seq: 10
        }
    );
    assert_eq!(st.check(2, 12), Verdict::OutOfSequence { expected: 11 });
    assert_eq!(st.check(2, 0), Verdict::OutOfSequence { expected: 11 });
    assert_eq!(
        st.check(2, u32::MAX),
        Verdict::OutOfSequence { expected: 11 }
    );
    assert_eq!(st.check(1, 11), Verdict::Fenced { current: 2 });
    assert_eq!(st.check(0, 11), Verdict::Fenced { current: 2 });
    assert_eq!(st.check(3, 1), Verdict::UnknownSession { current: 2 });
    let fresh = ProducerState::session(9, 1, 0);
    assert_eq!(fresh.check(1, 1), Verdict::Append);
    assert_eq!(fresh.check(1, 2), Verdict::OutOfSequence { expected: 1 });
    assert_eq!(fresh.check(1, 0), Verdict::OutOfSequence { expected: 1 });
}

#[test]
fn a_session_crosses_the_sequence_wrap() {
    let mut st = session_with(1, (u32::MAX - 5)..=u32::MAX);
    assert!(!st.wrapped);
    assert_eq!(st.check(1, 0), Verdict::Append);
    st.push(0, 200);
    assert!(st.wrapped);
    assert_eq!(st.check(1, 1), Verdict::Append);
    st.push(1, 201);
    assert_eq!(st.check(1, 0), Verdict::Duplicate { offset: 200 });
    assert_eq!(st.check(1, u32::MAX), Verdict::Duplicate { offset: 105 });
    // Older than the window, before the wrap: stored.
    assert!(matches!(
        st.check(1, u32::MAX - 3),
        Verdict::StoredBelow { last_seq: 1, .. }
    ));
    assert_eq!(st.check(1, 3), Verdict::OutOfSequence { expected: 2 });
}

#[test]
fn the_legacy_rule_accepts_gaps_and_compares_serially() {
    let mut st = ProducerState::new(4, u32::MAX - 1, 10);
    st.push(u32::MAX, 11);
    // After the wrap a new record is new, not an old resend.
    assert_eq!(st.check(0, 0), Verdict::Append);
    st.push(0, 12);
    st.push(5, 13); // a gap restarts the run
    assert_eq!(st.contiguous_from, 5);
    assert_eq!(st.check(0, 5), Verdict::Duplicate { offset: 13 });
    // Skipped inside the window's range, then sent late: unknown, not stored (it
    // could not be remembered, so every resend would be stored again).
    assert_eq!(st.check(0, 3), Verdict::Unknown { last_seq: 5 });
    assert_eq!(st.check(0, 9), Verdict::Append);
    st.push(6, 14);
    st.push(7, 15);
    assert_eq!(st.check(0, u32::MAX - 5), Verdict::Unknown { last_seq: 7 });
    assert_eq!(st.check(1, 8), Verdict::UnknownSession { current: 0 });
}

#[test]
fn a_snapshot_keeps_the_last_durable_record_and_says_when_it_is_behind() {
    let mut st = session_with(3, 1..=6);
    // Offsets 100..=105; durable below 104.
    let s = st.snapshot(104).unwrap();
    assert_eq!((s.last(), s.behind), (Some((4, 103)), false));
    st.set_persisted(s.last());
    for i in 7..=12 {
        st.push(i, 100 + i as u64 - 1);
    }
    // The window holds 9..=12 (offsets 108..=111), none durable below 106.
    let s = st.snapshot(106).unwrap();
    assert_eq!((s.last(), s.behind), (Some((4, 103)), true));
    assert_eq!(rebuild_from(106, &[s]), 104);
    let empty = ProducerState::session(1, 1, 50).snapshot(10).unwrap();
    assert_eq!((empty.last(), empty.behind), (None, false));
    let restored = ProducerState::from_snapshot(&s);
    assert_eq!(
        (restored.epoch, restored.last_seq(), restored.session_from),
        (3, 4, 100)
    );
    assert!(ProducerState::session(1, 0, 0).snapshot(10).is_none());
}

/// The producer table is most of a microcontroller's `Log` (32 producers), and a mount
/// holds a journal entry of 32 snapshots on its stack: their sizes are part of the
/// RAM budget (`scripts/mcu-test.sh`'s footprint), 96 and 56 bytes before the window
/// lost its length field and the snapshot its `Option`.
#[test]
fn a_producer_takes_88_bytes_and_a_snapshot_40() {
    assert_eq!(core::mem::size_of::<Window>(), 48);
    assert_eq!(core::mem::size_of::<ProducerState>(), 88);
    assert_eq!(core::mem::size_of::<Snapshot>(), 40);
}

#[test]
fn the_window_holds_its_pairs_without_a_length_field() {
    let mut w = Window::new();
    assert!(w.is_empty() && !w.is_full() && w.last().is_none());
    for i in 0..PRODUCER_WINDOW as u32 {
        assert_eq!(w.push((i, 10 + u64::from(i))), Ok(()));
    }
    assert!(w.is_full());
    assert_eq!(w.push((9, 99)), Err((9, 99)));
    w.remove_oldest();
    assert_eq!(
        (w.len(), w.first(), w.last()),
        (3, Some((1, 11)), Some((3, 13)))
    );
    // An offset no record can have is refused, not taken for an empty slot.
    assert_eq!(
        w.push((7, super::super::format::MAX_OFFSET)),
        Err((7, super::super::format::MAX_OFFSET))
    );
    assert_eq!(w.push((4, 14)), Ok(()));
    assert_eq!(
        w.iter().collect::<heapless::Vec<_, 4>>().as_slice(),
        &[(1, 11), (2, 12), (3, 13), (4, 14)]
    );
    while !w.is_empty() {
        w.remove_oldest();
    }
    assert_eq!((w, Window::new().len()), (Window::new(), 0));
}

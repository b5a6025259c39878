//! Model test: random operations on the log and on a `VecDeque` oracle of
//! `(offset, record)`, compared after every step.
//!
//! Operations: append (random topic, payload, sometimes a producer id), flush, read at a
//! random offset, commit, tick with an advancing clock, clean close and remount, drop and
//! remount (unclean), and a power cut armed after a random number of bytes that lands in
//! whatever operation comes next, and the simulated flash's other faults: a cut landing
//! out of order inside its write, a cut erase leaving arbitrary bits, a write failing after
//! part of its words (the log is then remounted with the power on), a transient read error
//! and a one-shot bit flip on read. Each case runs under one of the four combinations of
//! spill policy (`Always`, `OnPressure`) and full policy (`RejectNew`, `DropOldest`).
//! The oracle knows which records were acknowledged durable; after an unclean remount it
//! drops the records that are gone, which must all be above the durable mark (or
//! committed by every consumer while in RAM under `OnPressure`, or dropped under
//! `DropOldest`), and reads must report a lost range exactly where it has no record.
//!
//! Producers 1 and 2 publish in producer sessions (opened at the first mount, kept across
//! every remount): each new record takes the session's last stored sequence + 1, a record
//! refused `Full` is sent again with the same sequence, resends of earlier sequences must
//! be answered as duplicates (with the original offset when the oracle still has the
//! record) and never stored, and a sequence that skips one must be refused as out of
//! sequence. After every remount the session's last stored sequence must be at least the
//! last one acknowledged durable and at most the last one appended.

mod common;
use common::{Rec, Shared, Sim, nor};

use std::cell::RefCell;
use std::collections::VecDeque;

use proptest::prelude::*;
use spillway_core::log::{
    BRIDGE_CONSUMER, Compression, Config, FullPolicy, Log, LostReason, Memory, Producer, Record,
    RecoveryReport, SegmentSlot, SpillPolicy, segments_for,
};
use spillway_core::storage::{EraseTear, Geometry, SimError, SimFlash};
use spillway_core::{AppendError, FlushError, MountError};

type TestLog<'a> = Log<'a, Shared<'a>>;

const TOPICS: [&str; 3] = ["t", "sensors/41001/sst", "cgm/glucose"];
const LINGER_US: u64 = 10_000;

const GEOMETRY: Geometry = nor(1024, 1024 * (2 + 5));

fn config(spill: SpillPolicy, full: FullPolicy) -> Config {
    Config {
        spill,
        full,
        linger_us: LINGER_US,
        high_water_percent: 75,
        commit_interval_us: 50_000,
        lease_step: 16,
        compression: Compression::None,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        topic: usize,
        payload: Vec<u8>,
        producer: Option<u64>,
    },
    Flush,
    /// Read at first + (next − first) × n / 256.
    Read(u8),
    /// Commit `bridge` at first + (durable − first) × n / 256.
    Commit(u8),
    Tick(u64),
    CloseRemount,
    DropRemount,
    /// Arm a power cut after this many more programmed bytes.
    PowerCut(u16),
    /// Arm a power cut after this many more bytes, landing out of order inside its write
    /// in program units of 16 << n bytes.
    ReorderedCut(u16, u8),
    /// Arm a power cut in the erase after this many more, leaving arbitrary bits (or, odd
    /// `n`, a block that reads erased but for a few stray bits).
    TornErase(u8, u8),
    /// Arm a write failure after this many more programmed bytes.
    FailWrite(u16),
    /// Arm a transient read error after this many more reads.
    FailRead(u16),
    /// Arm a one-shot bit flip on the read after this many more.
    FlipRead(u16),
    /// Resend producer `id`'s record this many sequences before its last.
    Resend(u64, u8),
    /// Send producer `id` a record that skips one sequence (out of sequence).
    Skip(u64),
}

/// The operations, with appended payloads of `payload` bytes.
fn op(payload: std::ops::Range<usize>) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..TOPICS.len(), prop::collection::vec(any::<u8>(), payload), prop::option::weighted(0.3, 1u64..3))
            .prop_map(|(topic, payload, producer)| Op::Append { topic, payload, producer }),
        2 => Just(Op::Flush),
        3 => any::<u8>().prop_map(Op::Read),
        2 => any::<u8>().prop_map(Op::Commit),
        3 => (0..2 * LINGER_US).prop_map(Op::Tick),
        1 => Just(Op::CloseRemount),
        1 => Just(Op::DropRemount),
        1 => (0u16..1500).prop_map(Op::PowerCut),
        1 => (0u16..1500, 0u8..3).prop_map(|(n, u)| Op::ReorderedCut(n, u)),
        1 => (0u8..4, any::<u8>()).prop_map(|(n, t)| Op::TornErase(n, t)),
        1 => (0u16..1500).prop_map(Op::FailWrite),
        1 => (0u16..200).prop_map(Op::FailRead),
        1 => (0u16..200).prop_map(Op::FlipRead),
        2 => (1u64..3, 0u8..12).prop_map(|(id, back)| Op::Resend(id, back)),
        1 => (1u64..3).prop_map(Op::Skip),
    ]
}

/// The oracle.
struct Model {
    recs: VecDeque<(u64, Rec)>,
    /// Offsets below are acknowledged durable.
    durable: u64,
    /// One past the last offset handed out.
    next: u64,
    /// `(offset, append time)` of the records not yet durable.
    unflushed: VecDeque<(u64, u64)>,
    /// Per producer id: the session's last stored sequence as the oracle knows it.
    seqs: [u32; 3],
    /// Per producer id: the session epoch (0 before it is opened).
    epochs: [u32; 3],
    /// Per producer id: the highest sequence ever appended.
    appended: [u32; 3],
    /// Per producer id: the highest sequence acknowledged durable.
    durable_seqs: [u32; 3],
    now: u64,
    ts: u64,
    full: FullPolicy,
    /// `OnPressure`: records below this were committed by every consumer and may have been
    /// discarded from RAM unwritten (read back right, or reported lost).
    optional_below: u64,
}

impl Model {
    fn optional(&self, off: u64) -> bool {
        off < self.optional_below
    }

    fn get(&self, off: u64) -> Option<&Rec> {
        let i = self.recs.partition_point(|(o, _)| *o < off);
        self.recs.get(i).filter(|(o, _)| *o == off).map(|(_, r)| r)
    }

    /// Forgets the records retention reclaimed: only ones every consumer committed.
    fn retain(&mut self, log: &TestLog<'_>) {
        let first = log.first_offset();
        let committed = log.consumers().map(|c| c.1).min().unwrap_or(u64::MAX);
        assert!(
            first <= committed || self.full == FullPolicy::DropOldest,
            "first {first} above a commit {committed}"
        );
        while self.recs.front().is_some_and(|(o, _)| *o < first) {
            self.recs.pop_front();
        }
    }

    fn mark_durable(&mut self, log: &TestLog<'_>) {
        self.durable = self.durable.max(log.durable_offset());
        for (off, rec) in self.recs.iter().rev() {
            if *off < self.durable
                && let Some(p) = rec.producer
            {
                let d = &mut self.durable_seqs[p.id as usize];
                *d = (*d).max(p.seq);
            }
        }
        while self.unflushed.front().is_some_and(|u| u.0 < self.durable) {
            self.unflushed.pop_front();
        }
    }
}

fn mount<'a>(
    flash: &'a RefCell<Sim>,
    mems: &'a mut [(Vec<u8>, Vec<SegmentSlot>)],
    cfg: Config,
    now: u64,
) -> (TestLog<'a>, RecoveryReport) {
    for (buffer, segments) in mems.iter_mut() {
        let mem = Memory { buffer, segments };
        match Log::mount(Shared(flash), cfg, mem, now) {
            Ok(x) => return x,
            Err(MountError::Flash(SimError::PowerCut | SimError::ProgramFailed { .. })) => {
                flash.borrow_mut().power_on()
            }
            Err(e) => panic!("mount: {e:?}"),
        }
    }
    panic!("mount failed three times");
}

/// Reads every offset from the first to the next one and compares with the model: a record
/// where the model has one, a lost range (never corrupt) where it has none.
fn check_all(log: &mut TestLog<'_>, m: &Model) {
    let (first, next) = (log.first_offset(), log.next_offset());
    assert!(m.recs.front().is_none_or(|(o, _)| *o >= first));
    let mut out = vec![0u8; 700];
    let mut at = first;
    let mut steps = 0;
    while at < next {
        steps += 1;
        assert!(steps <= next - first + 1, "read loop stuck at {at}");
        at = check_read(log, m, at, &mut out);
    }
}

/// One read at `at`, checked against the model; returns where the next read starts.
fn check_read(log: &mut TestLog<'_>, m: &Model, at: u64, out: &mut [u8]) -> u64 {
    let r = log
        .read(at, out)
        .unwrap_or_else(|e| panic!("read {at}: {e:?}"));
    if at == log.next_offset() {
        assert_eq!((r.count, r.next_offset, r.lost), (0, at, None));
        return at;
    }
    if let Some(l) = r.lost {
        // Either reason: a torn batch left by a cut in a segment that is no longer the
        // head reads as corrupt (its bytes look like a damaged batch), although its
        // offsets were never durable. What matters is that no known record is in it.
        assert!(matches!(
            l.reason,
            LostReason::Skipped | LostReason::Corrupt
        ));
        assert_eq!(l.from, at);
        for off in l.from..l.to {
            assert!(
                m.get(off).is_none() || m.optional(off),
                "record {off} reported lost: {r:?}"
            );
        }
        return l.to;
    }
    assert!(r.count > 0, "{r:?}");
    let mut off = at;
    for rec in r.records(out) {
        assert_eq!(rec.offset, off);
        let want = m
            .get(off)
            .unwrap_or_else(|| panic!("phantom record at {off}: {rec:?}"));
        assert_eq!(rec.topic, want.topic);
        assert_eq!(rec.timestamp_us, want.ts);
        assert_eq!(rec.producer, want.producer);
        assert_eq!(rec.payload, &want.payload[..]);
        off += 1;
    }
    assert_eq!(r.next_offset, off);
    off
}

/// After an unclean remount: what was acknowledged durable is there, offsets are not
/// reused, and records that are gone leave the model (only above the durable mark).
fn recover(log: &mut TestLog<'_>, m: &mut Model) {
    let next = log.next_offset();
    assert!(next >= m.next, "offsets reused: next {next} < {}", m.next);
    m.retain(log);
    let mut out = vec![0u8; 700];
    let mut kept = VecDeque::new();
    let optional_below = m.optional_below;
    let recs = std::mem::take(&mut m.recs);
    for (off, rec) in recs {
        let r = log.read(off, &mut out).unwrap();
        match r.records(&out).next() {
            Some(got) if got.offset == off => {
                assert_eq!(got.payload, &rec.payload[..], "record {off} changed");
                kept.push_back((off, rec));
            }
            _ => assert!(
                off >= m.durable || off < optional_below,
                "durable record {off} lost (durable {}): {r:?}",
                m.durable
            ),
        }
    }
    m.recs = kept;
    m.next = next;
    m.durable = log.durable_offset();
    m.unflushed.clear();
}

/// After a mount: opens the sessions of producers 1 and 2 the first time, and afterwards
/// checks what the log remembers of them against the oracle. False if a power cut or a
/// failed write ended the boot.
fn sessions_after_mount(log: &mut TestLog<'_>, m: &mut Model) -> bool {
    for id in 1..3u64 {
        let i = id as usize;
        match log.producer_session(id) {
            Some((epoch, last)) if epoch > 0 => {
                // An open_session whose journal entry landed before a cut is adopted.
                assert!(m.epochs[i] == 0 || m.epochs[i] == epoch, "epoch {epoch}");
                m.epochs[i] = epoch;
                assert!(
                    last >= m.durable_seqs[i] || m.optional_below > 0,
                    "producer {id}: last {last} below the durable {}",
                    m.durable_seqs[i]
                );
                assert!(
                    last <= m.appended[i],
                    "producer {id}: last {last} never appended ({})",
                    m.appended[i]
                );
                m.seqs[i] = last;
            }
            other => {
                assert_eq!(
                    m.epochs[i], 0,
                    "producer {id} forgot its session: {other:?}"
                );
                match log.open_session(m.now, id, false) {
                    Ok(s) => {
                        assert_eq!((s.last_seq, s.resumed), (0, false));
                        // Epochs are log-wide: above every epoch handed out before.
                        assert!(m.epochs.iter().all(|&e| s.epoch > e), "epoch {}", s.epoch);
                        m.epochs[i] = s.epoch;
                        m.seqs[i] = 0;
                    }
                    Err(e) if is_cut(&e) => return false,
                    Err(e) => panic!("open_session: {e:?}"),
                }
            }
        }
    }
    true
}

/// Resends producer `id`'s record `back` sequences before its last: a duplicate (with the
/// oracle's offset when it still has the record) or "stored, offset unknown"; never stored
/// again. True if a fault ended the boot.
fn resend(log: &mut TestLog<'_>, m: &Model, id: u64, back: u8) -> bool {
    let i = id as usize;
    if m.seqs[i] <= back as u32 {
        return false;
    }
    let seq = m.seqs[i] - back as u32;
    let next = log.next_offset();
    let rec = Record {
        topic: "t",
        timestamp_us: m.ts,
        producer: Some(Producer { id, seq }),
        payload: b"resent",
    };
    let orig = m
        .recs
        .iter()
        .find(|(_, r)| r.producer == Some(Producer { id, seq }))
        .map(|(o, _)| *o);
    match log.append_in_session(m.now, &rec, m.epochs[i]) {
        Ok(a) => {
            assert!(
                a.duplicate,
                "resend of {id}/{seq} stored again at {}",
                a.offset
            );
            if let Some(o) = orig {
                assert_eq!(a.offset, o, "resend of {id}/{seq}");
            }
        }
        Err(AppendError::SequenceTooOld { stored_below, .. }) => {
            assert!(back as usize >= 1, "the last record is always remembered");
            if let Some(o) = orig {
                assert!(o < stored_below, "{o} not below {stored_below}");
            }
        }
        Err(e) if is_cut(&e) => return true,
        Err(e) => panic!("resend of {id}/{seq}: {e:?}"),
    }
    assert_eq!(log.next_offset(), next);
    false
}

/// Commits `bridge` up to the durable end and persists: room under `RejectNew`.
fn relieve(log: &mut TestLog<'_>, m: &mut Model) -> Result<(), ()> {
    let now = m.now;
    let d = log.durable_offset();
    log.commit(BRIDGE_CONSUMER, d).unwrap();
    m.note_commit(log);
    log.persist(now).map_err(|_| ())
}

impl Model {
    /// After a commit: under `OnPressure` what every consumer committed may be discarded.
    fn note_commit(&mut self, log: &TestLog<'_>) {
        if log.config().spill == SpillPolicy::OnPressure
            && let Some(c) = log.consumers().map(|c| c.1).min()
        {
            self.optional_below = self.optional_below.max(c);
        }
    }
}

/// An error that ends the boot: a power cut, or a failed write (the log is poisoned and
/// remounted, as a supervisor restarts the gateway).
fn is_cut<E: std::fmt::Debug>(e: &E) -> bool {
    let s = format!("{e:?}");
    s.contains("PowerCut") || s.contains("ProgramFailed") || s.contains("Poisoned")
}

fn run(ops: &[Op], sim_seed: u64, spill: SpillPolicy, full: FullPolicy) {
    let cfg = config(spill, full);
    let mut sim = SimFlash::new_vec(GEOMETRY).unwrap();
    sim.set_seed(sim_seed);
    Log::format(&mut sim, 7, 1).unwrap();
    let flash = RefCell::new(sim);
    let slots = segments_for(&GEOMETRY, 1) as usize;
    let mut mems: Vec<(Vec<u8>, Vec<SegmentSlot>)> = (0..3)
        .map(|_| (vec![0u8; 384], vec![SegmentSlot::EMPTY; slots]))
        .collect();
    let mut m = Model {
        recs: VecDeque::new(),
        durable: 0,
        next: 0,
        unflushed: VecDeque::new(),
        seqs: [0; 3],
        epochs: [0; 3],
        appended: [0; 3],
        durable_seqs: [0; 3],
        now: 1,
        ts: 1_700_000_000_000_000,
        full,
        optional_below: 0,
    };
    let mut i = 0;
    'mount: while i <= ops.len() {
        let (mut log, _) = mount(&flash, &mut mems, cfg, m.now);
        recover(&mut log, &mut m);
        check_all(&mut log, &m);
        if !sessions_after_mount(&mut log, &mut m) {
            flash.borrow_mut().power_on();
            continue 'mount;
        }
        while i < ops.len() {
            let op = &ops[i];
            i += 1;
            m.now += 13;
            let cut = match op {
                Op::Append {
                    topic,
                    payload,
                    producer,
                } => {
                    m.ts += 1000;
                    // The next sequence of the session; it is used up only once stored.
                    let producer = producer.map(|id| Producer {
                        id,
                        seq: m.seqs[id as usize].wrapping_add(1),
                    });
                    let epoch = producer.map_or(0, |p| m.epochs[p.id as usize]);
                    let rec = Rec {
                        topic: TOPICS[*topic],
                        ts: m.ts,
                        producer,
                        payload: payload.clone(),
                    };
                    let mut res = log.append_in_session(m.now, &rec.as_record(), epoch);
                    if matches!(res, Err(AppendError::Full)) {
                        if relieve(&mut log, &mut m).is_err() {
                            res = Err(AppendError::Full);
                        } else {
                            res = log.append_in_session(m.now, &rec.as_record(), epoch);
                        }
                    }
                    match res {
                        Ok(a) => {
                            assert!(!a.duplicate);
                            if let Some(p) = rec.producer {
                                m.seqs[p.id as usize] = p.seq;
                                m.appended[p.id as usize] = p.seq;
                            }
                            assert_eq!(a.offset, log.next_offset() - 1);
                            assert!(a.offset >= m.next, "offset {} reused", a.offset);
                            m.next = a.offset + 1;
                            m.recs.push_back((a.offset, rec));
                            m.unflushed.push_back((a.offset, m.now));
                            false
                        }
                        Err(AppendError::Full) => false,
                        Err(e) if is_cut(&e) || flash.borrow().is_cut() => true,
                        Err(e) => panic!("append: {e:?}"),
                    }
                }
                Op::Flush => {
                    let mut res = log.flush(m.now);
                    if matches!(res, Err(FlushError::Full)) && relieve(&mut log, &mut m).is_ok() {
                        res = log.flush(m.now);
                    }
                    match res {
                        Ok(d) => {
                            assert_eq!(d, log.next_offset());
                            false
                        }
                        Err(FlushError::Full) => false,
                        Err(e) if is_cut(&e) => true,
                        Err(e) => panic!("flush: {e:?}"),
                    }
                }
                Op::Read(k) => {
                    let (first, next) = (log.first_offset(), log.next_offset());
                    let at = first + (next - first) * *k as u64 / 256;
                    let mut out = vec![0u8; 700];
                    check_read(&mut log, &m, at, &mut out);
                    false
                }
                Op::Commit(k) => {
                    let (first, d) = (log.first_offset(), log.durable_offset());
                    log.commit(BRIDGE_CONSUMER, first + (d - first) * *k as u64 / 256)
                        .unwrap();
                    m.note_commit(&log);
                    false
                }
                Op::Tick(dt) => {
                    m.now += dt;
                    let lingered = m
                        .unflushed
                        .front()
                        .is_some_and(|u| m.now - u.1 >= LINGER_US);
                    match log.tick(m.now) {
                        Ok(_) => {
                            if lingered {
                                assert_eq!(log.buffered_records(), 0, "linger ran out");
                                assert_eq!(log.durable_offset(), log.next_offset());
                            }
                            false
                        }
                        Err(FlushError::Full) => false,
                        Err(e) if is_cut(&e) => true,
                        Err(e) => panic!("tick: {e:?}"),
                    }
                }
                Op::CloseRemount => {
                    let next = log.next_offset();
                    match log.close(m.now) {
                        Ok(_) => {
                            m.durable = next;
                            let (log, rep) = mount(&flash, &mut mems, cfg, m.now);
                            if !flash.borrow().is_cut() && rep.clean {
                                assert_eq!(log.next_offset(), next, "clean remount");
                            }
                            drop(log);
                            continue 'mount;
                        }
                        Err(FlushError::Full) => continue 'mount,
                        Err(e) if is_cut(&e) => {
                            flash.borrow_mut().power_on();
                            continue 'mount;
                        }
                        Err(e) => panic!("close: {e:?}"),
                    }
                }
                Op::DropRemount => continue 'mount,
                Op::PowerCut(n) => {
                    let mut f = flash.borrow_mut();
                    f.set_program_unit(None);
                    f.cut_after_bytes(*n as u64);
                    false
                }
                Op::ReorderedCut(n, u) => {
                    let mut f = flash.borrow_mut();
                    f.set_program_unit(Some(16 << u));
                    f.cut_after_bytes(*n as u64);
                    false
                }
                Op::TornErase(n, t) => {
                    let mut f = flash.borrow_mut();
                    f.set_erase_tear(if t % 2 == 0 {
                        EraseTear::Arbitrary
                    } else {
                        EraseTear::Sparse
                    });
                    f.cut_after_erases(*n as u64);
                    false
                }
                Op::FailWrite(n) => {
                    flash.borrow_mut().fail_write_after_bytes(*n as u64);
                    false
                }
                Op::FailRead(n) => {
                    flash.borrow_mut().fail_read_after(*n as u64);
                    false
                }
                Op::FlipRead(n) => {
                    flash.borrow_mut().flip_read_after(*n as u64);
                    false
                }
                Op::Resend(id, back) => resend(&mut log, &m, *id, *back),
                Op::Skip(id) => {
                    let i = *id as usize;
                    let rec = Record {
                        topic: "t",
                        timestamp_us: m.ts,
                        producer: Some(Producer {
                            id: *id,
                            seq: m.seqs[i].wrapping_add(2),
                        }),
                        payload: b"skipped",
                    };
                    match log.append_in_session(m.now, &rec, m.epochs[i]) {
                        Err(AppendError::OutOfSequence { expected, .. }) => {
                            assert_eq!(expected, m.seqs[i].wrapping_add(1));
                            false
                        }
                        Err(e) if is_cut(&e) => true,
                        other => panic!("a skipped sequence was answered {other:?}"),
                    }
                }
            };
            // A cut or a failed write can also land in the persist of a commit that made
            // room.
            if cut || flash.borrow().is_cut() || log.poisoned() {
                flash.borrow_mut().power_on();
                continue 'mount;
            }
            m.mark_durable(&log);
            m.retain(&log);
            assert!(log.next_offset() == m.next);
        }
        break;
    }
    // Last: a clean remount with nothing armed sees exactly the model.
    flash.borrow_mut().disarm();
    flash.borrow_mut().disarm_faults();
    let (mut log, _) = mount(&flash, &mut mems, cfg, m.now);
    recover(&mut log, &mut m);
    check_all(&mut log, &m);
}

/// Cases per run: 400 by default (a few seconds), `SPILLWAY_MODEL_CASES` for a longer
/// campaign.
fn cases() -> u32 {
    std::env::var("SPILLWAY_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn log_matches_a_vecdeque(
        ops in prop::collection::vec(op(0..120), 1..250),
        seed in any::<u64>(),
        spill in prop_oneof![Just(SpillPolicy::Always), Just(SpillPolicy::OnPressure)],
        full in prop_oneof![Just(FullPolicy::RejectNew), Just(FullPolicy::DropOldest)],
    ) {
        run(&ops, seed, spill, full);
    }

    /// Payloads up to 300 bytes (the largest record the 384-byte buffer takes on the
    /// longest topic with producer fields): records flushed alone are short batches with
    /// bodies past 255 bytes (format version 5, bit 8 of the length in tag bit 2).
    #[test]
    fn log_with_long_records_matches_a_vecdeque(
        ops in prop::collection::vec(op(0..300), 1..250),
        seed in any::<u64>(),
        spill in prop_oneof![Just(SpillPolicy::Always), Just(SpillPolicy::OnPressure)],
        full in prop_oneof![Just(FullPolicy::RejectNew), Just(FullPolicy::DropOldest)],
    ) {
        run(&ops, seed, spill, full);
    }
}

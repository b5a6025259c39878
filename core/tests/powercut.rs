//! Power-cut sweeps of the log on the simulated flash.
//!
//! A deterministic scenario (appends of varied sizes with and without producer ids, resends,
//! flushes, commits of `bridge` and `c2`, `persist`, `tick` with linger, clean reboots,
//! segment rolls and ring reuse) runs once without a cut to count the bytes programmed and
//! the erases. Then it runs again from a freshly formatted flash with a cut after every
//! programmed byte and after every erase. After the cut the flash is powered on, the log
//! remounted and checked against an oracle of what the scenario was told:
//!
//! - (a) every record acknowledged durable (below a `durable_offset()` seen after a
//!   successful operation) and still retained reads back with its offset, topic,
//!   timestamp, producer and payload, in order;
//! - (b) every record read back was appended at that offset with those bytes (no phantom);
//! - (c) committed offsets are at most the durable end, at least the value last persisted
//!   by a successful `persist()`, at most the highest value ever committed;
//! - (d) the next offset is at least one past every offset handed out (no reuse);
//! - (e) appending and flushing work again and the new records read back;
//! - (f) a second remount finds exactly the same state.
//!
//! Random runs add random scenarios, random cut points and two cuts in a row (the second
//! one possibly inside the remount after the first). `SPILLWAY_POWERCUTS=N` sets the number
//! of random runs (default [`RANDOM_RUNS`]); `SPILLWAY_SEED=S` replays a random campaign;
//! `SPILLWAY_FROM=K` starts it at run `K` (to go on from a run already passed); every
//! 10,000th run prints the progress. Every run prints what it needs to be replayed.
//!
//! Fault kinds beyond address-ordered cuts ([`FaultKind`]) run on random scenarios, each
//! until it has fired [`FAULT_RUNS`] times: a cut landing out of order inside its write, a
//! cut erase leaving arbitrary bits, a write failing after part of its words (the log is
//! poisoned and remounted with the power on), a transient read error and a one-shot bit
//! flip on read after a cut. `SPILLWAY_FAULT_RUNS=N` sets the number per kind;
//! `SPILLWAY_RUN=K` with `SPILLWAY_SEED` replays one run of a campaign.
//!
//! **Long mode.** `SPILLWAY_LONG=1 cargo test -p spillway-core --test powercut`
//! runs 1,000,000 random runs (over 10^6 cuts with the double cuts) and 200,000 fired
//! faults of each kind, besides the sweeps; each test prints its counts.

mod common;
use common::{Rng, Shared, Sim, mix};

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use spillway_core::log::{
    BRIDGE_CONSUMER, Config, FullPolicy, Log, Memory, Producer, Record, RecoveryReport,
    SegmentSlot, SpillPolicy, segments_for,
};
use spillway_core::storage::{EraseTear, Geometry, SimError, SimFaults, SimFlash};
use spillway_core::{AppendError, FlushError, MountError};

/// Default number of random runs in a normal `cargo test`.
const RANDOM_RUNS: u64 = 8000;

const SECOND_CONSUMER: &str = "c2";
const LOG_ID: u128 = 0x5350_494c_4c57_4159_0000_0000_0000_0001;

// ----- A flash shared between the log and the test --------------------------------------

type TestLog<'a> = Log<'a, Shared<'a>>;

/// RAM the log works in; a mount attempt cut by the power takes one, the retry the next.
struct Mem {
    buffer: Vec<u8>,
    slots: Vec<SegmentSlot>,
}

// ----- Deterministic randomness ---------------------------------------------------------

// ----- Scenario -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Variant {
    name: &'static str,
    write_size: u32,
    erase_size: u32,
    blocks_per_segment: u32,
    segments: u32,
    spill: SpillPolicy,
    full: FullPolicy,
    /// RAM buffer, bytes.
    buffer: usize,
    linger_us: u64,
    lease_step: u64,
    ops: usize,
    seed: u64,
}

impl Variant {
    fn geometry(&self) -> Geometry {
        Geometry {
            erase_size: self.erase_size,
            write_size: self.write_size,
            capacity: (2 + self.segments * self.blocks_per_segment) * self.erase_size,
            erased: 0xFF,
        }
    }
    fn config(&self) -> Config {
        Config {
            spill: self.spill,
            full: self.full,
            linger_us: self.linger_us,
            high_water_percent: 75,
            commit_interval_us: 3 * self.linger_us,
            lease_step: self.lease_step,
        }
    }
}

const TOPICS: [&str; 4] = [
    "t",
    "buoy/41001/sst",
    "cgm",
    "a/rather/long/topic/name/for/a/gateway/x",
];

/// Largest encoded record the scenario appends (payload ≤ 200, topic ≤ 40, producer 12).
const MAX_ENCODED: usize = 14 + 40 + 12 + 200;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rec {
    topic: &'static str,
    ts: u64,
    producer: Option<Producer>,
    payload: Vec<u8>,
}

impl Rec {
    fn as_record(&self) -> Record<'_> {
        Record {
            topic: self.topic,
            timestamp_us: self.ts,
            producer: self.producer,
            payload: &self.payload,
        }
    }
}

#[derive(Clone, Debug)]
enum CommitTo {
    Durable,
    Next,
    /// First offset + (durable − first) × n / 256.
    Between(u8),
}

#[derive(Clone, Debug)]
enum Op {
    Append(Rec),
    Flush,
    Commit(&'static str, CommitTo),
    /// Both consumers commit the next offset.
    CommitAll,
    Persist,
    Tick(u64),
    Reboot,
}

fn gen_ops(v: &Variant, seed: u64) -> Vec<Op> {
    let mut r = Rng(seed);
    let mut ops = Vec::with_capacity(v.ops);
    let mut seqs = [0u32; 2];
    let mut last_producer_rec: Option<Rec> = None;
    let mut ts = 1_764_000_000_000_000u64;
    while ops.len() < v.ops {
        let i = ops.len();
        // Consumers stall in the middle of the scenario, so the ring fills up (`Full` or
        // dropped segments); a clean reboot every 97 operations.
        let stalled = (v.ops * 3 / 10..v.ops * 17 / 20).contains(&i);
        let mut roll = r.below(100);
        if stalled && (68..=80).contains(&roll) {
            roll = 0;
        }
        if i % 97 == 96 {
            roll = 99;
        }
        let op = match roll {
            0..=59 => {
                ts += r.below(2_000_000);
                if r.chance(5)
                    && let Some(prev) = &last_producer_rec
                {
                    // A resend of the producer's last record.
                    Op::Append(prev.clone())
                } else {
                    let len = match r.below(10) {
                        0 => 0,
                        1..=5 => 1 + r.below(16),
                        6..=8 => 16 + r.below(64),
                        _ => 80 + r.below(121),
                    } as usize;
                    let payload = (0..len).map(|_| r.next() as u8).collect();
                    let producer = if r.chance(25) {
                        let p = r.below(2) as usize;
                        seqs[p] += 1;
                        Some(Producer {
                            id: 0xA000 + p as u64,
                            seq: seqs[p],
                        })
                    } else {
                        None
                    };
                    let rec = Rec {
                        topic: TOPICS[r.below(4) as usize],
                        ts,
                        producer,
                        payload,
                    };
                    if producer.is_some() {
                        last_producer_rec = Some(rec.clone());
                    }
                    Op::Append(rec)
                }
            }
            60..=67 => Op::Flush,
            68..=72 => Op::Commit(BRIDGE_CONSUMER, commit_to(&mut r)),
            73..=75 => Op::Commit(SECOND_CONSUMER, commit_to(&mut r)),
            // Both consumers read from RAM and commit what is there (OnPressure discards).
            76..=77 => Op::CommitAll,
            78..=80 => Op::Persist,
            81..=98 => Op::Tick(r.below(2 * v.linger_us)),
            _ => Op::Reboot,
        };
        ops.push(op);
    }
    ops
}

fn commit_to(r: &mut Rng) -> CommitTo {
    match r.below(4) {
        0 => CommitTo::Durable,
        1 => CommitTo::Next,
        _ => CommitTo::Between(r.next() as u8),
    }
}

// ----- Oracle ---------------------------------------------------------------------------

/// What the scenario was told, across reboots.
struct Oracle {
    spill: SpillPolicy,
    full: FullPolicy,
    /// Every record handed an offset and not known lost.
    recs: BTreeMap<u64, Rec>,
    /// Durable records that were never written because every consumer had them
    /// (`OnPressure`).
    discarded: BTreeMap<u64, Rec>,
    /// Highest durable offset acknowledged.
    durable: u64,
    /// One past the highest offset handed out.
    handed: u64,
    /// Committed offsets known persisted (lower bounds after a remount).
    commit_lb: BTreeMap<&'static str, u64>,
    /// Highest committed offset ever (upper bounds after a remount).
    commit_max: BTreeMap<&'static str, u64>,
    /// `OnPressure`: durable records below this may have been discarded unwritten.
    discard_below: u64,
    /// Mounts checked.
    mounts: u64,
    /// What the scenario exercised.
    seen: Exercised,
}

/// Counts of what a scenario exercised, to show the sweeps cover what they claim.
#[derive(Debug, Default, Clone, Copy)]
struct Exercised {
    full: u64,
    duplicates: u64,
    reboots: u64,
    segments_opened: u64,
    records_dropped: u64,
    records_discarded: u64,
}

impl Exercised {
    fn add_stats(&mut self, log: &TestLog<'_>) {
        let s = log.stats();
        self.segments_opened += s.segments_opened;
        self.records_dropped += s.records_dropped;
        self.records_discarded += s.records_discarded;
    }
}

impl Oracle {
    fn new(v: &Variant) -> Self {
        Oracle {
            spill: v.spill,
            full: v.full,
            recs: BTreeMap::new(),
            discarded: BTreeMap::new(),
            durable: 0,
            handed: 0,
            commit_lb: BTreeMap::from([(BRIDGE_CONSUMER, 0)]),
            commit_max: BTreeMap::from([(BRIDGE_CONSUMER, 0)]),
            discard_below: 0,
            mounts: 0,
            seen: Exercised::default(),
        }
    }

    fn may_be_discarded(&self, off: u64) -> bool {
        self.spill == SpillPolicy::OnPressure && off < self.discard_below
    }

    /// After any operation that did not meet a power cut.
    fn observe(&mut self, log: &TestLog<'_>) {
        self.durable = self.durable.max(log.durable_offset());
        if let Some(m) = log.consumers().map(|c| c.1).min() {
            self.discard_below = self.discard_below.max(m);
        }
    }

    fn note_persisted(&mut self, log: &TestLog<'_>) {
        let d = log.durable_offset();
        for (name, c) in log.consumers() {
            let name = static_name(name);
            let lb = self.commit_lb.entry(name).or_insert(0);
            *lb = (*lb).max(c.min(d));
        }
    }

    /// Checks a freshly mounted log against everything known (a–d) and forgets what the
    /// crash legitimately lost.
    fn verify(&mut self, log: &mut TestLog<'_>, rep: &RecoveryReport, ctx: &str) {
        self.mounts += 1;
        let next = log.next_offset();
        let first = log.first_offset();
        let dur = log.durable_offset();
        assert_eq!(rep.next_offset, next, "{ctx}: report");
        assert_eq!(rep.first_offset, first, "{ctx}: report");
        // (d)
        assert!(
            next >= self.handed,
            "{ctx}: offset reuse: next offset {next} below {} handed out",
            self.handed
        );
        assert!(first <= dur && dur <= next, "{ctx}: {first} {dur} {next}");
        // (c)
        for (name, c) in log.consumers() {
            assert!(c <= dur, "{ctx}: {name} committed {c} above durable {dur}");
            let name = static_name(name);
            if let Some(&lb) = self.commit_lb.get(name) {
                assert!(c >= lb, "{ctx}: {name} committed {c} below persisted {lb}");
            }
            let max = self.commit_max.get(name).copied().unwrap_or(0);
            assert!(
                c <= max,
                "{ctx}: {name} committed {c} above any commit {max}"
            );
        }
        for name in self.commit_lb.keys() {
            assert!(
                log.committed(name).is_some(),
                "{ctx}: persisted consumer {name} lost"
            );
        }
        if self.full == FullPolicy::RejectNew {
            let min = log.consumers().map(|c| c.1).min().unwrap_or(u64::MAX);
            assert!(
                first <= min,
                "{ctx}: RejectNew dropped offsets {first}..: a consumer is at {min}"
            );
        }
        // (a), (b): walk the whole log.
        if trace() {
            eprintln!(
                "verify: {rep:?} durable {dur} consumers {:?}",
                log.consumers().collect::<Vec<_>>()
            );
        }
        let mut seen = BTreeSet::new();
        let read_len = if self.mounts.is_multiple_of(2) {
            MAX_ENCODED + 40
        } else {
            4096
        };
        let mut out = vec![0u8; read_len];
        let mut at = first;
        let mut reads = 0u64;
        while at < next {
            reads += 1;
            assert!(
                reads <= next - first + 16,
                "{ctx}: read loop does not advance"
            );
            let r = log
                .read(at, &mut out)
                .unwrap_or_else(|e| panic!("{ctx}: read at {at}: {e:?}"));
            assert_eq!(r.first_offset, at, "{ctx}");
            if trace() {
                eprintln!(
                    "verify read at {at}: lost {:?} count {} next {}",
                    r.lost, r.count, r.next_offset
                );
            }
            if let Some(l) = r.lost {
                assert_eq!((l.from, l.to), (at, r.next_offset), "{ctx}: {r:?}");
                assert!(l.to > at && l.to <= next, "{ctx}: {r:?}");
                at = l.to;
                continue;
            }
            assert!(r.count > 0, "{ctx}: empty read at {at}: {r:?}");
            let mut want = at;
            for rec in r.records(&out) {
                assert_eq!(rec.offset, want, "{ctx}: out of order");
                let Some(exp) = self.recs.get(&rec.offset) else {
                    panic!("{ctx}: phantom record at {}: {rec:?}", rec.offset);
                };
                let got = Rec {
                    topic: exp.topic,
                    ts: rec.timestamp_us,
                    producer: rec.producer,
                    payload: rec.payload.to_vec(),
                };
                assert!(
                    rec.topic == exp.topic && got == *exp,
                    "{ctx}: record {} differs: {rec:?} vs {exp:?}",
                    rec.offset
                );
                seen.insert(rec.offset);
                want += 1;
            }
            assert_eq!(want, at + r.count as u64, "{ctx}: short record iteration");
            assert_eq!(r.next_offset, want, "{ctx}");
            at = want;
        }
        for (&off, _) in self.recs.range(first..self.durable) {
            assert!(
                seen.contains(&off) || self.may_be_discarded(off),
                "{ctx}: durable record {off} lost (durable {}, first {first}, next {next})",
                self.durable
            );
        }
        // Forget what is gone: dropped by retention or never made durable. Discarded
        // records (consumed from RAM) stay known: a resend may be answered with their
        // offset.
        let gone: Vec<u64> = self
            .recs
            .keys()
            .copied()
            .filter(|off| !seen.contains(off))
            .collect();
        for off in gone {
            let rec = self.recs.remove(&off).unwrap();
            if off >= first && off < dur {
                // Below the durable end the log reports now: only a discard explains it.
                assert!(
                    self.may_be_discarded(off),
                    "{ctx}: record {off} missing below the durable end {dur}"
                );
                self.discarded.insert(off, rec);
            }
        }
        self.durable = self.durable.max(dur);
        self.handed = next;
        self.observe(log);
    }
}

/// Consumer names used by the scenario, as `'static`.
fn static_name(name: &str) -> &'static str {
    match name {
        BRIDGE_CONSUMER => BRIDGE_CONSUMER,
        SECOND_CONSUMER => SECOND_CONSUMER,
        other => panic!("unknown consumer {other}"),
    }
}

// ----- Running --------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    Bytes(u64),
    Erases(u64),
    /// A cut after `n` bytes that lands out of order inside its write, in program units of
    /// the given bytes.
    Reordered(u64, u32),
    /// A cut during erase `n` that leaves the block as the tear mode says.
    TornErase(u64, EraseTear),
    /// A write that fails after `n` more bytes (partial data left, power on): the log is
    /// poisoned and remounted.
    FailWrite(u64),
    /// The read after `n` more reads fails once (a transient error).
    FailRead(u64),
    /// The read after `n` more reads returns one bit inverted once.
    FlipRead(u64),
}

fn arm(flash: &RefCell<Sim>, cut: Cut) {
    let mut f = flash.borrow_mut();
    f.set_program_unit(None);
    f.set_erase_tear(EraseTear::Mixed);
    match cut {
        Cut::Bytes(n) => f.cut_after_bytes(n),
        Cut::Erases(n) => f.cut_after_erases(n),
        Cut::Reordered(n, unit) => {
            f.set_program_unit(Some(unit));
            f.cut_after_bytes(n);
        }
        Cut::TornErase(n, tear) => {
            f.set_erase_tear(tear);
            f.cut_after_erases(n);
        }
        Cut::FailWrite(n) => f.fail_write_after_bytes(n),
        Cut::FailRead(n) => f.fail_read_after(n),
        Cut::FlipRead(n) => f.flip_read_after(n),
    }
}

fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("SPILLWAY_TRACE").is_some())
}

/// An error that ends the run's current boot: a power cut, or a failed write (the log is
/// poisoned; the test remounts it as a supervisor would restart the gateway).
fn power_cut<E: std::fmt::Debug>(e: &E) -> bool {
    let s = format!("{e:?}");
    s.contains("PowerCut") || s.contains("ProgramFailed")
}

struct Run<'v> {
    v: &'v Variant,
    ops: &'v [Op],
    flash: RefCell<Sim>,
    mems: Vec<Mem>,
    oracle: Oracle,
    at: usize,
    now: u64,
    /// Cuts that fired.
    cuts: u64,
}

enum Stop {
    End,
    Reboot,
    Cut,
}

fn new_mems(v: &Variant) -> Vec<Mem> {
    let n = segments_for(&v.geometry(), v.blocks_per_segment) as usize;
    (0..3)
        .map(|_| Mem {
            buffer: vec![0; v.buffer],
            slots: vec![SegmentSlot::EMPTY; n],
        })
        .collect()
}

impl<'v> Run<'v> {
    fn new(v: &'v Variant, ops: &'v [Op], sim_seed: u64) -> Self {
        let mut flash = SimFlash::new_vec(v.geometry()).unwrap();
        Log::format(&mut flash, LOG_ID, v.blocks_per_segment).unwrap();
        flash.reset_counters();
        flash.set_seed(sim_seed);
        Run {
            v,
            ops,
            flash: RefCell::new(flash),
            mems: new_mems(v),
            oracle: Oracle::new(v),
            at: 0,
            now: 1_000,
            cuts: 0,
        }
    }
}

/// Mounts, powering on and retrying when the mount itself meets the armed cut.
fn mount<'a>(
    flash: &'a RefCell<Sim>,
    mems: &'a mut [Mem],
    cfg: Config,
    now: u64,
    cuts: &mut u64,
    ctx: &str,
) -> (TestLog<'a>, RecoveryReport) {
    for m in mems.iter_mut() {
        let mem = Memory {
            buffer: &mut m.buffer,
            segments: &mut m.slots,
        };
        match Log::mount(Shared(flash), cfg, mem, now) {
            Ok(x) => return x,
            Err(MountError::Flash(SimError::PowerCut | SimError::ProgramFailed { .. })) => {
                *cuts += 1;
                flash.borrow_mut().power_on();
            }
            Err(e) => panic!("{ctx}: mount failed: {e:?}"),
        }
    }
    panic!("{ctx}: mount cut too many times");
}

/// Makes room under `RejectNew`: every consumer catches up with the durable end.
fn relieve(log: &mut TestLog<'_>, o: &mut Oracle, now: u64) -> Result<(), ()> {
    o.seen.full += 1;
    let d = log.durable_offset();
    let names: Vec<&'static str> = log.consumers().map(|c| static_name(c.0)).collect();
    for name in names {
        let c = log.commit(name, d).unwrap();
        let m = o.commit_max.entry(name).or_insert(0);
        *m = (*m).max(c);
    }
    o.observe(log);
    match log.persist(now) {
        Ok(()) => {
            o.note_persisted(log);
            Ok(())
        }
        Err(e) if power_cut(&e) => Err(()),
        Err(e) => panic!("persist: {e:?}"),
    }
}

/// Runs scenario operations from `run.at` until the end, a reboot or a power cut.
fn drive(
    log: &mut TestLog<'_>,
    v: &Variant,
    ops: &[Op],
    at: &mut usize,
    now: &mut u64,
    o: &mut Oracle,
    ctx: &str,
) -> Stop {
    while *at < ops.len() {
        let i = *at;
        *at += 1;
        *now += 41;
        let t = *now;
        if trace() {
            eprintln!(
                "op {i}: {:?} (next {} durable {} first {})",
                ops[i],
                log.next_offset(),
                log.durable_offset(),
                log.first_offset()
            );
        }
        let cut = match &ops[i] {
            Op::Append(rec) => match log.append(t, &rec.as_record()) {
                Ok(a) if a.duplicate => {
                    o.seen.duplicates += 1;
                    // A resend answered with the original offset: that record is stored.
                    if let Some(orig) = o.recs.get(&a.offset).or(o.discarded.get(&a.offset)) {
                        assert_eq!(orig, rec, "{ctx} op {i}: duplicate points elsewhere");
                    } else {
                        assert!(
                            a.offset < log.first_offset(),
                            "{ctx} op {i}: duplicate of unknown offset {}",
                            a.offset
                        );
                    }
                    false
                }
                Ok(a) => {
                    assert!(
                        a.offset >= o.handed,
                        "{ctx} op {i}: offset {} reused",
                        a.offset
                    );
                    assert_eq!(a.offset + 1, log.next_offset(), "{ctx} op {i}");
                    o.recs.insert(a.offset, rec.clone());
                    o.handed = a.offset + 1;
                    false
                }
                Err(AppendError::Full) => {
                    assert_eq!(v.full, FullPolicy::RejectNew, "{ctx} op {i}: Full");
                    relieve(log, o, t).is_err()
                }
                Err(AppendError::SequenceTooOld { .. }) => false,
                Err(e) if power_cut(&e) => true,
                Err(e) => panic!("{ctx} op {i}: append: {e:?}"),
            },
            Op::Flush => match log.flush(t) {
                Ok(d) => {
                    assert_eq!(d, log.durable_offset(), "{ctx} op {i}");
                    assert_eq!(d, log.next_offset(), "{ctx} op {i}: flush left records");
                    false
                }
                Err(FlushError::Full) => {
                    assert_eq!(v.full, FullPolicy::RejectNew, "{ctx} op {i}: Full");
                    relieve(log, o, t).is_err()
                }
                Err(e) if power_cut(&e) => true,
                Err(e) => panic!("{ctx} op {i}: flush: {e:?}"),
            },
            Op::Commit(name, to) => {
                let (first, d, n) = (log.first_offset(), log.durable_offset(), log.next_offset());
                let target = match to {
                    CommitTo::Durable => d,
                    CommitTo::Next => n,
                    CommitTo::Between(k) => first + (d - first) * *k as u64 / 256,
                };
                let c = log.commit(name, target).unwrap();
                assert!(c >= target, "{ctx} op {i}");
                let m = o.commit_max.entry(name).or_insert(0);
                *m = (*m).max(c);
                false
            }
            Op::CommitAll => {
                let n = log.next_offset();
                for name in [BRIDGE_CONSUMER, SECOND_CONSUMER] {
                    let c = log.commit(name, n).unwrap();
                    let m = o.commit_max.entry(name).or_insert(0);
                    *m = (*m).max(c);
                }
                false
            }
            Op::Persist => match log.persist(t) {
                Ok(()) => {
                    o.note_persisted(log);
                    false
                }
                Err(e) if power_cut(&e) => true,
                Err(e) => panic!("{ctx} op {i}: persist: {e:?}"),
            },
            Op::Tick(dt) => {
                *now += dt;
                let t = *now;
                match log.tick(t) {
                    Ok(deadline) => {
                        assert!(
                            deadline > t,
                            "{ctx} op {i}: deadline {deadline} not after {t}"
                        );
                        false
                    }
                    Err(FlushError::Full) => {
                        assert_eq!(v.full, FullPolicy::RejectNew, "{ctx} op {i}: Full");
                        relieve(log, o, t).is_err()
                    }
                    Err(e) if power_cut(&e) => true,
                    Err(e) => panic!("{ctx} op {i}: tick: {e:?}"),
                }
            }
            Op::Reboot => return Stop::Reboot,
        };
        if cut {
            return Stop::Cut;
        }
        o.observe(log);
    }
    Stop::End
}

/// What a mount found, compared between two mounts in a row.
#[derive(Debug, PartialEq, Eq)]
struct MountState {
    first: u64,
    next: u64,
    durable: u64,
    consumers: Vec<(String, u64)>,
}

fn mount_state(log: &TestLog<'_>) -> MountState {
    MountState {
        first: log.first_offset(),
        next: log.next_offset(),
        durable: log.durable_offset(),
        consumers: log.consumers().map(|(n, c)| (n.to_string(), c)).collect(),
    }
}

/// Flash counters when the scenario ended, and how many cuts fired.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    bytes: u64,
    erases: u64,
    cuts: u64,
    mounts: u64,
    seen: Exercised,
    /// Faults the simulated flash injected.
    faults: SimFaults,
}

/// Runs the scenario from a freshly formatted flash, arming `cuts` one after the other (the
/// next one right after the previous fired), then checks (f) and (e).
fn run(v: &Variant, ops: &[Op], cuts: &[Cut], sim_seed: u64, label: &str) -> Totals {
    let mut r = Run::new(v, ops, sim_seed);
    let ctx = format!(
        "[{} {label} sim seed {sim_seed:#x} cuts {cuts:?}]",
        r.v.name
    );
    let cfg = v.config();
    let mut pending = cuts.iter().copied();
    if let Some(c) = pending.next() {
        arm(&r.flash, c);
    }
    let mut totals = Totals::default();
    loop {
        let before = r.cuts;
        let (mut log, rep) = mount(&r.flash, &mut r.mems, cfg, r.now, &mut r.cuts, &ctx);
        // Before any cut a run repeats the uncut run exactly, whose mounts were checked.
        if r.cuts > 0 || cuts.is_empty() {
            r.oracle.verify(&mut log, &rep, &ctx);
        }
        if r.cuts > before {
            match pending.next() {
                Some(c) => arm(&r.flash, c),
                None => break,
            }
        }
        let stop = drive(
            &mut log,
            v,
            r.ops,
            &mut r.at,
            &mut r.now,
            &mut r.oracle,
            &ctx,
        );
        let cut = match stop {
            Stop::End => {
                r.oracle.seen.add_stats(&log);
                drop(log);
                let c = r.flash.borrow().counters();
                totals.bytes = c.bytes_written;
                totals.erases = c.erases;
                r.flash.borrow_mut().disarm();
                r.flash.borrow_mut().disarm_faults();
                break;
            }
            Stop::Cut => true,
            Stop::Reboot => {
                r.oracle.seen.reboots += 1;
                r.oracle.seen.add_stats(&log);
                let consumers: Vec<(&'static str, u64)> =
                    log.consumers().map(|(n, c)| (static_name(n), c)).collect();
                let next = log.next_offset();
                match log.close(r.now) {
                    Ok(_) => {
                        let o = &mut r.oracle;
                        o.durable = o.durable.max(next);
                        for (n, c) in consumers {
                            let lb = o.commit_lb.entry(n).or_insert(0);
                            *lb = (*lb).max(c.min(next));
                        }
                        false
                    }
                    Err(e) if power_cut(&e) => true,
                    Err(e) => panic!("{ctx}: close: {e:?}"),
                }
            }
        };
        if cut {
            r.cuts += 1;
            r.flash.borrow_mut().power_on();
            match pending.next() {
                Some(c) => arm(&r.flash, c),
                None => break,
            }
        }
    }
    finish(&mut r, &ctx);
    totals.faults = r.flash.borrow().faults();
    totals.cuts = r.cuts;
    totals.mounts = r.oracle.mounts;
    totals.seen = r.oracle.seen;
    totals
}

/// (f) two mounts in a row agree; (e) appending and flushing work and read back; a clean
/// close and a last mount keep them.
fn finish(r: &mut Run<'_>, ctx: &str) {
    let cfg = r.v.config();
    let (mut log, rep) = mount(&r.flash, &mut r.mems, cfg, r.now, &mut r.cuts, ctx);
    r.oracle.verify(&mut log, &rep, ctx);
    let s1 = mount_state(&log);
    drop(log);
    let (mut log, rep) = mount(&r.flash, &mut r.mems, cfg, r.now, &mut r.cuts, ctx);
    r.oracle.verify(&mut log, &rep, ctx);
    assert_eq!(s1, mount_state(&log), "{ctx}: second remount differs");

    let o = &mut r.oracle;
    let mut added = Vec::new();
    for k in 0..3u64 {
        let rec = Rec {
            topic: "t",
            ts: 42 + k,
            producer: None,
            payload: format!("after recovery {k}").into_bytes(),
        };
        let mut tries = 0;
        let a = loop {
            tries += 1;
            match log.append(r.now, &rec.as_record()) {
                Ok(a) => break a,
                Err(AppendError::Full) if tries == 1 => relieve(&mut log, o, r.now).unwrap(),
                Err(e) => panic!("{ctx}: append after recovery: {e:?}"),
            }
        };
        assert!(!a.duplicate && a.offset >= o.handed, "{ctx}: {a:?}");
        o.recs.insert(a.offset, rec.clone());
        o.handed = a.offset + 1;
        added.push((a.offset, rec));
    }
    if let Err(e) = log.flush(r.now) {
        assert!(
            matches!(e, FlushError::Full),
            "{ctx}: flush after recovery: {e:?}"
        );
        relieve(&mut log, o, r.now).unwrap();
        log.flush(r.now)
            .unwrap_or_else(|e| panic!("{ctx}: flush after relieving: {e:?}"));
    }
    assert_eq!(log.durable_offset(), log.next_offset(), "{ctx}");
    o.observe(&log);
    let mut out = vec![0u8; 1024];
    for (off, rec) in &added {
        let got = log.read(*off, &mut out).unwrap();
        let first = got.records(&out).next();
        let first = first.unwrap_or_else(|| panic!("{ctx}: {off} not readable: {got:?}"));
        assert_eq!(first.offset, *off);
        assert_eq!(first.payload, &rec.payload[..], "{ctx}");
    }
    let next = log.next_offset();
    log.close(r.now).unwrap();
    o.durable = o.durable.max(next);
    let (mut log, rep) = mount(&r.flash, &mut r.mems, cfg, r.now, &mut r.cuts, ctx);
    r.oracle.verify(&mut log, &rep, ctx);
    assert_eq!(
        log.next_offset(),
        next,
        "{ctx}: clean close skipped offsets"
    );
}

// ----- Sweeps ---------------------------------------------------------------------------

fn sweep(v: &Variant) -> u64 {
    let start = Instant::now();
    let ops = gen_ops(v, v.seed);
    let base = run(v, &ops, &[], v.seed, "no cut");
    assert_eq!(base.cuts, 0);
    let seen = base.seen;
    eprintln!("powercut sweep {}: scenario exercises {seen:?}", v.name);
    let ring = (v.segments * v.blocks_per_segment) as u64;
    assert!(base.erases > ring, "[{}] the ring never wraps", v.name);
    assert!(
        seen.reboots >= 2 && seen.duplicates > 0,
        "[{}] {seen:?}",
        v.name
    );
    match v.full {
        FullPolicy::RejectNew => assert!(seen.full > 0, "[{}] never full", v.name),
        FullPolicy::DropOldest => assert!(seen.records_dropped > 0, "[{}] never drops", v.name),
    }
    if v.spill == SpillPolicy::OnPressure {
        assert!(seen.records_discarded > 0, "[{}] never discards", v.name);
    }
    let mut cuts = 0u64;
    for n in 0..base.bytes {
        let t = run(
            v,
            &ops,
            &[Cut::Bytes(n)],
            mix(v.seed, n),
            &format!("byte cut {n}"),
        );
        assert_eq!(t.cuts, 1, "[{}] byte cut {n} did not fire", v.name);
        cuts += 1;
    }
    for n in 0..base.erases {
        let t = run(
            v,
            &ops,
            &[Cut::Erases(n)],
            mix(v.seed, !n),
            &format!("erase cut {n}"),
        );
        assert_eq!(t.cuts, 1, "[{}] erase cut {n} did not fire", v.name);
        cuts += 1;
    }
    eprintln!(
        "powercut sweep {}: scenario seed {:#x}, {} ops, {} bytes programmed, {} erases, {} mounts; {cuts} cuts in {:.2?}",
        v.name,
        v.seed,
        v.ops,
        base.bytes,
        base.erases,
        base.mounts,
        start.elapsed()
    );
    cuts
}

/// What the variants share: 2 erase blocks per segment, a 512-byte RAM buffer, a 20 ms
/// linger, a lease every 64 offsets, 400 operations.
const BASE: Variant = Variant {
    name: "",
    write_size: 4,
    erase_size: 1024,
    blocks_per_segment: 2,
    segments: 4,
    spill: SpillPolicy::Always,
    full: FullPolicy::RejectNew,
    buffer: 512,
    linger_us: 20_000,
    lease_step: 64,
    ops: 400,
    seed: 0,
};

const VARIANTS: [Variant; 6] = [
    Variant {
        name: "ws1-always-reject",
        write_size: 1,
        seed: 0x11,
        ..BASE
    },
    Variant {
        name: "ws4-pressure-drop",
        segments: 5,
        spill: SpillPolicy::OnPressure,
        full: FullPolicy::DropOldest,
        seed: 0x42,
        ..BASE
    },
    Variant {
        name: "ws16-always-drop",
        write_size: 16,
        full: FullPolicy::DropOldest,
        seed: 0x16,
        ..BASE
    },
    Variant {
        name: "ws1-pressure-reject",
        write_size: 1,
        spill: SpillPolicy::OnPressure,
        seed: 0x1001,
        ..BASE
    },
    Variant {
        name: "ws16-pressure-reject",
        write_size: 16,
        segments: 6,
        spill: SpillPolicy::OnPressure,
        seed: 0x1601,
        ..BASE
    },
    // 4 KiB erase blocks, one per segment; more operations to fill the larger ring.
    Variant {
        name: "ws4-e4096-always-reject",
        erase_size: 4096,
        blocks_per_segment: 1,
        ops: 600,
        seed: 0x4096,
        ..BASE
    },
];

#[test]
fn sweep_ws1_always_reject() {
    sweep(&VARIANTS[0]);
}
#[test]
fn sweep_ws4_pressure_drop() {
    sweep(&VARIANTS[1]);
}
#[test]
fn sweep_ws16_always_drop() {
    sweep(&VARIANTS[2]);
}
#[test]
fn sweep_ws1_pressure_reject() {
    sweep(&VARIANTS[3]);
}
#[test]
fn sweep_ws16_pressure_reject() {
    sweep(&VARIANTS[4]);
}
#[test]
fn sweep_ws4_e4096_always_reject() {
    sweep(&VARIANTS[5]);
}

/// Run `k` of the random campaign `seed`: a random variant and scenario with a random cut,
/// and in 60% of the runs a second cut (sometimes inside the remount after the first).
fn random_run(seed: u64, k: u64) -> Totals {
    let run_seed = mix(seed, k);
    let mut r = Rng(run_seed);
    let mut v = VARIANTS[r.below(VARIANTS.len() as u64) as usize];
    v.ops = 100 + r.below(300) as usize;
    v.seed = r.next();
    let ops = gen_ops(&v, v.seed);
    // About 60 bytes programmed per operation.
    let first = if r.chance(85) {
        Cut::Bytes(r.below(v.ops as u64 * 60))
    } else {
        Cut::Erases(r.below(20))
    };
    let mut plan = vec![first];
    if r.chance(60) {
        plan.push(match r.below(10) {
            // Inside the remount's journal write or the first operations after it.
            0..=2 => Cut::Bytes(r.below(200)),
            3 => Cut::Erases(r.below(4)),
            _ => Cut::Bytes(r.below(4000)),
        });
    }
    let label = format!("random run {k} of campaign {seed:#x}");
    run(&v, &ops, &plan, r.next(), &label)
}

/// Random scenarios with random cut points, a second cut after the first one in 60% of
/// the runs (sometimes inside the remount that follows the first).
#[test]
fn random_cuts() {
    let start = Instant::now();
    let runs =
        env_u64("SPILLWAY_POWERCUTS").unwrap_or(if long_mode() { 1_000_000 } else { RANDOM_RUNS });
    let seed = env_u64("SPILLWAY_SEED").unwrap_or(0x5EED_0000_CAFE);
    eprintln!("powercut random: {runs} runs, campaign seed {seed:#x} (SPILLWAY_SEED to replay)");
    let mut cuts = 0u64;
    let mut doubles = 0u64;
    let only = env_u64("SPILLWAY_RUN");
    let from = env_u64("SPILLWAY_FROM").unwrap_or(0);
    for k in from..runs {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        let t = random_run(seed, k);
        cuts += t.cuts;
        doubles += u64::from(t.cuts >= 2);
        if only.is_none() && (k + 1).is_multiple_of(10_000) {
            eprintln!(
                "powercut random: runs {from}..={k} passed, {cuts} cuts, {:.2?}",
                start.elapsed()
            );
        }
    }
    eprintln!(
        "powercut random: runs {from}..{runs}, {cuts} cuts ({doubles} runs cut twice) in {:.2?}",
        start.elapsed()
    );
    assert!(doubles > 0 || runs < 10);
}

/// The fault kinds beyond address-ordered power cuts, each run on random scenarios until
/// it has fired the given number of times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    /// A cut whose write lands out of order (program units complete, untouched or torn).
    ReorderedCut,
    /// A cut during an erase leaving arbitrary bits (every bit random, or a block that
    /// reads erased but for a few stray bits), half and half.
    TornErase,
    /// A write that fails after programming part of its words; the log is remounted with
    /// the power on, and in half the runs a power cut follows inside that remount or soon
    /// after.
    FailedWrite,
    /// A power cut, then a transient read error somewhere in the remount and the checks.
    ReadError,
    /// A power cut, then one read returning a flipped bit in the remount and the checks.
    ReadFlip,
}

const FAULT_KINDS: [FaultKind; 5] = [
    FaultKind::ReorderedCut,
    FaultKind::TornErase,
    FaultKind::FailedWrite,
    FaultKind::ReadError,
    FaultKind::ReadFlip,
];

/// Fired faults per kind in a normal `cargo test`.
const FAULT_RUNS: u64 = 10_000;

/// Run `k` of the campaign `seed` for fault `kind`: a random variant and scenario with that
/// fault.
fn fault_run(kind: FaultKind, seed: u64, k: u64) -> Totals {
    let run_seed = mix(seed ^ kind as u64, k);
    let mut r = Rng(run_seed);
    let mut v = VARIANTS[r.below(VARIANTS.len() as u64) as usize];
    v.ops = 60 + r.below(200) as usize;
    v.seed = r.next();
    let ops = gen_ops(&v, v.seed);
    let bytes = r.below(v.ops as u64 * 60);
    let plan = match kind {
        FaultKind::ReorderedCut => {
            let unit = [16u32, 64, 256][r.below(3) as usize];
            vec![Cut::Reordered(bytes, unit)]
        }
        FaultKind::TornErase => {
            let tear = if r.chance(50) {
                EraseTear::Arbitrary
            } else {
                EraseTear::Sparse
            };
            vec![Cut::TornErase(r.below(20), tear)]
        }
        FaultKind::FailedWrite => {
            let mut p = vec![Cut::FailWrite(bytes)];
            if r.chance(50) {
                p.push(Cut::Bytes(r.below(400)));
            }
            p
        }
        FaultKind::ReadError => vec![Cut::Bytes(bytes), Cut::FailRead(r.below(400))],
        FaultKind::ReadFlip => vec![Cut::Bytes(bytes), Cut::FlipRead(r.below(400))],
    };
    let label = format!("{kind:?} run {k} of campaign {seed:#x}");
    run(&v, &ops, &plan, r.next(), &label)
}

/// Runs random scenarios with fault `kind` until it has fired `target` times; returns the
/// runs made and the faults fired.
fn fault_campaign(kind: FaultKind, target: u64, seed: u64) -> (u64, u64) {
    let start = Instant::now();
    let (mut runs, mut fired, mut cuts) = (0u64, 0u64, 0u64);
    let only = env_u64("SPILLWAY_RUN");
    while fired < target {
        assert!(runs < 3 * target + 100, "{kind:?}: fires too rarely");
        let k = runs;
        runs += 1;
        if only.is_some_and(|o| o != k) {
            if runs > only.unwrap_or(0) {
                break;
            }
            continue;
        }
        let t = fault_run(kind, seed, k);
        cuts += t.cuts;
        let f = t.faults;
        fired += match kind {
            FaultKind::ReorderedCut => f.reordered_cuts,
            FaultKind::TornErase => f.torn_erases,
            FaultKind::FailedWrite => f.failed_writes,
            FaultKind::ReadError => f.failed_reads,
            FaultKind::ReadFlip => f.flipped_reads,
        };
    }
    eprintln!(
        "powercut faults {kind:?}: {fired} fired in {runs} runs ({cuts} cuts and failed writes), campaign seed {seed:#x}, {:.2?}",
        start.elapsed()
    );
    (runs, fired)
}

/// The fault kinds of [`FaultKind`], each until it fired [`FAULT_RUNS`] times
/// (`SPILLWAY_FAULT_RUNS=N` changes the number; `SPILLWAY_LONG=1` makes it 200,000).
/// Every run checks (a) to (f) after every remount.
fn fault_kind_test(kind: FaultKind) {
    let target =
        env_u64("SPILLWAY_FAULT_RUNS").unwrap_or(if long_mode() { 200_000 } else { FAULT_RUNS });
    let seed = env_u64("SPILLWAY_SEED").unwrap_or(0xFA17_0000_0001);
    let (_, fired) = fault_campaign(kind, target, seed);
    assert!(fired >= target || env_u64("SPILLWAY_RUN").is_some());
}

#[test]
fn faults_reordered_cut() {
    fault_kind_test(FAULT_KINDS[0]);
}
#[test]
fn faults_torn_erase_arbitrary_bits() {
    fault_kind_test(FAULT_KINDS[1]);
}
/// A write failing after part of its words (the log poisoned, remounted with the power
/// on), a cut in about half the runs after it.
#[test]
fn faults_failed_write_partial_data() {
    fault_kind_test(FAULT_KINDS[2]);
}
/// Regression, a torn resume marker measured short: a write failing 28 bytes into a batch
/// header, a remount that put the resume marker after the cut header, a cut 9 bytes into
/// that marker (its `len_check` bytes `FF FF FF` programmed but reading erased), and the
/// next mount placed its own marker on them (`Rewrite` at byte 4446). Run 4034 of the
/// failed-write campaign `0xfa1700000001`, variant ws1-always-reject, cuts
/// `[FailWrite(2647), Bytes(302)]`.
#[test]
fn torn_resume_marker_after_failed_write_is_not_written_over() {
    let t = fault_run(FaultKind::FailedWrite, 0xFA17_0000_0001, 4034);
    assert_eq!((t.faults.failed_writes, t.cuts), (1, 2));
}

/// Regression, the same bug reached by two power cuts: a cut inside a batch header, then
/// a cut 303 bytes into the next boot tearing the resume marker placed after it; the
/// mount after that placed its marker inside the torn one (`Rewrite` at byte 9060).
/// Run 322,509 of the random campaign `0x5eed0000cafe`, variant ws1-pressure-reject, cuts
/// `[Bytes(8321), Bytes(303)]`.
#[test]
fn torn_resume_marker_after_two_cuts_is_not_written_over() {
    let t = random_run(0x5EED_0000_CAFE, 322_509);
    assert_eq!(t.cuts, 2);
}

#[test]
fn faults_transient_read_error() {
    fault_kind_test(FAULT_KINDS[3]);
}
#[test]
fn faults_one_shot_read_flip() {
    fault_kind_test(FAULT_KINDS[4]);
}

/// `SPILLWAY_LONG=1`: the long campaign (see the module docs).
fn long_mode() -> bool {
    std::env::var_os("SPILLWAY_LONG").is_some()
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Replays one sweep case: `SPILLWAY_CASE=<variant index>:b<byte>|e<erase>`.
#[test]
#[ignore]
fn replay_case() {
    let Ok(case) = std::env::var("SPILLWAY_CASE") else {
        return;
    };
    let (vi, cut) = case.split_once(':').unwrap();
    let v = &VARIANTS[vi.parse::<usize>().unwrap()];
    let ops = gen_ops(v, v.seed);
    let n: u64 = cut[1..].parse().unwrap();
    let (cut, seed) = if cut.starts_with('b') {
        (Cut::Bytes(n), mix(v.seed, n))
    } else {
        (Cut::Erases(n), mix(v.seed, !n))
    };
    run(v, &ops, &[cut], seed, "replay");
}

// ----- Brownout reboot loop -------------------------------------------------------------

/// Boots of the brownout loop per case (`SPILLWAY_BROWNOUT_BOOTS` overrides).
const BROWNOUT_BOOTS: u64 = 10_000;

/// Ring bytes one boot may cost at most, beyond its own durable batch: the torn batch
/// (the same size as the durable one, rounded up to the write size) and the 32-byte resume
/// marker. A segment's header and the unused end of a full segment come on top, once per
/// segment.
fn brownout_bound(batch: u64, torn: bool) -> u64 {
    if torn { 2 * batch + 32 } else { batch }
}

/// A gateway on a flaky supply: `boots` times, mount after an unclean shutdown, append one
/// small record, flush it (durable), then lose power, either with nothing in flight or
/// during the write of a second record's batch (a torn write at the cut). On a 4 MiB
/// image with 4 KiB erase blocks and the gateway's default 64 KiB buffer (32 blocks per
/// segment, 31 segments), under `full`.
///
/// Checks: every mount succeeds and is unclean; nothing is refused, dropped or corrupt;
/// every durable record reads back at its offset, in order; the ring bytes used per boot
/// stay within [`brownout_bound`] (plus one header and one unused tail per segment).
///
/// `program_unit`: the cut write's program units land out of order (see
/// `SimFlash::set_program_unit`), so a torn batch may have later bytes written and its
/// header not.
fn brownout_loop(full: FullPolicy, torn: bool, program_unit: Option<u32>, boots: u64) {
    let start = Instant::now();
    let geo = Geometry {
        erase_size: 4096,
        write_size: 4,
        capacity: 4 << 20,
        erased: 0xFF,
    };
    let bps = 32;
    let seg_count = segments_for(&geo, bps);
    let seg_size = u64::from(bps * geo.erase_size);
    let flash = RefCell::new(SimFlash::new_vec(geo).unwrap());
    flash.borrow_mut().set_seed(mix(0xB0_0750, u64::from(torn)));
    flash.borrow_mut().set_program_unit(program_unit);
    Log::format(&mut *flash.borrow_mut(), LOG_ID, bps).unwrap();
    let cfg = Config {
        full,
        ..Config::default()
    };
    let mut buffer = vec![0u8; 64 * 1024];
    let mut slots = vec![SegmentSlot::EMPTY; seg_count as usize];
    let mut rng = Rng(mix(0xB0_0751, u64::from(torn)));
    // (offset, payload) of every record acknowledged durable.
    let mut durable: Vec<(u64, [u8; 8])> = Vec::new();
    let mut batch_len = 0u64;
    let mut segments_opened = 0u64;
    let mut now = 0u64;
    for boot in 0..boots {
        now += 1_000_000;
        let mem = Memory {
            buffer: &mut buffer,
            segments: &mut slots,
        };
        let (mut log, report) = Log::mount(Shared(&flash), cfg, mem, now)
            .unwrap_or_else(|e| panic!("boot {boot}: mount failed: {e:?}"));
        assert!(
            boot == 0 || !report.clean,
            "boot {boot}: an unclean shutdown mounted clean: {report:?}"
        );
        assert!(report.head_lost.is_none(), "boot {boot}: {report:?}");
        if let Some(&(last, _)) = durable.last() {
            assert!(report.next_offset > last, "boot {boot}: offset reused");
        }
        let payload = boot.to_le_bytes();
        let rec = Record {
            topic: "b",
            timestamp_us: now,
            producer: None,
            payload: &payload,
        };
        let offset = log
            .append(now, &rec)
            .unwrap_or_else(|e| panic!("boot {boot}: append refused: {e:?}"))
            .offset;
        log.flush(now)
            .unwrap_or_else(|e| panic!("boot {boot}: flush failed: {e:?}"));
        assert!(log.durable_offset() > offset);
        durable.push((offset, payload));
        let stats = log.stats();
        assert_eq!(stats.records_dropped, 0, "boot {boot}: {stats:?}");
        segments_opened += stats.segments_opened;
        batch_len = (32 + rec.encoded_len() as u64).next_multiple_of(4);
        if torn {
            // The power fails inside the next batch's write.
            log.append(now + 1, &rec).unwrap();
            let cut = 1 + rng.below(40);
            flash.borrow_mut().cut_after_bytes(cut);
            assert!(
                log.flush(now + 1).is_err(),
                "boot {boot}: cut at {cut} missed"
            );
            drop(log);
            flash.borrow_mut().power_on();
        } else {
            let _ = log.into_flash();
        }
    }
    // Every durable record reads back in order; what cannot be read was never persisted.
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(Shared(&flash), cfg, mem, now + 1).unwrap();
    assert_eq!(log.first_offset(), 0, "records were dropped");
    let mut got: Vec<(u64, [u8; 8])> = Vec::new();
    let mut skipped = 0u64;
    let mut out = vec![0u8; 4096];
    let mut at = 0u64;
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        if let Some(lost) = r.lost {
            assert_eq!(
                lost.reason,
                spillway_core::log::LostReason::Skipped,
                "offsets {}..{} lost as corrupt",
                lost.from,
                lost.to
            );
            skipped += lost.to - lost.from;
        }
        for rec in r.records(&out) {
            got.push((rec.offset, rec.payload.try_into().unwrap()));
        }
        assert!(r.next_offset > at);
        at = r.next_offset;
    }
    assert_eq!(got.len(), durable.len(), "records read back");
    assert!(
        got == durable,
        "records read back differ from the durable ones"
    );
    // Ring bytes used: for each segment, up to its last non-erased byte.
    let image = flash.borrow().bytes().to_vec();
    let mut used = 0u64;
    let mut segments_used = 0u64;
    for s in 0..u64::from(seg_count) {
        let base = ((2 + s * u64::from(bps)) * u64::from(geo.erase_size)) as usize;
        let seg = &image[base..base + seg_size as usize];
        if let Some(last) = seg.iter().rposition(|&b| b != 0xFF) {
            used += last as u64 + 1;
            segments_used += 1;
        }
    }
    let per_boot = used as f64 / boots as f64;
    let bound = boots * brownout_bound(batch_len, torn) + segments_used * 96;
    eprintln!(
        "brownout {full:?} torn {torn} program unit {program_unit:?}: {boots} boots in {:.2?}: {used} ring bytes \
         ({per_boot:.1} per boot, bound {bound}), {segments_used} segments used \
         ({segments_opened} opened), {skipped} offsets skipped, batch {batch_len} B",
        start.elapsed()
    );
    assert!(used <= bound, "{used} ring bytes used, bound {bound}");
    assert!(segments_used < u64::from(seg_count), "the ring filled up");
}

fn brownout_boots() -> u64 {
    env_u64("SPILLWAY_BROWNOUT_BOOTS").unwrap_or(BROWNOUT_BOOTS)
}

#[test]
fn brownout_reboot_loop_reject_new_costs_bytes_not_segments() {
    brownout_loop(FullPolicy::RejectNew, false, None, brownout_boots());
}

#[test]
fn brownout_reboot_loop_drop_oldest_costs_bytes_not_segments() {
    brownout_loop(FullPolicy::DropOldest, false, None, brownout_boots());
}

#[test]
fn brownout_reboot_loop_with_torn_writes_reject_new() {
    brownout_loop(FullPolicy::RejectNew, true, None, brownout_boots());
}

#[test]
fn brownout_reboot_loop_with_torn_writes_drop_oldest() {
    brownout_loop(FullPolicy::DropOldest, true, None, brownout_boots());
}

#[test]
fn brownout_reboot_loop_with_out_of_order_torn_writes() {
    brownout_loop(FullPolicy::RejectNew, true, Some(8), brownout_boots());
}

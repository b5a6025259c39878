// The power-cut scenario, its oracle and its runner, shared by the host's power-cut tests
// (core/tests/powercut.rs) and the Cortex-M build of the same sweep
// (firmware/boards/mps2-an386/src/bin/powercut.rs), so that both check the same things:
// each includes this file (`include!`) at a place that provides `Rec`, `Rng`, `mix`, `Shared`
// and `Sim` (core/tests/common/sim.rs), a `trace_enabled() -> bool` function and a
// `trace_line!` macro (`eprintln!` on the host). It needs `alloc` only.
//
// A scenario (appends of varied sizes with and without producer ids, resends, flushes,
// commits, persists, ticks with linger, clean reboots, segment rolls and ring reuse) runs
// from a freshly formatted simulated flash with power cuts armed at chosen points; after
// each cut the flash is powered on, the log remounted and checked against an oracle of
// what the scenario was told (the checks (a) to (f) of powercut.rs).

extern crate alloc;

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use spillway_core::log::{
    BRIDGE_CONSUMER, Compression, Config, FullPolicy, Log, Memory, Producer, RecoveryReport,
    SegmentSlot, SpillPolicy, segments_for,
};
use spillway_core::storage::{EraseTear, Geometry, SimError, SimFaults, SimFlash};
use spillway_core::{AppendError, FlushError, MountError};

const SECOND_CONSUMER: &str = "c2";
const LOG_ID: u128 = 0x5350_494c_4c57_4159_0000_0000_0000_0001;

// ----- A flash shared between the log and the test --------------------------------------

type TestLog<'a> = Log<'a, Shared<'a>>;

/// RAM the log works in; a mount attempt cut by the power takes one, the retry the next.
struct Mem {
    buffer: Vec<u8>,
    slots: Vec<SegmentSlot>,
    /// Scratch for compressed batches (empty for a variant without compression).
    scratch: Vec<u8>,
}

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
    /// Per-batch compression; with it the payloads are compressible (text-like runs).
    compression: Compression,
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
            compression: self.compression,
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
                    let payload = if v.compression == Compression::None {
                        (0..len).map(|_| r.next() as u8).collect()
                    } else {
                        // A short word repeated, one byte in ten random.
                        let w: Vec<u8> = (0..1 + r.below(6)).map(|_| r.next() as u8).collect();
                        (0..len)
                            .map(|i| {
                                if r.chance(10) {
                                    r.next() as u8
                                } else {
                                    w[i % w.len()]
                                }
                            })
                            .collect()
                    };
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
    /// `close` returned `Full` (a reboot without a clean shutdown).
    close_full: u64,
    duplicates: u64,
    reboots: u64,
    segments_opened: u64,
    records_dropped: u64,
    records_discarded: u64,
    /// Batches written compressed, and written plain.
    batches_compressed: u64,
    batches_plain: u64,
    /// Short batches written (format version 5: a record flushed alone).
    batches_short: u64,
}

impl Exercised {
    fn add_stats(&mut self, log: &TestLog<'_>) {
        let s = log.stats();
        self.segments_opened += s.segments_opened;
        self.records_dropped += s.records_dropped;
        self.records_discarded += s.records_discarded;
        self.batches_compressed += s.batches_compressed;
        self.batches_plain += s.batches_written - s.batches_compressed;
        self.batches_short += s.short_batches_written;
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

    /// After a mount left unchecked (one before the first cut of a sweep's run: the sweep
    /// checked it in its uncut run), forgets what the check would have: the records at or above both the
    /// mount's durable end and the highest durable offset acknowledged were never
    /// acknowledged durable (a `close` that returned `Full` left them in RAM), and the log
    /// reports their offsets as skipped. Kept, they would count as acknowledged once a
    /// later durable end passes their offsets. Records below the acknowledged end stay, so
    /// a mount that lost one is still caught by the next check.
    fn forget_unchecked(&mut self, log: &TestLog<'_>) {
        let gone_from = log.durable_offset().max(self.durable);
        drop(self.recs.split_off(&gone_from));
        self.handed = self.handed.max(log.next_offset());
        self.observe(log);
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
            trace_line!(
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
                trace_line!(
                    "verify read at {at}: lost {:?} count {} next {}",
                    r.lost,
                    r.count,
                    r.next_offset
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
    trace_enabled()
}

/// An error that ends the run's current boot: a power cut, or a failed write (the log is
/// poisoned; the test remounts it as a supervisor would restart the gateway).
fn power_cut<E: core::fmt::Debug>(e: &E) -> bool {
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
            // The LZ4 worst case for a body the size of the buffer: 1.1 times plus 20.
            scratch: if v.compression == Compression::None {
                Vec::new()
            } else {
                vec![0; v.buffer + v.buffer / 10 + 20]
            },
        })
        .collect()
}

impl<'v> Run<'v> {
    fn new(v: &'v Variant, ops: &'v [Op], sim_seed: u64) -> Self {
        let mut flash = SimFlash::new(
            vec![0; SimFlash::<&mut [u8]>::memory_len(v.geometry())],
            v.geometry(),
        )
        .unwrap();
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
        match Log::mount_with_scratch(Shared(flash), cfg, mem, &mut m.scratch, now) {
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
            trace_line!(
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

/// Which mounts of a run with cuts [`run`] checks against the oracle (a run without a cut
/// checks all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// The mounts from the first cut on: the ones before it repeat the sweep's uncut run,
    /// which checked them.
    FromFirstCut,
    /// Every mount: a random or fault run has no uncut run of its own.
    EveryMount,
}

/// Runs the scenario from a freshly formatted flash, arming `cuts` one after the other (the
/// next one right after the previous fired), then checks (f) and (e); `checks` says which
/// mounts before the first cut are checked.
fn run(
    v: &Variant,
    ops: &[Op],
    cuts: &[Cut],
    checks: Checks,
    sim_seed: u64,
    label: &str,
) -> Totals {
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
        // Before any cut a sweep's run repeats the uncut run exactly, whose mounts the
        // sweep checked; the oracle still forgets what such a check forgets.
        if r.cuts > 0 || cuts.is_empty() || checks == Checks::EveryMount {
            r.oracle.verify(&mut log, &rep, &ctx);
        } else {
            r.oracle.forget_unchecked(&log);
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
                    // Under `RejectNew` the ring can fill up after the buffered records
                    // were accepted: a consumer created by its first commit below them
                    // pins the tail. `close` then fails as `flush` would, and the records
                    // still in RAM (never acknowledged durable) go with the log. The
                    // storage is mounted again with the power on, as after an unclean
                    // shutdown; the oracle raises nothing (no durable offset, no commit).
                    Err(FlushError::Full) => {
                        assert_eq!(v.full, FullPolicy::RejectNew, "{ctx}: close: Full");
                        if trace() {
                            trace_line!("close: Full (consumers {consumers:?}, next {next})");
                        }
                        r.oracle.seen.full += 1;
                        r.oracle.seen.close_full += 1;
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
    // The cuts planned need not all have fired: say how many did.
    let ctx = format!("{ctx} ({} fired)", r.cuts);
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
    compression: Compression::None,
    ops: 400,
    seed: 0,
};

const VARIANTS: [Variant; 8] = [
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
        segments: 5,
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
    // LZ4 on every batch, compressible payloads: compressed and plain batches mixed.
    Variant {
        name: "ws4-lz4-always-reject",
        compression: Compression::Lz4,
        seed: 0x1747,
        ..BASE
    },
    Variant {
        name: "ws16-lz4-pressure-drop",
        write_size: 16,
        segments: 5,
        spill: SpillPolicy::OnPressure,
        full: FullPolicy::DropOldest,
        compression: Compression::Auto,
        seed: 0x1716,
        ..BASE
    },
];

// ----- The sweep subset that also runs on the microcontroller ---------------------------

/// Variants of the sweep subset: [`VARIANTS`] indices, one per full policy
/// (`ws1-always-reject`, `ws16-always-drop`).
const SUBSET_VARIANTS: [usize; 2] = [0, 2];

/// Byte cuts per variant of the sweep subset.
const SUBSET_BYTE_CUTS: u64 = 500;
/// Erase cuts per variant of the sweep subset.
const SUBSET_ERASE_CUTS: u64 = 50;

/// What a sweep subset did. The same seeds give the same summary on every build (64-bit
/// host, 32-bit Cortex-M): a difference means the builds behave differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SubsetSummary {
    /// The variant's name.
    name: &'static str,
    /// Power cuts that fired.
    cuts: u64,
    /// Mounts checked against the oracle, over every run.
    mounts: u64,
    /// Bytes programmed and erases of the run without a cut.
    bytes: u64,
    erases: u64,
    /// A digest of every run's counts (cuts, mounts, what the scenario exercised).
    digest: u64,
}

impl core::fmt::Display for SubsetSummary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "powercut subset {}: {} cuts, {} mounts checked, {} bytes and {} erases uncut, digest {:#018x}",
            self.name, self.cuts, self.mounts, self.bytes, self.erases, self.digest
        )
    }
}

/// The sweep of `v` on a subset of its cut points: `byte_cuts` cuts spread evenly over the
/// bytes the uncut scenario programs and `erase_cuts` over its erases (each at most all of
/// them), every run checked by the oracle like the full sweep. `progress` is called after
/// each run with the cuts so far.
fn sweep_subset(
    v: &Variant,
    byte_cuts: u64,
    erase_cuts: u64,
    mut progress: impl FnMut(u64),
) -> SubsetSummary {
    let ops = gen_ops(v, v.seed);
    let base = run(v, &ops, &[], Checks::FromFirstCut, v.seed, "no cut");
    assert_eq!(base.cuts, 0);
    let mut s = SubsetSummary {
        name: v.name,
        cuts: 0,
        mounts: base.mounts,
        bytes: base.bytes,
        erases: base.erases,
        digest: mix(base.bytes, base.erases),
    };
    let byte_cuts = byte_cuts.min(base.bytes);
    let erase_cuts = erase_cuts.min(base.erases);
    let points = (0..byte_cuts)
        .map(|i| (true, i * base.bytes / byte_cuts))
        .chain((0..erase_cuts).map(|i| (false, i * base.erases / erase_cuts)));
    for (bytes, n) in points {
        let (cut, seed, label) = if bytes {
            (Cut::Bytes(n), mix(v.seed, n), "byte cut")
        } else {
            (Cut::Erases(n), mix(v.seed, !n), "erase cut")
        };
        let t = run(v, &ops, &[cut], Checks::FromFirstCut, seed, label);
        assert_eq!(t.cuts, 1, "[{}] {label} {n} did not fire", v.name);
        s.cuts += t.cuts;
        s.mounts += t.mounts;
        let e = t.seen;
        for x in [
            n,
            t.mounts,
            e.full,
            e.duplicates,
            e.reboots,
            e.segments_opened,
            e.records_dropped,
            e.records_discarded,
        ] {
            s.digest = mix(s.digest, x);
        }
        progress(s.cuts);
    }
    s
}

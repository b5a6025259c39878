//! Storage faults that are not power cuts: a write that fails after programming part of its
//! words, a sync that fails and loses the writes it covered, an erase that fails. Each
//! fault is injected at many points of one workload (appends, flushes, commits, segment
//! rolls and reuse, journal block switches, clean closes and remounts), and the real `Log`
//! must then:
//! - return the storage error once, then `Poisoned` from every writing call, with its
//!   durable offset frozen and no further write, erase or sync reaching the flash;
//! - after a remount, both of what the flash holds when the fault happened (partial or
//!   unsynced data left readable, as a page cache that kept the pages shows it) and of the
//!   contents of the last successful sync (the unsynced writes lost): mount, find every
//!   record any call reported durable, in order and unchanged, never hand out an offset
//!   twice, show no record that was not appended at its offset, report what the fault
//!   left unsynced as never persisted (not as damage), and append again.
//!
//! `cargo test` runs a quick sweep. `SPILLWAY_FAULT_SEEDS=N` runs the sweep for `N` seeds
//! per configuration (default 2) and `SPILLWAY_FAULT_POINTS=N` tries `N` write-fault points
//! per seed (default 64; every sync and erase is always tried).

mod common;

use std::collections::BTreeMap;

use common::faults::{Fault, FaultFlash, sim_from_image};
use common::{Ram, Rng, formatted, mix};
use spillway_core::log::{Config, FullPolicy, Log, LostReason, Producer, Record, SpillPolicy};
use spillway_core::storage::{Flash, Geometry};
use spillway_core::{AppendError, CommitError, FlushError, StorageOp};

const BPS: u32 = 2;
const STEPS: u32 = 640;
const BRIDGE: &str = "bridge";

fn geometry(write_size: u32) -> Geometry {
    Geometry {
        erase_size: 1024,
        write_size,
        capacity: 1024 * (2 + 4 * BPS),
        erased: 0xFF,
    }
}

/// One sweep configuration.
#[derive(Debug, Clone, Copy)]
struct Setup {
    write_size: u32,
    spill: SpillPolicy,
    buffer: usize,
}

impl Setup {
    fn config(&self) -> Config {
        Config {
            spill: self.spill,
            full: FullPolicy::RejectNew,
            linger_us: 5_000,
            commit_interval_us: 20_000,
            lease_step: 16,
            ..Config::default()
        }
    }
}

const SETUPS: [Setup; 3] = [
    Setup {
        write_size: 4,
        spill: SpillPolicy::Always,
        buffer: 512,
    },
    Setup {
        write_size: 32,
        spill: SpillPolicy::Always,
        buffer: 768,
    },
    Setup {
        write_size: 8,
        spill: SpillPolicy::OnPressure,
        buffer: 384,
    },
];

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    topic: String,
    payload: Vec<u8>,
    producer: Option<Producer>,
}

/// What the workload was told.
#[derive(Debug, Default)]
struct Oracle {
    /// Every record handed an offset.
    records: BTreeMap<u64, Rec>,
    /// One past the highest offset handed out.
    handed: u64,
    /// The highest durable offset any call reported.
    promised: u64,
    /// The highest offset committed for the bridge consumer.
    committed: u64,
    /// The bridge consumer's committed offset (clamped to the durable offset) at the last
    /// successful persist or clean close: a remount finds at least this.
    persisted_commit: u64,
    /// Segments opened, erase blocks erased and clean closes, over the sessions that
    /// ended with a close (to show what the workload covers).
    segments_opened: u64,
    erases: u64,
    closes: u64,
}

impl Oracle {
    fn note_persisted(&mut self, log: &Log<'_, &mut FaultFlash>) {
        let c = log.committed(BRIDGE).unwrap_or(0).min(log.durable_offset());
        self.persisted_commit = self.persisted_commit.max(c);
    }

    fn note_close(&mut self, log: &Log<'_, &mut FaultFlash>) {
        let st = log.stats();
        self.segments_opened += st.segments_opened;
        self.erases += st.erases;
        self.closes += 1;
    }
}

enum End {
    /// The steps ran out (the log was closed cleanly).
    Done,
    /// Closed cleanly in the middle; mount again.
    Closed,
    /// The fault happened.
    Fault,
}

fn kind(f: Fault) -> StorageOp {
    match f {
        Fault::WriteAfter(_) => StorageOp::Write,
        Fault::Sync(_) => StorageOp::Sync,
        Fault::Erase(_) => StorageOp::Erase,
    }
}

/// One mounted session of the workload: runs until the steps run out, a clean close, or
/// the fault; after the fault, checks the poisoned log.
fn session(
    flash: &mut FaultFlash,
    setup: &Setup,
    arm: Option<Fault>,
    rng: &mut Rng,
    oracle: &mut Oracle,
    steps: &mut u32,
    now: &mut u64,
) -> End {
    let g = flash.geometry();
    let mut ram = Ram::new(&g, BPS, setup.buffer);
    let mem = ram.memory();
    if let Some(f) = arm {
        flash.arm(f);
    }
    let mounted = Log::mount(&mut *flash, setup.config(), mem, *now);
    let mut log = match mounted {
        Ok((log, _)) => log,
        Err(e) => {
            assert!(
                flash.fired().is_some(),
                "mount failed without a fault: {e:?}"
            );
            return End::Fault;
        }
    };
    oracle.promised = oracle.promised.max(log.durable_offset());
    let mut seq = 0u32;
    let producer_id = rng.next();
    while *steps > 0 {
        *steps -= 1;
        *now += 1 + rng.below(4_000);
        let durable_before = log.durable_offset();
        let op = rng.below(100);
        let failed: bool = match op {
            0..=59 => {
                let payload: Vec<u8> = (0..1 + rng.below(60)).map(|_| rng.next() as u8).collect();
                let producer = rng.chance(50).then(|| {
                    seq += 1;
                    Producer {
                        id: producer_id,
                        seq,
                    }
                });
                let topic = if rng.chance(80) { "t" } else { "other" };
                let rec = Record {
                    topic,
                    timestamp_us: *now,
                    producer,
                    payload: &payload,
                };
                match log.append(*now, &rec) {
                    Ok(a) => {
                        assert!(!a.duplicate);
                        oracle.records.insert(
                            a.offset,
                            Rec {
                                topic: topic.into(),
                                payload: payload.clone(),
                                producer,
                            },
                        );
                        oracle.handed = a.offset + 1;
                        false
                    }
                    Err(AppendError::Full) => {
                        commit_some(&mut log, rng, oracle, true);
                        false
                    }
                    Err(AppendError::Flash(_)) => true,
                    Err(e) => panic!("append: {e:?}"),
                }
            }
            60..=74 => match log.flush(*now) {
                Ok(d) => {
                    assert_eq!(d, log.next_offset());
                    false
                }
                Err(FlushError::Full) => {
                    commit_some(&mut log, rng, oracle, true);
                    false
                }
                Err(FlushError::Flash(_)) => true,
                Err(e) => panic!("flush: {e:?}"),
            },
            75..=84 => {
                commit_some(&mut log, rng, oracle, false);
                false
            }
            85..=89 => match log.persist(*now) {
                Ok(()) => {
                    oracle.note_persisted(&log);
                    false
                }
                Err(CommitError::Flash(_)) => true,
                Err(e) => panic!("persist: {e:?}"),
            },
            90..=97 => match log.tick(*now) {
                Ok(_) | Err(FlushError::Full) => false,
                Err(FlushError::Flash(_)) => true,
                Err(e) => panic!("tick: {e:?}"),
            },
            _ => {
                let fired = flash_of(&log).fired().is_some();
                assert!(!fired);
                oracle.note_close(&log);
                let persisted = log.committed(BRIDGE).unwrap_or(0);
                match log.close(*now) {
                    Ok(_) => {
                        oracle.persisted_commit = oracle.persisted_commit.max(persisted);
                        return End::Closed;
                    }
                    Err(FlushError::Full) => return End::Closed,
                    Err(FlushError::Flash(_)) => {
                        assert!(flash.fired().is_some(), "close failed without a fault");
                        return End::Fault;
                    }
                    Err(e) => panic!("close: {e:?}"),
                }
            }
        };
        let fired = flash_of(&log).fired();
        assert_eq!(
            failed,
            fired.is_some(),
            "op {op}: a storage error without the fault, or the fault swallowed"
        );
        if let Some(f) = fired {
            assert!(log.durable_offset() >= durable_before);
            check_poisoned(log, kind(f), oracle, now);
            return End::Fault;
        }
        oracle.promised = oracle.promised.max(log.durable_offset());
    }
    oracle.note_close(&log);
    let persisted = log.committed(BRIDGE).unwrap_or(0);
    match log.close(*now) {
        Ok(_) => {
            oracle.persisted_commit = oracle.persisted_commit.max(persisted);
            End::Done
        }
        Err(FlushError::Full) => End::Done,
        Err(FlushError::Flash(_)) => End::Fault,
        Err(e) => panic!("close: {e:?}"),
    }
}

fn flash_of<'l>(log: &'l Log<'_, &mut FaultFlash>) -> &'l FaultFlash {
    log.flash()
}

/// Commits the bridge consumer somewhere between its committed offset and the durable
/// offset (or the next offset), so that `RejectNew` can reuse segments.
fn commit_some(log: &mut Log<'_, &mut FaultFlash>, rng: &mut Rng, oracle: &mut Oracle, all: bool) {
    let top = if rng.chance(50) {
        log.next_offset()
    } else {
        log.durable_offset()
    };
    let cur = log.committed(BRIDGE).unwrap_or(0);
    let to = if all || top <= cur {
        top
    } else {
        cur + rng.below(top - cur + 1)
    };
    let c = log.commit(BRIDGE, to).expect("commit");
    oracle.committed = oracle.committed.max(c);
}

/// After the fault: every writing call fails with `Poisoned`, the durable offset stays,
/// reads stop at it, nothing more reaches the flash.
fn check_poisoned(
    mut log: Log<'_, &mut FaultFlash>,
    op: StorageOp,
    oracle: &mut Oracle,
    now: &u64,
) {
    assert!(log.poisoned());
    assert_eq!(log.poisoned_by(), Some(op));
    let durable = log.durable_offset();
    oracle.promised = oracle.promised.max(durable);
    let rec = Record {
        topic: "t",
        timestamp_us: 0,
        producer: None,
        payload: b"after the fault",
    };
    for _ in 0..2 {
        assert!(matches!(
            log.append(*now, &rec),
            Err(AppendError::Poisoned { op: o }) if o == op
        ));
        assert!(matches!(log.flush(*now), Err(FlushError::Poisoned { .. })));
        assert!(matches!(
            log.tick(*now + 1_000_000_000),
            Err(FlushError::Poisoned { .. })
        ));
        assert!(matches!(
            log.commit(BRIDGE, log.next_offset()),
            Err(CommitError::Poisoned { .. })
        ));
        assert!(matches!(
            log.persist(*now),
            Err(CommitError::Poisoned { .. })
        ));
        assert!(matches!(
            log.delete_consumer(BRIDGE),
            Err(CommitError::Poisoned { .. })
        ));
        assert_eq!(log.durable_offset(), durable, "durability advanced");
    }
    let mut out = vec![0u8; 4096];
    if durable < log.next_offset() {
        let r = log.read(durable, &mut out).unwrap();
        assert_eq!(
            r.count, 0,
            "a poisoned log served a record that is not durable"
        );
    }
    assert_eq!(
        flash_of(&log).writes_after_fault(),
        0,
        "the poisoned log still wrote"
    );
    assert!(matches!(log.close(*now), Err(FlushError::Poisoned { .. })));
}

/// Runs the workload with `fault` armed after the first mount. Returns the flash, what the
/// workload was told, and whether the fault happened.
fn run(setup: &Setup, seed: u64, fault: Fault) -> (FaultFlash, Oracle) {
    let g = geometry(setup.write_size);
    let sim = formatted(g, 0xFA_u128 << 64 | u128::from(seed), BPS);
    let mut flash = FaultFlash::new(sim, seed);
    let mut rng = Rng(seed);
    let mut oracle = Oracle::default();
    let mut steps = STEPS;
    let mut now = 1_000u64;
    let mut arm = Some(fault);
    loop {
        match session(
            &mut flash,
            setup,
            arm.take(),
            &mut rng,
            &mut oracle,
            &mut steps,
            &mut now,
        ) {
            End::Closed if steps > 0 => continue,
            End::Closed | End::Done | End::Fault => break,
        }
    }
    (flash, oracle)
}

/// Mounts `image`, checks it against the oracle, appends again and checks that too.
fn check_remount(setup: &Setup, image: &[u8], oracle: &Oracle, what: &str) {
    let g = geometry(setup.write_size);
    let mut sim = sim_from_image(g, image);
    let cfg = setup.config();
    let mut ram = Ram::new(&g, BPS, setup.buffer);
    let appended = {
        let mem = ram.memory();
        let (mut log, rep) = Log::mount(&mut sim, cfg, mem, 0)
            .unwrap_or_else(|e| panic!("{what}: remount failed: {e:?}"));
        assert!(!log.poisoned());
        verify(&mut log, oracle, what, &format!("{rep:?}"));
        // Append again (after making room), durably.
        log.commit(BRIDGE, log.next_offset()).unwrap();
        let mut appended = Vec::new();
        for i in 0..3u8 {
            let payload = [i; 20];
            let a = log
                .append(
                    0,
                    &Record {
                        topic: "again",
                        timestamp_us: 1,
                        producer: None,
                        payload: &payload,
                    },
                )
                .unwrap_or_else(|e| panic!("{what}: append after remount: {e:?}"));
            appended.push(a.offset);
        }
        let d = log
            .flush(0)
            .unwrap_or_else(|e| panic!("{what}: flush after remount: {e:?}"));
        assert!(d > *appended.last().unwrap());
        log.close(0).unwrap();
        appended
    };
    let mem = ram.memory();
    let (mut log, _) = Log::mount(&mut sim, cfg, mem, 0).unwrap();
    let mut out = vec![0u8; 4096];
    for (i, &off) in appended.iter().enumerate() {
        let r = log.read(off, &mut out).unwrap();
        let rec = r
            .records(&out)
            .next()
            .unwrap_or_else(|| panic!("{what}: record appended after remount is missing"));
        assert_eq!(
            (rec.offset, rec.payload),
            (off, &[i as u8; 20][..]),
            "{what}"
        );
    }
}

/// Every record any call reported durable is there, in order and unchanged (except what
/// the bridge consumer committed, which the ring may have reused); every record found is
/// the one appended at its offset; no offset is handed out twice.
fn verify(log: &mut Log<'_, &mut common::Sim>, oracle: &Oracle, what: &str, rep: &str) {
    assert!(
        log.next_offset() >= oracle.handed,
        "{what}: offsets from {} handed out again (handed up to {}; {rep})",
        log.next_offset(),
        oracle.handed
    );
    // The journal kept its newest synced entry: the committed offset is not older.
    let committed = log.committed(BRIDGE).unwrap_or(0);
    assert!(
        committed >= oracle.persisted_commit && committed <= oracle.committed,
        "{what}: bridge committed offset {committed}, persisted {}, highest commit {} ({rep})",
        oracle.persisted_commit,
        oracle.committed
    );
    let must_from = oracle.committed.min(oracle.promised);
    assert!(
        log.first_offset() <= must_from,
        "{what}: durable offsets {}..{} dropped ({rep})",
        must_from,
        log.first_offset()
    );
    let mut out = vec![0u8; 4096];
    let mut at = log.first_offset();
    let mut expect = must_from;
    while at < log.next_offset() {
        let r = log
            .read(at, &mut out)
            .unwrap_or_else(|e| panic!("{what}: read at {at}: {e:?} ({rep})"));
        if let Some(lost) = r.lost {
            assert!(
                lost.from.max(must_from) >= lost.to.min(oracle.promised),
                "{what}: durable offsets lost: {lost:?}, promised {must_from}..{} ({rep})",
                oracle.promised
            );
            // What a fault left behind was never durable: it is "never persisted", not
            // damage.
            assert_eq!(
                lost.reason,
                LostReason::Skipped,
                "{what}: {lost:?} reported as damage ({rep})"
            );
        }
        for rec in r.records(&out) {
            let want = oracle.records.get(&rec.offset).unwrap_or_else(|| {
                panic!("{what}: phantom record at offset {} ({rep})", rec.offset)
            });
            assert_eq!(
                (rec.topic, rec.payload, rec.producer),
                (want.topic.as_str(), &want.payload[..], want.producer),
                "{what}: record {} differs ({rep})",
                rec.offset
            );
            if rec.offset >= must_from && rec.offset < oracle.promised {
                assert_eq!(rec.offset, expect, "{what}: durable record missing ({rep})");
                expect += 1;
            }
        }
        assert!(r.next_offset > at, "{what}: read made no progress at {at}");
        at = r.next_offset;
    }
    // Under `OnPressure` records committed in RAM are discarded unwritten: `expect` stops
    // at the first of them; it never stops below the committed offset.
    assert!(
        expect >= oracle.promised,
        "{what}: durable records {expect}..{} missing ({rep})",
        oracle.promised
    );
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One fault kind, swept over the workload for every setup and seed.
fn sweep(kind: &str) {
    let seeds = env("SPILLWAY_FAULT_SEEDS", 2);
    let points = env("SPILLWAY_FAULT_POINTS", 64);
    let mut runs = 0u64;
    let mut fired = 0u64;
    for setup in &SETUPS {
        for s in 0..seeds {
            let seed = mix(0x5707_FA17, s);
            // A fault-free run counts the bytes, syncs and erases after the first mount.
            let (clean, oracle) = run(setup, seed, Fault::Sync(u64::MAX));
            assert!(clean.fired().is_none());
            // The workload goes round the ring, switches journal blocks, closes and
            // mounts again.
            let journal_erases = oracle.erases - oracle.segments_opened * u64::from(BPS);
            eprintln!(
                "{setup:?} seed {seed:#x}: {} records, {} durable, {} segments opened, \
                 {journal_erases} journal erases, {} closes",
                oracle.records.len(),
                oracle.promised,
                oracle.segments_opened,
                oracle.closes
            );
            assert!(oracle.segments_opened > 4, "{oracle:?}");
            assert!(journal_erases >= 2, "{oracle:?}");
            assert!(oracle.closes >= 2, "{oracle:?}");
            let (bytes, syncs, erases) = clean.counts();
            let faults: Vec<Fault> = match kind {
                "write" => {
                    let mut r = Rng(seed);
                    (0..points)
                        .map(|i| Fault::WriteAfter(bytes * i / points + r.below(8)))
                        .collect()
                }
                "sync" => (1..=syncs).map(Fault::Sync).collect(),
                _ => (1..=erases).map(Fault::Erase).collect(),
            };
            for f in faults {
                runs += 1;
                let (flash, oracle) = run(setup, seed, f);
                let Some(got) = flash.fired() else {
                    continue;
                };
                fired += 1;
                let ctx = format!("{setup:?} seed {seed:#x} fault {got:?}");
                check_remount(
                    setup,
                    &flash.image(),
                    &oracle,
                    &format!("{ctx}, flash as left"),
                );
                check_remount(
                    setup,
                    &flash.synced_image(),
                    &oracle,
                    &format!("{ctx}, unsynced writes lost"),
                );
            }
        }
    }
    eprintln!("{kind} faults: {runs} runs, {fired} with the fault hit");
    assert!(
        fired * 10 >= runs * 8,
        "too few faults hit: {fired} of {runs}"
    );
}

#[test]
fn failed_write_poisons_and_remount_keeps_every_durable_record() {
    sweep("write");
}

#[test]
fn failed_sync_poisons_and_remount_keeps_every_durable_record() {
    sweep("sync");
}

#[test]
fn failed_erase_poisons_and_remount_keeps_every_durable_record() {
    sweep("erase");
}

//! The append and read rows ([`write_case`]): each engine appends the same records into a
//! wrapping ring on the same flash, then reads back what it retained; the flash counts of
//! every repetition are checked equal.

use std::cell::Cell;
use std::hint::black_box;
use std::rc::Rc;
use std::time::{Duration, Instant};

use embassy_futures::block_on;
use spillway_core::log::{Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, NorFlashAdapter};

use super::{
    BLOCKS_PER_SEGMENT, LOG_ID, MIB, Options, RAM_BUFFER, READ_BUFFER, Spread, TOPIC, payload,
    peer_queue, spillway_config, stamp,
};
use crate::ram_nor::{NorCounters, RamNor};

/// Payload size and flash write size of an append run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCase {
    /// Payload bytes per record (at least 8).
    pub payload_len: usize,
    /// Flash write size (word), bytes: 4 or 16.
    pub write_size: u32,
}

/// The engine of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Spillway with its RAM buffer written when full.
    Spillway,
    /// Spillway with a flush after every record.
    SpillwayDurable,
    /// The `sequential-storage` queue.
    Peer,
}

impl Engine {
    /// Every engine, in table order.
    pub const ALL: [Engine; 3] = [Engine::Spillway, Engine::SpillwayDurable, Engine::Peer];

    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Engine::Spillway => "spillway, 4 KiB buffer",
            Engine::SpillwayDurable => "spillway, flush every record",
            Engine::Peer => "sequential-storage 8.0.2",
        }
    }
}

/// Figures of one engine on one [`WriteCase`].
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRun {
    /// The engine.
    pub engine: Engine,
    /// The case.
    pub case: WriteCase,
    /// Records appended per run.
    pub records: u64,
    /// Payload bytes appended per run.
    pub payload_bytes: u64,
    /// Appends per second (the final flush included).
    pub appends_per_s: Spread,
    /// Flash bytes programmed per run.
    pub bytes_programmed: u64,
    /// Erase blocks erased per run.
    pub erases: u64,
    /// Records read back per run (those still retained after the ring wrapped).
    pub records_read: u64,
    /// Records read per second.
    pub reads_per_s: Spread,
}

impl WriteRun {
    /// Flash bytes programmed per payload byte.
    pub fn programmed_per_payload_byte(&self) -> f64 {
        self.bytes_programmed as f64 / self.payload_bytes as f64
    }

    /// Erases per MiB of payload appended.
    pub fn erases_per_mib(&self) -> f64 {
        self.erases as f64 / (self.payload_bytes as f64 / MIB)
    }
}

/// What one repetition measured.
struct Rep {
    write: Duration,
    /// Time of every read pass together.
    read: Duration,
    /// Records read by every read pass together.
    read_total: u64,
    programmed: u64,
    erases: u64,
    /// Records retained (read by one pass).
    records_read: u64,
}

/// Shortest time the read passes of one repetition take together: passes are repeated
/// until it is reached, so that one timer tick or preemption does not dominate.
const MIN_READ_WINDOW: Duration = Duration::from_millis(25);

/// The timestamps of one engine's appends: the wall clock read at every append of its first
/// repetition (µs since the Unix epoch), replayed by the later ones.
#[derive(Debug, Clone, Default)]
pub struct Stamps(Vec<u64>);

impl Stamps {
    /// The timestamp of append `i`: the one recorded, or the wall clock now (recorded).
    fn at(&mut self, i: u64) -> u64 {
        if let Some(&t) = self.0.get(i as usize) {
            return t;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.0.push(now);
        now
    }
}

fn rate(count: u64, d: Duration) -> f64 {
    count as f64 / d.as_secs_f64().max(1e-9)
}

/// Runs every engine on `case` `opts.reps` times, interleaved (one repetition of each engine
/// in turn, so that a disturbance of the machine hits all of them alike): appends, then
/// reads back. Returns one [`WriteRun`] per engine, in [`Engine::ALL`] order.
///
/// # Panics
/// If an engine fails, if a run's flash counts differ between repetitions, or if a read
/// does not end with the newest record.
pub fn write_case(case: WriteCase, opts: &Options) -> Vec<WriteRun> {
    assert!(case.payload_len >= 8, "payloads carry an 8-byte index");
    let records = opts.write_payload_total / case.payload_len as u64;
    let (cap, len) = (opts.write_flash as usize, case.payload_len);
    let n = Engine::ALL.len();
    let mut writes = vec![Vec::new(); n];
    let mut reads = vec![Vec::new(); n];
    let mut counts = vec![None; n];
    let mut stamps = vec![Stamps::default(); n];
    for _ in 0..opts.reps.max(1) {
        for (k, engine) in Engine::ALL.into_iter().enumerate() {
            let durable = engine == Engine::SpillwayDurable;
            let rep = match (engine, case.write_size) {
                (Engine::Peer, 4) => peer_rep::<4>(cap, len, records),
                (Engine::Peer, 16) => peer_rep::<16>(cap, len, records),
                (_, 4) => {
                    let (flash, device) = counted_flash::<4>(cap);
                    let s = &mut stamps[k];
                    spillway_rep(flash, Some(&device), durable, records, len, s)
                }
                (_, 16) => {
                    let (flash, device) = counted_flash::<16>(cap);
                    let s = &mut stamps[k];
                    spillway_rep(flash, Some(&device), durable, records, len, s)
                }
                (_, ws) => panic!("no flash with a {ws}-byte write size"),
            };
            let c = (rep.programmed, rep.erases, rep.records_read);
            assert!(
                counts[k].is_none_or(|x| x == c),
                "{engine:?} {case:?}: counts differ between repetitions"
            );
            counts[k] = Some(c);
            writes[k].push(rate(records, rep.write));
            reads[k].push(rate(rep.read_total, rep.read));
        }
    }
    Engine::ALL
        .into_iter()
        .enumerate()
        .map(|(k, engine)| {
            let (bytes_programmed, erases, records_read) = counts[k].unwrap_or_default();
            WriteRun {
                engine,
                case,
                records,
                payload_bytes: records * case.payload_len as u64,
                appends_per_s: Spread::of(&writes[k]),
                bytes_programmed,
                erases,
                records_read,
                reads_per_s: Spread::of(&reads[k]),
            }
        })
        .collect()
}

/// Runs spillway on a fresh `flash`: formats, mounts, appends `records` records (flushing
/// after each when `durable`), then reads back every retained record. Programmed bytes and
/// erases are the log's own counts (see `Stats`), which cover every program and erase it
/// sends to the flash after the mount; with `device`, the flash's own counters, they are
/// checked against what the flash saw in the measured window.
///
/// # Panics
/// If the log fails, if a read does not end with the newest record, or if the log's counts
/// differ from the device's.
fn spillway_rep<F: Flash>(
    mut flash: F,
    device: Option<&Cell<NorCounters>>,
    durable: bool,
    records: u64,
    payload_len: usize,
    stamps: &mut Stamps,
) -> Rep {
    let warm_up = u64::from(flash.geometry().capacity) / payload_len as u64;
    let g = flash.geometry();
    Log::format(&mut flash, LOG_ID, BLOCKS_PER_SEGMENT).expect("format");
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, BLOCKS_PER_SEGMENT) as usize];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
    let mut p = payload(payload_len);
    let mut before = log.stats();
    let mut device_before = device.map(Cell::get);
    let mut t = Instant::now();
    for i in 0..warm_up + records {
        if i == warm_up {
            log.flush(i).expect("flush");
            before = log.stats();
            device_before = device.map(Cell::get);
            t = Instant::now();
        }
        stamp(&mut p, i);
        let rec = Record {
            topic: TOPIC,
            timestamp_us: stamps.at(i),
            producer: None,
            payload: &p,
        };
        log.append(i, &rec).expect("append");
        if durable {
            log.flush(i).expect("flush");
        }
    }
    log.flush(warm_up + records).expect("flush");
    let write = t.elapsed();
    let after = log.stats();
    let programmed = after.flash_bytes_programmed - before.flash_bytes_programmed;
    let erases = after.erases - before.erases;
    if let (Some(d0), Some(d1)) = (device_before, device.map(Cell::get)) {
        assert_eq!(
            (programmed, erases),
            (d1.bytes_written - d0.bytes_written, d1.erases - d0.erases),
            "spillway's own counts of bytes programmed and erases (left) differ from the \
             flash's (right)"
        );
    }

    let mut out = vec![0u8; READ_BUFFER];
    let (first, end) = (log.first_offset(), log.next_offset());
    let (read, passes, _) = timed_read_passes(warm_up + records - 1, |pass| {
        let mut at = first;
        while at < end {
            let r = log.read(at, &mut out).expect("read");
            assert!(r.lost.is_none(), "lost records at {at}: {r:?}");
            for rec in r.records(&out) {
                pass.see(rec.payload);
            }
            at = r.next_offset;
        }
    });
    Rep {
        write,
        read,
        read_total: passes * (end - first),
        programmed,
        erases,
        records_read: end - first,
    }
}

/// What one read pass saw: its records, a sum over their payloads (so that the reads are
/// not optimised away) and the index stamped into the last one.
#[derive(Default)]
struct Pass {
    records: u64,
    sum: u64,
    last: Option<u64>,
}

impl Pass {
    /// Counts the record with `payload` (at least 8 bytes, see [`stamp`]).
    #[inline]
    fn see(&mut self, payload: &[u8]) {
        self.records += 1;
        self.sum = self
            .sum
            .wrapping_add(payload[0] as u64 + payload.len() as u64);
        self.last = Some(u64::from_le_bytes(
            payload[..8].try_into().unwrap_or_default(),
        ));
    }
}

/// Times read passes over every retained record (`pass` hands each record's payload to
/// [`Pass::see`]), repeated until together they took [`MIN_READ_WINDOW`]. Returns the time
/// of all the passes, how many there were and the records of one pass.
///
/// # Panics
/// If a pass does not end with record `newest`.
fn timed_read_passes(newest: u64, mut pass: impl FnMut(&mut Pass)) -> (Duration, u64, u64) {
    let t = Instant::now();
    let mut passes = 0u64;
    let mut records = 0;
    while passes == 0 || t.elapsed() < MIN_READ_WINDOW {
        let mut seen = Pass::default();
        pass(&mut seen);
        black_box(seen.sum);
        assert_eq!(seen.last, Some(newest), "the newest record read back");
        records = seen.records;
        passes += 1;
    }
    (t.elapsed(), passes, records)
}

/// [`spillway_flash`](super::spillway_flash) with a cell that holds its counters (see
/// [`RamNor::shared_counters`]).
fn counted_flash<const WS: usize>(
    capacity: usize,
) -> (NorFlashAdapter<RamNor<WS>>, Rc<Cell<NorCounters>>) {
    let mut nor = RamNor::<WS>::new(capacity);
    let device = nor.shared_counters();
    (NorFlashAdapter::new(nor), device)
}

fn peer_rep<const WS: usize>(capacity: usize, payload_len: usize, records: u64) -> Rep {
    let mut q = peer_queue(RamNor::<WS>::new(capacity));
    let mut p = payload(payload_len);
    let warm_up = capacity as u64 / payload_len as u64;
    let (write, programmed, erases) = block_on(async {
        for i in 0..warm_up {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
        }
        let before = q.flash().counters();
        let t = Instant::now();
        for i in warm_up..warm_up + records {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
        }
        let write = t.elapsed();
        let c = q.flash().counters();
        (
            write,
            c.bytes_written - before.bytes_written,
            c.erases - before.erases,
        )
    });
    let mut buf = vec![0u8; READ_BUFFER];
    let (read, passes, n) = timed_read_passes(warm_up + records - 1, |pass| {
        block_on(async {
            let mut it = q.iter().await.expect("iter");
            while let Some(e) = it.next(&mut buf).await.expect("next") {
                pass.see(&e);
            }
        });
    });
    Rep {
        write,
        read,
        read_total: passes * n,
        programmed,
        erases,
        records_read: n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_counts_do_not_depend_on_the_flash_model() {
        use crate::bench_core::ERASE_SIZE;
        use spillway_core::storage::{Geometry, SimFlash};
        for durable in [false, true] {
            let g = Geometry {
                erase_size: ERASE_SIZE,
                write_size: 16,
                capacity: 64 << 10,
                erased: 0xFF,
            };
            let mut sim = SimFlash::new_vec(g).unwrap();
            let mut stamps = Stamps::default();
            let on_sim = spillway_rep(&mut sim, None, durable, 5000, 32, &mut stamps);
            let (flash, device) = counted_flash::<16>(64 << 10);
            let on_ram = spillway_rep(flash, Some(&device), durable, 5000, 32, &mut stamps);
            assert_eq!(
                (on_sim.programmed, on_sim.erases, on_sim.records_read),
                (on_ram.programmed, on_ram.erases, on_ram.records_read)
            );
            // The log's counts cover what the device saw after format and mount.
            let c = sim.counters();
            assert!(c.bytes_written > on_sim.programmed && c.erases > on_sim.erases);
        }
    }
}

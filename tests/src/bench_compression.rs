//! Per-batch LZ4 compression (`--compression`, `FORMAT.md` section 4.4) on the vendored real
//! series as the demo stores them (`tests/data`, see its `SOURCES.md` and [`crate::demo`]),
//! against the same records uncompressed and against the `sequential-storage` queue (the
//! core benchmark's peer) storing the same payloads.
//!
//! ## What is measured
//! - **Series.** The buoy's sea surface temperature: every CSV line as the sensor prints
//!   it, on topic `buoy/sst`, stamped at receipt at the demo's pace (19,226 lines over its
//!   40 s replay: one every 2,080 µs), no producer (line mode). The glucose monitor: per
//!   row, the sensor current on `cgm/isig` and the glucose value on `cgm/glucose` (empty
//!   values skipped), stamped with the reading's time, each topic's records spread
//!   round-robin over the demo's 4 producer ids with their own sequence numbers.
//! - **Patterns.** *linger*: the records flushed in the groups the gateway's default
//!   `--linger-ms 100` makes of them at the demo's pace (48 buoy lines, 261 glucose records
//!   per batch; the default 64 KiB `--buffer-bytes` never fills first); *flush each*: every
//!   record flushed alone (a durable publish with nothing else in flight).
//! - **Modes.** `none`, `auto` (the gateway's default) and `lz4`.
//! - **Figures.** Flash bytes programmed per payload byte (headers, padding, journal and
//!   segment headers included; the log's own count, checked against the flash's), the
//!   batches stored compressed, and the CPU time per MiB of payload of the appends (with
//!   their flushes) and of one read pass (every record, in order, 4 KiB buffer): what
//!   compression adds is the difference to `none` on the same records. The peer pushes the
//!   same payloads (it stores neither topic, timestamp nor producer), each push durable.
//!
//! Every run reads every record back and compares topic, timestamp, producer and payload
//! with what was appended, and requires the expected batch count and (for `lz4` and `auto`
//! in the linger pattern) compressed batches; the flash counts must be the same in every
//! repetition.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use embassy_futures::block_on;
use spillway_core::log::{
    Compression, Config, FullPolicy, Log, Memory, Producer, Record, SegmentSlot, scratch_len,
    segments_for,
};
use spillway_core::storage::Flash;

use crate::bench_core::Spread;
use crate::demo::{CGM_FILE, SST_FILE, TOPIC_GLUCOSE, TOPIC_ISIG, TOPIC_SST, load_cgm, load_sst};
use crate::figures::table_head;
use crate::ram_nor::RamNor;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Rows of each series (`None`: all of them).
    pub rows: Option<usize>,
    /// Repetitions of every timed figure.
    pub reps: usize,
}

/// The demo's replay of each series, µs.
const REPLAY_US: u64 = 40_000_000;
/// The gateway's default `--linger-ms`, in µs.
const LINGER_US: u64 = 100_000;
/// The gateway's default `--buffer-bytes`.
const BUFFER: usize = 64 * 1024;
/// Rows of the buoy and glucose files (`tests/data/SOURCES.md`): the demo paces each
/// series by row over [`REPLAY_US`], whatever rows a run takes.
const SST_ROWS: u64 = 19_226;
const CGM_ROWS: u64 = 52_281;
/// Producer ids per glucose topic (the demo's lanes).
const LANES: u64 = 4;
/// Flash of every run: large enough that neither series wraps it, 4-byte words.
const FLASH: usize = 16 << 20;
/// Erase blocks per segment.
const BPS: u32 = 4;
/// The read buffer.
const READ_BUFFER: usize = 4096;

/// One record as the demo stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    topic: &'static str,
    ts: u64,
    producer: Option<Producer>,
    payload: Vec<u8>,
}

/// A series and the size of its linger batches.
struct Series {
    name: &'static str,
    recs: Vec<Rec>,
    per_linger: usize,
}

/// How records are flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// In the groups the default linger makes at the demo's pace.
    Linger,
    /// Every record alone.
    FlushEach,
}

/// Figures of one series, pattern and mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The series.
    pub series: &'static str,
    /// The pattern.
    pub pattern: Pattern,
    /// `none`, `auto`, `lz4`, or the peer.
    pub mode: &'static str,
    /// Records per linger batch (the pattern's), 1 for flush each.
    pub per_batch: usize,
    /// Records appended.
    pub records: u64,
    /// Payload bytes appended.
    pub payload_bytes: u64,
    /// Flash bytes programmed.
    pub programmed: u64,
    /// Batches written, and of them compressed.
    pub batches: u64,
    /// Batches stored compressed.
    pub compressed: u64,
    /// Appends and flushes, µs per MiB of payload.
    pub write_us_per_mib: Option<Spread>,
    /// One read pass, µs per MiB of payload.
    pub read_us_per_mib: Option<Spread>,
}

impl Run {
    /// Flash bytes programmed per payload byte.
    pub fn per_payload_byte(&self) -> f64 {
        self.programmed as f64 / self.payload_bytes as f64
    }
}

fn load(opts: &Options) -> Vec<Series> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let sst = load_sst(&data.join(SST_FILE), opts.rows).expect("read the buoy series");
    let cgm = load_cgm(&data.join(CGM_FILE), opts.rows).expect("read the glucose series");
    // Buoy lines arrive evenly over the replay and are stamped at receipt.
    let step = REPLAY_US / SST_ROWS;
    let t0 = 1_764_000_000_000_000u64;
    let buoy: Vec<Rec> = sst
        .lines
        .iter()
        .enumerate()
        .map(|(i, l)| Rec {
            topic: TOPIC_SST,
            ts: t0 + i as u64 * step,
            producer: None,
            payload: l.as_bytes().to_vec(),
        })
        .collect();
    let buoy_per = (LINGER_US / step).max(1) as usize;
    // Glucose: by row, the sensor current then the glucose value, each topic over its
    // producer lanes with per-lane sequences.
    let mut rows: Vec<(usize, Rec)> = Vec::new();
    for (topic, values, base) in [
        (TOPIC_ISIG, &cgm.isig, 0x0123_4500u64),
        (TOPIC_GLUCOSE, &cgm.glucose, 0x6789_ab00u64),
    ] {
        for (k, v) in values.iter().enumerate() {
            let lane = k as u64 % LANES;
            rows.push((
                v.row * 2 + usize::from(topic == TOPIC_GLUCOSE),
                Rec {
                    topic,
                    ts: v.timestamp_us,
                    producer: Some(Producer {
                        id: base + lane,
                        seq: (k as u64 / LANES) as u32 + 1,
                    }),
                    payload: v.value.as_bytes().to_vec(),
                },
            ));
        }
    }
    rows.sort_by_key(|r| r.0);
    let glucose: Vec<Rec> = rows.into_iter().map(|r| r.1).collect();
    // Rows per linger at the demo's pace, times the values per row.
    let values_per_row = glucose.len() as f64 / cgm.rows.max(1) as f64;
    let cgm_per = ((CGM_ROWS * LINGER_US / REPLAY_US) as f64 * values_per_row)
        .round()
        .max(1.0) as usize;
    vec![
        Series {
            name: "buoy SST lines",
            recs: buoy,
            per_linger: buoy_per,
        },
        Series {
            name: "glucose records",
            recs: glucose,
            per_linger: cgm_per,
        },
    ]
}

/// What one repetition of spillway did.
struct Rep {
    write: Duration,
    read: Duration,
    programmed: u64,
    batches: u64,
    compressed: u64,
}

/// Appends `recs` in groups of `per_batch` (a flush after each) with `compression`, then
/// reads every record back and compares it.
///
/// # Panics
/// If the log fails, a record reads back different or missing, or the counts are off.
fn spillway_rep(recs: &[Rec], per_batch: usize, compression: Compression) -> Rep {
    let mut nor = RamNor::<4>::new(FLASH);
    let device = nor.shared_counters();
    let mut flash = spillway_core::storage::NorFlashAdapter::new(nor);
    let g = flash.geometry();
    Log::format(&mut flash, 0x1747, BPS).expect("format");
    let mut buffer = vec![0u8; BUFFER];
    let mut scratch = vec![0u8; scratch_len(BUFFER)];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&g, BPS) as usize];
    let cfg = Config {
        full: FullPolicy::RejectNew,
        linger_us: u64::MAX,
        compression,
        ..Config::default()
    };
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) =
        Log::mount_with_scratch(&mut flash, cfg, mem, &mut scratch, 0).expect("mount");
    let before = log.stats();
    let dev0 = device.get();
    let t = Instant::now();
    for (i, r) in recs.iter().enumerate() {
        let rec = Record {
            topic: r.topic,
            timestamp_us: r.ts,
            producer: r.producer,
            payload: &r.payload,
        };
        let a = log.append(i as u64, &rec).expect("append");
        assert!(!a.duplicate && a.offset == i as u64, "append {i}: {a:?}");
        if (i + 1) % per_batch == 0 {
            log.flush(i as u64).expect("flush");
        }
    }
    log.flush(recs.len() as u64).expect("flush");
    let write = t.elapsed();
    let after = log.stats();
    let dev1 = device.get();
    let programmed = after.flash_bytes_programmed - before.flash_bytes_programmed;
    assert_eq!(
        programmed,
        dev1.bytes_written - dev0.bytes_written,
        "the log's count of bytes programmed differs from the flash's"
    );
    let batches = after.batches_written - before.batches_written;
    let compressed = after.batches_compressed - before.batches_compressed;
    let groups = recs.len().div_ceil(per_batch) as u64;
    assert!(
        batches >= groups,
        "{batches} batches written for {groups} flushes"
    );
    assert!(compressed <= batches);

    let mut out = vec![0u8; READ_BUFFER];
    let t = Instant::now();
    let mut at = 0u64;
    while at < log.next_offset() {
        let r = log.read(at, &mut out).expect("read");
        assert!(r.lost.is_none() && r.count > 0, "read at {at}: {r:?}");
        for rec in r.records(&out) {
            let want = &recs[rec.offset as usize];
            assert_eq!(rec.offset, at);
            assert!(
                rec.topic == want.topic
                    && rec.timestamp_us == want.ts
                    && rec.producer == want.producer
                    && rec.payload == want.payload.as_slice(),
                "record {at} reads back different"
            );
            at += 1;
        }
    }
    let read = t.elapsed();
    assert_eq!(at, recs.len() as u64, "records read back");
    Rep {
        write,
        read,
        programmed,
        batches,
        compressed,
    }
}

/// The peer pushing the same payloads, each push durable: flash bytes programmed.
fn peer_programmed(recs: &[Rec]) -> u64 {
    let mut q = crate::bench_core::peer_queue(RamNor::<4>::new(FLASH));
    block_on(async {
        let before = q.flash().counters();
        for r in recs {
            q.push(&r.payload, false).await.expect("push");
        }
        let c = q.flash().counters();
        let mut buf = vec![0u8; READ_BUFFER];
        let mut it = q.iter().await.expect("iter");
        let mut n = 0usize;
        while let Some(e) = it.next(&mut buf).await.expect("next") {
            assert_eq!(&e[..], &recs[n].payload[..], "peer item {n}");
            n += 1;
        }
        assert_eq!(n, recs.len(), "peer items read back");
        c.bytes_written - before.bytes_written
    })
}

/// The codec alone on one series' linger batches: their compact bodies compressed and
/// decoded again, timed over passes of at least 50 ms each.
#[derive(Debug, Clone, PartialEq)]
pub struct Codec {
    /// The series.
    pub series: &'static str,
    /// Batches (compact bodies).
    pub batches: u64,
    /// Bytes of the compact bodies.
    pub body_bytes: u64,
    /// Bytes of their LZ4 blocks.
    pub block_bytes: u64,
    /// Payload bytes of their records.
    pub payload_bytes: u64,
    /// Compressing every body, µs per MiB of compact body.
    pub compress_us_per_mib: Spread,
    /// Decoding every block (the log's streaming decoder), µs per MiB of compact body.
    pub decompress_us_per_mib: Spread,
}

/// Shortest time of one timed codec measurement.
const CODEC_WINDOW: Duration = Duration::from_millis(50);

/// Times the codec on the compact bodies of `recs` in groups of `per_batch`.
///
/// # Panics
/// If a body does not decode back to itself.
fn codec(name: &'static str, recs: &[Rec], per_batch: usize, reps: usize) -> Codec {
    use spillway_core::log::compact::{self, SliceSource};
    use spillway_core::log::lz4;
    let mut bodies = Vec::new();
    let mut payload_bytes = 0u64;
    for (g, group) in recs.chunks(per_batch).enumerate() {
        // The canonical encodings (`FORMAT.md` section 4.1), as the RAM buffer holds them.
        let mut canonical = Vec::new();
        for r in group {
            canonical.push(r.topic.len() as u8);
            canonical.extend_from_slice(r.topic.as_bytes());
            canonical.extend_from_slice(&r.ts.to_le_bytes());
            match r.producer {
                Some(p) => {
                    canonical.push(1);
                    canonical.extend_from_slice(&p.id.to_le_bytes());
                    canonical.extend_from_slice(&p.seq.to_le_bytes());
                }
                None => canonical.push(0),
            }
            canonical.extend_from_slice(&(r.payload.len() as u32).to_le_bytes());
            canonical.extend_from_slice(&r.payload);
            payload_bytes += r.payload.len() as u64;
        }
        let base = (g * per_batch) as u64;
        let parsed: Vec<_> =
            spillway_core::log::RecordIter::new(&canonical, base, group.len() as u32).collect();
        assert!(
            parsed.len() == group.len()
                && parsed
                    .iter()
                    .zip(group)
                    .all(|(p, r)| p.payload == &r.payload[..]
                        && p.topic == r.topic
                        && p.timestamp_us == r.ts
                        && p.producer == r.producer),
            "{name}: the canonical encodings do not parse back"
        );
        let plan = compact::plan(&canonical, base, group.len() as u32, usize::MAX);
        assert_eq!(plan.count as usize, group.len());
        let mut body = Vec::with_capacity(plan.body_len);
        compact::encode::<()>(&canonical, base, &plan, &mut |b| {
            body.extend_from_slice(b);
            Ok(())
        })
        .expect("encode");
        bodies.push(body);
    }
    let body_bytes: u64 = bodies.iter().map(|b| b.len() as u64).sum();
    let mut out = vec![0u8; lz4::scratch_len(BUFFER)];
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    let mut back = vec![0u8; BUFFER];
    let (mut comp, mut decomp) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let (t, mut passes) = (Instant::now(), 0u32);
        while passes == 0 || t.elapsed() < CODEC_WINDOW {
            blocks.clear();
            for b in &bodies {
                let n = lz4::compress(b, &mut out).expect("compress");
                blocks.push(out[..n].to_vec());
            }
            passes += 1;
        }
        comp.push(us_per_mib(t.elapsed() / passes, body_bytes));
        let (t, mut passes) = (Instant::now(), 0u32);
        while passes == 0 || t.elapsed() < CODEC_WINDOW {
            for (b, c) in bodies.iter().zip(&blocks) {
                let mut src = SliceSource { rest: c };
                let ok = lz4::decompress(&mut src, c.len(), &mut back[..b.len()]);
                assert!(
                    ok == Ok(true) && back[..b.len()] == b[..],
                    "{name}: a body decoded wrong"
                );
            }
            passes += 1;
        }
        decomp.push(us_per_mib(t.elapsed() / passes, body_bytes));
    }
    Codec {
        series: name,
        batches: bodies.len() as u64,
        body_bytes,
        block_bytes: blocks.iter().map(|b| b.len() as u64).sum(),
        payload_bytes,
        compress_us_per_mib: Spread::of(&comp),
        decompress_us_per_mib: Spread::of(&decomp),
    }
}

fn us_per_mib(d: Duration, bytes: u64) -> f64 {
    d.as_secs_f64() * 1e6 / (bytes as f64 / (1024.0 * 1024.0))
}

/// Runs every series, pattern and mode, `opts.reps` times interleaved; the peer once per
/// series (its counts do not vary).
///
/// # Panics
/// If a run fails its checks (see the module doc).
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Report {
    let mut out = Vec::new();
    let mut codecs = Vec::new();
    for s in load(opts) {
        progress(&format!("compression: {}, the codec alone", s.name));
        codecs.push(codec(s.name, &s.recs, s.per_linger, opts.reps));
        let payload_bytes: u64 = s.recs.iter().map(|r| r.payload.len() as u64).sum();
        for pattern in [Pattern::Linger, Pattern::FlushEach] {
            progress(&format!("compression: {}, {pattern:?}", s.name));
            let per = match pattern {
                Pattern::Linger => s.per_linger,
                Pattern::FlushEach => 1,
            };
            let modes = [
                ("none", Compression::None),
                ("auto", Compression::Auto),
                ("lz4", Compression::Lz4),
            ];
            let mut writes = vec![Vec::new(); modes.len()];
            let mut reads = vec![Vec::new(); modes.len()];
            let mut counts = vec![None; modes.len()];
            for _ in 0..opts.reps.max(1) {
                for (k, &(_, mode)) in modes.iter().enumerate() {
                    let r = spillway_rep(&s.recs, per, mode);
                    let c = (r.programmed, r.batches, r.compressed);
                    assert!(
                        counts[k].is_none_or(|x| x == c),
                        "{} {pattern:?} {mode:?}: counts differ between repetitions",
                        s.name
                    );
                    counts[k] = Some(c);
                    writes[k].push(us_per_mib(r.write, payload_bytes));
                    reads[k].push(us_per_mib(r.read, payload_bytes));
                }
            }
            for (k, &(name, mode)) in modes.iter().enumerate() {
                let (programmed, batches, compressed) = counts[k].unwrap_or_default();
                match (mode, pattern) {
                    (Compression::None, _) => assert_eq!(compressed, 0, "{}", s.name),
                    (_, Pattern::Linger) => {
                        assert!(compressed > 0, "{} {name}: no batch was compressed", s.name)
                    }
                    _ => {}
                }
                out.push(Run {
                    series: s.name,
                    pattern,
                    mode: name,
                    per_batch: per,
                    records: s.recs.len() as u64,
                    payload_bytes,
                    programmed,
                    batches,
                    compressed,
                    write_us_per_mib: Some(Spread::of(&writes[k])),
                    read_us_per_mib: Some(Spread::of(&reads[k])),
                });
            }
        }
        progress(&format!("compression: {}, sequential-storage", s.name));
        out.push(Run {
            series: s.name,
            pattern: Pattern::FlushEach,
            mode: "sequential-storage 8.0.2",
            per_batch: 1,
            records: s.recs.len() as u64,
            payload_bytes,
            programmed: peer_programmed(&s.recs),
            batches: 0,
            compressed: 0,
            write_us_per_mib: None,
            read_us_per_mib: None,
        });
    }
    Report { runs: out, codecs }
}

/// Everything [`run`] measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// Every series, pattern and mode, and the peer.
    pub runs: Vec<Run>,
    /// The codec alone, per series.
    pub codecs: Vec<Codec>,
}

/// The Markdown section of a [`Report`].
pub struct Section<'a>(pub &'a Report);

impl fmt::Display for Section<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = &self.0.runs[..];
        writeln!(
            f,
            "## Compression: the demo's real series, 4-byte words, 64 KiB RAM buffer \
             (`--buffer-bytes` default), linger batches of the default 100 ms at the demo's \
             pace or every record flushed alone"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "Flash bytes per payload byte: everything programmed (headers, padding, journal) \
             over the payload. CPU: min / median / max µs per MiB of payload of the appends \
             with their flushes, and of one read pass; the cost of compression is the \
             difference to `none`. The peer stores the payloads only (no topic, timestamp or \
             producer), each push durable; ×peer is spillway ÷ sequential-storage on flash \
             bytes."
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| series | pattern | mode | records | batches (compressed) | programmed B / payload B | ×peer | write µs/MiB | +µs/MiB vs none | read µs/MiB | +µs/MiB vs none |",
        )?;
        for r in runs {
            let pattern = match r.pattern {
                Pattern::Linger => format!("linger, {} per batch", r.per_batch),
                Pattern::FlushEach => "flush each".to_string(),
            };
            let peer = runs
                .iter()
                .find(|p| p.series == r.series && p.write_us_per_mib.is_none());
            let none = runs
                .iter()
                .find(|p| p.series == r.series && p.pattern == r.pattern && p.mode == "none");
            let ratio = match peer {
                Some(p) if p.write_us_per_mib.is_some() != r.write_us_per_mib.is_some() => {
                    format!("{:.2}", r.per_payload_byte() / p.per_payload_byte())
                }
                _ => "—".into(),
            };
            let cpu = |s: &Option<Spread>, base: Option<&Option<Spread>>| match s {
                Some(s) => (
                    s.show(|x| format!("{x:.0}")),
                    match base {
                        Some(Some(b)) if r.mode != "none" => {
                            format!("{:+.0}", s.median - b.median)
                        }
                        _ => "—".into(),
                    },
                ),
                None => ("—".into(), "—".into()),
            };
            let (w, wd) = cpu(&r.write_us_per_mib, none.map(|n| &n.write_us_per_mib));
            let (rd, rdd) = cpu(&r.read_us_per_mib, none.map(|n| &n.read_us_per_mib));
            let batches = if r.write_us_per_mib.is_some() {
                format!("{} ({})", r.batches, r.compressed)
            } else {
                "—".into()
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} | {} |",
                r.series,
                pattern,
                r.mode,
                r.records,
                batches,
                r.per_payload_byte(),
                ratio,
                w,
                wd,
                rd,
                rdd
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "The codec alone on the linger batches' compact bodies (LZ4 compression with \
             `lz4_flex`, decoding with the log's streaming decoder from memory; min / median / \
             max of the repetitions, each a pass over every batch repeated for at least {} ms):",
            CODEC_WINDOW.as_millis()
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| series | batches | compact body B | LZ4 block B | block / body | compress µs/MiB of body | decompress µs/MiB of body | compress µs/MiB of payload | decompress µs/MiB of payload |",
        )?;
        for c in &self.0.codecs {
            let per_payload = c.body_bytes as f64 / c.payload_bytes as f64;
            let s = |x: &Spread| x.show(|v| format!("{v:.0}"));
            writeln!(
                f,
                "| {} | {} | {} | {} | {:.3} | {} | {} | {:.0} | {:.0} |",
                c.series,
                c.batches,
                c.body_bytes,
                c.block_bytes,
                c.block_bytes as f64 / c.body_bytes as f64,
                s(&c.compress_us_per_mib),
                s(&c.decompress_us_per_mib),
                c.compress_us_per_mib.median * per_payload,
                c.decompress_us_per_mib.median * per_payload,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A few hundred rows of each series: every run checks itself, compressed batches
    /// take less flash than plain ones, and the table has every row.
    #[test]
    fn a_small_run_checks_itself_and_renders() {
        let report = run(
            &Options {
                rows: Some(600),
                reps: 1,
            },
            |_| {},
        );
        let runs = &report.runs;
        assert_eq!(runs.len(), 2 * (2 * 3 + 1));
        assert_eq!(report.codecs.len(), 2);
        for c in &report.codecs {
            assert!(c.block_bytes < c.body_bytes, "{c:?}");
        }
        for s in ["buoy SST lines", "glucose records"] {
            let get = |mode: &str| {
                runs.iter()
                    .find(|r| r.series == s && r.pattern == Pattern::Linger && r.mode == mode)
                    .unwrap()
            };
            assert!(get("lz4").programmed < get("none").programmed, "{s}");
        }
        let text = Section(&report).to_string();
        assert!(text.contains("| buoy SST lines | linger,"), "{text}");
        assert!(text.contains("sequential-storage 8.0.2"), "{text}");
    }
}

//! Records/s written by `spillway-bridge drain --once` into the file sink (`file:DIR` with
//! its default settings) from a real `spillway` gateway, side by side with a plain writer
//! putting the same NDJSON lines into files rotated at the same size with one `fdatasync`
//! per file: the cost of writing those bytes durably, with nothing else. [`run`] measures;
//! its [`Report`] prints as a Markdown table with min/median/max over the runs, each run's
//! figures and the ratio beside its goal, [`GOAL`].
//!
//! What is timed: the bridge's whole process (start, handshake, state file, fetches, JSON
//! lines, the group checkpoints with their `fdatasync` of the files, exit); the plain writer
//! from its first file's creation to the `fdatasync` of its last. The gateway is started
//! and filled once as comparison 4's is (`start_gateway`, `publish_sized`, not timed);
//! the sink and the writer alternate, each run into a fresh directory.
//!
//! [`WARMUP_ROUNDS`] rounds of both sides come first, verified as the others and reported,
//! but not counted in the medians.
//!
//! The writer's lines are the bytes the first sink run wrote, read back before its first
//! run (not timed), with their line boundaries: it holds them in memory, as the Kafka
//! comparison's plain producer holds its records. It rotates by the sink's rule (a file
//! takes its first line whatever its length; a line that would take a file past
//! [`ROTATE_BYTES`] begins the next one), writes through a buffer of [`WRITE_BUFFER`] bytes,
//! and syncs each file once, when it is rotated or at the end (no directory `fsync`; the
//! sink syncs the directory of each file it creates, and the files at each checkpoint).
//!
//! Every run is verified before its figure counts. A sink run: `drain` exited 0, its
//! consumer (a fresh state file and a name of its own per run, `bench-file-N`, deleted on
//! the gateway afterwards) committed the gateway's last offset, and its files, read back
//! in name order, hold every offset exactly once, in order, each line with the record's
//! payload, topic, gateway id and log id, and rotated at [`ROTATE_BYTES`] (so the writer's
//! rotation is the sink's default). A writer run: its files hold exactly the bytes and the
//! line count it was given, in as many files as the sink wrote. A run that fails is kept in
//! the [`Report`] with what was found, its rate counts only the records in place, and
//! [`Report::failures`] names it: the benchmark program exits non-zero on any.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bench_core::{Machine, machine};
use crate::bench_kafka::{
    GATEWAY_ID, TOPIC, committed_and_delete, drain_once, image_size, payload_of, publish_sized,
    start_gateway,
};
use crate::bridge::bridge_bin;
use crate::figures::thousands;
use crate::sides::{Measured, Sides};

/// What to run: records drained (and lines written) per run and runs of each side;
/// [`default_options`] for the report.
pub type Options = crate::bench_kafka::Options;

/// The report's runs: comparison 4's 300,000 records (about 90 MB of lines, so the sink
/// rotates once at its default size), 9 runs of each side: a run takes a fifth of a second,
/// and the 3 runs of one report spread from 0.34 to 0.49 of the writer's rate, too wide for
/// a median of 3 to say much.
pub fn default_options() -> Options {
    Options {
        records: 300_000,
        runs: 9,
    }
}

pub use crate::bench_kafka::PAYLOAD;
/// The file sink's default rotation size, bytes (`drain --rotate-bytes`' default, 64 MiB):
/// the writer rotates at it, and every sink run is checked to have rotated at it.
pub const ROTATE_BYTES: u64 = 64 << 20;
/// The plain writer's buffer, bytes (the drain's default fetch budget, 256 KiB).
pub const WRITE_BUFFER: usize = 256 << 10;
/// The goal: sink records/s ÷ writer records/s, medians, at least this.
pub const GOAL: f64 = 0.5;
/// Rounds of both sides run before the timed ones, verified like them but not counted:
/// the first rounds after the fill were often the slowest sink runs (one report: 1.45-1.63M
/// records/s in its first 3 rounds, 2.0-2.5M in the 6 after; another rose from 1.26M to
/// 1.88M over its 9), the writer steady at 4.2-4.8M. The warm-up does not remove the
/// spread: in the first report run with it, its rounds drained at 2.2M and timed runs 1
/// and 2 at 1.74-1.76M. Both sides get the same warm-up.
pub const WARMUP_ROUNDS: usize = 2;

/// One timed run of one side.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Wall time, s.
    pub secs: f64,
    /// Records (lines) the run had to write.
    pub expected: u64,
    /// Lines found in its files.
    pub found: u64,
    /// Lines found in their place: for the sink, line `i` is the record at offset `i`,
    /// every field as sent; for the writer, every line when its files hold exactly the
    /// bytes it was given, else 0.
    pub matching: u64,
    /// Files written.
    pub files: usize,
    /// Bytes in them.
    pub bytes: u64,
    /// The 1-, 5- and 15-minute load averages when the run ended.
    pub load: String,
    /// What is wrong with the run, `None` when it did all its work.
    pub problem: Option<String>,
}

impl Run {
    /// Records/s, counting only the records in place (all of them for a verified run).
    pub fn records_per_s(&self) -> f64 {
        self.matching as f64 / self.secs
    }
}

impl Measured for Run {
    fn records_per_s(&self) -> f64 {
        Run::records_per_s(self)
    }

    fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }
}

/// Consumer name of sink run `run` on the gateway and in its state file.
fn run_consumer(run: usize) -> String {
    format!("bench-file-{run}")
}

/// The regular files under `dir`, recursively, sorted by path.
fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The current load averages, as [`Machine::load`] gives them.
fn load_now() -> String {
    machine().load
}

/// What reading a sink run's directory back found.
struct ReadBack {
    found: u64,
    matching: u64,
    files: usize,
    bytes: u64,
    problem: Option<String>,
}

/// Reads the sink's files under `out` back (see the module doc) against the `n` records
/// of log `log_hex`; appends their bytes, in order, to `keep` when given.
fn read_sink(out: &Path, log_hex: &str, n: u64, mut keep: Option<&mut Vec<u8>>) -> ReadBack {
    let mut r = ReadBack {
        found: 0,
        matching: 0,
        files: 0,
        bytes: 0,
        problem: None,
    };
    let topic_dir = out.join(GATEWAY_ID).join(TOPIC.replace('/', "%2F"));
    let files = match files_under(out) {
        Ok(f) => f,
        Err(e) => {
            r.problem = Some(format!("listing {}: {e}", out.display()));
            return r;
        }
    };
    let mut problems: Vec<String> = Vec::new();
    // (size, length of the first line) per file, for the rotation check.
    let mut sizes: Vec<(u64, u64)> = Vec::new();
    for path in &files {
        let name = path.file_name().and_then(|s| s.to_str()).unwrap_or("");
        let first = name
            .strip_suffix(".jsonl.open")
            .or_else(|| name.strip_suffix(".jsonl"))
            .filter(|d| d.len() == 20)
            .and_then(|d| d.parse::<u64>().ok());
        let Some(first) = first.filter(|_| path.parent() == Some(&topic_dir)) else {
            problems.push(format!("unexpected file {}", path.display()));
            continue;
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("reading {}: {e}", path.display()));
                continue;
            }
        };
        r.files += 1;
        r.bytes += bytes.len() as u64;
        let first_line = bytes.iter().position(|&b| b == b'\n').map_or(0, |p| p + 1);
        sizes.push((bytes.len() as u64, first_line as u64));
        if r.found != first {
            problems.push(format!(
                "{} is named for offset {first} but follows {} lines",
                path.display(),
                r.found
            ));
        }
        if !bytes.is_empty() && bytes.last() != Some(&b'\n') {
            problems.push(format!("{} ends in a torn line", path.display()));
        }
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let i = r.found;
            r.found += 1;
            match line_problem(line, i, log_hex) {
                None if i < n => r.matching += 1,
                // Only the first few wrong lines are named.
                Some(p) if problems.len() < 3 => {
                    problems.push(format!("line {i} (in {}): {p}", path.display()));
                }
                None | Some(_) => {}
            }
        }
        if let Some(k) = keep.as_deref_mut() {
            k.extend_from_slice(&bytes);
        }
    }
    for (i, &(size, _)) in sizes.iter().enumerate() {
        let next_first = sizes.get(i + 1).map(|&(_, l)| l);
        if size > ROTATE_BYTES || next_first.is_some_and(|l| size + l <= ROTATE_BYTES) {
            problems.push(format!(
                "file {} of {} holds {size} bytes: not rotated at {ROTATE_BYTES} bytes (the \
                 writer's rotation would differ from the sink's)",
                i + 1,
                sizes.len()
            ));
        }
    }
    if r.found != n {
        problems.insert(
            0,
            format!("{} lines in the files, {n} records drained", r.found),
        );
    }
    r.problem = (!problems.is_empty()).then(|| problems.join("; "));
    r
}

/// What is wrong with `line` as the sink's line for the record at offset `i` of log
/// `log_hex`, if anything.
fn line_problem(line: &[u8], i: u64, log_hex: &str) -> Option<String> {
    let v: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Some(format!("not JSON: {e}")),
    };
    let payload = usize::try_from(i)
        .ok()
        .map(|i| String::from_utf8_lossy(&payload_of(i, PAYLOAD)).into_owned());
    let checks = [
        ("offset", v["offset"].as_u64() == Some(i)),
        (
            "payload",
            payload.is_some_and(|p| v["payload"].as_str() == Some(p.as_str())),
        ),
        ("payload_encoding", v["payload_encoding"] == "utf8"),
        ("topic", v["topic"] == TOPIC),
        ("gateway_id", v["gateway_id"] == GATEWAY_ID),
        ("log_id", v["log_id"] == log_hex),
    ];
    let wrong: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    (!wrong.is_empty()).then(|| format!("wrong {}", wrong.join(", ")))
}

/// One `spillway-bridge drain --once` of the whole gateway into a fresh directory, with a
/// fresh state file and the consumer name of run `run`, verified by reading its files back
/// ([`read_sink`]) and by the consumer's committed offset, which is then deleted (not
/// timed); the files' bytes are appended to `keep` when given.
fn sink_run(gw: &Gateway, run: usize, keep: Option<&mut Vec<u8>>) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let consumer = run_consumer(run);
    let n = gw.records as u64;
    let sink = format!("file:{}", out.display());
    let (secs, exit) = drain_once(std::slice::from_ref(&gw.addr), &consumer, &sink);
    let load = load_now();
    let back = read_sink(&out, &format!("{:032x}", gw.log_id), n, keep);
    let committed = committed_and_delete(&gw.addr, &consumer);
    let mut problem = back.problem;
    if exit.is_some() {
        problem = exit;
    } else if problem.is_none() && committed != Some(n) {
        problem = Some(format!(
            "the files hold every record, but consumer {consumer} committed {committed:?} on \
             the gateway, not {n}"
        ));
    }
    Run {
        secs,
        expected: n,
        found: back.found,
        matching: back.matching,
        files: back.files,
        bytes: back.bytes,
        load,
        problem,
    }
}

/// Writes `lines` (`ends[k]`: the end of line `k` in it) into files under `dir` rotated by
/// the sink's rule at `rotate` bytes, through a buffer of [`WRITE_BUFFER`] bytes, with one
/// `fdatasync` per file; returns the files written.
///
/// # Errors
/// The I/O error of a create, write or sync.
fn write_rotated(dir: &Path, lines: &[u8], ends: &[usize], rotate: u64) -> std::io::Result<usize> {
    fn finish(w: std::io::BufWriter<File>) -> std::io::Result<()> {
        w.into_inner().map_err(|e| e.into_error())?.sync_data()
    }
    let mut cur: Option<(std::io::BufWriter<File>, u64)> = None;
    let mut files = 0;
    let mut start = 0;
    for &end in ends {
        let line = &lines[start..end];
        start = end;
        if let Some((_, len)) = &cur
            && *len + line.len() as u64 > rotate
            && let Some((w, _)) = cur.take()
        {
            finish(w)?;
        }
        let (w, len) = match &mut cur {
            Some(c) => c,
            None => {
                files += 1;
                let f = File::create_new(dir.join(format!("{files:08}.jsonl")))?;
                cur.insert((std::io::BufWriter::with_capacity(WRITE_BUFFER, f), 0))
            }
        };
        w.write_all(line)?;
        *len += line.len() as u64;
    }
    if let Some((w, _)) = cur {
        finish(w)?;
    }
    Ok(files)
}

/// One run of the plain writer into a fresh directory, verified by the files' sizes and
/// line counts (`sink_files`: the files the sink wrote for the same lines).
fn writer_run(lines: &[u8], ends: &[usize], sink_files: usize) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = ends.len() as u64;
    let t = Instant::now();
    let written = write_rotated(dir.path(), lines, ends, ROTATE_BYTES);
    let secs = t.elapsed().as_secs_f64();
    let load = load_now();
    let mut run = Run {
        secs,
        expected: n,
        found: 0,
        matching: 0,
        files: 0,
        bytes: 0,
        load,
        problem: None,
    };
    let files = match written.and_then(|_| files_under(dir.path())) {
        Ok(f) => f,
        Err(e) => {
            run.problem = Some(format!("writing: {e}"));
            return run;
        }
    };
    for f in &files {
        match std::fs::read(f) {
            Ok(b) => {
                run.files += 1;
                run.bytes += b.len() as u64;
                run.found += b.iter().filter(|&&c| c == b'\n').count() as u64;
                if b.len() as u64 > ROTATE_BYTES {
                    run.problem = Some(format!("{} holds {} bytes", f.display(), b.len()));
                }
            }
            Err(e) => run.problem = Some(format!("reading {}: {e}", f.display())),
        }
    }
    if run.bytes != lines.len() as u64 || run.found != n {
        run.problem = Some(format!(
            "the files hold {} bytes in {} lines, {} bytes in {n} lines were written",
            run.bytes,
            run.found,
            lines.len()
        ));
    } else if run.files != sink_files {
        run.problem = Some(format!(
            "{} files, the sink wrote the same lines into {sink_files}",
            run.files
        ));
    }
    if run.problem.is_none() {
        run.matching = n;
    }
    run
}

/// The filled gateway the sink runs drain.
struct Gateway {
    /// `host:port` of its TCP listener.
    addr: String,
    /// Its log id.
    log_id: u128,
    /// Records stored, offsets `0..records`.
    records: usize,
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// What ran.
    pub options: Options,
    /// The sink's runs and the writer's.
    pub sides: Sides<Run>,
    /// Time to fill the gateway.
    pub fill: Duration,
    /// The warm-up rounds ([`WARMUP_ROUNDS`]), sink and writer: verified, not counted.
    pub warmup: Vec<(Run, Run)>,
}

/// Fills a fresh gateway with `opts.records` records of [`PAYLOAD`] bytes and runs both
/// sides `opts.runs` times, alternating (the sink first: the writer's lines are the first
/// sink run's files); `progress` is told what starts and what each run measured. A run that
/// fails its check does not stop the others: see [`Report::failures`].
///
/// # Panics
/// If the gateway fails.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Report {
    let at_start = machine();
    let n = opts.records;
    progress(&format!(
        "publish {n} records of {PAYLOAD} bytes durably; each run drains all of them into a \
         fresh directory, and every directory is read back"
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let (_process, addr) = start_gateway(dir.path(), GATEWAY_ID, &image_size(n));
    // Built (if it must be) before the fill's clock starts.
    let _ = bridge_bin();
    let t = Instant::now();
    let log_id = publish_sized(&addr, n, PAYLOAD);
    let fill = t.elapsed();
    let gw = Gateway {
        addr,
        log_id,
        records: n,
    };
    let mut sides = Sides::new(["sink", "writer"]);
    let mut warmup = Vec::new();
    let mut lines = Vec::new();
    let mut ends = Vec::new();
    let check = |r: &Run| match &r.problem {
        None => format!("{} lines in {} files verified", r.found, r.files),
        Some(p) => format!("FAILED: {p}"),
    };
    for r in 0..WARMUP_ROUNDS + opts.runs.max(1) {
        let s = if r == 0 {
            let s = sink_run(&gw, r + 1, Some(&mut lines));
            let mut at = 0;
            for (i, &b) in lines.iter().enumerate() {
                if b == b'\n' {
                    at = i + 1;
                    ends.push(at);
                }
            }
            // A torn last line (a failed run) is written too.
            if at < lines.len() {
                ends.push(lines.len());
            }
            s
        } else {
            sink_run(&gw, r + 1, None)
        };
        let w = writer_run(&lines, &ends, s.files);
        let name = match r.checked_sub(WARMUP_ROUNDS) {
            Some(timed) => format!("run {}", timed + 1),
            None => format!("warm-up {} (not counted)", r + 1),
        };
        progress(&format!(
            "{name}: file sink {:.0} records/s ({}), plain writer {:.0} records/s ({}); \
             ratio {:.2}; load {}",
            s.records_per_s(),
            check(&s),
            w.records_per_s(),
            check(&w),
            s.records_per_s() / w.records_per_s(),
            w.load
        ));
        if r < WARMUP_ROUNDS {
            warmup.push((s, w));
        } else {
            sides.push(s, w);
        }
    }
    Report {
        machine: at_start,
        options: opts.clone(),
        sides,
        fill,
        warmup,
    }
}

impl Report {
    /// Every run that did not do all its work, described (empty when every run passed).
    /// A failed warm-up run counts: every run must do all its work.
    pub fn failures(&self) -> Vec<String> {
        let mut out = self.sides.failures("file");
        for (i, (s, w)) in self.warmup.iter().enumerate() {
            for (side, run) in [("sink", s), ("writer", w)] {
                if let Some(p) = &run.problem {
                    out.push(format!("file warm-up {}, {side}: {p}", i + 1));
                }
            }
        }
        out
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.options.records;
        let runs = self.sides.ours.len();
        let line = self.sides.ours.first().map_or(0.0, |r| {
            if r.found == 0 {
                0.0
            } else {
                r.bytes as f64 / r.found as f64
            }
        });
        writeln!(
            f,
            "A real gateway (`--max-frame-bytes {}`) holds {} records of {PAYLOAD} B \
             (filling it took {:.1} s, not timed); each run drains all of them with `spillway-bridge drain --once --sink \
             file:DIR` (default settings: rotation at {} MiB, a group checkpoint, an \
             `fdatasync` of the files written then a state file commit, every 1 s or 16 MiB \
             of payload and at the end) into a fresh directory, whole process timed, \
             from a fresh state file under a consumer name of its own; then a plain writer \
             writes the same lines (the first run's files, {line:.0} B a line on average, held \
             in memory) into files rotated at the same size, through a {} KiB buffer, one \
             `fdatasync` per file, timed from the first file's creation to the last sync. Every \
             sink run's files are read back (not timed): every offset exactly once, in order, \
             each line's fields as sent, rotated at {} MiB; and its consumer must have \
             committed the last offset. Every writer run's files must hold exactly the bytes \
             and lines given, in as many files as the sink wrote.",
            crate::bench_kafka::GATEWAY_FRAME,
            thousands(n as f64),
            self.fill.as_secs_f64(),
            ROTATE_BYTES >> 20,
            WRITE_BUFFER >> 10,
            ROTATE_BYTES >> 20,
        )?;
        if !self.warmup.is_empty() {
            let figures: Vec<String> = self
                .warmup
                .iter()
                .map(|(s, w)| {
                    format!(
                        "sink {} and writer {} records/s",
                        thousands(s.records_per_s()),
                        thousands(w.records_per_s())
                    )
                })
                .collect();
            writeln!(f)?;
            writeln!(
                f,
                "Before the timed runs, {} warm-up rounds of both sides, verified the same \
                 way and not counted: {}.",
                self.warmup.len(),
                figures.join("; ")
            )?;
        }
        writeln!(f)?;
        self.sides.write_spreads(
            f,
            &format!(
                "{} records of {PAYLOAD} B, {runs} runs",
                thousands(n as f64)
            ),
            [
                "`spillway-bridge drain --once` into `file:`, records/s (whole process)",
                "plain writer, one fdatasync per file, records/s (the ceiling)",
                &format!("sink ÷ writer, per run (goal ≥ {GOAL:.2})"),
            ],
        )?;
        writeln!(f)?;
        self.sides.write_runs(
            f,
            "sink s | sink records/s | sink: lines in place, files, MB | writer s | \
             writer records/s | writer: lines, files, MB | sink ÷ writer | load after",
            |s, w| {
                format!(
                    "{:.2} | {} | {} of {}, {}, {:.1} | {:.2} | {} | {}, {}, {:.1} | {:.2} | {}",
                    s.secs,
                    thousands(s.records_per_s()),
                    thousands(s.matching as f64),
                    thousands(s.expected as f64),
                    s.files,
                    s.bytes as f64 / 1e6,
                    w.secs,
                    thousands(w.records_per_s()),
                    thousands(w.found as f64),
                    w.files,
                    w.bytes as f64 / 1e6,
                    s.records_per_s() / w.records_per_s(),
                    w.load,
                )
            },
            |_, _| "verified".into(),
        )?;
        writeln!(f)?;
        self.sides
            .write_verdict(f, &self.failures(), "Every run verified.")
    }
}

//! Reading the file sink (`DIR/<gateway id>/<topic>/<first offset>.jsonl[.open]`): counting
//! its lines as they grow, and parsing every line at the end.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Counts the lines of the sink's files as they grow, reading only what is new.
#[derive(Debug, Default)]
pub(super) struct SinkCounter {
    /// Per file (its closed name: a rename on rotation is the same file): bytes read and
    /// lines counted.
    pub(super) files: HashMap<PathBuf, (u64, u64)>,
    /// Highest offset seen in a last line.
    pub(super) high: Option<u64>,
}

impl SinkCounter {
    pub(super) fn lines(&mut self, dir: &Path) -> u64 {
        let paths = crate::bridge::sink_files(dir);
        let keys: Vec<PathBuf> = paths.iter().map(|p| closed_name(p)).collect();
        // A file removed (an open file cut back to nothing after a kill) counts no more.
        self.files.retain(|k, _| keys.contains(k));
        for (path, key) in paths.into_iter().zip(keys) {
            let Ok(mut f) = File::open(&path) else {
                continue;
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let entry = self.files.entry(key).or_insert((0, 0));
            if len < entry.0 {
                // Cut back (a torn line after a kill): count again.
                *entry = (0, 0);
            }
            if len == entry.0 {
                continue;
            }
            let mut buf = Vec::new();
            if io::Seek::seek(&mut f, io::SeekFrom::Start(entry.0)).is_err()
                || f.take(len - entry.0).read_to_end(&mut buf).is_err()
            {
                continue;
            }
            // Only whole lines count; a partial one is read again next time.
            let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            entry.0 += last_nl as u64 + 1;
            entry.1 += buf[..=last_nl].iter().filter(|&&b| b == b'\n').count() as u64;
            let start = buf[..last_nl]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&buf[start..last_nl])
                && let Some(off) = v["offset"].as_u64()
            {
                self.high = Some(self.high.map_or(off, |h| h.max(off)));
            }
        }
        self.files.values().map(|v| v.1).sum()
    }
}

/// `path` without a trailing `.open`.
fn closed_name(path: &Path) -> PathBuf {
    let s = path.to_string_lossy();
    PathBuf::from(s.strip_suffix(".open").unwrap_or(&s).to_string())
}

/// Total size of the sink's files, bytes.
pub(super) fn sink_bytes(dir: &Path) -> u64 {
    crate::bridge::sink_files(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// One line of the file sink.
#[derive(Debug, Clone)]
pub(super) struct SinkLine {
    pub(super) log_id: String,
    pub(super) offset: u64,
    pub(super) topic: String,
    pub(super) timestamp_us: u64,
    pub(super) payload: Vec<u8>,
}

/// The sink's lines per topic directory (`<gateway id>/<topic>`), in file order (first
/// offset); errors, and files the layout does not name, are reported as failures.
pub(super) fn read_sink(dir: &Path, failures: &mut Vec<String>) -> BTreeMap<String, Vec<SinkLine>> {
    let mut files: BTreeMap<String, BTreeMap<u64, PathBuf>> = BTreeMap::new();
    let mut open_per_topic: BTreeMap<String, u32> = BTreeMap::new();
    for path in crate::bridge::sink_files(dir) {
        let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
        let name = rel.display().to_string();
        let parts: Vec<&str> = name.split('/').collect();
        let file = parts.last().copied().unwrap_or("");
        let (digits, open) = match file.strip_suffix(".jsonl.open") {
            Some(d) => (d, true),
            None => (file.strip_suffix(".jsonl").unwrap_or(""), false),
        };
        let first = (digits.len() == 20)
            .then(|| digits.parse::<u64>().ok())
            .flatten();
        match (first, parts.len()) {
            (Some(first), 3) => {
                let topic = format!("{}/{}", parts[0], parts[1]);
                if open {
                    *open_per_topic.entry(topic.clone()).or_default() += 1;
                }
                files.entry(topic).or_default().insert(first, path.clone());
            }
            _ => failures.push(format!("unexpected file in the sink: {name}")),
        }
    }
    for (topic, n) in open_per_topic {
        if n > 1 {
            failures.push(format!("{topic}: {n} open files, at most one expected"));
        }
    }
    let mut out = BTreeMap::new();
    for (stem, by_n) in files {
        let mut lines = Vec::new();
        for (&first, path) in &by_n {
            let at = lines.len();
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("cannot read {}: {e}", path.display()));
                    continue;
                }
            };
            if !text.is_empty() && !text.ends_with('\n') {
                failures.push(format!("{}: last line is torn", path.display()));
            }
            for (i, l) in text.lines().enumerate() {
                let v: serde_json::Value = match serde_json::from_str(l) {
                    Ok(v) => v,
                    Err(e) => {
                        failures.push(format!("{}:{}: not JSON: {e}", path.display(), i + 1));
                        continue;
                    }
                };
                if v.get("gap").is_some() {
                    failures.push(format!("{}:{}: a gap: {l}", path.display(), i + 1));
                    continue;
                }
                let payload = match v["payload_encoding"].as_str() {
                    Some("utf8") => v["payload"].as_str().unwrap_or("").as_bytes().to_vec(),
                    // A JSON object or array, written byte for byte: its raw text.
                    Some("json") => {
                        let raw: std::collections::HashMap<
                            String,
                            Box<serde_json::value::RawValue>,
                        > = serde_json::from_str(l).unwrap_or_default();
                        raw.get("payload")
                            .map(|p| p.get().as_bytes().to_vec())
                            .unwrap_or_default()
                    }
                    other => {
                        failures.push(format!(
                            "{}:{}: payload encoding {other:?}, expected utf8 or json",
                            path.display(),
                            i + 1
                        ));
                        continue;
                    }
                };
                lines.push(SinkLine {
                    log_id: v["log_id"].as_str().unwrap_or("").to_string(),
                    offset: v["offset"].as_u64().unwrap_or(u64::MAX),
                    topic: v["topic"].as_str().unwrap_or("").to_string(),
                    timestamp_us: v["timestamp_us"].as_u64().unwrap_or(0),
                    payload,
                });
            }
            // A file is named by the offset of its first record.
            if let Some(l) = lines.get(at)
                && l.offset != first
            {
                failures.push(format!(
                    "{}: named {first} but its first record has offset {}",
                    path.display(),
                    l.offset
                ));
            }
        }
        out.insert(stem, lines);
    }
    out
}

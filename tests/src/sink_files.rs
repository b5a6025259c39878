//! The files of a file sink's directory, in record order: std only, so that the bridge's
//! own integration tests (`host-bridge/tests/common`) include this same file by path.

use std::path::{Path, PathBuf};

/// Every file of a file sink under `dir` (the sink's `DIR`, or one gateway's directory in
/// it), closed (`*.jsonl`) and open (`*.jsonl.open`), in path order: by gateway, topic,
/// date directory, then first offset, which is the order of one topic's records.
pub fn sink_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(d) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.open"))
            {
                out.push(p);
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, &mut v);
    v.sort();
    v
}

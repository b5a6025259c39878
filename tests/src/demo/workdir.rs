//! The demo's working directory (its files, logs and the marker that lets it be emptied),
//! progress lines, and reading numbers out of the processes' log lines.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{DemoError, io_err};

/// A file marking a working directory as the demo's (so that it may be emptied).
const MARKER: &str = ".spillway-demo";

/// Prints progress lines unless quiet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Say {
    pub(super) quiet: bool,
}

impl Say {
    pub(super) fn line(&self, s: impl AsRef<str>) {
        if !self.quiet {
            use std::io::Write as _;
            println!("{}", s.as_ref());
            let _ = std::io::stdout().flush();
        }
    }
}

/// The working directory's files.
#[derive(Debug, Clone)]
pub(super) struct WorkDir {
    pub(super) dir: PathBuf,
    pub(super) image: PathBuf,
    pub(super) sink: PathBuf,
    pub(super) state: PathBuf,
    pub(super) gateway_log: PathBuf,
}

impl WorkDir {
    /// Empties `dir` if it is a previous run's (refuses any other non-empty directory),
    /// creates it and marks it as the demo's.
    pub(super) fn prepare(dir: &Path) -> Result<WorkDir, DemoError> {
        if dir.exists() {
            let is_ours = dir.join(MARKER).exists();
            let empty = std::fs::read_dir(dir)
                .map(|mut rd| rd.next().is_none())
                .unwrap_or(false);
            if !is_ours && !empty {
                return Err(DemoError::Step(format!(
                    "{} exists and is not a previous demo's working directory: not emptying it",
                    dir.display()
                )));
            }
            std::fs::remove_dir_all(dir).map_err(io_err(format!("empty {}", dir.display())))?;
        }
        std::fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        std::fs::write(dir.join(MARKER), b"spillway-demo working directory\n")
            .map_err(io_err(format!("create {}", dir.join(MARKER).display())))?;
        Ok(WorkDir {
            dir: dir.to_path_buf(),
            image: dir.join("gateway.img"),
            sink: dir.join("sink"),
            state: dir.join("bridge-state.redb"),
            gateway_log: dir.join("gateway.log"),
        })
    }

    pub(super) fn bridge_log(&self, run: &str) -> PathBuf {
        self.dir.join(format!("bridge-{run}.log"))
    }
}

/// The message part of an `env_logger` line (`[time LEVEL target] message`).
pub(super) fn log_message(line: &str) -> &str {
    match line.split_once("] ") {
        Some((head, msg)) if head.starts_with('[') => msg,
        _ => line,
    }
}

/// The numbers after `needle` in every line of `text` that has it.
pub(super) fn numbers_after(text: &str, needle: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let rest = &l[l.find(needle)? + needle.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// `[  12.3s]`: seconds since `t0`, for progress lines.
pub(super) fn stamp(t0: Instant) -> String {
    format!("[{:6.1}s]", t0.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_logs() {
        let text = "x file sink: skipped 12 duplicates\nfoo\ny file sink: skipped 3 dups";
        assert_eq!(numbers_after(text, "file sink: skipped "), vec![12, 3]);
        assert_eq!(
            log_message("[2026-01-01T00:00:00.000Z INFO  spillway] listening on x"),
            "listening on x"
        );
    }
}

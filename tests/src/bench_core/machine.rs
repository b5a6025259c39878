//! The machine a benchmark ran on ([`Machine`]) and the spread of a set of timed samples
//! ([`Spread`]): what every benchmark report prints beside its figures.

use std::fmt;

/// The machine a report was measured on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo` (or "unknown").
    pub cpu: String,
    /// Logical cores available to the process.
    pub cores: usize,
    /// Operating system and architecture.
    pub os: String,
    /// Kernel release from `/proc/sys/kernel/osrelease` (or "unknown").
    pub kernel: String,
    /// The 1-, 5- and 15-minute load averages from `/proc/loadavg` when described (other
    /// work on the machine disturbs the timings).
    pub load: String,
}

/// Describes this machine.
pub fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string()),
        load: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".to_string()),
    }
}

impl Machine {
    /// The machine with the load averages at the start of a run and `load_at_end`: `CPU,
    /// N logical cores, OS, kernel K; load average A at the start, B at the end`.
    pub fn with_end_load(&self, load_at_end: &str) -> String {
        format!(
            "{}, {} logical cores, {}, kernel {}; load average {} at the start, {load_at_end} \
             at the end",
            self.cpu, self.cores, self.os, self.kernel, self.load
        )
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} logical cores, {}, kernel {}, load average {}",
            self.cpu, self.cores, self.os, self.kernel, self.load
        )
    }
}

/// Smallest, median and largest of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Smallest sample.
    pub min: f64,
    /// Median (the mean of the two middle samples for an even count).
    pub median: f64,
    /// Largest sample.
    pub max: f64,
}

impl Spread {
    /// The spread of `samples`.
    ///
    /// # Panics
    /// If `samples` is empty.
    pub fn of(samples: &[f64]) -> Spread {
        assert!(!samples.is_empty(), "no samples");
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Spread {
            min: s[0],
            median,
            max: s[n - 1],
        }
    }

    /// `min / median / max`, each figure written by `show`.
    pub fn show(&self, show: impl Fn(f64) -> String) -> String {
        format!(
            "{} / {} / {}",
            show(self.min),
            show(self.median),
            show(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_samples() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 4.0]).median, 2.5);
    }
}

//! Both sides of a benchmark comparison: Spillway's runs and a peer's, run `i` of each back
//! to back so that each pair saw the same machine. [`Sides`] holds them and gives what
//! every comparison reports the same way: the rates and their per-run ratio, the runs that
//! failed their check, the summary table of min / median / max, and the closing verdict.
//! What one run is and how it is checked is each benchmark's own ([`Measured`]).

use std::fmt;

use crate::bench_core::Spread;
use crate::figures::{table_head, thousands};

/// One timed, checked run of one side.
pub trait Measured {
    /// Records/s, counting only the records found in their place (all of them for a run
    /// that passed its check).
    fn records_per_s(&self) -> f64;
    /// What is wrong with the run, `None` when it did all its work.
    fn problem(&self) -> Option<&str>;
}

/// Both sides' runs of one comparison.
#[derive(Debug, Clone)]
pub struct Sides<R> {
    /// What the failures and the check column call the two sides: Spillway's, the peer's
    /// (`["bridge", "producer"]`).
    pub names: [&'static str; 2],
    /// Spillway's runs.
    pub ours: Vec<R>,
    /// The peer's runs, in the same order.
    pub peer: Vec<R>,
}

impl<R: Measured> Sides<R> {
    /// No runs yet; the sides called `names` (Spillway's, the peer's).
    pub fn new(names: [&'static str; 2]) -> Sides<R> {
        Sides {
            names,
            ours: Vec::new(),
            peer: Vec::new(),
        }
    }

    /// Adds run `i` of both sides.
    pub fn push(&mut self, ours: R, peer: R) {
        self.ours.push(ours);
        self.peer.push(peer);
    }

    /// Spillway's records/s per run (see [`Measured::records_per_s`]).
    pub fn ours_rates(&self) -> Vec<f64> {
        self.ours.iter().map(R::records_per_s).collect()
    }

    /// The peer's records/s per run.
    pub fn peer_rates(&self) -> Vec<f64> {
        self.peer.iter().map(R::records_per_s).collect()
    }

    /// Spillway's ÷ the peer's records/s, per run.
    pub fn ratios(&self) -> Vec<f64> {
        crate::figures::per_run_ratios(&self.ours_rates(), &self.peer_rates())
    }

    /// Every run that did not do all its work, described, each line starting with `what`
    /// and the side's name (`Kafka bridge run 2: …`; empty when every run passed).
    pub fn failures(&self, what: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (side, runs) in self.names.iter().zip([&self.ours, &self.peer]) {
            for (i, r) in runs.iter().enumerate() {
                if let Some(p) = r.problem() {
                    out.push(format!("{what} {side} run {}: {p}", i + 1));
                }
            }
        }
        out
    }

    /// The per-run table: a row per pair of runs with its number, then the columns named
    /// in `columns` (`a | b | c`) as `cells(ours, peer)` gives them (`1.20 | 3 | 4`), then its
    /// check: `verified(ours, peer)` when both runs passed, else `**FAILED**: ` and what is
    /// wrong with each (`bridge: …; producer: …`).
    pub fn write_runs(
        &self,
        f: &mut fmt::Formatter<'_>,
        columns: &str,
        cells: impl Fn(&R, &R) -> String,
        verified: impl Fn(&R, &R) -> String,
    ) -> fmt::Result {
        table_head(f, &format!("| run | {columns} | check |"))?;
        for (i, (a, b)) in self.ours.iter().zip(&self.peer).enumerate() {
            let problems: Vec<String> = self
                .names
                .iter()
                .zip([a, b])
                .filter_map(|(side, r)| r.problem().map(|e| format!("{side}: {e}")))
                .collect();
            let check = if problems.is_empty() {
                verified(a, b)
            } else {
                format!("**FAILED**: {}", problems.join("; "))
            };
            writeln!(f, "| {} | {} | {check} |", i + 1, cells(a, b))?;
        }
        Ok(())
    }

    /// The summary table: `head` as its first column's title, then min / median / max of
    /// Spillway's records/s (row `ours`), the peer's (row `peer`) and their per-run ratio
    /// (row `ratio`).
    pub fn write_spreads(
        &self,
        f: &mut fmt::Formatter<'_>,
        head: &str,
        [ours, peer, ratio]: [&str; 3],
    ) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, label: &str, v: &[f64]| {
            let s = Spread::of(v);
            writeln!(
                f,
                "| {label} | {} | {} | {} |",
                thousands(s.min),
                thousands(s.median),
                thousands(s.max)
            )
        };
        table_head(f, &format!("| {head} | min | median | max |"))?;
        row(f, ours, &self.ours_rates())?;
        row(f, peer, &self.peer_rates())?;
        let r = Spread::of(&self.ratios());
        writeln!(
            f,
            "| {ratio} | {:.2} | {:.2} | {:.2} |",
            r.min, r.median, r.max
        )
    }

    /// The closing paragraph: `verified` when every run passed; else how many runs of both
    /// sides failed (the rates count only the records in place, so the figures are not
    /// valid), then each of the `failures` as a list item.
    pub fn write_verdict(
        &self,
        f: &mut fmt::Formatter<'_>,
        failures: &[String],
        verified: &str,
    ) -> fmt::Result {
        if failures.is_empty() {
            return writeln!(f, "{verified}");
        }
        writeln!(
            f,
            "**{} of {} runs FAILED their check**: the rates above count only the records \
             found in place, and the figures are not valid.",
            failures.len(),
            self.ours.len() + self.peer.len()
        )?;
        for e in failures {
            writeln!(f, "- {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `rate` records/s, failed with `problem` if given.
    struct R(f64, Option<&'static str>);

    impl Measured for R {
        fn records_per_s(&self) -> f64 {
            self.0
        }

        fn problem(&self) -> Option<&str> {
            self.1
        }
    }

    /// Writes through a `Display` so that the writers get a `Formatter`.
    struct Show<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result>(F);

    impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for Show<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            (self.0)(f)
        }
    }

    fn sides() -> Sides<R> {
        let mut s = Sides::new(["bridge", "producer"]);
        s.push(R(200.0, None), R(100.0, None));
        s.push(R(300.0, None), R(100.0, Some("3 of 5 records")));
        s
    }

    #[test]
    fn rates_ratios_and_failures_name_the_side_and_the_run() {
        let s = sides();
        assert_eq!(s.ours_rates(), [200.0, 300.0]);
        assert_eq!(s.ratios(), [2.0, 3.0]);
        assert_eq!(
            s.failures("Kafka"),
            ["Kafka producer run 2: 3 of 5 records"]
        );
    }

    #[test]
    fn a_failed_run_fails_its_row_and_the_verdict() {
        let s = sides();
        let runs = Show(|f| {
            s.write_runs(
                f,
                "a ÷ b",
                |a, b| format!("{:.1}", a.0 / b.0),
                |_, _| "verified".into(),
            )
        })
        .to_string();
        assert_eq!(
            runs,
            "| run | a ÷ b | check |\n|---|---|---|\n| 1 | 2.0 | verified |\n\
             | 2 | 3.0 | **FAILED**: producer: 3 of 5 records |\n"
        );
        let failures = s.failures("Kafka");
        let verdict = Show(|f| s.write_verdict(f, &failures, "Every run verified.")).to_string();
        assert!(
            verdict.starts_with("**1 of 4 runs FAILED their check**"),
            "{verdict}"
        );
        assert!(
            verdict.ends_with("- Kafka producer run 2: 3 of 5 records\n"),
            "{verdict}"
        );
        let ok = Sides::<R>::new(["a", "b"]);
        let verdict = Show(|f| ok.write_verdict(f, &[], "Every run verified.")).to_string();
        assert_eq!(verdict, "Every run verified.\n");
    }
}

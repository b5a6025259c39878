//! How the benchmark reports and the demo write numbers: thousands separators
//! ([`thousands`], [`thousands_u64`]) and rates with a k/M suffix ([`si`]); and the head of
//! a Markdown table ([`table_head`]).

/// `x` rounded to a whole number, with thousands separators: `999`, `1,234,567`, `-4,321`.
pub fn thousands(x: f64) -> String {
    group(&format!("{x:.0}"))
}

/// `n` with thousands separators: `52,281`.
pub fn thousands_u64(n: u64) -> String {
    group(&n.to_string())
}

/// The digits of `s` (a whole number, maybe negative) grouped by three with commas.
fn group(s: &str) -> String {
    let (sign, digits) = s.strip_prefix('-').map_or(("", s), |d| ("-", d));
    let mut out = String::from(sign);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A rate with a k/M suffix: `950`, `12.3k`, `1.25M`.
pub fn si(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// `a[i] ÷ b[i]` for each pair of runs `i` that ran back to back (as many as the shorter
/// side has).
pub fn per_run_ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
}

/// Writes the head row `head` of a Markdown table (`| a | b |`, one line) and the separator
/// row under it, one `---` per column (`|---|---|`).
///
/// # Errors
/// The writer's.
pub fn table_head(f: &mut impl std::fmt::Write, head: &str) -> std::fmt::Result {
    let columns = head.matches('|').count().saturating_sub(1);
    writeln!(f, "{head}")?;
    writeln!(f, "|{}", "---|".repeat(columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(thousands(-4321.0), "-4,321");
        assert_eq!(thousands_u64(0), "0");
        assert_eq!(thousands_u64(999), "999");
        assert_eq!(thousands_u64(1000), "1,000");
        assert_eq!(thousands_u64(52_281), "52,281");
        assert_eq!(thousands_u64(1_234_567), "1,234,567");
    }

    #[test]
    fn a_table_head_has_a_separator_per_column() {
        let mut s = String::new();
        table_head(&mut s, "| a | b c | d |").unwrap();
        assert_eq!(s, "| a | b c | d |\n|---|---|---|\n");
    }

    #[test]
    fn rates() {
        assert_eq!(si(950.0), "950");
        assert_eq!(si(12_345.0), "12.3k");
        assert_eq!(si(1_250_000.0), "1.25M");
    }
}

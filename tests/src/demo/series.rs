//! The two real sensor series the demo replays (see `tests/data/SOURCES.md`): the buoy's
//! sea surface temperature and the glucose monitor, read from their gzipped CSV files.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::summary::thousands;
use super::{DemoError, io_err};

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian).
pub(super) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD hh:mm:ss` or `YYYY-MM-DDThh:mm:ssZ` (UTC) as µs since the Unix epoch.
pub fn parse_utc_us(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches('Z');
    let b = s.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b' ' || b[10] == b'T') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + se);
    u64::try_from(secs).ok().map(|s| s * 1_000_000)
}

/// The buoy series: each line as the sensor prints it.
#[derive(Debug, Clone, Default)]
pub struct SstSeries {
    /// Data lines (no header, no newline), at most the row limit.
    pub lines: Vec<String>,
    /// Rows without a temperature (not sent).
    pub empty: u64,
    /// Time of the first and last reading, µs.
    pub span_us: (u64, u64),
}

/// One value of the glucose monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgmValue {
    /// Row index in the file (from 0, header not counted).
    pub row: usize,
    /// Time of the reading, µs since the Unix epoch (the file's times taken as UTC).
    pub timestamp_us: u64,
    /// The value as text, as in the file.
    pub value: String,
}

/// The glucose series, split into its two channels.
#[derive(Debug, Clone, Default)]
pub struct CgmSeries {
    /// Rows read.
    pub rows: usize,
    /// Sensor current values.
    pub isig: Vec<CgmValue>,
    /// Glucose values.
    pub glucose: Vec<CgmValue>,
    /// Rows without a sensor current.
    pub isig_empty: u64,
    /// Rows without a glucose value.
    pub glucose_empty: u64,
    /// Time of the first and last reading, µs.
    pub span_us: (u64, u64),
}

pub(super) fn gz_lines(path: &Path) -> Result<Vec<String>, DemoError> {
    let f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .map_err(io_err(format!("read {}", path.display())))?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect())
}

pub(super) fn is_empty_value(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || v.eq_ignore_ascii_case("nil") || v.eq_ignore_ascii_case("nan")
}

/// The two progress lines that present the series and the replay's pace.
pub(super) fn describe(sst: &SstSeries, cgm: &CgmSeries, replay: Duration, seed: u64) -> String {
    let days = |span: (u64, u64)| span.1.saturating_sub(span.0) as f64 / 86_400e6;
    let speedup = |span: (u64, u64)| {
        span.1.saturating_sub(span.0) as f64 / 1e6 / replay.as_secs_f64().max(1e-3)
    };
    format!(
        "data: buoy sea surface temperature, {} rows over {:.0} days; glucose monitor, {} rows \
         over {:.0} days ({} sensor-current and {} glucose values)\n\
         replay: {:.0} s each, {:.0}x (buoy) and {:.0}x (glucose) faster than real time; seed {}",
        thousands(sst.lines.len() as u64 + sst.empty),
        days(sst.span_us),
        thousands(cgm.rows as u64),
        days(cgm.span_us),
        thousands(cgm.isig.len() as u64),
        thousands(cgm.glucose.len() as u64),
        replay.as_secs_f64(),
        speedup(sst.span_us),
        speedup(cgm.span_us),
        seed
    )
}

/// The data rows of a series file after its header, at most a row limit.
struct Rows {
    path: PathBuf,
    /// (line number from 1, line).
    rows: Vec<(usize, String)>,
    /// Times of the first and last row, µs.
    span_us: Option<(u64, u64)>,
}

impl Rows {
    /// Reads `path`, checks its header with `header_ok` and keeps up to `limit` rows.
    fn read(
        path: &Path,
        header_ok: impl Fn(&str) -> bool,
        limit: Option<usize>,
    ) -> Result<Rows, DemoError> {
        let mut it = gz_lines(path)?.into_iter().enumerate();
        let mut r = Rows {
            path: path.to_path_buf(),
            rows: Vec::new(),
            span_us: None,
        };
        match it.next() {
            Some((_, h)) if header_ok(&h) => {}
            other => return Err(r.bad(1, format!("unexpected header {other:?}"))),
        }
        r.rows = it
            .take(limit.unwrap_or(usize::MAX))
            .map(|(i, l)| (i + 1, l))
            .collect();
        Ok(r)
    }

    fn bad(&self, line: usize, why: String) -> DemoError {
        DemoError::Data {
            file: self.path.clone(),
            line,
            why,
        }
    }

    /// The time of row `line` in field `t`, µs, widening the span.
    fn time(&mut self, line: usize, t: &str) -> Result<u64, DemoError> {
        let ts = parse_utc_us(t).ok_or_else(|| self.bad(line, format!("bad time {t:?}")))?;
        let (first, _) = self.span_us.unwrap_or((ts, ts));
        self.span_us = Some((first, ts));
        Ok(ts)
    }
}

/// Reads the buoy series (`time (UTC),temperature (celsius)`), at most `rows` rows.
pub fn load_sst(path: &Path, rows: Option<usize>) -> Result<SstSeries, DemoError> {
    let mut r = Rows::read(path, |h| h.starts_with("time"), rows)?;
    let mut s = SstSeries::default();
    for (n, line) in std::mem::take(&mut r.rows) {
        let Some((t, v)) = line.split_once(',') else {
            return Err(r.bad(n, "expected time,temperature".into()));
        };
        r.time(n, t)?;
        if is_empty_value(v) {
            s.empty += 1;
            continue;
        }
        s.lines.push(line);
    }
    s.span_us = r.span_us.unwrap_or((0, 0));
    Ok(s)
}

/// Reads the glucose series (`isig,datetime,glucose`), at most `rows` rows.
pub fn load_cgm(path: &Path, rows: Option<usize>) -> Result<CgmSeries, DemoError> {
    let mut r = Rows::read(path, |h| h == "isig,datetime,glucose", rows)?;
    let mut s = CgmSeries::default();
    for (n, line) in std::mem::take(&mut r.rows) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 3 {
            return Err(r.bad(n, "expected isig,datetime,glucose".into()));
        }
        let ts = r.time(n, f[1])?;
        let row = s.rows;
        s.rows += 1;
        for (v, out, empty) in [
            (f[0], &mut s.isig, &mut s.isig_empty),
            (f[2], &mut s.glucose, &mut s.glucose_empty),
        ] {
            if is_empty_value(v) {
                *empty += 1;
            } else {
                out.push(CgmValue {
                    row,
                    timestamp_us: ts,
                    value: v.trim().to_string(),
                });
            }
        }
    }
    s.span_us = r.span_us.unwrap_or((0, 0));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{CGM_FILE, SST_FILE};

    #[test]
    fn utc_times() {
        assert_eq!(parse_utc_us("1970-01-01 00:00:00"), Some(0));
        assert_eq!(
            parse_utc_us("2016-02-15T00:30:00Z"),
            Some(1_455_496_200_000_000)
        );
        assert_eq!(
            parse_utc_us("2010-03-24 09:51:00"),
            Some(1_269_424_260_000_000)
        );
        // 2000 was a leap year, 2100 will not be.
        assert_eq!(
            parse_utc_us("2000-03-01 00:00:00").unwrap()
                - parse_utc_us("2000-02-28 00:00:00").unwrap(),
            2 * 86_400_000_000
        );
        assert_eq!(
            parse_utc_us("2100-03-01 00:00:00").unwrap()
                - parse_utc_us("2100-02-28 00:00:00").unwrap(),
            86_400_000_000
        );
        for bad in [
            "",
            "2010-03-24",
            "2010-13-01 00:00:00",
            "2010-03-24 24:00:00",
            "x010-03-24 00:00:00",
        ] {
            assert_eq!(parse_utc_us(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_vendored_series_have_the_documented_shape() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
        let sst = load_sst(&data.join(SST_FILE), None).unwrap();
        assert_eq!(sst.lines.len() as u64 + sst.empty, 19_226);
        assert_eq!(sst.lines[0], "2016-02-15T00:00:00Z,4.929");
        let cgm = load_cgm(&data.join(CGM_FILE), None).unwrap();
        assert_eq!(cgm.rows, 52_281);
        assert_eq!(cgm.glucose.len() as u64 + cgm.glucose_empty, 52_281);
        assert_eq!(cgm.isig.len() as u64 + cgm.isig_empty, 52_281);
        assert!(
            cgm.isig_empty > 0,
            "the file has rows without a sensor current"
        );
        assert_eq!(cgm.isig[0].value, "22.59");
        assert_eq!(cgm.glucose[0].value, "258");
        assert_eq!(cgm.glucose[0].timestamp_us, 1_269_424_260_000_000);
        let few = load_cgm(&data.join(CGM_FILE), Some(10)).unwrap();
        assert_eq!(few.rows, 10);
    }
}

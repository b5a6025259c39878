//! The benchmark report's SVG plots, drawn with `plotters` (SVG backend only: no font
//! files or bitmap libraries are needed, text is left to the SVG viewer).
//!
//! - [`log_log_lines`]: several series of (x, y) points on logarithmic axes, one marked
//!   line per series (mount time against image size).
//! - [`ratio_bars`]: one bar per ratio on a logarithmic axis centred on 1, with the
//!   min–max range of the per-repetition ratios as a whisker, coloured by which side the
//!   ratio favours.

use std::path::Path;

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

/// An error while drawing (plotters' errors are not `Send`, so they are kept as text).
#[derive(Debug)]
pub struct PlotError(pub String);

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "plot: {}", self.0)
    }
}

impl std::error::Error for PlotError {}

fn err(e: impl std::fmt::Debug) -> PlotError {
    PlotError(format!("{e:?}"))
}

/// One line of a [`log_log_lines`] plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, x ascending; every coordinate must be positive.
    pub points: Vec<(f64, f64)>,
}

/// The colours of the series, in order (cycled).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// The smallest and largest positive value of `values`, widened by a margin on a log scale.
fn log_bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.1, 10.0);
    }
    (lo / 1.5, hi * 1.5)
}

/// Draws `series` on log-log axes into the SVG file `path`.
pub fn log_log_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (x0, x1) = log_bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (y0, y1) = log_bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x}"))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// One bar of a [`ratio_bars`] plot.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// The ratio (spillway ÷ peer on medians).
    pub ratio: f64,
    /// Smallest and largest per-repetition ratio, if the repetitions were paired.
    pub range: Option<(f64, f64)>,
    /// Whether a ratio above 1 favours spillway (throughput) or the peer (costs).
    pub higher_is_better: bool,
}

/// Draws `bars` as a bar chart on a logarithmic ratio axis into the SVG file `path`: bars
/// start at 1 (the peer), green when the ratio favours spillway, red when it favours the
/// peer.
pub fn ratio_bars(path: &Path, title: &str, bars: &[Bar]) -> Result<(), PlotError> {
    let height = 120 + 34 * bars.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let values = bars
        .iter()
        .flat_map(|b| {
            let (lo, hi) = b.range.unwrap_or((b.ratio, b.ratio));
            [b.ratio, lo, hi, 1.0]
        })
        .collect::<Vec<_>>();
    let (r0, r1) = log_bounds(values.into_iter());
    let n = bars.len().max(1) as f64;
    let (left, chart_area) = root.split_horizontally(430);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .build_cartesian_2d((r0..r1).log_scale(), 0.0..n)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("spillway ÷ peer (log scale; 1 = equal)")
        .x_label_formatter(&|x| format!("{x}"))
        .draw()
        .map_err(err)?;
    let green = RGBColor(0x2c, 0xa0, 0x2c);
    let red = RGBColor(0xd6, 0x27, 0x28);
    for (i, b) in bars.iter().enumerate() {
        // Bar i is drawn from the top down.
        let y = n - i as f64 - 1.0;
        let favours_spillway = (b.ratio >= 1.0) == b.higher_is_better;
        let color = if favours_spillway { green } else { red };
        let (a, c) = if b.ratio >= 1.0 {
            (1.0, b.ratio)
        } else {
            (b.ratio, 1.0)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(a, y + 0.15), (c, y + 0.85)],
                color.mix(0.8).filled(),
            )))
            .map_err(err)?;
        if let Some((lo, hi)) = b.range {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(lo, y + 0.5), (hi, y + 0.5)],
                    BLACK.stroke_width(2),
                )))
                .map_err(err)?;
        }
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(1.0, 0.0), (1.0, n)],
            BLACK.stroke_width(1),
        )))
        .map_err(err)?;
    // Labels on the left, aligned with the bars (the chart's plotting area starts below
    // its caption).
    let (_, h) = chart_area.dim_in_pixel();
    let plot = chart.plotting_area();
    let (top, bottom) = (plot.get_pixel_range().1.start, plot.get_pixel_range().1.end);
    let row = f64::from(bottom - top) / n;
    let offset = top - chart_area.get_base_pixel().1;
    for (i, b) in bars.iter().enumerate() {
        let y = offset + (row * (i as f64 + 0.5)) as i32;
        if y < 0 || y > h as i32 {
            continue;
        }
        let text = format!("{} {:.2}×", b.label, b.ratio);
        left.draw(&Text::new(
            text,
            (8, y - 7),
            ("sans-serif", 13).into_font().color(&BLACK),
        ))
        .map_err(err)?;
    }
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let lines = dir.path().join("lines.svg");
        log_log_lines(
            &lines,
            "t",
            "x",
            "y",
            &[Series {
                label: "a".into(),
                points: vec![(1.0, 0.5), (10.0, 2.0), (1000.0, 3.0)],
            }],
        )
        .unwrap();
        let bars = dir.path().join("bars.svg");
        ratio_bars(
            &bars,
            "t",
            &[
                Bar {
                    label: "faster".into(),
                    ratio: 3.0,
                    range: Some((2.0, 4.0)),
                    higher_is_better: true,
                },
                Bar {
                    label: "bigger".into(),
                    ratio: 0.5,
                    range: None,
                    higher_is_better: false,
                },
            ],
        )
        .unwrap();
        for p in [lines, bars] {
            let svg = std::fs::read_to_string(&p).unwrap();
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(svg.contains("<text"), "{svg}");
        }
    }
}

//! The report's two plots per scenario, drawn with `plotters` as SVG: every
//! attempt's latency, and the acknowledged throughput, in the seconds around
//! each fault, all faults of the scenario overlaid on one time axis.
//!
//! The SVG backend writes text as `<text>` elements and leaves the fonts to
//! whatever displays the page, so no font library is needed to draw them.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::client::Outcome;

/// The plots show this long before each fault, in ms.
pub(super) const BEFORE_MS: i64 = 1_000;
/// And this long after it starts.
pub(super) const AFTER_MS: i64 = 6_000;
/// Throughput buckets.
const BUCKET_MS: i64 = 100;
/// Each plot's size, in pixels.
const SIZE: (u32, u32) = (760, 260);

const OK: RGBColor = RGBColor(0x22, 0xaa, 0x22);
const REFUSED: RGBColor = RGBColor(0xee, 0x99, 0x00);
const UNKNOWN: RGBColor = RGBColor(0xdd, 0x22, 0x22);
const BAND: RGBColor = RGBColor(0xff, 0xdd, 0xdd);
const LINE: RGBColor = RGBColor(0x33, 0x66, 0xcc);

/// One attempt, in time relative to a fault.
#[derive(Debug, Clone, Copy)]
pub(super) struct Point {
    /// When it was sent, ms after the fault started.
    pub at: i64,
    /// How long it took, ms.
    pub latency: i64,
    /// How it ended.
    pub outcome: Outcome,
}

/// The attempts around one fault, and how long the fault lasted.
#[derive(Debug)]
pub(super) struct Window {
    pub points: Vec<Point>,
    pub length_ms: i64,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Each attempt's latency (log scale) against when it was sent.
pub(super) fn latency(around: &[Window]) -> String {
    render(|root| {
        let max = around
            .iter()
            .flat_map(|window| window.points.iter().map(|point| point.latency))
            .max()
            .unwrap_or(1)
            .max(10) as f64
            * 1.2;
        let mut chart = ChartBuilder::on(root)
            .caption("latency of every attempt", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(56)
            .build_cartesian_2d(-BEFORE_MS..AFTER_MS, (1f64..max).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .y_label_formatter(&|ms| format!("{ms:.0}"))
            .x_desc("ms from the fault's start")
            .y_desc("latency, ms (log)")
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0, 1.0), (median_length(around), max)],
            BAND.filled(),
        )))?;
        for (outcome, color, label) in [
            (Outcome::Ok, OK, "ok"),
            (Outcome::Fail, REFUSED, "refused, or nothing sent"),
            (Outcome::Unknown, UNKNOWN, "unknown"),
        ] {
            let points = around
                .iter()
                .flat_map(|window| &window.points)
                .filter(move |point| point.outcome == outcome)
                .map(move |point| {
                    Circle::new(
                        (point.at, (point.latency as f64).max(1.0)),
                        2,
                        color.mix(0.6).filled(),
                    )
                });
            chart
                .draw_series(points)?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 5, y), 3, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        Ok(())
    })
}

/// Acknowledged attempts per second, by when they were answered, averaged
/// over the faults.
pub(super) fn throughput(around: &[Window]) -> String {
    let rates = rates(around);
    render(|root| {
        let max = rates.iter().map(|(_, rate)| *rate).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(root)
            .caption("acknowledged throughput", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(34)
            .y_label_area_size(56)
            .build_cartesian_2d(-BEFORE_MS..AFTER_MS, 0f64..max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .y_label_formatter(&|rate| format!("{rate:.0}"))
            .x_desc("ms from the fault's start")
            .y_desc("ok answers / s")
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0, 0.0), (median_length(around), max)],
            BAND.filled(),
        )))?;
        chart.draw_series(LineSeries::new(rates.iter().copied(), LINE.stroke_width(2)))?;
        Ok(())
    })
}

/// Per bucket (at its middle, ms from the fault), the ok answers per second.
fn rates(around: &[Window]) -> Vec<(i64, f64)> {
    let buckets = ((BEFORE_MS + AFTER_MS) / BUCKET_MS) as usize;
    let mut ok = vec![0usize; buckets];
    for window in around {
        for point in &window.points {
            let end = point.at + point.latency + BEFORE_MS;
            if point.outcome == Outcome::Ok && (0..BEFORE_MS + AFTER_MS).contains(&end) {
                ok[(end / BUCKET_MS) as usize] += 1;
            }
        }
    }
    let faults = around.len().max(1) as f64;
    ok.iter()
        .enumerate()
        .map(|(i, n)| {
            let middle = i as i64 * BUCKET_MS - BEFORE_MS + BUCKET_MS / 2;
            (middle, *n as f64 / faults * (1000.0 / BUCKET_MS as f64))
        })
        .collect()
}

/// The median fault's length, within the plot: the shaded band.
fn median_length(around: &[Window]) -> i64 {
    let mut lengths: Vec<i64> = around.iter().map(|window| window.length_ms).collect();
    lengths.sort_unstable();
    lengths
        .get(lengths.len() / 2)
        .copied()
        .unwrap_or(0)
        .clamp(1, AFTER_MS)
}

/// Draws on a fresh SVG; a plot that cannot be drawn becomes a note.
fn render(draw: impl FnOnce(&Area<'_>) -> Drawn) -> String {
    let mut svg = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)
            .map_err(Into::into)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(Into::into))
    };
    match drawn {
        Ok(()) => svg,
        Err(error) => format!("<p>(the plot could not be drawn: {error})</p>"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        let point = |at, latency, outcome| Point {
            at,
            latency,
            outcome,
        };
        Window {
            points: vec![
                point(-500, 10, Outcome::Ok),
                point(100, 2_900, Outcome::Unknown),
                point(200, 3, Outcome::Fail),
                point(1_000, 20, Outcome::Ok),
            ],
            length_ms: 800,
        }
    }

    #[test]
    fn draws_both_plots_as_svg() {
        for svg in [latency(&[window()]), throughput(&[window()])] {
            assert!(svg.starts_with("<svg"), "{svg}");
            assert!(svg.trim_end().ends_with("</svg>"));
            assert!(svg.contains("ms from the fault"), "axis labels are text");
        }
        assert!(latency(&[window()]).contains("unknown"), "a legend");
    }

    #[test]
    fn plots_without_faults_still_draw() {
        assert!(latency(&[]).starts_with("<svg"));
        assert!(throughput(&[]).starts_with("<svg"));
    }

    #[test]
    fn throughput_counts_ok_answers_by_when_they_came() {
        let rates = rates(&[window()]);
        let total: f64 = rates.iter().map(|(_, rate)| rate).sum();
        // Two ok answers, each a rate of 10/s in its 100 ms bucket.
        assert!((total - 20.0).abs() < 1e-9, "{total}");
        let (middle, rate) = rates.iter().find(|(_, rate)| *rate > 0.0).unwrap();
        assert_eq!((*middle, *rate), (-450, 10.0));
    }
}

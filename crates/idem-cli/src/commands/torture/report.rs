//! What a campaign found: one row per scenario for the terminal (or JSON),
//! and an HTML page with, per scenario, latency and throughput around the
//! faults, drawn as inline SVG.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comfy_table::Table;
use serde_json::json;

use super::client::Outcome;
use super::scenario::TrialResult;

/// The plots show this long before each fault, in ms.
const BEFORE_MS: i64 = 1_000;
/// And this long after it starts.
const AFTER_MS: i64 = 6_000;
/// Throughput buckets.
const BUCKET_MS: i64 = 100;

/// One attempt, in time relative to a fault.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// When it was sent, ms after the fault started.
    at: i64,
    latency: i64,
    outcome: Outcome,
}

/// The attempts around one fault, and how long the fault lasted.
#[derive(Debug)]
struct Window {
    points: Vec<Point>,
    length_ms: i64,
}

/// One scenario's totals.
#[derive(Debug)]
pub struct Summary {
    scenario: &'static str,
    trials: usize,
    operations: usize,
    faults: usize,
    fault_kinds: BTreeMap<String, usize>,
    replays: usize,
    double_effects: usize,
    expected_repeats: usize,
    lost_acked: usize,
    unknown: usize,
    unknown_attempts: usize,
    /// Violations over all trials.
    pub violations: usize,
    /// The attempts around each fault.
    around: Vec<Window>,
    trial_lines: Vec<String>,
}

impl Summary {
    pub fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            trials: 0,
            operations: 0,
            faults: 0,
            fault_kinds: BTreeMap::new(),
            replays: 0,
            double_effects: 0,
            expected_repeats: 0,
            lost_acked: 0,
            unknown: 0,
            unknown_attempts: 0,
            violations: 0,
            around: Vec::new(),
            trial_lines: Vec::new(),
        }
    }

    pub fn add(&mut self, trial: TrialResult) {
        let counts = &trial.report.counts;
        self.trials += 1;
        self.operations += counts.operations;
        self.faults += trial.faults.len();
        self.replays += counts.replays_seen + trial.suppressed_downstream;
        self.double_effects += trial.double_effects;
        self.expected_repeats += trial.expected_repeats;
        self.lost_acked += trial.lost_acked;
        self.unknown += counts.unknown + counts.unanswered;
        self.unknown_attempts += trial
            .samples
            .iter()
            .filter(|s| s.outcome == Outcome::Unknown)
            .count();
        self.violations += trial.violations.len();
        for fault in &trial.faults {
            *self.fault_kinds.entry(fault.what.clone()).or_default() += 1;
            let points = trial
                .samples
                .iter()
                .filter(|s| (fault.at_ms - BEFORE_MS..fault.at_ms + AFTER_MS).contains(&s.start_ms))
                .map(|s| Point {
                    at: s.start_ms - fault.at_ms,
                    latency: s.end_ms - s.start_ms,
                    outcome: s.outcome,
                })
                .collect();
            self.around.push(Window {
                points,
                length_ms: fault.until_ms - fault.at_ms,
            });
        }
        let faults: Vec<_> = trial
            .faults
            .iter()
            .map(|f| format!("{} ({} ms)", f.what, f.until_ms - f.at_ms))
            .collect();
        self.trial_lines.push(format!(
            "<li><a href=\"{scenario}/trial-{i}.jsonl\">trial {i}</a>: {ops} operations, faults: {faults}; {ok} ok, {unknown} unknown, {replays} replays, {repeats} repeats after an unknown outcome, {violations} violations</li>",
            scenario = self.scenario,
            i = trial.index,
            ops = counts.operations,
            faults = if faults.is_empty() { "none".to_owned() } else { escape(&faults.join(", ")) },
            ok = counts.ok,
            unknown = counts.unknown + counts.unanswered,
            replays = counts.replays_seen,
            repeats = trial.expected_repeats,
            violations = trial.violations.len(),
        ));
    }

    fn kinds(&self) -> String {
        self.fault_kinds
            .iter()
            .map(|(what, n)| format!("{what} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

const HEADER: [&str; 10] = [
    "scenario",
    "trials",
    "operations",
    "faults injected",
    "duplicates suppressed (replays)",
    "double effects",
    "repeats after unknown (at-least-once)",
    "lost acked",
    "unknown answers (attempts / final)",
    "violations",
];

/// The table printed at the end.
pub fn table(summaries: &[Summary]) -> String {
    let mut table = Table::new();
    table.set_header(HEADER);
    for s in summaries {
        table.add_row(row(s));
    }
    let mut out = table.to_string();
    for s in summaries {
        let _ = write!(out, "\n{}: faults {}", s.scenario, s.kinds());
    }
    out
}

fn row(s: &Summary) -> Vec<String> {
    vec![
        s.scenario.to_owned(),
        s.trials.to_string(),
        s.operations.to_string(),
        s.faults.to_string(),
        s.replays.to_string(),
        s.double_effects.to_string(),
        s.expected_repeats.to_string(),
        s.lost_acked.to_string(),
        format!("{} / {}", s.unknown_attempts, s.unknown),
        s.violations.to_string(),
    ]
}

/// The table as JSON.
pub fn json(summaries: &[Summary]) -> serde_json::Value {
    summaries
        .iter()
        .map(|s| {
            json!({
                "scenario": s.scenario,
                "trials": s.trials,
                "operations": s.operations,
                "faults": s.faults,
                "fault_kinds": s.fault_kinds,
                "replays_seen": s.replays,
                "double_effects": s.double_effects,
                "repeats_after_unknown": s.expected_repeats,
                "lost_acked": s.lost_acked,
                "unknown_attempts": s.unknown_attempts,
                "unknown": s.unknown,
                "violations": s.violations,
            })
        })
        .collect()
}

/// The HTML report.
pub fn html(summaries: &[Summary], ops: u64) -> String {
    let mut page = String::from(
        "<!doctype html><meta charset=\"utf-8\"><title>idem torture</title>\
         <style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{border:1px solid #ccc;padding:.2em .5em}table{border-collapse:collapse}</style>\
         <h1>idem torture</h1>",
    );
    let _ = write!(page, "<p>{ops} operations per trial.</p><table><tr>");
    for cell in HEADER {
        let _ = write!(page, "<th>{cell}</th>");
    }
    page.push_str("</tr>");
    for s in summaries {
        page.push_str("<tr>");
        for cell in row(s) {
            let _ = write!(page, "<td>{cell}</td>");
        }
        page.push_str("</tr>");
    }
    page.push_str("</table>");
    for s in summaries {
        let _ = write!(
            page,
            "<h2>{}</h2><p>Faults: {}</p>",
            s.scenario,
            escape(&s.kinds())
        );
        let _ = write!(
            page,
            "<p>Every attempt in the {before} s before and {after} s after each fault starts (time 0), all faults of the scenario overlaid; the shaded band is the median fault's length. Green: ok, orange: refused or nothing sent, red: unknown.</p>",
            before = BEFORE_MS / 1000,
            after = AFTER_MS / 1000
        );
        page.push_str(&latency_plot(&s.around));
        page.push_str(&throughput_plot(&s.around));
        let _ = write!(page, "<ul>{}</ul>", s.trial_lines.join(""));
    }
    page
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 30.0;
const TOP: f64 = 20.0;

fn x_of(t: i64) -> f64 {
    LEFT + (t + BEFORE_MS) as f64 / (BEFORE_MS + AFTER_MS) as f64 * (WIDTH - LEFT - 10.0)
}

/// The frame of a plot: axes, the fault band, time ticks and a y label.
fn frame(svg: &mut String, around: &[Window], y_label: &str, y_max: f64) {
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-size=\"11\">"
    );
    let mut lengths: Vec<i64> = around.iter().map(|window| window.length_ms).collect();
    lengths.sort_unstable();
    let median = lengths.get(lengths.len() / 2).copied().unwrap_or(0);
    let (x0, x1) = (x_of(0), x_of(median.min(AFTER_MS)));
    let _ = write!(
        svg,
        "<rect x=\"{x0:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#fdd\"/>",
        (x1 - x0).max(1.0),
        HEIGHT - TOP - BOTTOM
    );
    let base = HEIGHT - BOTTOM;
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"#000\"/><line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{base}\" stroke=\"#000\"/>",
        WIDTH - 10.0
    );
    for second in (-BEFORE_MS / 1000)..=(AFTER_MS / 1000) {
        let x = x_of(second * 1000);
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{base}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#000\"/><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{second}s</text>",
            base + 4.0,
            base + 16.0
        );
    }
    let _ = write!(
        svg,
        "<text x=\"4\" y=\"{}\">{y_max:.0}</text><text x=\"4\" y=\"{base}\">0</text><text x=\"4\" y=\"{}\">{y_label}</text>",
        TOP + 4.0,
        (TOP + base) / 2.0
    );
}

fn y_of(value: f64, max: f64) -> f64 {
    let base = HEIGHT - BOTTOM;
    base - (value.min(max) / max) * (base - TOP)
}

/// Each attempt's latency against when it was sent.
fn latency_plot(around: &[Window]) -> String {
    let max = around
        .iter()
        .flat_map(|window| window.points.iter().map(|point| point.latency))
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let mut svg = String::new();
    frame(&mut svg, around, "ms", max);
    for window in around {
        for point in &window.points {
            let color = match point.outcome {
                Outcome::Ok => "#2a2",
                Outcome::Fail => "#e90",
                Outcome::Unknown => "#d22",
            };
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.8\" fill=\"{color}\" fill-opacity=\"0.6\"/>",
                x_of(point.at),
                y_of(point.latency as f64, max)
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Acknowledged attempts per second, averaged over the faults.
fn throughput_plot(around: &[Window]) -> String {
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
    let rates: Vec<f64> = ok
        .iter()
        .map(|n| *n as f64 / faults * (1000.0 / BUCKET_MS as f64))
        .collect();
    let max = rates.iter().copied().fold(1.0, f64::max);
    let mut svg = String::new();
    frame(&mut svg, around, "ok/s", max);
    let points: Vec<String> = rates
        .iter()
        .enumerate()
        .map(|(i, rate)| {
            let t = i as i64 * BUCKET_MS - BEFORE_MS + BUCKET_MS / 2;
            format!("{:.1},{:.1}", x_of(t), y_of(*rate, max))
        })
        .collect();
    let _ = write!(
        svg,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\"/></svg>",
        points.join(" ")
    );
    svg
}

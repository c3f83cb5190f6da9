//! What a campaign found: one row per scenario for the terminal (or JSON),
//! and an HTML page with, per scenario, latency and throughput around the
//! faults (drawn by [`plot`], inline SVG, each plot also a file of its own).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comfy_table::Table;
use serde_json::json;

use super::client::Outcome;
use super::findings::TrialResult;
use super::plot::{self, AFTER_MS, BEFORE_MS, Point, Window};

/// One scenario's totals.
#[derive(Debug)]
pub(super) struct Summary {
    scenario: &'static str,
    trials: usize,
    operations: usize,
    faults: usize,
    fault_kinds: BTreeMap<String, usize>,
    replays: usize,
    double_effects: usize,
    expected_repeats: usize,
    unstored_repeats: usize,
    lost_acked: usize,
    unknown: usize,
    unknown_attempts: usize,
    /// Processes that ended by themselves after a fault, by name.
    exits: BTreeMap<&'static str, usize>,
    /// Requests `idem dup-proxy` sent twice, when it was in the chain.
    proxy_copies: Option<u64>,
    /// Violations over all trials.
    pub violations: usize,
    /// The attempts around each fault.
    around: Vec<Window>,
    trial_lines: Vec<String>,
}

impl Summary {
    pub(super) fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            trials: 0,
            operations: 0,
            faults: 0,
            fault_kinds: BTreeMap::new(),
            replays: 0,
            double_effects: 0,
            expected_repeats: 0,
            unstored_repeats: 0,
            lost_acked: 0,
            unknown: 0,
            unknown_attempts: 0,
            exits: BTreeMap::new(),
            proxy_copies: None,
            violations: 0,
            around: Vec::new(),
            trial_lines: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, trial: TrialResult) {
        let counts = &trial.report.counts;
        self.trials += 1;
        self.operations += counts.operations;
        self.faults += trial.faults.len();
        self.replays += counts.replays_seen + trial.suppressed_downstream;
        self.double_effects += trial.double_effects;
        self.expected_repeats += trial.expected_repeats;
        self.unstored_repeats += trial.unstored_repeats;
        self.lost_acked += trial.lost_acked;
        self.unknown += counts.unknown + counts.unanswered;
        self.unknown_attempts += trial
            .samples
            .iter()
            .filter(|s| s.outcome == Outcome::Unknown)
            .count();
        self.violations += trial.violations.len();
        for name in &trial.exits {
            *self.exits.entry(name).or_default() += 1;
        }
        if let Some(copies) = trial.proxy_copies {
            *self.proxy_copies.get_or_insert(0) += copies;
        }
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
            "<li><a href=\"{scenario}/trial-{i}.jsonl\">trial {i}</a>: {ops} operations, faults: {faults}; {ok} ok, {unknown} unknown, {replays} replays, {repeats} repeats after an unknown outcome, {unstored} after an unstored answer, {violations} violations</li>",
            scenario = self.scenario,
            i = trial.index,
            ops = counts.operations,
            faults = if faults.is_empty() { "none".to_owned() } else { escape(&faults.join(", ")) },
            ok = counts.ok,
            unknown = counts.unknown + counts.unanswered,
            replays = counts.replays_seen,
            repeats = trial.expected_repeats,
            unstored = trial.unstored_repeats,
            violations = trial.violations.len(),
        ));
    }

    fn kinds(&self) -> String {
        let mut line = self
            .fault_kinds
            .iter()
            .map(|(what, n)| format!("{what} ×{n}"))
            .collect::<Vec<_>>()
            .join(", ");
        if !self.exits.is_empty() {
            let exits: Vec<_> = self
                .exits
                .iter()
                .map(|(name, n)| format!("idem {name} ×{n}"))
                .collect();
            let _ = write!(
                line,
                "; ended by itself and restarted: {}",
                exits.join(", ")
            );
        }
        if let Some(copies) = self.proxy_copies {
            let _ = write!(line, "; requests sent twice by idem dup-proxy: {copies}");
        }
        line
    }
}

const HEADER: [&str; 11] = [
    "scenario",
    "trials",
    "operations",
    "faults injected",
    "duplicates suppressed (replays)",
    "double effects",
    "repeats after unknown (at-least-once)",
    "repeats after an unstored answer",
    "lost acked",
    "unknown answers (attempts / final)",
    "violations",
];

/// The table printed at the end.
pub(super) fn table(summaries: &[Summary]) -> String {
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
        s.unstored_repeats.to_string(),
        s.lost_acked.to_string(),
        format!("{} / {}", s.unknown_attempts, s.unknown),
        s.violations.to_string(),
    ]
}

/// The table as JSON.
pub(super) fn json(summaries: &[Summary]) -> serde_json::Value {
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
                "repeats_after_unstored_answer": s.unstored_repeats,
                "lost_acked": s.lost_acked,
                "unknown_attempts": s.unknown_attempts,
                "unknown": s.unknown,
                "violations": s.violations,
                "exits": s.exits,
                "proxy_copies": s.proxy_copies,
            })
        })
        .collect()
}

/// The HTML report, and its plots as files of their own.
pub(super) struct Page {
    /// `index.html`.
    pub html: String,
    /// Per scenario, `SCENARIO/latency.svg` and `SCENARIO/throughput.svg`.
    pub plots: Vec<(String, String)>,
}

/// The HTML report.
pub(super) fn html(summaries: &[Summary], ops: u64) -> Page {
    let mut page = String::from(
        "<!doctype html><meta charset=\"utf-8\"><title>idem torture</title>\
         <style>body{font-family:sans-serif;max-width:62em;margin:2em auto}td,th{border:1px solid #ccc;padding:.2em .5em}table{border-collapse:collapse}</style>\
         <h1>idem torture</h1>",
    );
    let mut plots = Vec::new();
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
        for (name, svg) in [
            ("latency", plot::latency(&s.around)),
            ("throughput", plot::throughput(&s.around)),
        ] {
            page.push_str(&svg);
            plots.push((format!("{}/{name}.svg", s.scenario), svg));
        }
        let _ = write!(page, "<ul>{}</ul>", s.trial_lines.join(""));
    }
    Page { html: page, plots }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

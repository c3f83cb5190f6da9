//! What a run found: one entry per rule, with its outcome, what it saw, how
//! many effects its requests applied, and every request and answer; as a
//! table for people and as JSON for scripts.

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

use super::client::Exchange;
use super::config::Expect;

/// How a rule ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The server did what the rule asks.
    Pass,
    /// It did not: a required rule, so the run fails.
    Fail,
    /// Nothing the tester saw broke the rule, but what it saw cannot prove
    /// it either (say, equal answers and no effect count to tell a replay
    /// from a second application).
    Unproven,
    /// What the server does, reported and not judged.
    Info,
    /// Not run: it needs an option that was not given.
    Skipped,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Unproven => "unproven",
            Outcome::Info => "info",
            Outcome::Skipped => "skipped",
        }
    }
}

/// One rule's result.
#[derive(Debug, Clone, Serialize)]
pub struct RuleReport {
    /// The rule's name, such as `retry-replayed`.
    pub rule: &'static str,
    /// What the rule asks of the server.
    pub asks: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// What the tester saw, and why that is the outcome.
    pub detail: String,
    /// How many effects the rule's requests applied, when effects are
    /// counted.
    pub effects: Option<u64>,
    /// How many the rule allows.
    pub effects_expected: Option<u64>,
    /// Every request the rule sent, and its answer.
    pub exchanges: Vec<Exchange>,
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The endpoint tested.
    pub target: String,
    /// Which refusal statuses were accepted (`--mode`).
    pub mode: Expect,
    /// Whether effects were counted.
    pub effects_counted: bool,
    /// One entry per rule, in the order they ran.
    pub rules: Vec<RuleReport>,
}

impl Report {
    /// The rules that failed.
    pub fn failed(&self) -> Vec<&RuleReport> {
        self.rules
            .iter()
            .filter(|r| r.outcome == Outcome::Fail)
            .collect()
    }

    /// The rule named `rule`.
    pub fn rule(&self, rule: &str) -> Option<&RuleReport> {
        self.rules.iter().find(|r| r.rule == rule)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut table = Table::new();
        table
            .load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(120)
            .set_header(["rule", "result", "effects", "what came back"]);
        for rule in &self.rules {
            let effects = match (rule.effects, rule.effects_expected) {
                (Some(seen), Some(expected)) => format!("{seen} (want {expected})"),
                (Some(seen), None) => seen.to_string(),
                (None, _) => "-".to_owned(),
            };
            table.add_row([
                rule.rule.to_owned(),
                rule.outcome.label().to_owned(),
                effects,
                rule.detail.clone(),
            ]);
        }
        writeln!(
            f,
            "idem conformance: {} (refusals: {}; effects {})",
            self.target,
            self.mode,
            if self.effects_counted {
                "counted"
            } else {
                "not counted: give --effects-url or --effects-query to prove what was applied"
            }
        )?;
        writeln!(f, "{table}")?;
        let failed = self.failed();
        let count = |outcome| self.rules.iter().filter(|r| r.outcome == outcome).count();
        writeln!(
            f,
            "{} passed, {} failed, {} unproven, {} info, {} skipped{}",
            count(Outcome::Pass),
            failed.len(),
            count(Outcome::Unproven),
            count(Outcome::Info),
            count(Outcome::Skipped),
            if failed.is_empty() {
                ""
            } else {
                "; --json lists every request and answer"
            }
        )
    }
}

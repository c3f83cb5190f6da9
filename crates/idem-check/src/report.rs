//! What a check found: the counts of what it read and every violation,
//! printed for a person ([`Display`](std::fmt::Display)) or as JSON
//! (`serde::Serialize`) for a script.

use std::fmt;

use serde::Serialize;

/// The result of [`check`](crate::check).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// What the history and the effect log hold.
    pub counts: Counts,
    /// Every broken rule, grouped by kind in the order the rules run.
    pub violations: Vec<Violation>,
}

/// What the history and the effect log hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Operations (distinct `op` numbers).
    pub operations: usize,
    /// Distinct `(scope, key)` pairs the operations carried.
    pub keys: usize,
    /// Operations whose last answer was `ok`.
    pub ok: usize,
    /// Operations whose last answer was `fail`.
    pub fail: usize,
    /// Operations whose last answer was `unknown`, or that were never answered.
    pub unknown: usize,
    /// Of `unknown`: operations invoked and never answered.
    pub unanswered: usize,
    /// Operations sent without a key: not checked for dedupe.
    pub without_key: usize,
    /// Attempts after the first of each operation.
    pub retries: usize,
    /// Operations sent on purpose as copies of another (`duplicate_of`).
    pub duplicates_sent: usize,
    /// `ok` answers marked as replays.
    pub replays_seen: usize,
    /// Lines of the effect log.
    pub effects: usize,
    /// Effects whose key no operation of the history carried.
    pub effects_without_operation: usize,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which rule.
    pub kind: ViolationKind,
    /// The keys' scope, when known.
    pub scope: Option<String>,
    /// The key or keys involved.
    pub keys: Vec<String>,
    /// The operations involved (empty when the history has none for the key).
    pub ops: Vec<u64>,
    /// The resource, for a stale write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// What was found, in words.
    pub message: String,
}

impl Violation {
    pub(crate) fn on_key(
        kind: ViolationKind,
        (scope, key): &(Option<String>, String),
        ops: Vec<u64>,
        message: String,
    ) -> Self {
        Self {
            kind,
            scope: scope.clone(),
            keys: vec![key.clone()],
            ops,
            resource: None,
            message,
        }
    }
}

/// The rules a history can break, each pointing at a kind of bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// A key was applied more than once: no dedupe, or a mark committed
    /// apart from its effect.
    DoubleEffect,
    /// A key answered `ok` was never applied: an acknowledgement sent before
    /// the commit, or a write lost.
    AckedNotApplied,
    /// A key only ever answered `fail` was applied: an error answered after
    /// the commit, or an effect not rolled back.
    FailedButApplied,
    /// Two `ok` answers for one key and payload differ: a replay that is not
    /// the stored answer, or a second run whose answer was sent.
    ReplayDiffers,
    /// One key was applied for two different payloads: the fingerprint is not
    /// compared.
    KeyReuse,
    /// One operation was retried under a new key and applied again: the
    /// client makes a key per attempt instead of per operation.
    NewKeyOnRetry,
    /// A write with a lower fence or version was applied after a higher
    /// one: no fencing, a zombie writer or reordered versions.
    StaleWrite,
}

impl ViolationKind {
    /// A short name and what it means.
    pub fn describe(self) -> &'static str {
        match self {
            Self::DoubleEffect => "double effect: a key applied more than once",
            Self::AckedNotApplied => "acknowledged, never applied",
            Self::FailedButApplied => "answered as failed, yet applied",
            Self::ReplayDiffers => "a replay differs from the original answer",
            Self::KeyReuse => "one key applied for two payloads",
            Self::NewKeyOnRetry => "a retry under a new key applied again",
            Self::StaleWrite => "a stale write applied after a newer one",
        }
    }
}

impl Report {
    /// No violations.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one kind.
    pub fn of_kind(&self, kind: ViolationKind) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.kind == kind)
    }
}

/// How many violations of one kind [`Report`]'s `Display` lists before
/// "and N more".
const LISTED: usize = 10;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        writeln!(
            f,
            "{} on {}: {} ok, {} fail, {} unknown ({} never answered)",
            count(c.operations, "operation"),
            count(c.keys, "key"),
            c.ok,
            c.fail,
            c.unknown,
            c.unanswered
        )?;
        writeln!(
            f,
            "{}, {} sent, {} seen, {} without a key (not checked for dedupe)",
            count(c.retries, "retry"),
            count(c.duplicates_sent, "duplicate"),
            count(c.replays_seen, "replay"),
            c.without_key
        )?;
        writeln!(
            f,
            "{}, {} for no operation in the history",
            count(c.effects, "effect"),
            c.effects_without_operation
        )?;
        if self.is_clean() {
            return writeln!(f, "no violations");
        }
        writeln!(f, "{}", count(self.violations.len(), "violation"))?;
        let mut kinds: Vec<ViolationKind> = self.violations.iter().map(|v| v.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            let found: Vec<&Violation> = self.of_kind(kind).collect();
            writeln!(f, "\n{} ({}):", kind.describe(), found.len())?;
            for violation in found.iter().take(LISTED) {
                writeln!(f, "  {violation}")?;
            }
            if found.len() > LISTED {
                writeln!(f, "  and {} more", found.len() - LISTED)?;
            }
        }
        Ok(())
    }
}

/// `1 key`, `2 keys`, `1 retry`, `3 retries`.
fn count(n: usize, noun: &str) -> String {
    match (n, noun) {
        (1, _) => format!("1 {noun}"),
        (_, "retry") => format!("{n} retries"),
        _ => format!("{n} {noun}s"),
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self
            .keys
            .iter()
            .map(|key| format!("{key:?}"))
            .collect::<Vec<_>>()
            .join(" and ");
        match &self.scope {
            Some(scope) => write!(f, "{keys} (scope {scope:?}): {}", self.message),
            None => write!(f, "{keys}: {}", self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_read_as_english() {
        assert_eq!(count(1, "key"), "1 key");
        assert_eq!(count(2, "key"), "2 keys");
        assert_eq!(count(0, "retry"), "0 retries");
        assert_eq!(count(1, "retry"), "1 retry");
    }
}

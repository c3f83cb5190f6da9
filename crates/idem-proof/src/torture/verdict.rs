//! The verdict on one trial: the checker's double effects split into the
//! leased gateway's known cost (a repeat after an unknown outcome, or after
//! an answer the gateway could not store) and violations, and the rest
//! counted.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use idem_check::history::Event;
use idem_check::{Report, ViolationKind};

use super::findings::{Fault, TrialResult};

/// What, besides the clients' unknown outcomes, may explain an extra effect.
#[derive(Debug, Default)]
pub(super) struct Explanations {
    /// Answers the gateway logged it could not store: each explains one.
    pub unstored: usize,
    /// Per key, the copies `idem dup-proxy` sent whose outcome was unknown:
    /// attempts the clients' history does not show (a client whose request
    /// met its copy in flight was answered 409 while the copy reached the
    /// upstream and the gateway died).
    pub copies_unknown: HashMap<String, usize>,
    /// Nothing explains an extra effect: every hop dedupes, so even an
    /// unknown outcome must not apply a key twice.
    pub exact: bool,
    /// The store may lose writes it acknowledged (Redis without `WAIT`, a
    /// primary failing before its replica had them): extra effects nothing
    /// else explains, and acknowledged operations without an effect, are
    /// counted and noted, not violations.
    pub lossy: bool,
}

/// Per key, the copies in a dup-proxy history whose outcome was unknown.
pub(super) fn copies_unknown(events: &[Event]) -> HashMap<String, usize> {
    let copies: HashSet<u64> = events
        .iter()
        .filter_map(|event| match event {
            Event::Invoke {
                op,
                duplicate_of: Some(_),
                ..
            } => Some(*op),
            _ => None,
        })
        .collect();
    let of_copies: Vec<Event> = events
        .iter()
        .filter(|event| copies.contains(&event.op()))
        .cloned()
        .collect();
    unknown_attempts(&of_copies)
        .into_iter()
        .map(|(key, n)| (key.to_owned(), n))
        .collect()
}

/// Splits the checker's double effects into the leased gateway's known cost
/// and violations, and counts the rest.
pub(super) fn judge(
    index: usize,
    faults: Vec<Fault>,
    report: Report,
    events: &[Event],
    effects: &[idem_check::Effect],
    explain: &Explanations,
) -> TrialResult {
    let mut unknown = if explain.exact {
        HashMap::new()
    } else {
        unknown_attempts(events)
    };
    for (key, n) in &explain.copies_unknown {
        *unknown.entry(key.as_str()).or_default() += n;
    }
    // Each answer the gateway could not store explains one extra effect.
    let mut unstored_left = explain.unstored;
    let mut unstored_repeats = 0;
    let mut applied: HashMap<&str, usize> = HashMap::new();
    for effect in effects {
        *applied.entry(effect.key.as_str()).or_default() += 1;
    }
    let (mut expected_repeats, mut double_effects, mut lost_acked) = (0, 0, 0);
    let mut violations = Vec::new();
    let mut notes = Vec::new();
    for violation in &report.violations {
        match violation.kind {
            ViolationKind::DoubleEffect => {
                let mut explained = true;
                for key in &violation.keys {
                    let extra = applied
                        .get(key.as_str())
                        .copied()
                        .unwrap_or(1)
                        .saturating_sub(1);
                    let after_unknown = unknown.get(key.as_str()).copied().unwrap_or(0);
                    if extra <= after_unknown {
                        expected_repeats += extra;
                    } else if extra - after_unknown <= unstored_left {
                        expected_repeats += after_unknown;
                        unstored_repeats += extra - after_unknown;
                        unstored_left -= extra - after_unknown;
                    } else {
                        double_effects += extra;
                        explained = false;
                    }
                }
                if explained {
                    continue;
                }
            }
            ViolationKind::AckedNotApplied => lost_acked += violation.keys.len(),
            _ => {}
        }
        let line = format!(
            "{}: {:?} {}",
            violation.kind.describe(),
            violation.keys,
            violation.message
        );
        let lost_by_store = matches!(
            violation.kind,
            ViolationKind::DoubleEffect | ViolationKind::AckedNotApplied
        );
        if explain.lossy && lost_by_store {
            notes.push(format!("a write the store acknowledged was lost: {line}"));
        } else {
            violations.push(line);
        }
    }
    TrialResult {
        index,
        faults,
        report,
        expected_repeats,
        unstored_repeats,
        double_effects,
        suppressed_downstream: 0,
        lost_acked,
        violations,
        exits: Vec::new(),
        notes,
        proxy_copies: None,
        samples: Vec::new(),
        history: PathBuf::new(),
    }
}

/// Per key, the attempts whose outcome was unknown: answered `unknown`, or
/// not answered before the next attempt or the end of the history. Each may
/// have reached the upstream while the gateway could not store its answer.
fn unknown_attempts(events: &[Event]) -> HashMap<&str, usize> {
    let mut key_of: HashMap<u64, &str> = HashMap::new();
    let mut pending: HashMap<u64, bool> = HashMap::new();
    let mut unknown: HashMap<&str, usize> = HashMap::new();
    for event in events {
        match event {
            Event::Invoke {
                op, key: Some(key), ..
            } => {
                if pending.insert(*op, true) == Some(true)
                    && let Some(key) = key_of.get(op)
                {
                    *unknown.entry(key).or_default() += 1;
                }
                key_of.insert(*op, key.as_str());
            }
            Event::Unknown { op, .. } => {
                if pending.insert(*op, false) == Some(true)
                    && let Some(key) = key_of.get(op)
                {
                    *unknown.entry(key).or_default() += 1;
                }
            }
            other => {
                pending.insert(other.op(), false);
            }
        }
    }
    for (op, open) in pending {
        if open && let Some(key) = key_of.get(&op) {
            *unknown.entry(key).or_default() += 1;
        }
    }
    unknown
}

#[cfg(test)]
mod tests {
    use idem_check::Effect;
    use idem_check::history::Answer;

    use super::*;
    use crate::torture::findings::TrialResult;

    fn invoke(op: u64, key: &str) -> Event {
        Event::Invoke {
            op,
            process: "client-1".into(),
            at_ms: 0,
            scope: None,
            key: Some(key.into()),
            fingerprint: None,
            request: None,
            duplicate_of: None,
        }
    }

    fn ok(op: u64) -> Event {
        Event::Ok {
            op,
            process: "client-1".into(),
            at_ms: 1,
            answer: Answer {
                status: 201,
                body_hash: None,
                replayed: false,
            },
        }
    }

    fn unknown(op: u64) -> Event {
        Event::Unknown {
            op,
            process: "client-1".into(),
            at_ms: 1,
            error: "reset".into(),
        }
    }

    fn effect(key: &str) -> Effect {
        Effect {
            key: key.into(),
            scope: None,
            resource: None,
            fence: None,
        }
    }

    fn judged(events: &[Event], effects: &[Effect]) -> TrialResult {
        judged_with(events, effects, 0)
    }

    fn judged_with(events: &[Event], effects: &[Effect], unstored: usize) -> TrialResult {
        let report = idem_check::check(events, effects);
        let explain = Explanations {
            unstored,
            ..Explanations::default()
        };
        judge(1, Vec::new(), report, events, effects, &explain)
    }

    #[test]
    fn a_repeat_after_an_unknown_outcome_is_the_leases_cost() {
        let events = [invoke(1, "a"), unknown(1), invoke(1, "a"), ok(1)];
        let result = judged(&events, &[effect("a"), effect("a")]);
        assert_eq!((result.expected_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
    }

    #[test]
    fn a_repeat_no_unknown_outcome_explains_is_a_violation() {
        // One attempt never answered explains one extra effect, not two.
        let events = [invoke(1, "a"), invoke(1, "a"), ok(1), invoke(2, "b"), ok(2)];
        let result = judged(
            &events,
            &[
                effect("a"),
                effect("a"),
                effect("a"),
                effect("b"),
                effect("b"),
            ],
        );
        assert_eq!((result.expected_repeats, result.double_effects), (0, 3));
        assert_eq!(result.violations.len(), 2, "{:?}", result.violations);
    }

    #[test]
    fn an_acknowledged_key_without_effect_is_lost() {
        let result = judged(&[invoke(1, "a"), ok(1)], &[]);
        assert_eq!(result.lost_acked, 1);
        assert_eq!(result.violations.len(), 1);
    }

    #[test]
    fn a_store_that_may_lose_writes_has_its_losses_counted_and_noted() {
        // Acknowledged, then applied again: the store lost the record.
        let events = [invoke(1, "a"), ok(1), invoke(2, "a"), ok(2)];
        let effects = [effect("a"), effect("a")];
        let report = idem_check::check(&events, &effects);
        let explain = Explanations {
            lossy: true,
            ..Explanations::default()
        };
        let result = judge(1, Vec::new(), report, &events, &effects, &explain);
        assert_eq!(result.double_effects, 1);
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        assert_eq!(result.notes.len(), 1, "{:?}", result.notes);
    }

    #[test]
    fn a_repeat_after_an_unstored_answer_is_counted_against_it() {
        // Acknowledged, then the copy applied again: the gateway could not
        // store the first answer.
        let events = [invoke(1, "a"), ok(1), invoke(2, "a"), ok(2)];
        let effects = [effect("a"), effect("a")];
        let result = judged_with(&events, &effects, 1);
        assert_eq!((result.unstored_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        let result = judged_with(&events, &effects, 0);
        assert_eq!((result.unstored_repeats, result.double_effects), (0, 1));
        assert_eq!(result.violations.len(), 1);
    }

    #[test]
    fn a_copy_of_the_proxy_with_an_unknown_outcome_explains_a_repeat() {
        // The client met its copy in flight (409); the copy reached the
        // upstream and the gateway died; the retry after the lease ran again.
        let fail_409 = Event::Fail {
            op: 1,
            process: "client-1".into(),
            at_ms: 1,
            answer: Some(Answer {
                status: 409,
                body_hash: None,
                replayed: false,
            }),
            error: "answered 409".into(),
        };
        let events = [invoke(1, "a"), fail_409, invoke(1, "a"), ok(1)];
        let effects = [effect("a"), effect("a")];
        let mut copy = invoke(7, "a");
        if let Event::Invoke { duplicate_of, .. } = &mut copy {
            *duplicate_of = Some(6);
        }
        let proxy = [invoke(6, "a"), copy, unknown(7), ok(6)];
        let explain = Explanations {
            copies_unknown: copies_unknown(&proxy),
            ..Explanations::default()
        };
        assert_eq!(
            explain.copies_unknown.get("a"),
            Some(&1),
            "only the copy counts"
        );
        let report = idem_check::check(&events, &effects);
        let result = judge(1, Vec::new(), report, &events, &effects, &explain);
        assert_eq!((result.expected_repeats, result.double_effects), (1, 0));
        assert!(result.violations.is_empty(), "{:?}", result.violations);
        assert_eq!(judged(&events, &effects).double_effects, 1);
    }
}

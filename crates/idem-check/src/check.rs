//! The rules: a history and an effect log against each other.
//!
//! One pass over the history builds, per key, what its clients were told;
//! the effects are matched to those keys; then each rule runs on its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::effects::Effect;
use crate::history::{Answer, Event};
use crate::report::{Counts, Report, Violation, ViolationKind};

/// A key as the checker groups it: its scope (when recorded) and the key.
type KeyId = (Option<String>, String);

/// What one attempt of an operation was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Ok,
    Fail,
    Unknown,
}

/// One attempt: the key it carried and the answers recorded for it.
#[derive(Debug)]
struct Attempt {
    key: Option<KeyId>,
    fingerprint: Option<String>,
    told: Vec<Told>,
}

/// One operation, all its attempts.
#[derive(Debug)]
struct Operation {
    duplicate: bool,
    attempts: Vec<Attempt>,
    /// The last answer, whatever the attempt.
    last: Option<Told>,
}

/// An `ok` answer, with the key and payload it answered.
#[derive(Debug)]
struct Replayable {
    op: u64,
    slot: (KeyId, Option<String>),
    answer: Answer,
}

/// Everything the history says about one key.
#[derive(Debug, Default)]
struct KeyGroup {
    /// The operations that used the key, in order, each once.
    ops: Vec<u64>,
    /// The operations answered `ok` with this key.
    ok_ops: Vec<u64>,
    /// Whether some attempt with the key was answered `unknown` or never answered.
    unknown: bool,
    /// The operations answered `ok`, by the payload fingerprint they carried.
    ok_by_fingerprint: BTreeMap<Option<String>, Vec<u64>>,
    /// The effects matched to the key, as indexes into the effect log.
    effects: Vec<usize>,
}

impl KeyGroup {
    fn add_op(&mut self, op: u64) {
        if !self.ops.contains(&op) {
            self.ops.push(op);
        }
    }
}

/// Checks a history against the effect log it caused.
///
/// `history` is in the order the events happened and `effects` in the order
/// the effects were committed.
///
/// Operations are grouped by their `(scope, key)`; every attempt of an
/// operation counts for the key it carried. An effect matches the operations
/// with its key and scope; an effect without a scope matches its key in
/// every scope (so when one key is used in several scopes, give the effect
/// log a scope, or two scopes' single effects look like one key applied
/// twice). Then, per key:
///
/// - if any attempt with the key was answered `ok`, the key has exactly one
///   effect ([`DoubleEffect`](ViolationKind::DoubleEffect) or
///   [`AckedNotApplied`](ViolationKind::AckedNotApplied));
/// - else, if any was answered `unknown` or never answered, at most one;
/// - else (it was only ever answered `fail`), none
///   ([`FailedButApplied`](ViolationKind::FailedButApplied)).
///
/// And across keys:
///
/// - every `ok` answer for one key and payload fingerprint has the status
///   and body hash of the first ([`ReplayDiffers`](ViolationKind::ReplayDiffers));
/// - one key answered `ok` for two fingerprints is not applied twice
///   ([`KeyReuse`](ViolationKind::KeyReuse), reported instead of a double effect);
/// - one operation retried under several keys is applied at most once over
///   all of them ([`NewKeyOnRetry`](ViolationKind::NewKeyOnRetry));
/// - per resource, in the log's order, no effect carries a fence lower than
///   one applied before it ([`StaleWrite`](ViolationKind::StaleWrite)). An
///   equal fence is allowed: a lease holder writes several times with its one
///   token, and one version applied twice is a double effect of its key.
///
/// Operations without a key are counted and not checked for dedupe. Effects
/// whose key no operation carried are counted, and reported only when one
/// such key is applied twice. A completion of an operation that was never
/// invoked is ignored ([`history::validate`](crate::history::validate) finds
/// those).
pub fn check(history: &[Event], effects: &[Effect]) -> Report {
    let mut counts = Counts {
        effects: effects.len(),
        ..Counts::default()
    };
    let mut ops: BTreeMap<u64, Operation> = BTreeMap::new();
    // Every `ok` answer to a keyed attempt, in history order, for the replay
    // rule: the operation, its key and payload, and the answer.
    let mut answers: Vec<Replayable> = Vec::new();

    for event in history {
        match event {
            Event::Invoke {
                op,
                scope,
                key,
                fingerprint,
                duplicate_of,
                ..
            } => {
                let operation = ops.entry(*op).or_insert_with(|| Operation {
                    duplicate: duplicate_of.is_some(),
                    attempts: Vec::new(),
                    last: None,
                });
                operation.attempts.push(Attempt {
                    key: key.clone().map(|key| (scope.clone(), key)),
                    fingerprint: fingerprint.clone(),
                    told: Vec::new(),
                });
            }
            Event::Ok { op, answer, .. } => {
                if let Some(attempt) = tell(&mut ops, *op, Told::Ok) {
                    if let Some(id) = &attempt.key {
                        answers.push(Replayable {
                            op: *op,
                            slot: (id.clone(), attempt.fingerprint.clone()),
                            answer: answer.clone(),
                        });
                    }
                    if answer.replayed {
                        counts.replays_seen += 1;
                    }
                }
            }
            Event::Fail { op, .. } => {
                tell(&mut ops, *op, Told::Fail);
            }
            Event::Unknown { op, .. } => {
                tell(&mut ops, *op, Told::Unknown);
            }
        }
    }

    let mut groups: BTreeMap<KeyId, KeyGroup> = BTreeMap::new();
    for (&op, operation) in &ops {
        counts.operations += 1;
        counts.retries += operation.attempts.len().saturating_sub(1);
        if operation.duplicate {
            counts.duplicates_sent += 1;
        }
        match operation.last {
            Some(Told::Ok) => counts.ok += 1,
            Some(Told::Fail) => counts.fail += 1,
            Some(Told::Unknown) => counts.unknown += 1,
            None => {
                counts.unknown += 1;
                counts.unanswered += 1;
            }
        }
        if operation.attempts.iter().all(|a| a.key.is_none()) {
            counts.without_key += 1;
        }
        for attempt in &operation.attempts {
            let Some(id) = &attempt.key else { continue };
            let group = groups.entry(id.clone()).or_default();
            group.add_op(op);
            if attempt.told.is_empty() || attempt.told.contains(&Told::Unknown) {
                group.unknown = true;
            }
            if attempt.told.contains(&Told::Ok) {
                if !group.ok_ops.contains(&op) {
                    group.ok_ops.push(op);
                }
                let by_fingerprint = group
                    .ok_by_fingerprint
                    .entry(attempt.fingerprint.clone())
                    .or_default();
                if !by_fingerprint.contains(&op) {
                    by_fingerprint.push(op);
                }
            }
        }
    }
    counts.keys = groups.len();

    let unmatched = match_effects(&mut groups, effects);
    counts.effects_without_operation = unmatched.len();

    let mut violations = Vec::new();
    for (id, group) in &groups {
        per_key(id, group, &mut violations);
    }
    doubles_outside_history(effects, &unmatched, &mut violations);
    new_keys_on_retry(&ops, &groups, &mut violations);
    replays(&answers, &mut violations);
    stale_writes(effects, &groups, &mut violations);

    Report { counts, violations }
}

/// Records an answer on the operation's latest attempt and returns that
/// attempt; `None` when the operation was never invoked.
fn tell(ops: &mut BTreeMap<u64, Operation>, op: u64, told: Told) -> Option<&Attempt> {
    let operation = ops.get_mut(&op)?;
    operation.last = Some(told);
    let attempt = operation.attempts.last_mut()?;
    attempt.told.push(told);
    Some(attempt)
}

/// Gives each key group the effects that match it; returns the indexes of
/// the effects no key of the history matches.
fn match_effects(groups: &mut BTreeMap<KeyId, KeyGroup>, effects: &[Effect]) -> Vec<usize> {
    let mut by_key: HashMap<String, Vec<KeyId>> = HashMap::new();
    for id in groups.keys() {
        by_key.entry(id.1.clone()).or_default().push(id.clone());
    }
    let mut unmatched = Vec::new();
    for (index, effect) in effects.iter().enumerate() {
        let mut matched = false;
        for id in by_key.get(&effect.key).into_iter().flatten() {
            let compatible = match (&effect.scope, &id.0) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            if compatible {
                groups.get_mut(id).expect("indexed").effects.push(index);
                matched = true;
            }
        }
        if !matched {
            unmatched.push(index);
        }
    }
    unmatched
}

/// The rules of one key: how many effects its answers allow, and whether
/// two payloads were both applied under it.
fn per_key(id: &KeyId, group: &KeyGroup, violations: &mut Vec<Violation>) {
    let applied = group.effects.len();
    let fingerprints: Vec<&Option<String>> = group
        .ok_by_fingerprint
        .keys()
        .filter(|fingerprint| fingerprint.is_some())
        .collect();
    if fingerprints.len() > 1 && applied > 1 {
        let ops = group
            .ok_by_fingerprint
            .values()
            .flat_map(|ops| ops.first().copied())
            .collect::<Vec<_>>();
        violations.push(Violation::on_key(
            ViolationKind::KeyReuse,
            id,
            ops.clone(),
            format!(
                "{} payloads answered ok under one key and {applied} effects applied (ops {})",
                fingerprints.len(),
                list(&ops)
            ),
        ));
        return;
    }
    if applied > 1 {
        violations.push(Violation::on_key(
            ViolationKind::DoubleEffect,
            id,
            group.ops.clone(),
            format!("applied {applied} times (ops {})", list(&group.ops)),
        ));
    } else if applied == 0 && !group.ok_ops.is_empty() {
        violations.push(Violation::on_key(
            ViolationKind::AckedNotApplied,
            id,
            group.ok_ops.clone(),
            format!(
                "answered ok but never applied (ops {})",
                list(&group.ok_ops)
            ),
        ));
    } else if applied == 1 && group.ok_ops.is_empty() && !group.unknown {
        violations.push(Violation::on_key(
            ViolationKind::FailedButApplied,
            id,
            group.ops.clone(),
            format!(
                "every answer was a failure, yet it was applied (ops {})",
                list(&group.ops)
            ),
        ));
    }
}

/// Effects of keys the history does not know, applied more than once.
fn doubles_outside_history(effects: &[Effect], unmatched: &[usize], out: &mut Vec<Violation>) {
    let mut counted: BTreeMap<KeyId, usize> = BTreeMap::new();
    for &index in unmatched {
        let effect = &effects[index];
        *counted
            .entry((effect.scope.clone(), effect.key.clone()))
            .or_default() += 1;
    }
    for (id, applied) in counted {
        if applied > 1 {
            out.push(Violation::on_key(
                ViolationKind::DoubleEffect,
                &id,
                Vec::new(),
                format!("applied {applied} times (no operation in the history)"),
            ));
        }
    }
}

/// Operations whose attempts carried several keys, applied under more than
/// one of them.
fn new_keys_on_retry(
    ops: &BTreeMap<u64, Operation>,
    groups: &BTreeMap<KeyId, KeyGroup>,
    out: &mut Vec<Violation>,
) {
    for (&op, operation) in ops {
        let keys: BTreeSet<&KeyId> = operation
            .attempts
            .iter()
            .filter_map(|a| a.key.as_ref())
            .collect();
        if keys.len() < 2 {
            continue;
        }
        let applied: BTreeSet<usize> = keys
            .iter()
            .flat_map(|id| groups[*id].effects.iter().copied())
            .collect();
        if applied.len() > 1 {
            let scope = keys.iter().find_map(|id| id.0.clone());
            out.push(Violation {
                kind: ViolationKind::NewKeyOnRetry,
                scope,
                keys: keys.iter().map(|id| id.1.clone()).collect(),
                ops: vec![op],
                resource: None,
                message: format!(
                    "op {op} was retried under {} keys and applied {} times",
                    keys.len(),
                    applied.len()
                ),
            });
        }
    }
}

/// Every `ok` answer for one key and payload must be the first one.
fn replays(answers: &[Replayable], out: &mut Vec<Violation>) {
    let mut first: HashMap<&(KeyId, Option<String>), &Replayable> = HashMap::new();
    for answer in answers {
        let Some(original) = first.get(&answer.slot) else {
            first.insert(&answer.slot, answer);
            continue;
        };
        if differs(&original.answer, &answer.answer) {
            out.push(Violation::on_key(
                ViolationKind::ReplayDiffers,
                &answer.slot.0,
                vec![original.op, answer.op],
                format!(
                    "op {} was answered {}, op {} {}",
                    original.op,
                    describe(&original.answer),
                    answer.op,
                    describe(&answer.answer)
                ),
            ));
        }
    }
}

/// Two answers differ in status, or in body when both hashes are known.
fn differs(a: &Answer, b: &Answer) -> bool {
    a.status != b.status || matches!((&a.body_hash, &b.body_hash), (Some(x), Some(y)) if x != y)
}

fn describe(answer: &Answer) -> String {
    match &answer.body_hash {
        Some(hash) => format!("{} (body {hash})", answer.status),
        None => answer.status.to_string(),
    }
}

/// Per resource, an applied write whose fence is lower than one applied
/// before it. An equal fence is a lease holder writing again with its token.
fn stale_writes(effects: &[Effect], groups: &BTreeMap<KeyId, KeyGroup>, out: &mut Vec<Violation>) {
    let mut highest: HashMap<&str, (i64, usize)> = HashMap::new();
    for (index, effect) in effects.iter().enumerate() {
        let (Some(resource), Some(fence)) = (&effect.resource, effect.fence) else {
            continue;
        };
        match highest.get(resource.as_str()) {
            Some(&(seen, before)) if fence < seen => {
                let earlier = &effects[before];
                let ops = ops_of(groups, &[before, index]);
                out.push(Violation {
                    kind: ViolationKind::StaleWrite,
                    scope: effect.scope.clone(),
                    keys: vec![earlier.key.clone(), effect.key.clone()],
                    ops: ops.clone(),
                    resource: Some(resource.clone()),
                    message: format!(
                        "{resource}: key {:?} wrote with fence {fence} after key {:?} wrote with {seen}",
                        effect.key, earlier.key
                    ),
                });
            }
            Some(&(seen, _)) if fence <= seen => {}
            _ => {
                highest.insert(resource, (fence, index));
            }
        }
    }
}

/// The operations whose keys matched these effects.
fn ops_of(groups: &BTreeMap<KeyId, KeyGroup>, effects: &[usize]) -> Vec<u64> {
    let mut ops: Vec<u64> = groups
        .values()
        .filter(|group| group.effects.iter().any(|e| effects.contains(e)))
        .flat_map(|group| group.ops.iter().copied())
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

/// `1, 2, 3`.
fn list(ops: &[u64]) -> String {
    ops.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

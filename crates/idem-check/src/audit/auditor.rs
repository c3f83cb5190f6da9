//! The auditor's rules and memory, without I/O: it is handed pages of
//! effects with the records of their keys, and pages of records, and says
//! what it found. The pass ([`super::Audit`]) does the reading.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use idem_core::{ExpiryPosition, IdempotencyKey, Record, RecordState, Scope, Timestamp};

use super::finding::{Finding, FindingKind, RecordSeen};
use crate::effects::LoggedEffect;

/// What the auditor checks, and how patiently.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// The scopes whose records are compared with the effects. An effect
    /// without a `scope` column is in the only one of them, when there is
    /// one.
    pub scopes: Vec<Scope>,
    /// The dedupe window: two effects of one key less than this apart are a
    /// double effect; an effect older than this may have lost its record to
    /// the sweeper.
    pub window: Duration,
    /// How long after a record completed its effect may still be missing
    /// from what the auditor has read.
    pub grace: Duration,
}

/// A key as the auditor remembers it: its scope (when known) and the key.
type KeyId = (Option<String>, String);

/// The first effect of a key in its window, and how many it has had.
#[derive(Debug)]
struct Seen {
    first: LoggedEffect,
    at: i64,
    count: u32,
}

/// What [`Auditor::judge_records`] did with a page of records.
#[derive(Debug, Default)]
pub struct Judged {
    /// Missing effects found.
    pub findings: Vec<Finding>,
    /// Records of the page judged or set aside; the next page starts after
    /// the last of them.
    pub records: usize,
    /// The page reached a record claimed less than the grace period ago:
    /// the walk waits for the next pass there.
    pub reached_recent: bool,
}

/// The rules and the memory of one auditor.
#[derive(Debug)]
pub struct Auditor {
    settings: AuditSettings,
    seen: HashMap<KeyId, Seen>,
    order: VecDeque<(i64, KeyId)>,
    pending: BTreeSet<(Scope, IdempotencyKey)>,
    position: Option<ExpiryPosition>,
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Auditor {
    /// An auditor that has read nothing yet.
    pub fn new(settings: AuditSettings) -> Self {
        Self {
            settings,
            seen: HashMap::new(),
            order: VecDeque::new(),
            pending: BTreeSet::new(),
            position: None,
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &AuditSettings {
        &self.settings
    }

    /// The scope of an effect: its own, or the only audited one.
    fn scope_of(&self, effect: &LoggedEffect) -> Option<String> {
        match (&effect.effect.scope, self.settings.scopes.as_slice()) {
            (Some(scope), _) => Some(scope.clone()),
            (None, [only]) => Some(only.to_string()),
            (None, _) => None,
        }
    }

    /// The audited scope and key of an effect, when its scope is audited and
    /// both are valid.
    fn audited(&self, effect: &LoggedEffect) -> Option<(Scope, IdempotencyKey)> {
        let scope = self.scope_of(effect)?;
        let scope = self
            .settings
            .scopes
            .iter()
            .find(|audited| audited.as_str() == scope)?;
        let key = IdempotencyKey::new(effect.effect.key.clone()).ok()?;
        Some((scope.clone(), key))
    }

    /// The keys of `page` whose records [`read_effects`](Self::read_effects)
    /// needs: those of audited scopes, each once.
    pub fn keys_to_look_up(&self, page: &[LoggedEffect]) -> Vec<(Scope, IdempotencyKey)> {
        let keys: BTreeSet<_> = page.iter().filter_map(|e| self.audited(e)).collect();
        keys.into_iter().collect()
    }

    /// Reads a page of effects, in cursor order, with the records found for
    /// [`keys_to_look_up`](Self::keys_to_look_up): a key's repeat within
    /// its window is a double effect, and an effect of an audited scope
    /// whose key has no record (and is younger than the window, when its
    /// time is known) is an effect without a record.
    pub fn read_effects(
        &mut self,
        page: &[LoggedEffect],
        records: &[Record],
        now: Timestamp,
    ) -> Vec<Finding> {
        let window = ms(self.settings.window);
        let records: HashMap<(&str, &str), &Record> = records
            .iter()
            .map(|r| ((r.scope.as_str(), r.key.as_str()), r))
            .collect();
        let record_of = |scope: Option<&str>, key: &str| {
            scope.and_then(|scope| records.get(&(scope, key)).copied())
        };
        let mut findings = Vec::new();
        for effect in page {
            let scope = self.scope_of(effect);
            let at = effect.at_ms.unwrap_or(now.0);
            let id: KeyId = (scope.clone(), effect.effect.key.clone());
            let in_scope = scope
                .as_deref()
                .is_some_and(|s| self.settings.scopes.iter().any(|a| a.as_str() == s));
            if in_scope {
                let record = record_of(scope.as_deref(), &effect.effect.key);
                let may_be_swept = effect.at_ms.is_some_and(|at| at <= now.0 - window);
                if record.is_none() && !may_be_swept {
                    findings.push(Finding {
                        kind: FindingKind::EffectWithoutRecord,
                        scope: scope.clone(),
                        key: effect.effect.key.clone(),
                        effects: vec![effect.clone()],
                        count: None,
                        record: None,
                        found_at_ms: now.0,
                    });
                }
            }
            match self.seen.get_mut(&id) {
                Some(seen) if at - seen.at < window => {
                    seen.count = seen.count.saturating_add(1);
                    let record = record_of(scope.as_deref(), &effect.effect.key);
                    findings.push(Finding {
                        kind: FindingKind::DoubleEffect,
                        scope,
                        key: effect.effect.key.clone(),
                        effects: vec![seen.first.clone(), effect.clone()],
                        count: Some(seen.count),
                        record: record.map(RecordSeen::from),
                        found_at_ms: now.0,
                    });
                }
                _ => {
                    self.order.push_back((at, id.clone()));
                    self.seen.insert(
                        id,
                        Seen {
                            first: effect.clone(),
                            at,
                            count: 1,
                        },
                    );
                }
            }
        }
        findings
    }

    /// Where the walk over the records goes on from.
    pub fn position(&self) -> Option<&ExpiryPosition> {
        self.position.as_ref()
    }

    /// Judges a page of records, in the order [`RecordScan`] gives them,
    /// once every effect written before `now` was read: a record claimed
    /// less than the grace period ago stops the walk (it and the ones after
    /// it wait for a later pass); a completed record whose effect was not
    /// read is a missing effect, once it completed at least the grace period
    /// ago; a record still in flight, or completed too recently, is set
    /// aside and looked at again by [`recheck`](Self::recheck); a failed
    /// record has no effect to look for.
    ///
    /// [`RecordScan`]: idem_core::RecordScan
    pub fn judge_records(&mut self, page: &[Record], now: Timestamp) -> Judged {
        let grace = ms(self.settings.grace);
        let mut judged = Judged::default();
        for record in page {
            if record.created_at.0 > now.0 - grace {
                judged.reached_recent = true;
                break;
            }
            if let Some(finding) = self.judge(record, now, grace) {
                judged.findings.push(finding);
            }
            self.position = Some(ExpiryPosition::after(record));
            judged.records += 1;
        }
        judged
    }

    /// A record's verdict: a missing effect, nothing, or set aside.
    fn judge(&mut self, record: &Record, now: Timestamp, grace: i64) -> Option<Finding> {
        let pair = (record.scope.clone(), record.key.clone());
        match record.state {
            RecordState::Failed => {
                self.pending.remove(&pair);
                None
            }
            RecordState::InFlight => {
                self.pending.insert(pair);
                None
            }
            RecordState::Completed if record.updated_at.0 > now.0 - grace => {
                self.pending.insert(pair);
                None
            }
            RecordState::Completed => {
                self.pending.remove(&pair);
                let id: KeyId = (Some(record.scope.to_string()), record.key.to_string());
                (!self.seen.contains_key(&id)).then(|| Finding {
                    kind: FindingKind::MissingEffect,
                    scope: Some(record.scope.to_string()),
                    key: record.key.to_string(),
                    effects: Vec::new(),
                    count: None,
                    record: Some(RecordSeen::from(record)),
                    found_at_ms: now.0,
                })
            }
        }
    }

    /// Moves the walk past `records` without judging them.
    pub fn skip_records(&mut self, records: &[Record]) {
        if let Some(last) = records.last() {
            self.position = Some(ExpiryPosition::after(last));
        }
    }

    /// The records set aside (in flight, or completed within the grace
    /// period) to look at again.
    pub fn pending(&self) -> Vec<(Scope, IdempotencyKey)> {
        self.pending.iter().cloned().collect()
    }

    /// Looks again at `keys` (from [`pending`](Self::pending)) with the
    /// records found for them now: one that is gone (swept, evicted) is
    /// dropped; the others are judged as in
    /// [`judge_records`](Self::judge_records).
    pub fn recheck(
        &mut self,
        keys: &[(Scope, IdempotencyKey)],
        records: &[Record],
        now: Timestamp,
    ) -> Vec<Finding> {
        let grace = ms(self.settings.grace);
        let mut findings = Vec::new();
        for pair in keys {
            match records
                .iter()
                .find(|r| r.scope == pair.0 && r.key == pair.1)
            {
                None => {
                    self.pending.remove(pair);
                }
                Some(record) => findings.extend(self.judge(record, now, grace)),
            }
        }
        findings
    }

    /// Forgets the keys whose first effect is older than the window.
    pub fn forget_old(&mut self, now: Timestamp) {
        let window = ms(self.settings.window);
        while let Some((at, _)) = self.order.front() {
            if now.0 - *at < window {
                break;
            }
            let (at, id) = self.order.pop_front().expect("front exists");
            if self.seen.get(&id).is_some_and(|seen| seen.at == at) {
                self.seen.remove(&id);
            }
        }
    }

    /// How many keys it remembers (their first effect in their window).
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{FencingToken, Fingerprint, Outcome};

    use super::*;
    use crate::effects::Effect;

    const MINUTE: i64 = 60_000;

    fn auditor() -> Auditor {
        Auditor::new(AuditSettings {
            scopes: vec![Scope::new("payments").unwrap()],
            window: Duration::from_secs(3600),
            grace: Duration::from_secs(30),
        })
    }

    fn effect(cursor: i64, key: &str, at_ms: Option<i64>) -> LoggedEffect {
        LoggedEffect {
            cursor,
            at_ms,
            effect: Effect {
                key: key.into(),
                scope: None,
                resource: None,
                fence: None,
            },
        }
    }

    fn record(key: &str, state: RecordState, created: i64, updated: i64) -> Record {
        Record {
            scope: Scope::new("payments").unwrap(),
            key: IdempotencyKey::new(key).unwrap(),
            fingerprint: Fingerprint::of_bytes(b"x"),
            state,
            token: FencingToken::FIRST,
            lease_until: None,
            outcome: (state != RecordState::InFlight).then(|| Outcome::success("ok")),
            created_at: Timestamp(created),
            updated_at: Timestamp(updated),
            expires_at: Timestamp(created + 60 * MINUTE),
        }
    }

    #[test]
    fn a_repeat_within_the_window_is_a_double_effect_and_one_after_it_is_not() {
        let mut auditor = auditor();
        let now = Timestamp(100 * MINUTE);
        let records = [record("a", RecordState::Completed, 0, 0)];
        let page = [
            effect(1, "a", Some(0)),
            effect(2, "a", Some(10 * MINUTE)),
            effect(3, "a", Some(70 * MINUTE)),
        ];
        let found = auditor.read_effects(&page, &records, now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, FindingKind::DoubleEffect);
        let rows: Vec<i64> = found[0].effects.iter().map(|e| e.cursor).collect();
        assert_eq!(rows, [1, 2]);
    }

    #[test]
    fn an_effect_without_a_record_is_found_unless_it_is_older_than_the_window() {
        let mut auditor = auditor();
        let now = Timestamp(100 * MINUTE);
        let page = [
            effect(1, "old", Some(0)),
            effect(2, "new", Some(99 * MINUTE)),
        ];
        let found = auditor.read_effects(&page, &[], now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, FindingKind::EffectWithoutRecord);
        assert_eq!(found[0].key, "new");
    }

    #[test]
    fn a_completed_record_without_its_effect_is_missing_only_after_the_grace() {
        let mut auditor = auditor();
        let completed = record("gone", RecordState::Completed, 0, 0);
        let early = auditor.judge_records(std::slice::from_ref(&completed), Timestamp(10_000));
        assert!(early.reached_recent && early.findings.is_empty());
        assert_eq!(auditor.position(), None);
        let late = auditor.judge_records(std::slice::from_ref(&completed), Timestamp(31_000));
        assert_eq!(late.findings.len(), 1);
        assert_eq!(late.findings[0].kind, FindingKind::MissingEffect);
        assert_eq!(auditor.position().unwrap().key.as_str(), "gone");
    }

    #[test]
    fn an_in_flight_record_waits_and_is_judged_once_completed() {
        let mut auditor = auditor();
        let now = Timestamp(MINUTE);
        let in_flight = record("k", RecordState::InFlight, 0, 0);
        assert!(auditor.judge_records(&[in_flight], now).findings.is_empty());
        let keys = auditor.pending();
        assert_eq!(keys.len(), 1);
        let completed = record("k", RecordState::Completed, 0, MINUTE);
        assert!(
            auditor
                .recheck(&keys, std::slice::from_ref(&completed), now)
                .is_empty()
        );
        let later = Timestamp(2 * MINUTE);
        let found = auditor.recheck(&auditor.pending(), &[completed], later);
        assert_eq!(found.len(), 1);
        assert!(auditor.pending().is_empty());
    }

    #[test]
    fn keys_older_than_the_window_are_forgotten() {
        let mut auditor = auditor();
        let records = [record("a", RecordState::Completed, 0, 0)];
        auditor.read_effects(&[effect(1, "a", Some(0))], &records, Timestamp(0));
        auditor.forget_old(Timestamp(59 * MINUTE));
        assert_eq!(auditor.remembered(), 1);
        auditor.forget_old(Timestamp(60 * MINUTE));
        assert_eq!(auditor.remembered(), 0);
    }
}

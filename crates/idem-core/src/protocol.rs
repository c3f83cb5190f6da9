//! The apply protocol as one pure function: given what the store found for a
//! `(scope, key)`, decide what happens. Every store calls [`decide`] inside its
//! own transaction, so the table below is implemented once and tested once.
//!
//! | record found                      | fingerprint | decision                         |
//! |-----------------------------------|-------------|----------------------------------|
//! | none, or past retention           | —           | [`Decision::Claim`]               |
//! | past retention, tombstones kept   | same        | refuse with `Expired`             |
//! | past retention, tombstones kept   | different   | refuse with `KeyReuse`            |
//! | completed or failed               | same        | [`Decision::Replay`]              |
//! | any state                         | different   | refuse with `KeyReuse`            |
//! | any state                         | other rule  | as if the same (logged, counted)  |
//! | in flight, lease alive            | same        | refuse with `InFlight`            |
//! | in flight, lease ended            | same        | [`Decision::TakeOver`] (token + 1) |
//!
//! A fingerprint made under another [`FingerprintRule`](crate::FingerprintRule)
//! than the record's cannot be compared with it (the payload is not stored),
//! so it is taken as the same: a retry across a change of the rule is
//! replayed rather than refused as key reuse, and the event is logged and
//! counted ([`observe::fingerprint_rule_changed`](crate::observe::fingerprint_rule_changed)).
//!
//! With tombstones kept ([`Settings::tombstones`]), a record past retention
//! (or the tombstone the sweep left in its place) still refuses its key until
//! the grace period ends: a late retry is the request most likely to apply an
//! operation twice. After the grace period the key is new again.
//!
//! A record past retention is replaced, but its token still grows: tokens are
//! never reused, so a worker holding an old token can never be mistaken for the
//! new owner.
//!
//! [`Plan`] then says what a claim writes, so every store writes the same
//! record. The dedupe window counts from the key's first claim: `created_at`
//! is the first claim's time and `expires_at` is `created_at + retention`. A
//! takeover, a claim after a release, a completion and a renewal keep both;
//! only a record past retention is replaced with a new window.

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, StoreError};
use crate::fingerprint::Fingerprint;
use crate::fingerprint_rule::FingerprintMatch;
use crate::key::{IdempotencyKey, Scope};
use crate::outcome::Outcome;
use crate::record::{FencingToken, Record, RecordState};
use crate::settings::Settings;
use crate::store::{Operation, Replay};

/// What the caller of [`decide`] must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No live record: write a new one with this token and run the effect.
    Claim {
        /// The token of the new claim.
        token: FencingToken,
    },
    /// An in-flight record whose lease ended: its worker is presumed dead. Take
    /// it over with this (greater) token and run the effect.
    TakeOver {
        /// The token of the new claim.
        token: FencingToken,
    },
    /// A settled record: return its outcome, run nothing.
    Replay(Replay),
}

impl Decision {
    /// The token to claim with, unless this is a replay.
    pub fn token(&self) -> Option<FencingToken> {
        match self {
            Self::Claim { token } | Self::TakeOver { token } => Some(*token),
            Self::Replay(_) => None,
        }
    }
}

/// Applies the protocol table to what the store found.
///
/// ```
/// use idem_core::{decide, Decision, Fingerprint, IdempotencyKey, Scope, Settings, Timestamp};
/// let scope = Scope::new("payments").unwrap();
/// let key = IdempotencyKey::new("k-1").unwrap();
/// let fp = Fingerprint::of_bytes(b"debit 10");
/// let first = decide(None, &scope, &key, &fp, Timestamp(0), &Settings::default()).unwrap();
/// assert!(matches!(first, Decision::Claim { .. }));
/// ```
pub fn decide(
    found: Option<&Record>,
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    now: Timestamp,
    settings: &Settings,
) -> Result<Decision, Error> {
    let Some(record) = found else {
        return Ok(Decision::Claim {
            token: FencingToken::first_at(now),
        });
    };
    if record.expires_at <= now {
        if settings.refuses_late(record.expires_at, now) {
            return match fingerprint.compare(&record.fingerprint) {
                FingerprintMatch::Different => Err(Error::KeyReuse {
                    scope: scope.clone(),
                    key: key.clone(),
                }),
                FingerprintMatch::Same | FingerprintMatch::OtherRule => Err(Error::Expired {
                    scope: scope.clone(),
                    key: key.clone(),
                    expired_at: record.expires_at,
                }),
            };
        }
        return Ok(Decision::Claim {
            token: record.token.next().max(FencingToken::first_at(now)),
        });
    }
    match fingerprint.compare(&record.fingerprint) {
        FingerprintMatch::Same => {}
        FingerprintMatch::Different => {
            return Err(Error::KeyReuse {
                scope: scope.clone(),
                key: key.clone(),
            });
        }
        FingerprintMatch::OtherRule => {
            crate::observe::fingerprint_rule_changed(scope, &record.fingerprint, fingerprint);
        }
    }
    match record.state {
        RecordState::Completed | RecordState::Failed => match &record.outcome {
            Some(outcome) => Ok(Decision::Replay(Replay::new(
                outcome.clone(),
                record.expires_at,
            ))),
            None => Err(Error::Store(StoreError::new(
                ErrorKind::Corrupt,
                format!("settled record {scope}/{key} has no stored outcome"),
            ))),
        },
        RecordState::InFlight => match record.lease_until {
            Some(until) if until > now => Err(Error::InFlight {
                scope: scope.clone(),
                key: key.clone(),
                retry_after: now.until(until).min(settings.in_flight_retry_after),
            }),
            Some(_) => Ok(Decision::TakeOver {
                token: record.token.next(),
            }),
            // Released by its holder: free for the next claim, which still
            // gets the next token so the old holder stays fenced.
            None => Ok(Decision::Claim {
                token: record.token.next(),
            }),
        },
    }
}

/// What a claim or takeover writes, apart from the state it writes it in:
/// the token, and the window the record keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The token of the new claim.
    pub token: FencingToken,
    /// Whether an expired lease was taken over (its worker presumed dead).
    pub took_over: bool,
    /// When the key was first claimed: the start of the dedupe window.
    pub created_at: Timestamp,
    /// When the record may be swept: `created_at + retention`.
    pub expires_at: Timestamp,
}

impl Plan {
    /// The plan for carrying out `decision`, taken at `now` on `found`; `None`
    /// for a replay, which writes nothing.
    ///
    /// A record still inside its window (taken over, or released by its
    /// holder) keeps its `created_at` and `expires_at`; a new key or a record
    /// past retention starts a new window at `now`.
    ///
    /// ```
    /// use idem_core::{decide, Fingerprint, IdempotencyKey, Plan, Scope, Settings, Timestamp};
    /// let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
    /// let settings = Settings::default();
    /// let fp = Fingerprint::of_bytes(b"x");
    /// let decision = decide(None, &scope, &key, &fp, Timestamp(5), &settings).unwrap();
    /// let plan = Plan::of(&decision, None, Timestamp(5), &settings).unwrap();
    /// assert_eq!(plan.created_at, Timestamp(5));
    /// assert_eq!(plan.expires_at, Timestamp(5).plus(settings.retention));
    /// ```
    pub fn of(
        decision: &Decision,
        found: Option<&Record>,
        now: Timestamp,
        settings: &Settings,
    ) -> Option<Plan> {
        let (token, took_over) = match decision {
            Decision::Replay(_) => return None,
            Decision::Claim { token } => (*token, false),
            Decision::TakeOver { token } => (*token, true),
        };
        Some(match found {
            Some(found) if found.expires_at > now => Plan {
                token,
                took_over,
                created_at: found.created_at,
                expires_at: found.expires_at,
            },
            _ => Plan {
                took_over,
                ..Plan::first(token, now, settings)
            },
        })
    }

    /// The plan of a key claimed for the first time at `now`.
    pub fn first(token: FencingToken, now: Timestamp, settings: &Settings) -> Plan {
        Plan {
            token,
            took_over: false,
            created_at: now,
            expires_at: now.plus(settings.retention),
        }
    }

    /// The record of a claim whose effect is still to run (leased mode): in
    /// flight, its lease ending at `now + lease`.
    pub fn in_flight(&self, op: &Operation, now: Timestamp, settings: &Settings) -> Record {
        self.record(
            op,
            RecordState::InFlight,
            Some(now.plus(settings.lease)),
            None,
            now,
        )
    }

    /// The record of a claim that already has its outcome (atomic mode):
    /// completed or failed, by the outcome's kind.
    pub fn settled(&self, op: &Operation, outcome: Outcome, now: Timestamp) -> Record {
        let state = RecordState::settled_by(outcome.kind);
        self.record(op, state, None, Some(outcome), now)
    }

    fn record(
        &self,
        op: &Operation,
        state: RecordState,
        lease_until: Option<Timestamp>,
        outcome: Option<Outcome>,
        now: Timestamp,
    ) -> Record {
        Record {
            scope: op.scope.clone(),
            key: op.key.clone(),
            fingerprint: op.fingerprint,
            state,
            token: self.token,
            lease_until,
            outcome,
            created_at: self.created_at,
            updated_at: now,
            expires_at: self.expires_at,
        }
    }
}

/// The refusal given to a concurrent duplicate found by a store's try-lock
/// (the first caller holds the key right now and has not committed yet).
pub fn busy(scope: &Scope, key: &IdempotencyKey, settings: &Settings) -> Error {
    Error::InFlight {
        scope: scope.clone(),
        key: key.clone(),
        retry_after: settings.in_flight_retry_after,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record(state: RecordState, fp: &[u8], lease_until: Option<i64>) -> Record {
        Record {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::new("k").unwrap(),
            fingerprint: Fingerprint::of_bytes(fp),
            state,
            token: FencingToken::new(3).unwrap(),
            lease_until: lease_until.map(Timestamp),
            outcome: state.is_settled().then(|| Outcome::success("done")),
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
            expires_at: Timestamp(10_000),
        }
    }

    fn run(found: Option<&Record>, fp: &[u8], now: i64) -> Result<Decision, Error> {
        decide(
            found,
            &Scope::new("s").unwrap(),
            &IdempotencyKey::new("k").unwrap(),
            &Fingerprint::of_bytes(fp),
            Timestamp(now),
            &Settings::default(),
        )
    }

    #[test]
    fn a_late_retry_meets_the_tombstone_until_the_grace_period_ends() {
        let grace = Duration::from_millis(1_000);
        let settings = Settings::default().with_tombstones(Some(grace));
        let mut done = record(RecordState::Completed, b"a", None);
        done.expires_at = Timestamp(9_000);
        let gone = Record::tombstone(
            done.scope.clone(),
            done.key.clone(),
            done.fingerprint,
            done.token,
            Timestamp(9_000),
        );
        for found in [&done, &gone] {
            let at = |now: i64, fp: &[u8]| {
                decide(
                    Some(found),
                    &found.scope,
                    &found.key,
                    &Fingerprint::of_bytes(fp),
                    Timestamp(now),
                    &settings,
                )
            };
            assert!(matches!(at(8_999, b"a"), Ok(Decision::Replay(_)) | Err(_)));
            match at(9_000, b"a") {
                Err(Error::Expired { expired_at, .. }) => assert_eq!(expired_at, Timestamp(9_000)),
                other => panic!("a retry at the end of the window must be refused, got {other:?}"),
            }
            assert!(matches!(at(9_999, b"a"), Err(Error::Expired { .. })));
            assert!(matches!(at(9_999, b"b"), Err(Error::KeyReuse { .. })));
            let Ok(Decision::Claim { token }) = at(10_000, b"a") else {
                panic!("past the grace period the key is new again");
            };
            assert!(token > found.token);
        }
        // Without tombstones the key is new as soon as its window ends.
        assert!(matches!(
            decide(
                Some(&done),
                &done.scope,
                &done.key,
                &done.fingerprint,
                Timestamp(9_000),
                &Settings::default(),
            ),
            Ok(Decision::Claim { .. })
        ));
        let message = Error::Expired {
            scope: done.scope.clone(),
            key: done.key.clone(),
            expired_at: Timestamp(0),
        }
        .to_string();
        assert!(message.contains("1970-01-01T00:00:00.000Z"), "{message}");
    }

    #[test]
    fn a_record_of_another_fingerprint_rule_is_answered_as_a_retry() {
        let body = br#"{"amount":10,"sent_at":1}"#;
        let none = |_: &str| Vec::new();
        let amount = crate::fingerprint_rule::FingerprintRule::default()
            .select("json:/amount")
            .unwrap();
        let decide_on = |stored: Fingerprint, state, current: Fingerprint| {
            let mut found = record(state, b"", Some(9_000));
            found.fingerprint = stored;
            decide(
                Some(&found),
                &found.scope.clone(),
                &found.key.clone(),
                &current,
                Timestamp(5),
                &Settings::default(),
            )
        };
        // Stored under the default rule, retried under a selection: replayed.
        let whole = Fingerprint::of_json_or_bytes(body);
        let selected = amount.fingerprint(br#"{"amount":10,"sent_at":2}"#, none);
        assert!(matches!(
            decide_on(whole, RecordState::Completed, selected),
            Ok(Decision::Replay(_))
        ));
        // And back: a live claim is still in flight, not key reuse.
        assert!(matches!(
            decide_on(selected, RecordState::InFlight, whole),
            Err(Error::InFlight { .. })
        ));
        // Under one rule, a different selected field is key reuse.
        let other = amount.fingerprint(br#"{"amount":11,"sent_at":1}"#, none);
        assert!(matches!(
            decide_on(selected, RecordState::Completed, other),
            Err(Error::KeyReuse { .. })
        ));
    }

    #[test]
    fn every_row_of_the_table() {
        assert_eq!(
            run(None, b"a", 5).unwrap(),
            Decision::Claim {
                token: FencingToken::first_at(Timestamp(5))
            }
        );
        let done = record(RecordState::Completed, b"a", None);
        assert_eq!(
            run(Some(&done), b"a", 5).unwrap(),
            Decision::Replay(Replay::new(Outcome::success("done"), Timestamp(10_000)))
        );
        let failed = record(RecordState::Failed, b"a", None);
        assert!(matches!(
            run(Some(&failed), b"a", 5).unwrap(),
            Decision::Replay(_)
        ));
        for state in RecordState::ALL {
            let r = record(state, b"a", Some(9_000));
            assert!(matches!(
                run(Some(&r), b"b", 5),
                Err(Error::KeyReuse { .. })
            ));
        }
        let running = record(RecordState::InFlight, b"a", Some(500));
        match run(Some(&running), b"a", 100) {
            Err(Error::InFlight { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_millis(400))
            }
            other => panic!("expected InFlight, got {other:?}"),
        }
        assert_eq!(
            run(Some(&running), b"a", 500).unwrap(),
            Decision::TakeOver {
                token: FencingToken::new(4).unwrap()
            }
        );
        let released = record(RecordState::InFlight, b"a", None);
        assert_eq!(
            run(Some(&released), b"a", 100).unwrap(),
            Decision::Claim {
                token: FencingToken::new(4).unwrap()
            }
        );
    }

    #[test]
    fn the_window_counts_from_the_first_claim() {
        let settings = Settings::default();
        let mut found = record(RecordState::InFlight, b"a", Some(500));
        found.created_at = Timestamp(7);
        found.expires_at = Timestamp(9_000);
        for decision in [
            Decision::TakeOver {
                token: FencingToken::new(4).unwrap(),
            },
            Decision::Claim {
                token: FencingToken::new(4).unwrap(),
            },
        ] {
            let plan = Plan::of(&decision, Some(&found), Timestamp(600), &settings).unwrap();
            assert_eq!(
                (plan.created_at, plan.expires_at),
                (Timestamp(7), Timestamp(9_000))
            );
        }
        let expired = Plan::of(
            &Decision::Claim {
                token: FencingToken::new(4).unwrap(),
            },
            Some(&found),
            Timestamp(9_000),
            &settings,
        )
        .unwrap();
        assert_eq!(expired.created_at, Timestamp(9_000));
        assert_eq!(
            expired.expires_at,
            Timestamp(9_000).plus(settings.retention)
        );
        assert_eq!(
            Plan::of(
                &Decision::Replay(Replay::new(Outcome::empty(), Timestamp(0))),
                None,
                Timestamp(1),
                &settings
            ),
            None
        );
    }

    #[test]
    fn expired_records_are_replaced_with_a_greater_token() {
        let done = record(RecordState::Completed, b"a", None);
        assert_eq!(
            run(Some(&done), b"other payload", 10_000).unwrap(),
            Decision::Claim {
                token: FencingToken::first_at(Timestamp(10_000))
            }
        );
        let mut busy = record(RecordState::Completed, b"a", None);
        busy.token = FencingToken::new(i64::MAX / 2).unwrap();
        assert_eq!(
            run(Some(&busy), b"a", 10_000).unwrap(),
            Decision::Claim {
                token: busy.token.next()
            }
        );
    }

    #[test]
    fn a_swept_key_claimed_again_outranks_its_stalled_holder() {
        let mut stalled = record(RecordState::InFlight, b"a", Some(500));
        stalled.token = FencingToken::first_at(stalled.created_at).next().next();
        // The sweeper deleted the record once its window ended.
        let Decision::Claim { token } = run(None, b"a", stalled.expires_at.0).unwrap() else {
            panic!("a key without a record is claimed");
        };
        assert!(token > stalled.token);
    }
}

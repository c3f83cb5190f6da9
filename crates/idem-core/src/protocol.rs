//! The apply protocol as one pure function: given what the store found for a
//! `(scope, key)`, decide what happens. Every store calls [`decide`] inside its
//! own transaction, so the table below is implemented once and tested once.
//!
//! | record found                      | fingerprint | decision                         |
//! |-----------------------------------|-------------|----------------------------------|
//! | none, or past retention           | —           | [`Decision::Claim`]               |
//! | completed or failed               | same        | [`Decision::Replay`]              |
//! | any state                         | different   | refuse with `KeyReuse`            |
//! | in flight, lease alive            | same        | refuse with `InFlight`            |
//! | in flight, lease ended            | same        | [`Decision::TakeOver`] (token + 1) |
//!
//! A record past retention is replaced, but its token still grows: tokens are
//! never reused, so a worker holding an old token can never be mistaken for the
//! new owner.

use crate::clock::Timestamp;
use crate::{
    Error, FencingToken, Fingerprint, IdempotencyKey, Outcome, Record, RecordState, Scope, Settings,
};

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
    Replay(Outcome),
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
            token: FencingToken::FIRST,
        });
    };
    if record.expires_at <= now {
        return Ok(Decision::Claim {
            token: record.token.next(),
        });
    }
    if record.fingerprint != *fingerprint {
        return Err(Error::KeyReuse {
            scope: scope.clone(),
            key: key.clone(),
        });
    }
    match record.state {
        RecordState::Completed | RecordState::Failed => match &record.outcome {
            Some(outcome) => Ok(Decision::Replay(outcome.clone())),
            None => Err(Error::Store(crate::StoreError::new(
                crate::ErrorKind::Corrupt,
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
    fn every_row_of_the_table() {
        assert_eq!(
            run(None, b"a", 5).unwrap(),
            Decision::Claim {
                token: FencingToken::FIRST
            }
        );
        let done = record(RecordState::Completed, b"a", None);
        assert_eq!(
            run(Some(&done), b"a", 5).unwrap(),
            Decision::Replay(Outcome::success("done"))
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
    fn expired_records_are_replaced_with_a_greater_token() {
        let done = record(RecordState::Completed, b"a", None);
        assert_eq!(
            run(Some(&done), b"other payload", 10_000).unwrap(),
            Decision::Claim {
                token: FencingToken::new(4).unwrap()
            }
        );
    }
}

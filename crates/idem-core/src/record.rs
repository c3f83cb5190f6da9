//! What a store keeps per `(scope, key)`, and the text form of its state.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::outcome::{Outcome, OutcomeKind};

/// The life of a record. In flight while a worker holds the claim; completed or
/// failed (terminally) once an outcome is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// Claimed; the effect is running or its worker died and the lease will run out.
    InFlight,
    /// Applied; the outcome is replayed to duplicates.
    Completed,
    /// Failed terminally; the failure is replayed to duplicates.
    Failed,
}

impl RecordState {
    /// All states, in lifecycle order.
    pub const ALL: [RecordState; 3] = [Self::InFlight, Self::Completed, Self::Failed];

    /// The text stored in the database and shown to people.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }

    /// The state a record settles in when `kind` is stored: completed for a
    /// success, failed for a terminal failure.
    pub fn settled_by(kind: OutcomeKind) -> Self {
        match kind {
            OutcomeKind::Success => Self::Completed,
            OutcomeKind::TerminalFailure => Self::Failed,
        }
    }

    /// Whether an outcome is stored (completed or failed).
    pub fn is_settled(self) -> bool {
        !matches!(self, Self::InFlight)
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of `in_flight`, `completed`, `failed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record state {0:?}: expected one of in_flight, completed, failed")]
pub struct UnknownState(pub String);

impl FromStr for RecordState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// A fencing token: grows with every claim or takeover of a key and is never
/// reused. Completion is accepted only from the holder of the current token.
///
/// A key's tokens keep growing across its windows even when the sweeper
/// deleted the record in between: a window's first token is derived from the
/// time the window starts ([`first_at`](Self::first_at)), so it is greater
/// than every token of an earlier window and a worker stalled past the whole
/// window stays fenced. Treat tokens as opaque increasing numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(NonZeroU64);

impl FencingToken {
    /// The smallest token: the first one of a window that starts at the epoch.
    pub const FIRST: FencingToken = FencingToken(NonZeroU64::MIN);

    /// How many claims of one key each millisecond of its window leaves room
    /// for before the tokens could reach the next window's first one.
    pub const CLAIMS_PER_MS: u64 = 1 << 10;

    /// The first token of a window that starts at `now`:
    /// `now × CLAIMS_PER_MS + 1`, with `now` in milliseconds since the epoch.
    ///
    /// A window lasts its retention, and a claim within it takes the token
    /// after the last; a key would need more than [`CLAIMS_PER_MS`](Self::CLAIMS_PER_MS)
    /// claims per millisecond of retention (about 6×10¹¹ a week) to reach the
    /// next window's first token. Tokens fit a signed 64-bit column until the
    /// year 2262.
    ///
    /// ```
    /// use idem_core::{FencingToken, Timestamp};
    /// assert_eq!(FencingToken::first_at(Timestamp(0)), FencingToken::FIRST);
    /// let week = 7 * 24 * 3600 * 1000;
    /// let first = FencingToken::first_at(Timestamp(1_000));
    /// assert!(FencingToken::first_at(Timestamp(1_000 + week)) > first);
    /// ```
    pub fn first_at(now: Timestamp) -> Self {
        let ms = u64::try_from(now.0).unwrap_or(0);
        let value = ms
            .checked_mul(Self::CLAIMS_PER_MS)
            .and_then(|v| v.checked_add(1))
            .filter(|v| i64::try_from(*v).is_ok())
            .expect("fencing tokens stay below i64::MAX until the year 2262");
        Self(NonZeroU64::new(value).expect("one more than a product is not zero"))
    }

    /// Wraps a stored value; `None` for zero or a negative number.
    pub fn new(value: i64) -> Option<Self> {
        u64::try_from(value)
            .ok()
            .and_then(NonZeroU64::new)
            .map(Self)
    }

    /// The token after this one.
    pub fn next(self) -> Self {
        Self(self.0.checked_add(1).expect("fencing token overflow"))
    }

    /// The value as stored in a signed 64-bit column.
    pub fn get(self) -> i64 {
        i64::try_from(self.0.get()).expect("fencing tokens stay below i64::MAX")
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Who applied the key.
    pub scope: Scope,
    /// The key.
    pub key: IdempotencyKey,
    /// Hash of the payload first seen with this key.
    pub fingerprint: Fingerprint,
    /// In flight, completed or failed.
    pub state: RecordState,
    /// The current fencing token.
    pub token: FencingToken,
    /// When the current claim's lease ends (in-flight records).
    pub lease_until: Option<Timestamp>,
    /// The stored outcome (settled records).
    pub outcome: Option<Outcome>,
    /// When the key was first claimed.
    pub created_at: Timestamp,
    /// When the record last changed.
    pub updated_at: Timestamp,
    /// When the record may be swept.
    pub expires_at: Timestamp,
}

impl Record {
    /// A tombstone read as the record it stands for: the key was used with
    /// `fingerprint`, its window ended at `expired_at`, and its answer is gone.
    /// Only the protocol's decision reads it (it refuses the key while
    /// [`Settings::refuses_late`](crate::Settings::refuses_late) says so); it
    /// is never written back.
    pub fn tombstone(
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        token: FencingToken,
        expired_at: Timestamp,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            state: RecordState::Completed,
            token,
            lease_until: None,
            outcome: None,
            created_at: expired_at,
            updated_at: expired_at,
            expires_at: expired_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_text_round_trips_and_unknown_text_is_named() {
        for state in RecordState::ALL {
            assert_eq!(state.as_str().parse::<RecordState>(), Ok(state));
        }
        let err = "done".parse::<RecordState>().unwrap_err();
        assert!(err.to_string().contains("\"done\""));
    }

    #[test]
    fn each_kind_settles_a_record_in_its_state() {
        assert_eq!(
            RecordState::settled_by(OutcomeKind::Success),
            RecordState::Completed
        );
        assert_eq!(
            RecordState::settled_by(OutcomeKind::TerminalFailure),
            RecordState::Failed
        );
        assert!(
            OutcomeKind::ALL
                .into_iter()
                .all(|kind| RecordState::settled_by(kind).is_settled())
        );
    }

    #[test]
    fn tokens_are_positive_and_grow() {
        assert_eq!(FencingToken::new(0), None);
        assert_eq!(FencingToken::new(-3), None);
        let one = FencingToken::FIRST;
        assert_eq!(one.get(), 1);
        assert!(one.next() > one);
        assert_eq!(FencingToken::new(2), Some(one.next()));
    }

    #[test]
    fn a_later_window_starts_above_every_token_of_an_earlier_one() {
        let start = Timestamp(1_780_000_000_000);
        let retention_ms = 3;
        let mut last = FencingToken::first_at(start);
        for _ in 1..FencingToken::CLAIMS_PER_MS * retention_ms {
            last = last.next();
        }
        let next_window = FencingToken::first_at(Timestamp(start.0 + 3));
        assert!(next_window > last);
        assert_eq!(FencingToken::first_at(Timestamp(-5)), FencingToken::FIRST);
    }
}

/// Settled records generated in bulk by a store's database, for tests and
/// benchmarks that need a full dedupe table (`SqliteStore::seed_records`,
/// `PgStore::seed_records`). A test hook, not part of the protocol: the
/// records are written directly, without the protocol's locks and checks.
///
/// Each record is completed with an empty JSON outcome and a random
/// fingerprint, under key `{tag}-{n}-{random hex}` for `n` in
/// `from..from + count` (so chunks with the same tag never collide), created
/// at a random moment of the `window` before `now`, and expiring `window`
/// after it.
#[derive(Debug, Clone)]
pub struct RecordSeed {
    /// The scope of every record.
    pub scope: Scope,
    /// Distinguishes one run's keys from another's.
    pub tag: String,
    /// The first key's number.
    pub from: i64,
    /// How many records.
    pub count: i64,
    /// The moment the records are made for.
    pub now: Timestamp,
    /// The retention window.
    pub window: std::time::Duration,
}

impl RecordSeed {
    /// The window in milliseconds, as the stores' SQL takes it.
    pub fn window_ms(&self) -> i64 {
        i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX)
    }
}

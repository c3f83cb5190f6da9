//! Errors: the protocol's refusals and the stores' failures.
//!
//! The protocol never sees a driver error type. Each store maps its native
//! errors (SQLite's busy and constraint codes, PostgreSQL's SQLSTATEs) onto one
//! [`ErrorKind`] in exactly one function, and everything above decides on the kind.

use std::fmt;
use std::time::Duration;

use crate::key::{IdempotencyKey, KeyError, Scope};
use crate::record::FencingToken;

/// Why an operation was refused or could not be carried out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key was first used with a different payload. This is the caller's
    /// error, not a retry: nothing was changed.
    #[error(
        "idempotency key {key} in scope {scope} was first used with a different payload; a retry must send the same payload, and a new operation needs a new key"
    )]
    KeyReuse {
        /// Scope of the record.
        scope: Scope,
        /// The reused key.
        key: IdempotencyKey,
    },
    /// Another call with the same key is running right now. Answered at once,
    /// never by waiting on its lock.
    #[error(
        "an operation with idempotency key {key} in scope {scope} is still in flight; retry after {} ms",
        retry_after.as_millis()
    )]
    InFlight {
        /// Scope of the record.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// When a retry has a fair chance of finding the outcome.
        retry_after: Duration,
    },
    /// The key's dedupe window ended, and a tombstone says the key was used:
    /// this is a late retry of an operation that may have been applied, so it
    /// is refused rather than run again. Nothing was changed.
    #[error(
        "idempotency key {key} in scope {scope} expired at {} (its dedupe window ended); a late retry is refused so the operation cannot apply twice; check whether it was applied, and use a new key for a new operation",
        expired_at.rfc3339()
    )]
    Expired {
        /// Scope of the record.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// When the key's window ended.
        expired_at: crate::clock::Timestamp,
    },
    /// The caller's claim was taken over by a newer owner (its lease ended).
    /// Its completion and its effect were rejected. Retrying is wrong: the newer
    /// owner is doing the work.
    #[error(
        "fenced: token {held} for idempotency key {key} in scope {scope} is no longer current{}; a newer owner exists, so this worker must stop and must not retry",
        current.map(|t| format!(" (current token {t})")).unwrap_or_default()
    )]
    Fenced {
        /// Scope of the record.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// The token the caller held.
        held: FencingToken,
        /// The record's current token, where the store knew it without another read.
        current: Option<FencingToken>,
    },
    /// A guarded write carried a token or version that is not newer than the
    /// stored one: a newer owner or a newer version exists. Never retry it.
    #[error(
        "stale write to {target}: it carries {carried}, but {} is stored; a newer owner or a newer version exists, so this write is rejected and must not be retried",
        stored.map_or_else(|| "no row".to_owned(), |s| s.to_string())
    )]
    Stale {
        /// What was written (table, column and row).
        target: String,
        /// The token or version the write carried.
        carried: i64,
        /// The stored token or version, if the row exists.
        stored: Option<i64>,
    },
    /// Somebody else holds a live lease on the resource.
    #[error(
        "resource {resource} is leased to another holder for {} ms more; try again after that",
        retry_after.as_millis()
    )]
    LeaseHeld {
        /// The resource.
        resource: crate::key::Resource,
        /// When the current lease ends.
        retry_after: Duration,
    },
    /// A key or scope broke the rules.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// Whether the same call may succeed if made again later (in flight, or a
    /// transient store failure). Key reuse and fencing are never retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::InFlight { .. } | Self::LeaseHeld { .. } => true,
            Self::Store(e) => e.kind().is_transient(),
            Self::KeyReuse { .. }
            | Self::Expired { .. }
            | Self::Fenced { .. }
            | Self::Stale { .. }
            | Self::InvalidKey(_) => false,
        }
    }

    /// A copy for each caller of a group commit, where one failure answers
    /// many calls: a store error of the same kind (`Other` for anything
    /// else) and the same message, without the driver's error underneath.
    pub fn copy_for_group(&self) -> Error {
        let kind = match self {
            Self::Store(e) => e.kind(),
            _ => ErrorKind::Other,
        };
        StoreError::new(kind, self.to_string()).into()
    }
}

/// What kind of store failure happened, whatever the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A unique constraint was violated.
    UniqueViolation,
    /// The database aborted the transaction to keep it serializable, or found a
    /// deadlock; the transaction may be run again.
    SerializationFailure,
    /// The database is locked by another writer for longer than the busy timeout.
    Busy,
    /// The database cannot be reached or went away.
    Unavailable,
    /// The connection broke while a commit was on its way, so whether the
    /// transaction committed is unknown. Under an idempotency key, running
    /// the operation again is safe and tells: a committed outcome is
    /// replayed, otherwise the operation runs.
    CommitUnknown,
    /// The stored data or schema is not what this version expects.
    Corrupt,
    /// The store was configured wrongly (bad URL, unknown option).
    Config,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Whether a retry of the whole operation may succeed. For
    /// [`CommitUnknown`](Self::CommitUnknown) that holds under an idempotency
    /// key only: without one, a retry may apply the operation twice.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::SerializationFailure | Self::Busy | Self::Unavailable | Self::CommitUnknown
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Self::UniqueViolation => "unique violation",
            Self::SerializationFailure => "serialization failure",
            Self::Busy => "database busy",
            Self::Unavailable => "database unavailable",
            Self::CommitUnknown => "commit outcome unknown",
            Self::Corrupt => "stored data not understood",
            Self::Config => "store configuration error",
            Self::Other => "store error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A store failure, with its kind, a message for people and the driver's error.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct StoreError {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A store error with a message and no underlying cause.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A store error wrapping the driver's error.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether this is a unique violation.
    pub fn is_unique_violation(&self) -> bool {
        self.kind == ErrorKind::UniqueViolation
    }
}

/// The result of an atomic or leased apply whose effect can fail with `E`.
///
/// An effect error is a *retryable* failure: the claim is released (in atomic
/// mode the transaction is rolled back, so nothing was written) and the next
/// retry runs the effect again. A terminal failure is not an error: the effect
/// returns [`Outcome::terminal_failure`](crate::Outcome::terminal_failure), which
/// is stored and replayed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError<E> {
    /// The protocol refused the call or the store failed; the effect did not run
    /// or its transaction was rolled back.
    #[error(transparent)]
    Protocol(#[from] Error),
    /// The effect failed; its transaction was rolled back and the key released.
    #[error("effect failed: {0}")]
    Effect(E),
}

impl<E> ApplyError<E> {
    /// The protocol error, if this is one.
    pub fn protocol(&self) -> Option<&Error> {
        match self {
            Self::Protocol(e) => Some(e),
            Self::Effect(_) => None,
        }
    }
}

impl<E> From<StoreError> for ApplyError<E> {
    fn from(e: StoreError) -> Self {
        Self::Protocol(Error::Store(e))
    }
}

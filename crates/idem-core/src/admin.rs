//! What an operator does to a store by hand, and the audit log that keeps
//! each such action: evict a record, end a stuck claim, discard or archive a
//! dead letter.
//!
//! Every action names what it saw: a record is changed only while it is still
//! the one the operator was shown (same state, token, lease and last change),
//! so a record that moved on in between (completed, renewed, claimed anew) is
//! answered [`RecordAction::Changed`] and left alone. Each action writes one
//! [`AuditEntry`] with who did it, when, and the record or letter as it was,
//! in the same transaction as the change where the store has transactions.
//!
//! Ending a claim ([`AdminStore::release_claim`]) is not the holder's
//! [`release`](crate::LeaseStore::release), which keeps the token: the
//! holder may still be running, so the token is raised by one as the lease
//! is cleared. The holder's completion is then refused as
//! [`Error::Fenced`](crate::Error::Fenced), and the next claim gets the token
//! after the raised one.

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::dead_letter::DeadLetter;
use crate::error::Error;
use crate::key::{IdempotencyKey, Scope};
use crate::record::{Record, RecordState};

/// What an operator did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditAction {
    /// A record removed (`idem keys rm`): the key's next use applies anew.
    Evict,
    /// An in-flight claim ended, its token fenced (`idem keys release`).
    Release,
    /// A dead letter deleted (`idem dlq discard`).
    Discard,
    /// A dead letter set aside (`idem dlq archive`): kept, no longer waiting.
    Archive,
}

impl AuditAction {
    /// Every action.
    pub const ALL: [AuditAction; 4] = [Self::Evict, Self::Release, Self::Discard, Self::Archive];

    /// The text stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evict => "evict",
            Self::Release => "release",
            Self::Discard => "discard",
            Self::Archive => "archive",
        }
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action name that is not one of [`AuditAction::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown audit action {0:?}: expected one of evict, release, discard, archive")]
pub struct UnknownAction(pub String);

impl FromStr for AuditAction {
    type Err = UnknownAction;
    fn from_str(s: &str) -> Result<Self, UnknownAction> {
        Self::ALL
            .into_iter()
            .find(|action| action.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

/// What an action was done to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSubject {
    /// The record of a key.
    Record {
        /// Its scope, as stored (principal hashes stay hashes).
        scope: Scope,
        /// Its key.
        key: IdempotencyKey,
    },
    /// A dead letter.
    DeadLetter {
        /// Its id.
        id: i64,
        /// The message's key.
        key: IdempotencyKey,
    },
}

impl AuditSubject {
    /// The subject of a stored row: a record when it has a scope, a dead
    /// letter when it has a letter id. `Err` says what is wrong with the row.
    pub fn from_columns(
        scope: Option<String>,
        key: String,
        dead_letter: Option<i64>,
    ) -> Result<Self, String> {
        let key = IdempotencyKey::new(key).map_err(|e| e.to_string())?;
        match (scope, dead_letter) {
            (Some(scope), None) => Ok(Self::Record {
                scope: Scope::new(scope).map_err(|e| e.to_string())?,
                key,
            }),
            (None, Some(id)) => Ok(Self::DeadLetter { id, key }),
            _ => Err("names both or neither of a scope and a dead letter".to_owned()),
        }
    }

    /// The columns a row stores: scope, key, dead letter id.
    pub fn columns(&self) -> (Option<&str>, &str, Option<i64>) {
        match self {
            Self::Record { scope, key } => (Some(scope.as_str()), key.as_str(), None),
            Self::DeadLetter { id, key } => (None, key.as_str(), Some(*id)),
        }
    }
}

impl fmt::Display for AuditSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Record { scope, key } => write!(f, "key {key} in scope {scope}"),
            Self::DeadLetter { id, key } => write!(f, "dead letter {id} (key {key})"),
        }
    }
}

/// An action about to be written to the audit log; the store adds the id
/// and the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    /// Who did it (`--actor`, or the operating-system user).
    pub actor: String,
    /// What was done.
    pub action: AuditAction,
    /// To what.
    pub subject: AuditSubject,
    /// The record or letter as it was before, as JSON text
    /// ([`record_json`] or [`dead_letter_json`]).
    pub before: String,
}

impl NewAuditEntry {
    /// The entry for `action` on `record`, as it was.
    pub fn for_record(actor: &str, action: AuditAction, record: &Record) -> Self {
        Self {
            actor: actor.to_owned(),
            action,
            subject: AuditSubject::Record {
                scope: record.scope.clone(),
                key: record.key.clone(),
            },
            before: record_json(record).to_string(),
        }
    }

    /// The entry for `action` on `letter`, as it was.
    pub fn for_dead_letter(actor: &str, action: AuditAction, letter: &DeadLetter) -> Self {
        Self {
            actor: actor.to_owned(),
            action,
            subject: AuditSubject::DeadLetter {
                id: letter.id,
                key: letter.key.clone(),
            },
            before: dead_letter_json(letter).to_string(),
        }
    }

    /// The entry as stored, with its id and time.
    pub fn stored(self, id: i64, at: Timestamp) -> AuditEntry {
        AuditEntry {
            id,
            at,
            actor: self.actor,
            action: self.action,
            subject: self.subject,
            before: self.before,
        }
    }
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its number; later entries have greater ones.
    pub id: i64,
    /// When it was done, by the store's clock.
    pub at: Timestamp,
    /// Who did it.
    pub actor: String,
    /// What was done.
    pub action: AuditAction,
    /// To what.
    pub subject: AuditSubject,
    /// The record or letter as it was before, as JSON text.
    pub before: String,
}

/// What an action on a record found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordAction {
    /// Done, and logged.
    Done(AuditEntry),
    /// There is no record for the key (any more).
    Missing,
    /// The record is no longer the one shown: this is it now. Nothing changed.
    Changed(Record),
    /// (Ending a claim) the record is not an in-flight claim with a lease:
    /// settled, or released already. Nothing changed.
    NotHeld(Record),
}

/// What an action on a dead letter found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterAction {
    /// Done, and logged.
    Done(AuditEntry),
    /// No dead letter has this id.
    Missing,
    /// (Archiving) the letter was archived already, at this time. Nothing changed.
    AlreadyArchived(Timestamp),
}

/// The changes an operator makes by hand, each logged in the store's audit
/// log with `actor` as who did it. Times are the store's clock.
pub trait AdminStore: Send + Sync {
    /// Removes the record `seen` (the record of `seen.scope`, `seen.key`), if
    /// it is still as seen, and logs it as it was. The key's next use is a
    /// new key: its effect runs again.
    fn evict(
        &self,
        seen: &Record,
        actor: &str,
    ) -> impl Future<Output = Result<RecordAction, Error>> + Send;

    /// Ends the in-flight claim `seen`, if it is still as seen and holds a
    /// lease: clears the lease and raises the token by one, so the holder's
    /// completion is refused and the next claim runs at once with a greater
    /// token. Logs the record as it was.
    fn release_claim(
        &self,
        seen: &Record,
        actor: &str,
    ) -> impl Future<Output = Result<RecordAction, Error>> + Send;

    /// Deletes dead letter `id` and logs it as it was.
    fn discard_dead_letter(
        &self,
        id: i64,
        actor: &str,
    ) -> impl Future<Output = Result<LetterAction, Error>> + Send;

    /// Marks dead letter `id` archived (now) and logs it as it was: it stays
    /// in the store, but no longer waits, nor is listed or counted as waiting.
    fn archive_dead_letter(
        &self,
        id: i64,
        actor: &str,
    ) -> impl Future<Output = Result<LetterAction, Error>> + Send;

    /// The newest `limit` entries of the audit log, newest first.
    fn audit_log(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, Error>> + Send;
}

/// Whether the stored record `now` is still the record `seen` an operator
/// was shown: same state, token, lease and last change.
pub fn unchanged(seen: &Record, now: &Record) -> bool {
    now.state == seen.state
        && now.token == seen.token
        && now.lease_until == seen.lease_until
        && now.updated_at == seen.updated_at
}

/// Whether `record` is a claim an operator can end: in flight, with a lease
/// (alive or ended). A claim its holder released has none: it is free already.
pub fn is_held(record: &Record) -> bool {
    record.state == RecordState::InFlight && record.lease_until.is_some()
}

/// A body as text when it is UTF-8, otherwise as hexadecimal digits.
fn body_json(body: &[u8]) -> (&'static str, Value) {
    match std::str::from_utf8(body) {
        Ok(text) => ("body", Value::from(text)),
        Err(_) => (
            "body_hex",
            Value::from(body.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        ),
    }
}

/// A record as JSON, in full, as the audit log keeps it: times in
/// milliseconds since the epoch, the body as text (or `body_hex` when it is
/// not UTF-8).
pub fn record_json(record: &Record) -> Value {
    json!({
        "scope": record.scope.as_str(),
        "key": record.key.as_str(),
        "state": record.state.as_str(),
        "token": record.token.get(),
        "fingerprint": record.fingerprint.to_hex(),
        "lease_until_ms": record.lease_until.map(|t| t.0),
        "created_at_ms": record.created_at.0,
        "updated_at_ms": record.updated_at.0,
        "expires_at_ms": record.expires_at.0,
        "outcome": record.outcome.as_ref().map(|o| {
            let (name, body) = body_json(&o.body);
            json!({ "kind": o.kind.as_str(), "meta": o.meta, name: body })
        }),
    })
}

/// A dead letter as JSON, in full, as the audit log keeps it. The
/// destination is kept as stored; show it through a redaction.
pub fn dead_letter_json(letter: &DeadLetter) -> Value {
    let (name, payload) = body_json(&letter.payload);
    let name = if name == "body" {
        "payload"
    } else {
        "payload_hex"
    };
    json!({
        "id": letter.id,
        "origin": letter.origin,
        "destination": letter.destination,
        "key": letter.key.as_str(),
        name: payload,
        "headers": letter.headers,
        "attempts": letter.attempts,
        "last_error": letter.last_error,
        "first_seen_at_ms": letter.first_seen_at.0,
        "dead_at_ms": letter.dead_at.0,
        "redriven_at_ms": letter.redriven_at.map(|t| t.0),
        "archived_at_ms": letter.archived_at.map(|t| t.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::outcome::Outcome;
    use crate::record::FencingToken;

    fn record() -> Record {
        Record {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::new("k").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"x"),
            state: RecordState::Completed,
            token: FencingToken::new(9).unwrap(),
            lease_until: None,
            outcome: Some(Outcome::success(vec![0xff, 0x01])),
            created_at: Timestamp(1),
            updated_at: Timestamp(2),
            expires_at: Timestamp(3),
        }
    }

    #[test]
    fn actions_round_trip_and_unknown_ones_are_named() {
        for action in AuditAction::ALL {
            assert_eq!(action.as_str().parse::<AuditAction>(), Ok(action));
        }
        assert!(
            "delete"
                .parse::<AuditAction>()
                .unwrap_err()
                .to_string()
                .contains("\"delete\"")
        );
    }

    #[test]
    fn a_binary_body_is_kept_as_hex_and_a_change_is_seen() {
        let seen = record();
        let json = record_json(&seen);
        assert_eq!(json["outcome"]["body_hex"], "ff01");
        assert_eq!(json["token"], 9);
        let mut now = seen.clone();
        assert!(unchanged(&seen, &now));
        now.updated_at = Timestamp(5);
        assert!(!unchanged(&seen, &now));
        assert!(!is_held(&seen));
    }
}

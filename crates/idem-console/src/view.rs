//! Records, dead letters, cause groups and audit entries as the API returns
//! them and the pages show them: times in milliseconds since the epoch,
//! bodies as text and cut to a length, destinations with their passwords
//! removed, scopes as stored (a principal's hash stays a hash). `idem keys
//! --json` and `idem dlq --json` print the same views, bodies whole
//! ([`WHOLE_BODY`]), so an operator's scripts read one shape from the API and
//! from the command line.

use std::collections::BTreeMap;

use idem::{AuditEntry, DeadLetter, Outcome, Record, RecordState, SentMessage, Timestamp};
use idem_broker::dead_letter::{self, CauseGroup};
use idem_broker::publish;
use serde::Serialize;
use utoipa::ToSchema;

/// How much of a body a detail view shows.
pub const DETAIL_BODY: usize = 4096;
/// How much of a body or error a listing shows.
pub const LIST_TEXT: usize = 80;
/// A body shown whole, as the command line prints it for scripts.
pub const WHOLE_BODY: usize = usize::MAX;

/// Headers whose values are credentials: shown as `<redacted>`.
const SECRET_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
];

/// `text` cut to `at` characters, with an ellipsis when it was longer.
pub fn shorten(text: &str, at: usize) -> String {
    if text.chars().count() > at {
        format!(
            "{}…",
            text.chars().take(at.saturating_sub(1)).collect::<String>()
        )
    } else {
        text.to_owned()
    }
}

/// A body as text: UTF-8 as it is (cut to `at` characters), anything else
/// as its length.
fn body_text(body: &[u8], at: usize) -> (String, bool, bool) {
    match std::str::from_utf8(body) {
        Ok(text) => (shorten(text, at), text.chars().count() > at, false),
        Err(_) => (
            format!("<{} bytes of binary data>", body.len()),
            false,
            true,
        ),
    }
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// In flight, the holder's lease still running.
    Alive,
    /// In flight, the lease ended: the next retry takes the key over.
    Expired,
    /// In flight without a lease: its holder released it, the next claim runs at once.
    Released,
    /// Settled: no lease.
    None,
}

/// The stored outcome of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutcomeView {
    /// `success` or `terminal_failure`.
    pub kind: String,
    /// Whether `kind` is `terminal_failure` (the name `idem keys --json`
    /// gives it).
    pub failure: bool,
    /// Stored metadata (status, headers of a stored response).
    pub meta: BTreeMap<String, String>,
    /// The body as text, cut; binary bodies are described by their length.
    pub body: String,
    /// The body's length in bytes.
    pub body_bytes: usize,
    /// Whether `body` was cut.
    pub truncated: bool,
    /// Whether the body is not UTF-8 text.
    pub binary: bool,
}

impl OutcomeView {
    fn of(outcome: &Outcome, at: usize) -> Self {
        let (body, truncated, binary) = body_text(&outcome.body, at);
        Self {
            kind: outcome.kind.as_str().to_owned(),
            failure: outcome.is_failure(),
            meta: outcome.meta.clone(),
            body,
            body_bytes: outcome.body.len(),
            truncated,
            binary,
        }
    }
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RecordView {
    /// Its scope, as stored.
    pub scope: String,
    /// Its key.
    pub key: String,
    /// `in_flight`, `completed` or `failed`.
    pub state: String,
    /// The fencing token of its latest claim.
    pub token: i64,
    /// The payload's fingerprint, in hexadecimal.
    pub fingerprint: String,
    /// Where the lease stands.
    pub lease: LeaseState,
    /// When the lease ends (or ended).
    pub lease_until_ms: Option<i64>,
    /// Milliseconds left on the lease; negative once it ended.
    pub lease_remaining_ms: Option<i64>,
    /// When the key was first claimed.
    pub created_at_ms: i64,
    /// When the record last changed.
    pub updated_at_ms: i64,
    /// When the record leaves the dedupe window.
    pub expires_at_ms: i64,
    /// The stored outcome, once settled.
    pub outcome: Option<OutcomeView>,
}

impl RecordView {
    /// `record` at `now`, its body cut to `body_at` characters.
    pub fn of(record: &Record, now: Timestamp, body_at: usize) -> Self {
        Self {
            scope: record.scope.as_str().to_owned(),
            key: record.key.as_str().to_owned(),
            state: record.state.as_str().to_owned(),
            token: record.token.get(),
            fingerprint: record.fingerprint.to_hex(),
            lease: lease_state(record, now),
            lease_until_ms: record.lease_until.map(|t| t.0),
            lease_remaining_ms: record.lease_until.map(|t| t.0 - now.0),
            created_at_ms: record.created_at.0,
            updated_at_ms: record.updated_at.0,
            expires_at_ms: record.expires_at.0,
            outcome: record.outcome.as_ref().map(|o| OutcomeView::of(o, body_at)),
        }
    }
}

/// Where the lease of `record` stands at `now`.
pub fn lease_state(record: &Record, now: Timestamp) -> LeaseState {
    match (record.state, record.lease_until) {
        (RecordState::InFlight, Some(until)) if until > now => LeaseState::Alive,
        (RecordState::InFlight, Some(_)) => LeaseState::Expired,
        (RecordState::InFlight, None) => LeaseState::Released,
        _ => LeaseState::None,
    }
}

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct LetterView {
    /// Its id.
    pub id: i64,
    /// Who gave up on it.
    pub origin: String,
    /// Where a redrive publishes it, without passwords.
    pub destination: String,
    /// The message's original key.
    pub key: String,
    /// The payload as text, cut; binary payloads are described by their length.
    pub payload: String,
    /// The payload's length in bytes.
    pub payload_bytes: usize,
    /// Whether `payload` was cut.
    pub truncated: bool,
    /// The message headers (credentials redacted).
    pub headers: BTreeMap<String, String>,
    /// Attempts made before it was given up on.
    pub attempts: u32,
    /// The last attempt's error.
    pub last_error: String,
    /// The first line of the last error: what the letter is grouped by.
    pub cause: String,
    /// When the message was first seen.
    pub first_seen_at_ms: i64,
    /// When it was given up on.
    pub dead_at_ms: i64,
    /// When it was last redriven.
    pub redriven_at_ms: Option<i64>,
    /// When an operator archived it.
    pub archived_at_ms: Option<i64>,
    /// Whether it waits for a redrive (neither redriven nor archived).
    pub waiting: bool,
}

impl LetterView {
    /// `letter`, its payload cut to `body_at` characters.
    pub fn of(letter: &DeadLetter, body_at: usize) -> Self {
        let (payload, truncated, _) = body_text(&letter.payload, body_at);
        Self {
            id: letter.id,
            origin: letter.origin.clone(),
            destination: publish::redact(&letter.destination),
            key: letter.key.as_str().to_owned(),
            payload,
            payload_bytes: letter.payload.len(),
            truncated,
            headers: letter
                .headers
                .iter()
                .map(|(name, value)| {
                    let secret = SECRET_HEADERS.contains(&name.to_ascii_lowercase().as_str());
                    let shown = if secret { "<redacted>" } else { value.as_str() };
                    (name.clone(), shown.to_owned())
                })
                .collect(),
            attempts: letter.attempts,
            last_error: letter.last_error.clone(),
            cause: dead_letter::cause(letter).to_owned(),
            first_seen_at_ms: letter.first_seen_at.0,
            dead_at_ms: letter.dead_at.0,
            redriven_at_ms: letter.redriven_at.map(|t| t.0),
            archived_at_ms: letter.archived_at.map(|t| t.0),
            waiting: letter.is_waiting(),
        }
    }
}

/// The letters of one cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct GroupView {
    /// The cause: the first line of the letters' last error.
    pub cause: String,
    /// How many letters.
    pub letters: u64,
    /// How many of them wait for a redrive.
    pub waiting: u64,
    /// Who gave up on them.
    pub origins: Vec<String>,
    /// When the oldest was given up on.
    pub oldest_dead_at_ms: i64,
    /// When the newest was given up on.
    pub newest_dead_at_ms: i64,
}

impl From<&CauseGroup> for GroupView {
    fn from(group: &CauseGroup) -> Self {
        Self {
            cause: group.cause.clone(),
            letters: group.letters,
            waiting: group.waiting,
            origins: group.origins.iter().cloned().collect(),
            oldest_dead_at_ms: group.oldest.0,
            newest_dead_at_ms: group.newest.0,
        }
    }
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AuditView {
    /// Its number.
    pub id: i64,
    /// When it was done.
    pub at_ms: i64,
    /// Who did it.
    pub actor: String,
    /// `evict`, `release`, `discard` or `archive`.
    pub action: String,
    /// The record's scope, for an action on a record.
    pub scope: Option<String>,
    /// The key of the record or of the letter's message.
    pub key: String,
    /// The dead letter's id, for an action on a letter.
    pub dead_letter: Option<i64>,
    /// The record or letter as it was before, as JSON text.
    pub before: String,
}

impl From<&AuditEntry> for AuditView {
    fn from(entry: &AuditEntry) -> Self {
        let (scope, key, dead_letter) = entry.subject.columns();
        Self {
            id: entry.id,
            at_ms: entry.at.0,
            actor: entry.actor.clone(),
            action: entry.action.as_str().to_owned(),
            scope: scope.map(str::to_owned),
            key: key.to_owned(),
            dead_letter,
            before: redact_before(&entry.before),
        }
    }
}

/// A message the outbox relay published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SentView {
    /// The outbox row's id.
    pub id: i64,
    /// Where it went (passwords removed); absent for the relay's default
    /// destination.
    pub destination: Option<String>,
    /// The message's own key.
    pub key: String,
    /// Attempts it took, the successful one included.
    pub attempts: u32,
    /// When it was enqueued.
    pub created_at_ms: i64,
    /// When it was sent.
    pub sent_at_ms: i64,
    /// How long it waited in the outbox, in milliseconds.
    pub waited_ms: i64,
}

impl From<&SentMessage> for SentView {
    fn from(sent: &SentMessage) -> Self {
        Self {
            id: sent.id,
            destination: sent.destination.as_deref().map(publish::redact),
            key: sent.key.as_str().to_owned(),
            attempts: sent.attempts,
            created_at_ms: sent.created_at.0,
            sent_at_ms: sent.sent_at.0,
            waited_ms: sent.sent_at.0.saturating_sub(sent.created_at.0),
        }
    }
}

/// The stored "before" of an audit entry with a letter's destination
/// redacted (the log keeps it as stored).
fn redact_before(before: &str) -> String {
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(before) else {
        return before.to_owned();
    };
    if let Some(destination) = value.get_mut("destination")
        && let Some(text) = destination.as_str()
    {
        *destination = serde_json::Value::from(publish::redact(text));
    }
    value.to_string()
}

/// A time for people: RFC 3339, to the second, in UTC.
pub fn time(ms: i64) -> String {
    humantime::format_rfc3339_seconds(Timestamp(ms).to_system_time()).to_string()
}

/// A duration for people, to the second: `3m 12s`.
pub fn span(ms: i64) -> String {
    let seconds = (ms.max(0) + 999) / 1000;
    humantime::format_duration(std::time::Duration::from_secs(seconds.unsigned_abs())).to_string()
}

#[cfg(test)]
mod tests {
    use idem::{FencingToken, Fingerprint, IdempotencyKey, Scope};

    use super::*;

    /// The names scripts read, from the API and from `idem keys --json`
    /// alike: the outcome says its kind both ways (`kind`, `failure`), and a
    /// whole body is not cut.
    #[test]
    fn a_record_view_carries_the_names_of_the_api_and_of_the_command_line() {
        let record = Record {
            scope: Scope::new("payments").unwrap(),
            key: IdempotencyKey::new("order-1").unwrap(),
            fingerprint: Fingerprint::of_bytes(b"10 EUR"),
            state: RecordState::Failed,
            token: FencingToken::new(3).unwrap(),
            lease_until: None,
            outcome: Some(Outcome::terminal_failure("x".repeat(100))),
            created_at: Timestamp(1),
            updated_at: Timestamp(2),
            expires_at: Timestamp(3),
        };
        let json = serde_json::to_value(RecordView::of(&record, Timestamp(2), WHOLE_BODY)).unwrap();
        for name in [
            "scope",
            "key",
            "state",
            "token",
            "fingerprint",
            "lease",
            "lease_until_ms",
            "lease_remaining_ms",
            "created_at_ms",
            "updated_at_ms",
            "expires_at_ms",
            "outcome",
        ] {
            assert!(json.get(name).is_some(), "no {name} in {json}");
        }
        let outcome = &json["outcome"];
        assert_eq!(outcome["kind"], "terminal_failure");
        assert_eq!(outcome["failure"], true);
        assert_eq!(outcome["body"], "x".repeat(100));
        assert_eq!(outcome["truncated"], false);
        let listed = RecordView::of(&record, Timestamp(2), LIST_TEXT);
        assert!(listed.outcome.unwrap().truncated);
    }
}

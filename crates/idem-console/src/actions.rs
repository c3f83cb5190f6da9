//! What the console does to the store, for the pages and the API alike:
//! evict a record, end a claim, redrive, discard or archive dead letters. Each action takes the
//! record as the operator was shown it (token and last change), so a record
//! that moved on in between is refused with what it is now, and the store
//! logs each eviction, release, discard and archive in its audit log.

use std::collections::{BTreeSet, HashMap};

use idem::{
    AdminStore, AnyStore, AuditEntry, DeadLetterStore, IdempotencyKey, LetterAction, Record,
    RecordAction, RecordState, RecordStore, Scope, Timestamp,
};
use idem_broker::dead_letter::{self, DeadLetter, RedriveError};
use idem_broker::publish::{self, Publisher};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::problem::Problem;

/// The most dead letters a listing, a grouping or a redrive reads.
pub const LETTERS_READ: usize = 100_000;

/// A record as the operator saw it, and who acts on it.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct RecordChange {
    /// The record's scope.
    pub scope: String,
    /// Its key.
    pub key: String,
    /// The token shown.
    pub token: i64,
    /// The last change shown (`updated_at_ms`).
    pub updated_at_ms: i64,
    /// Who acts, for the audit log.
    pub actor: String,
}

/// Which of the two record actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordVerb {
    /// Remove the record: the key's next use applies anew.
    Evict,
    /// End an in-flight claim: its token is fenced, the next claim runs at once.
    Release,
}

/// Parses a scope and key given by a caller.
pub fn scope_and_key(scope: &str, key: &str) -> Result<(Scope, IdempotencyKey), Problem> {
    let scope = Scope::new(scope).map_err(|e| Problem::bad_request(format!("scope: {e}")))?;
    let key = IdempotencyKey::new(key).map_err(|e| Problem::bad_request(format!("key: {e}")))?;
    Ok((scope, key))
}

/// The record of `scope` and `key`, or 404.
pub async fn stored(store: &AnyStore, scope: &str, key: &str) -> Result<Record, Problem> {
    let (scope, key) = scope_and_key(scope, key)?;
    store.get(&scope, &key).await?.ok_or_else(|| {
        Problem::not_found(format!(
            "no record for key {key} in scope {scope} (evicted, swept, or never claimed)"
        ))
    })
}

/// Evicts or releases the record `change` names, if it is still as shown;
/// `actor` is who, as the audit log keeps it.
pub async fn change_record(
    store: &AnyStore,
    verb: RecordVerb,
    change: &RecordChange,
    actor: &str,
) -> Result<AuditEntry, Problem> {
    let record = stored(store, &change.scope, &change.key).await?;
    let at = format!("key {} in scope {}", record.key, record.scope);
    if record.token.get() != change.token || record.updated_at.0 != change.updated_at_ms {
        return Err(changed(&at, &record));
    }
    if verb == RecordVerb::Release && !idem::is_held(&record) {
        return Err(not_held(&at, &record));
    }
    let answer = match verb {
        RecordVerb::Evict => store.evict(&record, actor).await?,
        RecordVerb::Release => store.release_claim(&record, actor).await?,
    };
    match answer {
        RecordAction::Done(entry) => Ok(entry),
        RecordAction::Missing => Err(Problem::not_found(format!(
            "the record of {at} is gone already; nothing changed"
        ))),
        RecordAction::Changed(now) => Err(changed(&at, &now)),
        RecordAction::NotHeld(now) => Err(not_held(&at, &now)),
    }
}

fn changed(at: &str, now: &Record) -> Problem {
    Problem::conflict(format!(
        "the record of {at} changed since it was shown (it is {} now, token {}); nothing changed: look at it again and decide anew",
        now.state, now.token
    ))
}

fn not_held(at: &str, record: &Record) -> Problem {
    if record.state == RecordState::InFlight {
        Problem::conflict(format!(
            "the claim on {at} was released already (token {}): the next claim takes the key at once",
            record.token
        ))
    } else {
        Problem::conflict(format!(
            "{at} is {}, not in flight: there is no claim to end",
            record.state
        ))
    }
}

/// Which dead letters: every condition given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LetterFilter {
    /// Only letters from this origin (exactly).
    pub origin: Option<String>,
    /// Only letters whose last error contains this text (any case).
    pub error: Option<String>,
    /// Only letters of this cause (the first line of the last error, exactly).
    pub cause: Option<String>,
    /// Only letters dead for at least this many seconds.
    pub min_age_s: Option<u64>,
    /// Only letters dead for at most this many seconds.
    pub max_age_s: Option<u64>,
    /// Letters already redriven or archived too.
    #[serde(default)]
    pub all: Option<bool>,
}

impl LetterFilter {
    /// Whether `letter` passes, at `now`.
    pub fn admits(&self, letter: &DeadLetter, now: Timestamp) -> bool {
        let age = letter.dead_at.until(now).as_secs();
        fn given(field: &Option<String>) -> Option<&str> {
            field.as_deref().filter(|text| !text.is_empty())
        }
        given(&self.origin).is_none_or(|origin| letter.origin == origin)
            && given(&self.error).is_none_or(|text| {
                letter
                    .last_error
                    .to_lowercase()
                    .contains(&text.to_lowercase())
            })
            && given(&self.cause).is_none_or(|cause| dead_letter::cause(letter) == cause)
            && self.min_age_s.is_none_or(|min| age >= min)
            && self.max_age_s.is_none_or(|max| age <= max)
    }

    /// Whether any condition is set.
    pub fn is_empty(&self) -> bool {
        let unset = |field: &Option<String>| field.as_deref().is_none_or(str::is_empty);
        unset(&self.origin)
            && unset(&self.error)
            && unset(&self.cause)
            && self.min_age_s.is_none()
            && self.max_age_s.is_none()
    }

    /// The filter as a query string, for links.
    pub fn query(&self) -> String {
        serde_urlencoded::to_string(self).unwrap_or_default()
    }
}

/// The letters `filter` admits at `now`, oldest first.
pub async fn letters(
    store: &AnyStore,
    filter: &LetterFilter,
    now: Timestamp,
) -> Result<Vec<DeadLetter>, Problem> {
    Ok(store
        .list_dead_letters(LETTERS_READ, filter.all.unwrap_or(false))
        .await?
        .into_iter()
        .filter(|letter| filter.admits(letter, now))
        .collect())
}

/// What a redrive of a set would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RedrivePlan {
    /// How many letters would be published again.
    pub letters: usize,
    /// Their ids.
    pub ids: Vec<i64>,
    /// Where they would go (passwords removed).
    pub destinations: Vec<String>,
    /// What a redrive does, in words.
    pub effect: String,
}

/// The words for what a redrive does.
pub const REDRIVE_EFFECT: &str = "each letter is published again to its stored destination with its original idempotency key, then marked redriven; a consumer that applied the message already drops it as a duplicate";

impl RedrivePlan {
    /// The plan for the waiting ones among `letters`.
    pub fn of(letters: &[DeadLetter]) -> Self {
        let waiting: Vec<&DeadLetter> = letters.iter().filter(|l| l.is_waiting()).collect();
        let destinations: BTreeSet<String> = waiting
            .iter()
            .map(|l| publish::redact(&l.destination))
            .collect();
        Self {
            letters: waiting.len(),
            ids: waiting.iter().map(|l| l.id).collect(),
            destinations: destinations.into_iter().collect(),
            effect: REDRIVE_EFFECT.to_owned(),
        }
    }
}

/// A letter a redrive could not publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RedriveFailure {
    /// The letter.
    pub id: i64,
    /// Why; it stays waiting.
    pub error: String,
}

/// What a redrive did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct RedriveReport {
    /// The letters published again and marked redriven.
    pub redriven: Vec<i64>,
    /// The letters that stay waiting, and why.
    pub failed: Vec<RedriveFailure>,
}

/// Redrives `letters`, one connection per destination.
pub async fn redrive(store: &AnyStore, letters: &[DeadLetter]) -> RedriveReport {
    let mut publishers: HashMap<&str, Publisher> = HashMap::new();
    let mut report = RedriveReport::default();
    for letter in letters {
        let published = async {
            if !publishers.contains_key(letter.destination.as_str()) {
                let destination = dead_letter::destination(letter)?;
                let publisher = publish::connect(&destination).await.map_err(|error| {
                    RedriveError::Publish {
                        id: letter.id,
                        error,
                    }
                })?;
                publishers.insert(letter.destination.as_str(), publisher);
            }
            dead_letter::redrive_with(store, letter, &publishers[letter.destination.as_str()]).await
        }
        .await;
        match published {
            Ok(()) => report.redriven.push(letter.id),
            Err(error) => report.failed.push(RedriveFailure {
                id: letter.id,
                error: idem::error_chain(&error),
            }),
        }
    }
    report
}

/// Redrives dead letter `id` (waiting or not: the operator asked for it).
pub async fn redrive_one(store: &AnyStore, id: i64) -> Result<RedriveReport, Problem> {
    let letter = store
        .get_dead_letter(id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("no dead letter with id {id}")))?;
    Ok(redrive(store, std::slice::from_ref(&letter)).await)
}

/// Which of the two ways to set a dead letter aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SetAside {
    /// Delete the letter for good.
    Discard,
    /// Keep the letter, no longer waiting.
    Archive,
}

impl SetAside {
    /// The verb, as paths and the audit log name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Discard => "discard",
            Self::Archive => "archive",
        }
    }

    /// The past participle, for reports.
    pub fn done(self) -> &'static str {
        match self {
            Self::Discard => "discarded",
            Self::Archive => "archived",
        }
    }

    /// What it does to each letter, in words.
    pub fn effect(self) -> &'static str {
        match self {
            Self::Discard => {
                "each letter is deleted for good and can never be redriven; the letter as it was is kept in the audit log"
            }
            Self::Archive => {
                "each letter is kept but no longer waits: it is not redriven, counted or listed as waiting (the filter's \"redriven and archived too\" shows it); the letter as it was is kept in the audit log"
            }
        }
    }
}

/// What discarding or archiving a set would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SetAsidePlan {
    /// `discard` or `archive`.
    pub action: SetAside,
    /// How many letters.
    pub letters: usize,
    /// Their ids.
    pub ids: Vec<i64>,
    /// What it does, in words.
    pub effect: String,
}

impl SetAsidePlan {
    /// The plan for the waiting ones among `letters`.
    pub fn of(action: SetAside, letters: &[DeadLetter]) -> Self {
        let ids: Vec<i64> = letters
            .iter()
            .filter(|l| l.is_waiting())
            .map(|l| l.id)
            .collect();
        Self {
            action,
            letters: ids.len(),
            ids,
            effect: action.effect().to_owned(),
        }
    }
}

/// A letter a discard or archive left as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SetAsideSkip {
    /// The letter.
    pub id: i64,
    /// Why it was left.
    pub reason: String,
}

/// What a discard or archive of several letters did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SetAsideReport {
    /// `discard` or `archive`.
    pub action: SetAside,
    /// The audit entries written, one per letter set aside.
    pub done: Vec<crate::view::AuditView>,
    /// The letters left as they were, and why.
    pub skipped: Vec<SetAsideSkip>,
}

/// Discards or archives dead letter `id`; `actor` is who, as the audit log
/// keeps it. A letter that is gone is 404, one archived already 409.
pub async fn set_aside_one(
    store: &AnyStore,
    action: SetAside,
    id: i64,
    actor: &str,
) -> Result<AuditEntry, Problem> {
    let answer = match action {
        SetAside::Discard => store.discard_dead_letter(id, actor).await?,
        SetAside::Archive => store.archive_dead_letter(id, actor).await?,
    };
    match answer {
        LetterAction::Done(entry) => Ok(entry),
        LetterAction::Missing => Err(Problem::not_found(format!(
            "no dead letter with id {id} (discarded already, or never recorded); nothing changed"
        ))),
        LetterAction::AlreadyArchived(at) => Err(Problem::conflict(format!(
            "dead letter {id} was archived already, at {}; nothing changed",
            crate::view::time(at.0)
        ))),
    }
}

/// Discards or archives each of `ids` that still waits; the others are
/// left as they are, with the reason.
pub async fn set_aside(
    store: &AnyStore,
    action: SetAside,
    ids: &[i64],
    actor: &str,
) -> Result<SetAsideReport, Problem> {
    if ids.len() > LETTERS_READ {
        return Err(Problem::bad_request(format!(
            "at most {LETTERS_READ} letters at a time"
        )));
    }
    let mut report = SetAsideReport {
        action,
        done: Vec::new(),
        skipped: Vec::new(),
    };
    for &id in ids {
        let waiting = store
            .get_dead_letter(id)
            .await?
            .is_some_and(|letter| letter.is_waiting());
        if !waiting {
            report.skipped.push(SetAsideSkip {
                id,
                reason: "no longer waiting (redriven, archived or discarded since)".to_owned(),
            });
            continue;
        }
        match set_aside_one(store, action, id, actor).await {
            Ok(entry) => report.done.push(crate::view::AuditView::from(&entry)),
            Err(problem) if problem.status().is_client_error() => {
                report.skipped.push(SetAsideSkip {
                    id,
                    reason: problem.detail,
                });
            }
            Err(problem) => return Err(problem),
        }
    }
    Ok(report)
}

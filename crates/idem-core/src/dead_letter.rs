//! Dead letters: messages given up on after their attempts ran out, kept in
//! the store with their original key so that a redrive after a fix is still
//! deduplicated by whoever receives it.
//!
//! Why the contract lives here rather than with the broker code that records
//! letters: the table is the store's (it is created by the store's own
//! migrations, next to the records), and the outbox relay, the consumers and
//! the `idem dlq` command all reach it through [`DeadLetterStore`], whatever
//! the database. The destination is kept as the text the publisher parses
//! (`amqp://…`, `nats://…`, `http(s)://…`); what it means is the broker's
//! business, not the store's.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::{Error, ErrorKind, StoreError};
use crate::key::IdempotencyKey;

/// A dead letter about to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// Who gave up on it, for people: `"relay"`, `"consumer amqp queue orders"`.
    pub origin: String,
    /// Where a redrive publishes it, as a destination URL.
    pub destination: String,
    /// The message's original idempotency key, kept for the redrive.
    pub key: IdempotencyKey,
    /// The message body.
    pub payload: Vec<u8>,
    /// The message headers.
    pub headers: BTreeMap<String, String>,
    /// How many attempts were made.
    pub attempts: u32,
    /// The last attempt's error, for people.
    pub last_error: String,
    /// When the message was first seen (enqueued, or first delivered).
    pub first_seen_at: Timestamp,
}

/// A recorded dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its number in the table, for `idem dlq show ID` and `redrive ID`.
    pub id: i64,
    /// Who gave up on it.
    pub origin: String,
    /// Where a redrive publishes it, as a destination URL.
    pub destination: String,
    /// The original key.
    pub key: IdempotencyKey,
    /// The message body.
    pub payload: Vec<u8>,
    /// The message headers.
    pub headers: BTreeMap<String, String>,
    /// How many attempts were made.
    pub attempts: u32,
    /// The last attempt's error.
    pub last_error: String,
    /// When the message was first seen.
    pub first_seen_at: Timestamp,
    /// When it was recorded here.
    pub dead_at: Timestamp,
    /// When it was last redriven, if ever.
    pub redriven_at: Option<Timestamp>,
    /// When an operator archived it (`idem dlq archive`), if ever: kept, but
    /// no longer waiting.
    pub archived_at: Option<Timestamp>,
}

impl DeadLetter {
    /// Whether it still waits for a redrive: neither redriven nor archived.
    pub fn is_waiting(&self) -> bool {
        self.redriven_at.is_none() && self.archived_at.is_none()
    }
}

/// How many dead letters wait, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadLetterStats {
    /// Letters neither redriven nor archived.
    pub waiting: u64,
    /// Letters redriven and not archived (kept until the retention ends).
    pub redriven: u64,
    /// Letters archived by an operator (kept until the retention ends).
    pub archived: u64,
    /// When the oldest waiting letter was recorded.
    pub oldest_waiting: Option<Timestamp>,
}

/// The dead-letter table of a store. Times are the store's clock.
///
/// Recording is a local commit: [`record_dead_letter`](Self::record_dead_letter)
/// returns only once the letter is durable, so a consumer may ack the message
/// it gave up on right after.
pub trait DeadLetterStore: Send + Sync {
    /// Records a dead letter; returns its id once it is committed.
    fn record_dead_letter(
        &self,
        letter: &NewDeadLetter,
    ) -> impl Future<Output = Result<i64, Error>> + Send;

    /// The oldest `limit` dead letters (by id): the waiting ones, or with
    /// `include_redriven` every one (redriven and archived too).
    fn list_dead_letters(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// One dead letter.
    fn get_dead_letter(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetter>, Error>> + Send;

    /// Notes that the letter was redriven (now). Marking a letter twice keeps
    /// the latest time; an unknown id is an error.
    fn mark_redriven(&self, id: i64) -> impl Future<Output = Result<(), Error>> + Send;

    /// Counts for metrics and `idem dlq ls`.
    fn dead_letter_stats(&self) -> impl Future<Output = Result<DeadLetterStats, Error>> + Send;

    /// Deletes at most `limit` letters recorded more than `retention` ago
    /// (waiting or redriven); returns how many.
    fn sweep_dead_letters(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}

/// The answer of [`DeadLetterStore::mark_redriven`] for an id no dead letter
/// has.
pub fn no_such_dead_letter(id: i64) -> Error {
    StoreError::new(
        ErrorKind::Other,
        format!("no dead letter with id {id}; `idem dlq ls` lists them"),
    )
    .into()
}

//! Dead letters: messages that could not be delivered or applied after N
//! attempts (5 by default), kept with their original key so a redrive after a
//! fix is still deduped by the consumer.
//!
//! Why a table in the store and not only a broker dead-letter queue: the
//! dead letters of the outbox relay, of the RabbitMQ consumer and of the NATS
//! consumer all end up in one place that `idem dlq` can list, show and redrive,
//! whatever the transport, and recording one is a local commit that cannot be
//! lost between "give up" and "ack". [`DeadLetters::record`] returns only after
//! the commit, so a consumer acks a poison message only once its dead letter is
//! durable: dead-lettering is at-least-once (a crash between record and ack
//! records it twice, two rows with the same key; a redrive of both is deduped
//! by the key).
//!
//! A redrive ([`redrive`]) publishes the stored payload to the stored
//! destination with the **original key**, then marks the letter redriven. A
//! crash between the two redrives it again on the next attempt; the key makes
//! that harmless.
//!
//! Dead letters are swept after the retention (7 days by default, the dedupe
//! window): a redrive later than the consumer's dedupe window could no longer
//! be recognised as a duplicate, so the letters do not outlive it by default.
//!
//! Modules: the types, the [`DeadLetters`] trait and [`redrive`] here; every
//! SQL statement on the `idem_dead_letters` table in `table`.

pub(crate) mod table;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use idem_core::{Error, IdempotencyKey, Timestamp};

use crate::publish::{self, Destination, Message, Publish, PublishError};

/// A dead letter about to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// Who gave up on it, for people: `"relay"`, `"consumer amqp queue orders"`.
    pub origin: String,
    /// Where a redrive publishes it.
    pub destination: Destination,
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
    /// Where a redrive publishes it.
    pub destination: Destination,
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
}

impl DeadLetter {
    /// The message to publish on a redrive: the original key, payload and headers.
    pub fn message(&self) -> Message {
        Message {
            key: self.key.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
        }
    }
}

/// The dead-letter table of a store. Implemented by [`idem::SqliteStore`],
/// [`idem::PgStore`] and [`idem::AnyStore`]; the table is created on first use.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{IdempotencyKey, SqliteStore, Timestamp};
/// use idem_broker::dead_letter::{DeadLetters, NewDeadLetter};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let id = store
///     .record(&NewDeadLetter {
///         origin: "consumer amqp queue orders".into(),
///         destination: "amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders".parse()?,
///         key: IdempotencyKey::new("order-42/created")?,
///         payload: b"{}".to_vec(),
///         headers: Default::default(),
///         attempts: 5,
///         last_error: "handler failed: no such customer".into(),
///         first_seen_at: Timestamp(1_750_000_000_000),
///     })
///     .await?;
/// let letter = store.get(id).await?.expect("just recorded");
/// assert_eq!(letter.key.as_str(), "order-42/created");
/// assert_eq!(store.list(10, false).await?.len(), 1);
/// store.mark_redriven(id).await?;
/// assert!(store.list(10, false).await?.is_empty());
/// assert_eq!(store.list(10, true).await?.len(), 1);
/// # Ok(()) }
/// ```
pub trait DeadLetters: Send + Sync {
    /// Records a dead letter; returns its id once it is committed.
    fn record(&self, letter: &NewDeadLetter) -> impl Future<Output = Result<i64, Error>> + Send;

    /// The oldest `limit` dead letters (by id), without the redriven ones
    /// unless `include_redriven`.
    fn list(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// One dead letter.
    fn get(&self, id: i64) -> impl Future<Output = Result<Option<DeadLetter>, Error>> + Send;

    /// Notes that the letter was redriven (now). Marking a letter twice keeps
    /// the latest time; an unknown id is an error.
    fn mark_redriven(&self, id: i64) -> impl Future<Output = Result<(), Error>> + Send;
}

/// How many dead letters wait, and since when: the dead-letter queue's depth
/// and oldest age, which [`observe_stats`] reports as gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadLetterStats {
    /// Letters not redriven yet.
    pub waiting: u64,
    /// Letters already redriven (kept until the retention ends).
    pub redriven: u64,
    /// When the oldest waiting letter was recorded.
    pub oldest_waiting: Option<Timestamp>,
}

/// Upkeep of the dead-letter table: counts and retention.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem::SqliteStore;
/// use idem_broker::dead_letter::DeadLetterUpkeep;
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let stats = store.stats().await?;
/// assert_eq!((stats.waiting, stats.oldest_waiting), (0, None));
/// assert_eq!(store.sweep_dead_letters(Duration::from_secs(7 * 24 * 3600), 1000).await?, 0);
/// # Ok(()) }
/// ```
pub trait DeadLetterUpkeep: Send + Sync {
    /// Counts for metrics and `idem dlq ls`.
    fn stats(&self) -> impl Future<Output = Result<DeadLetterStats, Error>> + Send;

    /// Deletes at most `limit` letters recorded more than `retention` ago
    /// (waiting or redriven); returns how many.
    fn sweep_dead_letters(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;
}

/// Reports the DLQ depth and oldest age as gauges (`dead_letters`,
/// `dead_letter_oldest_age_seconds`).
pub fn observe_stats(stats: &DeadLetterStats, now: Timestamp) {
    metrics::gauge!("dead_letters").set(stats.waiting as f64);
    let age = stats
        .oldest_waiting
        .map_or(0.0, |oldest| oldest.until(now).as_secs_f64());
    metrics::gauge!("dead_letter_oldest_age_seconds").set(age);
}

/// Why a redrive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// No dead letter has this id.
    #[error("no dead letter with id {0}; `idem dlq ls` lists them")]
    NotFound(i64),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] Error),
    /// The publish failed; the letter stays waiting.
    #[error("dead letter {id} was not redriven: {error}")]
    Publish {
        /// The letter.
        id: i64,
        /// Why.
        #[source]
        error: PublishError,
    },
}

/// Publishes letter `id` to its stored destination with its original key,
/// then marks it redriven. A letter already redriven is published again (the
/// operator asked for it; the key keeps it from being applied twice).
pub async fn redrive<S: DeadLetters>(store: &S, id: i64) -> Result<DeadLetter, RedriveError> {
    let letter = store.get(id).await?.ok_or(RedriveError::NotFound(id))?;
    let publisher = publish::connect(&letter.destination)
        .await
        .map_err(|error| RedriveError::Publish { id, error })?;
    redrive_with(store, &letter, &publisher).await?;
    Ok(letter)
}

/// Publishes `letter` with `publisher` (already connected to its destination)
/// and marks it redriven: for redriving many letters over one connection.
pub async fn redrive_with<S: DeadLetters, P: Publish>(
    store: &S,
    letter: &DeadLetter,
    publisher: &P,
) -> Result<(), RedriveError> {
    publisher
        .publish(&letter.message())
        .await
        .map_err(|error| RedriveError::Publish {
            id: letter.id,
            error,
        })?;
    store.mark_redriven(letter.id).await?;
    metrics::counter!("dead_letters_redriven_total").increment(1);
    tracing::info!(
        id = letter.id,
        destination = %letter.destination.redacted(),
        "dead letter redriven with its original key"
    );
    Ok(())
}

//! Dead letters: messages that could not be delivered or applied after N
//! attempts (5 by default), kept with their original key so a redrive after a
//! fix is still deduped by the consumer.
//!
//! Why a table in the store and not only a broker dead-letter queue: the
//! dead letters of the outbox relay, of the RabbitMQ consumer and of the NATS
//! consumer all end up in one place that `idem dlq` can list, show and redrive,
//! whatever the transport, and recording one is a local commit that cannot be
//! lost between "give up" and "ack". [`DeadLetterStore::record_dead_letter`] returns only after
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
//! The table itself is the store's: its contract is
//! [`DeadLetterStore`] in `idem-core`, its SQL and migration in the store
//! crates. This module is what the broker adds: the redrive, and the gauges.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{IdempotencyKey, SqliteStore, Timestamp};
//! use idem_broker::dead_letter::{DeadLetterStore, NewDeadLetter};
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("idem.db")).await?;
//! let id = store
//!     .record_dead_letter(&NewDeadLetter {
//!         origin: "consumer amqp queue orders".into(),
//!         destination: "amqp://guest:guest@127.0.0.1:5672/%2f?queue=orders".into(),
//!         key: IdempotencyKey::new("order-42/created")?,
//!         payload: b"{}".to_vec(),
//!         headers: Default::default(),
//!         attempts: 5,
//!         last_error: "handler failed: no such customer".into(),
//!         first_seen_at: Timestamp(1_750_000_000_000),
//!     })
//!     .await?;
//! let letter = store.get_dead_letter(id).await?.expect("just recorded");
//! assert_eq!(letter.key.as_str(), "order-42/created");
//! assert_eq!(store.list_dead_letters(10, false).await?.len(), 1);
//! store.mark_redriven(id).await?;
//! assert!(store.list_dead_letters(10, false).await?.is_empty());
//! assert_eq!(store.dead_letter_stats().await?.redriven, 1);
//! # Ok(()) }
//! ```

use idem_core::Timestamp;

pub use idem_core::{DeadLetter, DeadLetterStats, DeadLetterStore, NewDeadLetter};

use crate::publish::{self, Destination, Message, Publish, PublishError};

impl From<&DeadLetter> for Message {
    /// The message a redrive publishes: the original key, payload and headers.
    fn from(letter: &DeadLetter) -> Self {
        Message {
            key: letter.key.clone(),
            payload: letter.payload.clone(),
            headers: letter.headers.clone(),
        }
    }
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

/// What a letter died of: the first line of its last error, which names the
/// failure without the details that differ from one letter to the next.
pub fn cause(letter: &DeadLetter) -> &str {
    match letter.last_error.lines().next().map(str::trim) {
        Some(line) if !line.is_empty() => line,
        _ => "(no error text)",
    }
}

/// The letters of one [`cause`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CauseGroup {
    /// The cause.
    pub cause: String,
    /// How many letters.
    pub letters: u64,
    /// How many of them still wait (neither redriven nor archived).
    pub waiting: u64,
    /// Who gave up on them.
    pub origins: std::collections::BTreeSet<String>,
    /// When the oldest was recorded.
    pub oldest: Timestamp,
    /// When the newest was recorded.
    pub newest: Timestamp,
}

/// `letters` by [`cause`], the largest group first (then by cause).
pub fn group_by_cause(letters: &[DeadLetter]) -> Vec<CauseGroup> {
    let mut groups: std::collections::BTreeMap<&str, CauseGroup> = Default::default();
    for letter in letters {
        let group = groups.entry(cause(letter)).or_insert_with(|| CauseGroup {
            cause: cause(letter).to_owned(),
            letters: 0,
            waiting: 0,
            origins: Default::default(),
            oldest: letter.dead_at,
            newest: letter.dead_at,
        });
        group.letters += 1;
        group.waiting += u64::from(letter.is_waiting());
        group.origins.insert(letter.origin.clone());
        group.oldest = group.oldest.min(letter.dead_at);
        group.newest = group.newest.max(letter.dead_at);
    }
    let mut groups: Vec<CauseGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.letters
            .cmp(&a.letters)
            .then_with(|| a.cause.cmp(&b.cause))
    });
    groups
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
    Store(#[from] idem_core::Error),
    /// The publish failed (or the stored destination does not parse); the
    /// letter stays waiting.
    #[error("dead letter {id} was not redriven: {error}")]
    Publish {
        /// The letter.
        id: i64,
        /// Why.
        #[source]
        error: PublishError,
    },
}

/// Where a redrive of `letter` publishes it: its stored destination, parsed.
pub fn destination(letter: &DeadLetter) -> Result<Destination, RedriveError> {
    letter
        .destination
        .parse()
        .map_err(|error: publish::DestinationError| RedriveError::Publish {
            id: letter.id,
            error: error.into(),
        })
}

/// Publishes letter `id` to its stored destination with its original key,
/// then marks it redriven. A letter already redriven is published again (the
/// operator asked for it; the key keeps it from being applied twice).
pub async fn redrive<S: DeadLetterStore>(store: &S, id: i64) -> Result<DeadLetter, RedriveError> {
    let letter = store
        .get_dead_letter(id)
        .await?
        .ok_or(RedriveError::NotFound(id))?;
    let publisher = publish::connect(&destination(&letter)?)
        .await
        .map_err(|error| RedriveError::Publish { id, error })?;
    redrive_with(store, &letter, &publisher).await?;
    Ok(letter)
}

/// Publishes `letter` with `publisher` (already connected to its destination)
/// and marks it redriven: for redriving many letters over one connection.
pub async fn redrive_with<S: DeadLetterStore, P: Publish>(
    store: &S,
    letter: &DeadLetter,
    publisher: &P,
) -> Result<(), RedriveError> {
    publisher
        .publish(&Message::from(letter))
        .await
        .map_err(|error| RedriveError::Publish {
            id: letter.id,
            error,
        })?;
    store.mark_redriven(letter.id).await?;
    metrics::counter!("dead_letters_redriven_total").increment(1);
    tracing::info!(
        id = letter.id,
        destination = %publish::redact(&letter.destination),
        "dead letter redriven with its original key"
    );
    Ok(())
}

//! What becomes of a delivery once its apply answered: acked, given back
//! after a jittered delay, or dead-lettered (committed) and then acked.
//!
//! | apply answered | the runtime |
//! | --- | --- |
//! | applied now, or replayed (a duplicate) | acks |
//! | `InFlight` (a duplicate being applied right now elsewhere) | retries locally for up to the patience, then gives it back; not a failed attempt |
//! | a transient store failure | retries locally a few times, then gives it back; not a failed attempt |
//! | `KeyReuse` (the key came with another payload) | dead-letters it at once, then acks |
//! | the effect failed | counts the attempt; gives it back after a jittered delay, or after the last attempt dead-letters it, then acks |
//! | no key in the message | dead-letters it with the reason, then acks (or keys it by its coordinates, if so configured) |

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Applied, AttemptStore, DeadLetterStore, Fingerprint, IdempotencyKey, NewDeadLetter, Timestamp,
    crash,
};
use rand::Rng;

use super::apply::Apply;
use super::config::Checkpoint;
use super::error::{ConsumeError, Failure};
use super::message::{KeyedMessage, Message};
use super::runtime::Shared;
use super::stats::Settled;
use super::transport::{Settle, TransportError};

impl<A: Apply> Shared<A> {
    /// Acks, gives back or dead-letters, according to the answer.
    pub(crate) async fn settle<S: Settle>(
        &self,
        keyed: Arc<KeyedMessage>,
        answer: Result<Applied, Failure>,
        settle: &S,
    ) -> Result<(), ConsumeError> {
        match answer {
            Ok(applied) => {
                self.reached(Checkpoint::AfterCommit);
                let terminal = applied.outcome().is_failure();
                if terminal && !applied.is_replay() && self.config.dead_letter_terminal_failures {
                    let reason = format!(
                        "terminal failure: {}",
                        String::from_utf8_lossy(&applied.outcome().body)
                    );
                    let attempts = keyed.message.delivery_count.unwrap_or(1);
                    return self
                        .dead_letter(
                            keyed.key.clone(),
                            &keyed.message,
                            attempts,
                            reason,
                            None,
                            settle,
                        )
                        .await;
                }
                crash::point(crash::BEFORE_ACK);
                self.ack(settle).await;
                if applied.is_replay() {
                    self.replayed(&keyed).await;
                    self.settled(Settled::Replayed);
                } else {
                    tracing::debug!("applied, committed and acked");
                    self.settled(Settled::Applied);
                }
                Ok(())
            }
            Err(Failure::Busy { retry_after }) => {
                tracing::info!("another consumer holds this key; given back for redelivery");
                self.requeue(settle, retry_after).await
            }
            Err(Failure::Unavailable { error }) => {
                tracing::warn!(%error, "the store is unavailable; message given back for redelivery");
                let delay = self.redelivery_delay(1, None);
                self.requeue(settle, delay).await
            }
            Err(Failure::KeyReuse { error }) => {
                let attempts = keyed.message.delivery_count.unwrap_or(1);
                self.dead_letter(
                    keyed.key.clone(),
                    &keyed.message,
                    attempts,
                    error,
                    None,
                    settle,
                )
                .await
            }
            Err(Failure::Failed { error, hint }) => self.failed(&keyed, error, hint, settle).await,
        }
    }

    /// A failed attempt: counted; given back, or dead-lettered after the last.
    async fn failed<S: Settle>(
        &self,
        keyed: &KeyedMessage,
        error: String,
        hint: Option<Duration>,
        settle: &S,
    ) -> Result<(), ConsumeError> {
        let store = self.apply.store();
        let failures = match store.record_failure(&keyed.scope, &keyed.key, &error).await {
            Ok(failures) => failures,
            Err(store_error) => {
                tracing::warn!(%error, %store_error, "the effect failed and the failure could not be counted; given back for redelivery");
                let delay = self.redelivery_delay(1, hint);
                return self.requeue(settle, delay).await;
            }
        };
        let attempts = failures
            .count
            .max(keyed.message.delivery_count.unwrap_or(0));
        if attempts >= self.config.max_attempts {
            return self
                .dead_letter(
                    keyed.key.clone(),
                    &keyed.message,
                    attempts,
                    error,
                    Some(failures.first_at),
                    settle,
                )
                .await;
        }
        tracing::info!(attempt = attempts, max = self.config.max_attempts, %error, "the effect failed; given back for redelivery");
        let delay = self.redelivery_delay(attempts, hint);
        self.requeue(settle, delay).await
    }

    /// The delay before redelivery after `attempts` failures: a full-jitter
    /// draw, at least the failure's own hint, the longest delay when the
    /// retry budget is spent.
    fn redelivery_delay(&self, attempts: u32, hint: Option<Duration>) -> Duration {
        let backoff = &self.config.redelivery;
        if let Some(budget) = &self.config.budget
            && let Err(exhausted) = budget.try_withdraw()
        {
            tracing::warn!(%exhausted, "redelivery delayed to the backoff cap");
            return backoff.cap().max(hint.unwrap_or_default());
        }
        let drawn = jitter(backoff.ceiling(attempts.saturating_sub(1)));
        drawn.max(hint.unwrap_or_default())
    }

    async fn requeue<S: Settle>(&self, settle: &S, delay: Duration) -> Result<(), ConsumeError> {
        if let Err(error) = settle.requeue(delay).await {
            settle_lost("given back", &error);
        }
        self.settled(Settled::Requeued);
        Ok(())
    }

    /// Acks. A failed ack is not the consumer's end: its connection is gone
    /// (the transport connects again by itself), the broker redelivers the
    /// message, and the store answers the copy.
    pub(crate) async fn ack<S: Settle>(&self, settle: &S) {
        if let Err(error) = settle.ack().await {
            settle_lost("acked", &error);
        }
    }

    /// A message without a key: dead-lettered under a key made from its payload.
    pub(crate) async fn dead_letter_keyless<S: Settle>(
        &self,
        message: Message,
        why: String,
        settle: &S,
    ) -> Result<(), ConsumeError> {
        let key = placeholder_key(&message);
        tracing::warn!(reason = %why, placeholder_key = key.as_str(), "message without an idempotency key");
        let attempts = message.delivery_count.unwrap_or(1);
        self.dead_letter(key, &message, attempts, why, None, settle)
            .await
    }

    /// Records the dead letter (committed), then acks. If the record fails,
    /// the message is given back: dead-lettering is at-least-once too.
    async fn dead_letter<S: Settle>(
        &self,
        key: IdempotencyKey,
        message: &Message,
        attempts: u32,
        last_error: String,
        first_failure: Option<Timestamp>,
        settle: &S,
    ) -> Result<(), ConsumeError> {
        let store = self.apply.store();
        let now = store.now();
        let first_seen_at = [message.published_at, first_failure]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now);
        let origin = match &message.coordinates {
            Some(position) => format!("{} at {position}", self.route.origin),
            None => self.route.origin.clone(),
        };
        let letter = NewDeadLetter {
            origin,
            destination: self.route.destination(message).to_string(),
            key,
            payload: message.payload.to_vec(),
            headers: message.headers.clone(),
            attempts,
            last_error,
            first_seen_at,
        };
        match store.record_dead_letter(&letter).await {
            Ok(id) => {
                if let Err(error) = store.forget_failures(&self.config.scope, &letter.key).await {
                    tracing::debug!(%error, "could not clear the failure count of a dead-lettered message");
                }
                self.ack(settle).await;
                tracing::warn!(
                    dead_letter = id,
                    attempts,
                    last_error = letter.last_error.as_str(),
                    "message dead-lettered with its key, then acked"
                );
                self.settled(Settled::DeadLettered);
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, "the dead letter could not be recorded; message given back for redelivery");
                let delay = self.redelivery_delay(attempts, None);
                self.requeue(settle, delay).await
            }
        }
    }

    pub(crate) fn reached(&self, point: Checkpoint) {
        if let Some(hook) = &self.config.checkpoint {
            hook(point);
        }
    }

    pub(crate) fn settled(&self, what: Settled) {
        self.stats.settled(what);
        metrics::counter!(
            "consumer_messages_total",
            "scope" => self.config.scope.family().to_owned(),
            "result" => what.label()
        )
        .increment(1);
    }
}

/// Logs a settlement that could not be sent.
pub(crate) fn settle_lost(what: &str, error: &TransportError) {
    tracing::warn!(
        error = %idem_core::error_chain(error),
        "a message could not be {what} (its broker connection is gone); the broker delivers it again and the store answers the copy"
    );
}

/// A uniform draw from `[0, ceiling]`.
pub(crate) fn jitter(ceiling: Duration) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

/// The key a keyless message is dead-lettered under: `no-key/` and the first
/// 32 hex digits of its payload's hash, so a redrive of it is at least
/// deduplicated from then on.
fn placeholder_key(message: &Message) -> IdempotencyKey {
    let hash = Fingerprint::of_bytes(&message.payload).to_hex();
    IdempotencyKey::new(format!("no-key/{}", &hash[..32])).expect("hex is visible ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_messages_get_a_stable_placeholder() {
        let a = placeholder_key(&Message::new("x"));
        assert_eq!(a, placeholder_key(&Message::new("x")));
        assert_ne!(a, placeholder_key(&Message::new("y")));
        assert!(a.as_str().starts_with("no-key/"));
    }
}

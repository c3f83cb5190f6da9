//! One delivery, start to finish: its key taken (or the reason it has
//! none), its effect applied through the store in a span that continues the
//! publisher's trace, a concurrent duplicate and brief store outages waited
//! out, and the answer handed to `settle`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Applied, ApplyError, Error};
use tracing::Instrument;

use super::apply::Apply;
use super::error::{ConsumeError, Failure};
use super::message::{KeyedMessage, Message};
use super::runtime::Shared;
use super::settle::jitter;
use super::transport::{Delivery, Settle};

impl<A: Apply> Shared<A> {
    /// The message with its scope, key and fingerprint, or the reason it has
    /// no key.
    pub(crate) fn keyed(&self, message: Message) -> Result<KeyedMessage, Box<(Message, String)>> {
        if message.delivery_count.is_some_and(|n| n > 1) {
            // The redelivery ratio: redeliveries over `consumer_messages_total`.
            metrics::counter!(
                "consumer_redeliveries_total",
                "scope" => self.config.scope.family().to_owned()
            )
            .increment(1);
        }
        match self.config.key.extract(&message) {
            Ok(key) => Ok(KeyedMessage {
                scope: self.config.scope.clone(),
                key,
                fingerprint: message.fingerprint(&self.config.fingerprint),
                message,
            }),
            Err(why) => Err(Box::new((message, why.to_string()))),
        }
    }

    /// One delivery, start to finish.
    pub(crate) async fn process<S: Settle>(
        self: Arc<Self>,
        delivery: Delivery<S>,
    ) -> Result<(), ConsumeError> {
        let Delivery { message, settle } = delivery;
        match self.keyed(message) {
            Ok(keyed) => self.process_keyed(Arc::new(keyed), &settle).await,
            Err(keyless) => {
                let (message, why) = *keyless;
                self.dead_letter_keyless(message, why, &settle).await
            }
        }
    }

    /// Applies one keyed message and settles it.
    pub(crate) async fn process_keyed<S: Settle>(
        &self,
        keyed: Arc<KeyedMessage>,
        settle: &S,
    ) -> Result<(), ConsumeError> {
        let span = tracing::info_span!(
            "consume",
            scope = keyed.scope.as_str(),
            idempotency_key = self.config.key_in_spans.show(&keyed.key),
            subject = keyed.message.subject.as_str(),
            delivery = keyed.message.delivery_count,
        );
        // Every delivery of one message continues the trace it was published
        // in: a redelivery shows as one more child of the same publish.
        idem_trace::continue_trace(&span, &idem_trace::Headers(&keyed.message.headers));
        async {
            self.count_request(&keyed.message);
            let answer = self.apply_patiently(&keyed).await;
            self.settle(keyed, answer, settle).await
        }
        .instrument(span)
        .await
    }

    fn count_request(&self, message: &Message) {
        if let Some(budget) = &self.config.budget
            && message.delivery_count.is_none_or(|n| n <= 1)
        {
            budget.record_request();
        }
    }

    /// Applies, waiting out a concurrent duplicate and brief store outages.
    async fn apply_patiently(&self, keyed: &Arc<KeyedMessage>) -> Result<Applied, Failure> {
        let started = Instant::now();
        let mut step = Duration::from_millis(5);
        let mut transient_left = 3u32;
        loop {
            match self.shared_apply(keyed).await {
                Ok(applied) => return Ok(applied),
                Err(Failure::Busy { retry_after }) => {
                    if started.elapsed() + step > self.config.in_flight_patience {
                        return Err(Failure::Busy { retry_after });
                    }
                    tokio::time::sleep(self.apply.busy_wait(retry_after, step)).await;
                    step = (step * 2).min(Duration::from_millis(250));
                }
                Err(Failure::Unavailable { error }) if transient_left > 0 => {
                    transient_left -= 1;
                    tracing::debug!(%error, "store unavailable; retrying locally");
                    tokio::time::sleep(jitter(Duration::from_millis(100))).await;
                }
                Err(other) => return Err(other),
            }
        }
    }

    async fn shared_apply(&self, keyed: &Arc<KeyedMessage>) -> Result<Applied, Failure> {
        match self.apply.apply(Arc::clone(keyed)).await {
            Ok(applied) => Ok(applied),
            Err(ApplyError::Effect(error)) => Err(Failure::Failed {
                hint: self.apply.retry_hint(&error),
                error: error.to_string(),
            }),
            Err(ApplyError::Protocol(error)) => Err(classify(error)),
        }
    }
}

/// Sorts a protocol refusal or store failure.
pub(crate) fn classify(error: Error) -> Failure {
    match error {
        Error::InFlight { retry_after, .. } => Failure::Busy { retry_after },
        Error::KeyReuse { .. } => Failure::KeyReuse {
            error: error.to_string(),
        },
        other if other.is_retryable() => Failure::Unavailable {
            error: other.to_string(),
        },
        other => Failure::Failed {
            error: other.to_string(),
            hint: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::IdempotencyKey;

    #[test]
    fn refusals_are_sorted() {
        let scope = idem_core::Scope::new("s").unwrap();
        let key = IdempotencyKey::new("k").unwrap();
        let busy = classify(Error::InFlight {
            scope: scope.clone(),
            key: key.clone(),
            retry_after: Duration::from_secs(1),
        });
        assert!(matches!(busy, Failure::Busy { .. }));
        let reuse = classify(Error::KeyReuse { scope, key });
        assert!(matches!(reuse, Failure::KeyReuse { .. }));
        let down = classify(Error::Store(idem_core::StoreError::new(
            idem_core::ErrorKind::Unavailable,
            "gone",
        )));
        assert!(matches!(down, Failure::Unavailable { .. }));
        let corrupt = classify(Error::Store(idem_core::StoreError::new(
            idem_core::ErrorKind::Corrupt,
            "bad",
        )));
        assert!(matches!(corrupt, Failure::Failed { .. }));
    }
}

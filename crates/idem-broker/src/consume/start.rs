//! What a consumer checks before its first delivery: the dedupe window
//! against every term a copy may arrive within, and the broker's delivery
//! limit against the consumer's attempts; and the upkeep of the
//! failure-count table, swept of counts older than the window.

use idem_core::{AttemptStore, DEFAULT_RETENTION, Timestamp};

use super::apply::Apply;
use super::config::ConsumerConfig;
use super::error::ConsumeError;
use super::window::{BrokerHorizon, DeliveryLimit, Uncovered, WindowTerms};

/// Checks the windows (a dedupe window shorter than the producer's retry
/// horizon, or than how long the broker keeps records for a replay, would
/// let a late copy through as a new message, so it is refused at start-up) and sweeps failure counts older than the dedupe window (7
/// days): a consumer's start is that table's upkeep. The table itself comes
/// with the store's migrations.
pub(crate) async fn prepare<A: Apply>(
    apply: &A,
    config: &ConsumerConfig,
    replay: Option<BrokerHorizon>,
) -> Result<(), ConsumeError> {
    if let Some(window) = apply.dedupe_window() {
        let origin = replay
            .as_ref()
            .map(|b| b.origin.clone())
            .unwrap_or_default();
        let terms = Box::new(WindowTerms::new(window, config, replay));
        match terms.uncovered() {
            None => tracing::debug!(%terms, "the dedupe window covers every term"),
            Some(Uncovered::Term(horizon)) => {
                return Err(ConsumeError::WindowTooShort {
                    window,
                    horizon,
                    terms,
                });
            }
            Some(Uncovered::Broker(horizon)) => {
                return Err(ConsumeError::ReplayBeyondWindow {
                    window,
                    horizon,
                    origin,
                    terms,
                });
            }
        }
    }
    let store = apply.store();
    let before = Timestamp(
        store
            .now()
            .0
            .saturating_sub(i64::try_from(DEFAULT_RETENTION.as_millis()).unwrap_or(i64::MAX)),
    );
    match store.sweep_failures(before, 10_000).await {
        Ok(0) => {}
        Ok(swept) => tracing::debug!(swept, "old failure counts swept"),
        Err(error) => tracing::warn!(%error, "old failure counts could not be swept"),
    }
    Ok(())
}

/// Warns when the broker moves a failing message aside (to a dead-letter
/// queue of its own) before the consumer's last attempt: such a message
/// leaves without Idem's dead letter, its key and its reason.
pub(crate) fn check_delivery_limit(limit: Option<DeliveryLimit>, config: &ConsumerConfig) {
    let Some(limit) = limit else { return };
    if limit.deliveries < config.max_attempts {
        tracing::warn!(
            source = limit.origin.as_str(),
            broker_deliveries = limit.deliveries,
            max_attempts = config.max_attempts,
            "the broker moves a message aside after fewer deliveries than the consumer's attempts: a failing message would leave without a dead letter of Idem's; raise the broker's limit above the attempts (every delivery counts there, including those given back while a duplicate was in flight)"
        );
    } else {
        tracing::debug!(
            source = limit.origin.as_str(),
            broker_deliveries = limit.deliveries,
            max_attempts = config.max_attempts,
            "the broker's delivery limit is above the consumer's attempts"
        );
    }
}

//! One relay pass: claim due rows, publish them concurrently, then settle each
//! one — sent, given back with a jittered due time, postponed by the retry
//! budget, or moved to the dead letters.
//!
//! A pass works on a borrowed view of the relay ([`Relaying`]), so it reads
//! the settings and the publisher cache without depending on the run loop
//! that starts it.

use std::time::Duration;

use futures::StreamExt;
use idem_core::{
    DeadLetterStore, Error, NewDeadLetter, OutboxStore, Pending, SharedClock, Timestamp,
};
use idem_retry::{RetryBudget, next_delay};
use tracing::Instrument;

use super::config::{FailPoint, RelayConfig};
use super::publishers::Publishers;
use crate::publish::{Destination, Message, Publish, PublishError, PublishErrorKind};

/// What one pass (or several, added up) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows published and marked sent.
    pub sent: usize,
    /// Rows that failed and were given back for a later attempt.
    pub retried: usize,
    /// Retries the budget refused; given back without using an attempt.
    pub postponed: usize,
    /// Rows moved to the dead letters.
    pub dead_lettered: usize,
}

impl Pass {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Pass) {
        self.claimed += other.claimed;
        self.sent += other.sent;
        self.retried += other.retried;
        self.postponed += other.postponed;
        self.dead_lettered += other.dead_lettered;
    }
}

/// What happened to one row before it is settled.
enum Fate {
    Published,
    Failed(PublishError),
    /// The budget refused the retry.
    Postponed(String),
    /// Attempts were used up by relays that stopped mid-publish.
    Exhausted,
    /// The stored destination does not parse (the table was edited by hand).
    Unroutable(String),
}

/// What a pass works with: the relay's store, settings, name, clock, budget
/// and publishers, borrowed.
pub(super) struct Relaying<'a, S> {
    pub(super) store: &'a S,
    pub(super) config: &'a RelayConfig,
    pub(super) owner: &'a str,
    pub(super) clock: &'a SharedClock,
    pub(super) budget: &'a RetryBudget,
    pub(super) publishers: &'a Publishers,
    pub(super) fail_point: Option<FailPoint>,
}

impl<S: OutboxStore + DeadLetterStore> Relaying<'_, S> {
    /// One pass.
    pub(super) async fn pass(&self) -> Result<Pass, Error> {
        run(self).await
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

async fn run<S: OutboxStore + DeadLetterStore>(relay: &Relaying<'_, S>) -> Result<Pass, Error> {
    let config = relay.config;
    let now = relay.now();
    let rows = relay
        .store
        .claim_outbox(
            relay.owner,
            now,
            config.lease,
            config.batch.max(1),
            config.default_destination.is_some(),
        )
        .await?;
    let mut pass = Pass {
        claimed: rows.len(),
        ..Pass::default()
    };
    if rows.is_empty() {
        return Ok(pass);
    }

    let fates: Vec<(Pending, Option<Destination>, Fate)> = futures::stream::iter(rows)
        .map(|row| async move {
            let (destination, fate) = attempt(relay, &row).await;
            (row, destination, fate)
        })
        .buffer_unordered(config.concurrency.max(1))
        .collect()
        .await;

    if fates
        .iter()
        .any(|(_, _, fate)| matches!(fate, Fate::Published))
    {
        idem_core::crash::point(idem_core::crash::AFTER_PUBLISH);
    }
    if relay.fail_point == Some(FailPoint::AfterPublish) {
        return Err(idem_core::StoreError::new(
            idem_core::ErrorKind::Other,
            "fail point after-publish: the relay stopped before marking its rows sent",
        )
        .into());
    }

    let now = relay.now();
    let sent: Vec<i64> = fates
        .iter()
        .filter(|(_, _, fate)| matches!(fate, Fate::Published))
        .map(|(row, _, _)| row.id)
        .collect();
    if !sent.is_empty() {
        relay.store.mark_sent(&sent, now).await?;
        pass.sent = sent.len();
        metrics::counter!("outbox_sent_total").increment(sent.len() as u64);
    }
    for (row, destination, fate) in fates {
        match fate {
            Fate::Published => {}
            Fate::Postponed(reason) => {
                let due = now.plus(delay(relay, row.attempts.saturating_sub(1), None));
                relay
                    .store
                    .retry_later(
                        row.id,
                        relay.owner,
                        row.attempts.saturating_sub(1),
                        due,
                        &reason,
                    )
                    .await?;
                pass.postponed += 1;
            }
            Fate::Unroutable(reason) => {
                tracing::error!(id = row.id, %reason, "outbox row cannot be routed; left pending");
                let due = now.plus(relay.config.backoff.cap());
                relay
                    .store
                    .retry_later(row.id, relay.owner, row.attempts, due, &reason)
                    .await?;
                pass.retried += 1;
            }
            Fate::Exhausted => {
                let last = format!(
                    "no confirmation after {} attempts: the relays publishing it stopped before it was marked sent",
                    row.attempts.saturating_sub(1)
                );
                let destination = destination.expect("a routed row has a destination");
                bury(relay, &row, destination, last, now, &mut pass).await?;
            }
            Fate::Failed(error) => {
                let destination = destination.expect("a published row has a destination");
                relay.publishers.forget_after(&destination, &error).await;
                let verdict = error.verdict();
                if !verdict.is_retry() || row.attempts >= relay.config.max_attempts {
                    bury(relay, &row, destination, error.to_string(), now, &mut pass).await?;
                    continue;
                }
                let due = now.plus(delay(relay, row.attempts - 1, verdict.hint()));
                tracing::info!(
                    id = row.id,
                    attempt = row.attempts,
                    retry_in_ms = due.0.saturating_sub(now.0),
                    %error,
                    "outbox publish failed; retrying later"
                );
                relay
                    .store
                    .retry_later(row.id, relay.owner, row.attempts, due, &error.to_string())
                    .await?;
                metrics::counter!("outbox_retries_total").increment(1);
                pass.retried += 1;
            }
        }
    }
    Ok(pass)
}

/// Routes, checks the attempt count and the budget, and publishes one row.
async fn attempt<S: OutboxStore + DeadLetterStore>(
    relay: &Relaying<'_, S>,
    row: &Pending,
) -> (Option<Destination>, Fate) {
    let destination = match &row.message.destination {
        Some(text) => match text.parse::<Destination>() {
            Ok(destination) => destination,
            Err(error) => return (None, Fate::Unroutable(error.to_string())),
        },
        None => match &relay.config.default_destination {
            Some(destination) => destination.clone(),
            None => return (None, Fate::Unroutable("no default destination".into())),
        },
    };
    if row.attempts > relay.config.max_attempts {
        return (Some(destination), Fate::Exhausted);
    }
    if row.attempts <= 1 {
        relay.budget.record_request();
    } else if let Err(exhausted) = relay.budget.try_withdraw() {
        return (Some(destination), Fate::Postponed(exhausted.to_string()));
    }
    let fate = match publish(relay, &destination, row).await {
        Ok(()) => Fate::Published,
        Err(error) => Fate::Failed(error),
    };
    (Some(destination), fate)
}

/// Connects if needed and publishes, within the publish timeout — and within
/// half the lease, so the row is marked before another relay may claim it.
///
/// Each publish runs in a `publish` span that continues the trace context
/// stored with the row, and the message carries this span's context on (or
/// the stored one, when spans have no OpenTelemetry context here).
async fn publish<S>(
    relay: &Relaying<'_, S>,
    destination: &Destination,
    row: &Pending,
) -> Result<(), PublishError> {
    let span = tracing::info_span!(
        "publish",
        destination = %destination.redacted(),
        idempotency_key = relay.config.key_in_spans.show(&row.message.key),
        outbox_id = row.id,
        attempt = row.attempts,
    );
    idem_trace::continue_trace(&span, &idem_trace::Headers(&row.message.headers));
    let timeout = relay.config.publish_timeout.min(relay.config.lease / 2);
    let publishing = async {
        let mut headers = row.message.headers.clone();
        idem_trace::inject_current(&mut idem_trace::HeadersMut(&mut headers));
        let message = Message {
            key: row.message.key.clone(),
            payload: row.message.payload.clone(),
            headers,
        };
        let publisher = relay.publishers.get(destination).await?;
        publisher.publish(&message).await
    };
    match tokio::time::timeout(timeout, publishing.instrument(span)).await {
        Ok(result) => result,
        Err(_) => Err(PublishError::new(
            PublishErrorKind::Unavailable,
            destination.redacted(),
            format!("no confirmation within {} ms", timeout.as_millis()),
        )),
    }
}

/// The delay before retry `k` (0 for the first retry): full jitter, raised to
/// the destination's hint.
fn delay<S>(relay: &Relaying<'_, S>, k: u32, hint: Option<Duration>) -> Duration {
    let backoff = relay
        .config
        .backoff
        .with_max_attempts(u32::MAX)
        .delays()
        .nth(k as usize)
        .unwrap_or(relay.config.backoff.cap());
    next_delay(backoff, hint, None).unwrap_or(backoff)
}

async fn bury<S: OutboxStore + DeadLetterStore>(
    relay: &Relaying<'_, S>,
    row: &Pending,
    destination: Destination,
    last_error: String,
    now: Timestamp,
    pass: &mut Pass,
) -> Result<(), Error> {
    let letter = NewDeadLetter {
        origin: "relay".into(),
        destination: destination.to_string(),
        key: row.message.key.clone(),
        payload: row.message.payload.clone(),
        headers: row.message.headers.clone(),
        attempts: row.attempts.min(relay.config.max_attempts),
        last_error,
        first_seen_at: row.created_at,
    };
    if let Some(id) = relay.store.bury(row.id, relay.owner, &letter, now).await? {
        tracing::warn!(
            outbox_id = row.id,
            dead_letter = id,
            attempts = letter.attempts,
            error = %letter.last_error,
            "outbox message dead-lettered; `idem dlq redrive` sends it again with its key"
        );
        metrics::counter!("outbox_dead_lettered_total").increment(1);
        pass.dead_lettered += 1;
    }
    Ok(())
}

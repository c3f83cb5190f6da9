//! The consumer runtime, single mode: for each delivery, take its key, apply
//! it through the store (effect and record in one commit), and only then ack.
//!
//! The order is the guarantee. A crash before the commit leaves nothing
//! behind and the broker redelivers; a crash after the commit and before the
//! ack makes the broker redeliver a message whose record exists, and the
//! redelivery is answered from the store and acked without running the
//! effect. Nothing is ever acked before its effect (or its dead letter) is
//! committed.
//!
//! What becomes of a delivery:
//!
//! | apply answered | the runtime |
//! | --- | --- |
//! | applied now, or replayed (a duplicate) | acks |
//! | `InFlight` (a duplicate being applied right now elsewhere) | retries locally for up to the patience, then gives it back; not a failed attempt |
//! | a transient store failure | retries locally a few times, then gives it back; not a failed attempt |
//! | `KeyReuse` (the key came with another payload) | dead-letters it at once, then acks |
//! | the effect failed | counts the attempt; gives it back after a jittered delay, or after the last attempt dead-letters it, then acks |
//! | no key in the message | dead-letters it with the reason, then acks (or keys it by its coordinates, if so configured) |

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Applied, ApplyError, AttemptStore, DEFAULT_RETENTION, DeadLetterStore, Error, Fingerprint,
    IdempotencyKey, NewDeadLetter, Timestamp, crash,
};
use rand::Rng;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::apply::Apply;
use super::config::{Checkpoint, ConsumerConfig};
use super::message::{KeyedMessage, Message};
use super::stats::{Settled, Stats, StatsSnapshot};
use super::transport::{Delivery, Route, Settle, Transport, TransportError};
use super::window::{BrokerHorizon, DeliveryLimit, Uncovered, WindowTerms};

/// How long messages in hand may take to finish once the connection broke.
const DRAIN_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// How long closing the transport may take when the consumer stops.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a consumer stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The broker connection failed; unsettled deliveries go back to the broker.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The store could not be prepared.
    #[error(transparent)]
    Store(#[from] Error),
    /// An effect panicked; the consumer stopped so the broker redelivers its
    /// message to a fresh process.
    #[error("an effect panicked: {0}")]
    Panicked(String),
    /// The dedupe window is shorter than the producer's retry horizon
    /// ([`ConsumerConfig::producer_horizon`]) or the allowance for manual
    /// replays ([`ConsumerConfig::manual_replay_allowance`]); the consumer did
    /// not start. The message names every term.
    #[error(
        "the dedupe window ({}, the store's retention) is shorter than {}, the longest a copy of a message may still arrive; {}. A copy arriving after the window closed would be applied twice: raise the store's retention to at least {}, or shorten the term marked longer",
        humantime::format_duration(*.window),
        humantime::format_duration(*.horizon),
        .terms,
        humantime::format_duration(*.horizon)
    )]
    WindowTooShort {
        /// The store's retention.
        window: Duration,
        /// The longest term the window falls short of.
        horizon: Duration,
        /// Every term, as found at start-up.
        terms: Box<WindowTerms>,
    },
    /// The watchdog found the consumer holding deliveries without progress
    /// for its limit ([`ConsumerConfig::watchdog`]) and the transport cannot
    /// restart; the deliveries go back to the broker when the process ends.
    #[error(
        "the consumer held {held} deliveries without settling any for {}: an effect hangs or the broker stopped answering; restart the process (a transport that reconnects, such as Source::connect_reconnecting, is restarted in place)",
        humantime::format_duration(*.after)
    )]
    Stalled {
        /// The watchdog's limit.
        after: Duration,
        /// Deliveries in hand.
        held: usize,
    },
    /// The broker keeps messages longer than the dedupe window (a Kafka
    /// topic's retention, a JetStream stream's max age), so a replay of old
    /// messages would apply them again; the consumer did not start.
    #[error(
        "the dedupe window ({}, the store's retention) is shorter than how long {origin} keeps messages ({}): messages replayed after the window closed (an offset reset to the earliest, a new consumer group or durable consumer) would be applied twice; {}. Raise the store's retention to at least {}, shorten the broker's retention (a topic's retention.ms, a stream's max age), or promise no such replays with ConsumerConfig::allow_replays_beyond_window",
        humantime::format_duration(*.window),
        horizon.map_or_else(|| "forever".to_owned(), |h| humantime::format_duration(h).to_string()),
        .terms,
        horizon.map_or_else(|| "forever".to_owned(), |h| humantime::format_duration(h).to_string())
    )]
    ReplayBeyondWindow {
        /// The store's retention.
        window: Duration,
        /// How long the broker keeps messages; `None`: forever.
        horizon: Option<Duration>,
        /// The source, as printed.
        origin: String,
        /// Every term, as found at start-up.
        terms: Box<WindowTerms>,
    },
}

/// A consumer: a transport, an effect applied through a store, a config.
///
/// ```no_run
/// # async fn demo(store: idem::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{Outcome, Scope};
/// use idem_broker::consume::{AmqpTransport, AtomicApply, Consumer, ConsumerConfig};
///
/// let transport = AmqpTransport::connect("amqp://127.0.0.1:5672/%2f", "payments", 32).await?;
/// let effect = AtomicApply::new(store, |message| async move |tx| -> idem::rusqlite::Result<Outcome> {
///     tx.execute("INSERT INTO ledger (key) VALUES (?1)", [message.key.as_str()])?;
///     Ok(Outcome::success("recorded"))
/// });
/// let consumer = Consumer::new(transport, effect, ConsumerConfig::new(Scope::new("ledger")?));
/// consumer.run(std::future::pending::<()>()).await?; // or a shutdown signal
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer<T, A> {
    pub(crate) transport: T,
    pub(crate) shared: Arc<Shared<A>>,
}

#[derive(Debug)]
pub(crate) struct Shared<A> {
    pub(crate) apply: A,
    pub(crate) config: ConsumerConfig,
    pub(crate) route: Route,
    pub(crate) stats: Arc<Stats>,
}

/// Why an apply did not produce an answer to ack.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Another consumer holds the key right now.
    Busy { retry_after: Duration },
    /// The store is unreachable or busy; not the message's fault.
    Unavailable { error: String },
    /// The key was first used with another payload.
    KeyReuse { error: String },
    /// The effect failed (or the store failed for this message).
    Failed {
        error: String,
        hint: Option<Duration>,
    },
}

impl<T: Transport, A: Apply> Consumer<T, A> {
    /// A consumer of `transport`'s deliveries, applying them with `apply`.
    pub fn new(transport: T, apply: A, config: ConsumerConfig) -> Self {
        let route = transport.route();
        Self {
            transport,
            shared: Arc::new(Shared {
                apply,
                config,
                route,
                stats: Arc::default(),
            }),
        }
    }

    /// Live counters of what the consumer did.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.shared.stats)
    }

    /// Consumes until `shutdown` completes or the subscription ends, working
    /// on up to the configured concurrency of messages at once. On shutdown
    /// it stops receiving, finishes (and settles) what it started, and closes
    /// the transport.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<StatsSnapshot, ConsumeError> {
        let replay = self.transport.replay_horizon();
        if let Err(error) = prepare(&self.shared.apply, &self.shared.config, replay).await {
            self.transport.close().await;
            return Err(error);
        }
        check_delivery_limit(self.transport.delivery_limit(), &self.shared.config);
        let concurrency = self.shared.config.concurrency;
        let mut shutdown = pin!(shutdown);
        let mut working = JoinSet::new();
        let mut watchdog = Watchdog::new(self.shared.config.watchdog);
        let stopped = loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                Some(done) = working.join_next(), if !working.is_empty() => {
                    watchdog.progress();
                    if let Err(error) = joined(done) {
                        break Err(error);
                    }
                }
                () = watchdog.stalled(), if watchdog.on() && !working.is_empty() => {
                    if let Err(error) = watchdog.restart(&mut self.transport, &mut working).await {
                        break Err(error);
                    }
                }
                received = self.transport.receive(), if working.len() < concurrency => match received {
                    Ok(Some(delivery)) => {
                        watchdog.progress();
                        self.shared.stats.received(1);
                        working.spawn(Arc::clone(&self.shared).process(delivery));
                    }
                    Ok(None) => break Ok(()),
                    Err(error) => break Err(error.into()),
                },
            }
        };
        // After a clean stop the work in hand is finished and settled. After
        // a broken connection its settlements may never be answered, so it
        // gets a bounded time and is then dropped: what it did not settle the
        // broker delivers again, and the records answer those copies.
        let broken = stopped.is_err();
        let mut finished = stopped;
        let deadline = tokio::time::Instant::now() + DRAIN_AFTER_FAILURE;
        loop {
            let next = if broken {
                match tokio::time::timeout_at(deadline, working.join_next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        tracing::warn!(
                            unfinished = working.len(),
                            "the connection broke; messages still in hand after {:?} are left for the broker to redeliver",
                            DRAIN_AFTER_FAILURE
                        );
                        working.abort_all();
                        break;
                    }
                }
            } else {
                working.join_next().await
            };
            let Some(done) = next else { break };
            if let (Ok(()), Err(error)) = (&finished, joined(done)) {
                finished = Err(error);
            }
        }
        // Closing a channel on a connection that is gone can wait forever
        // for the broker's answer.
        if tokio::time::timeout(CLOSE_TIMEOUT, self.transport.close())
            .await
            .is_err()
        {
            tracing::warn!(
                "closing the broker connection took longer than {CLOSE_TIMEOUT:?}; leaving it"
            );
        }
        finished.map(|()| self.shared.stats.snapshot())
    }
}

/// Notices a consumer that holds deliveries and makes no progress (nothing
/// settled, nothing received) for its limit, and restarts it: the work in
/// hand is dropped unsettled and the transport's connection replaced, so the
/// broker delivers those messages again.
pub(crate) struct Watchdog {
    after: Option<Duration>,
    last: tokio::time::Instant,
}

impl Watchdog {
    pub(crate) fn new(after: Option<Duration>) -> Self {
        Self {
            after,
            last: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn on(&self) -> bool {
        self.after.is_some()
    }

    /// Something was received or settled.
    pub(crate) fn progress(&mut self) {
        self.last = tokio::time::Instant::now();
    }

    /// Completes when the limit has passed since the last progress (never
    /// when off).
    pub(crate) async fn stalled(&self) {
        match self.after {
            Some(after) => tokio::time::sleep_until(self.last + after).await,
            None => std::future::pending().await,
        }
    }

    /// Drops the work in hand and restarts the transport, or says why it
    /// cannot.
    pub(crate) async fn restart<T: Transport>(
        &mut self,
        transport: &mut T,
        working: &mut JoinSet<Result<(), ConsumeError>>,
    ) -> Result<(), ConsumeError> {
        let after = self.after.unwrap_or_default();
        let held = working.len();
        let origin = transport.route().origin;
        tracing::error!(
            source = origin.as_str(),
            held,
            after_s = after.as_secs(),
            "the consumer held messages without settling any for too long; restarting it (the messages in hand are left for the broker to redeliver)"
        );
        metrics::counter!("consumer_watchdog_restarts_total", "origin" => origin).increment(1);
        working.abort_all();
        while working.join_next().await.is_some() {}
        self.progress();
        if transport.restart("the watchdog restarted the consumer") {
            Ok(())
        } else {
            Err(ConsumeError::Stalled { after, held })
        }
    }
}

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

pub(crate) fn joined(
    done: Result<Result<(), ConsumeError>, tokio::task::JoinError>,
) -> Result<(), ConsumeError> {
    match done {
        Ok(result) => result,
        Err(join) => Err(ConsumeError::Panicked(join.to_string())),
    }
}

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
    async fn process<S: Settle>(
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

    /// Logs a duplicate at info, never higher: it is the consumer doing its
    /// job. It names where the copy came from (source, subject, position in
    /// the log, Kafka's partition and offset, delivery count), how old the
    /// record that answered it is (`age_ms`, from the key's first claim, one
    /// read of the record) and how long ago the broker first had the message
    /// (`since_published_ms`), so a burst of redeliveries can be told from a
    /// producer that publishes twice; the key is in the span, not here.
    pub(crate) async fn replayed(&self, keyed: &KeyedMessage) {
        if !tracing::enabled!(tracing::Level::INFO) {
            return;
        }
        let recorded_at = self.apply.recorded_at(keyed).await;
        let message = &keyed.message;
        let fields = DuplicateFields::of(
            message,
            self.route.is_kafka(),
            recorded_at,
            self.apply.store().now(),
        );
        tracing::info!(
            scope = self.config.scope.as_str(),
            origin = self.route.origin.as_str(),
            subject = message.subject.as_str(),
            position = message.coordinates.as_deref(),
            partition = fields.partition,
            offset = fields.offset,
            delivery = message.delivery_count,
            age_ms = fields.age_ms,
            since_published_ms = fields.since_published_ms,
            "duplicate delivery: answered from the store and acked; the effect did not run again"
        );
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

/// The fields of a duplicate's log line that are worked out, not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DuplicateFields {
    /// Milliseconds since the record that answered the copy was made.
    pub(crate) age_ms: Option<u64>,
    /// Milliseconds since the broker first had the message.
    pub(crate) since_published_ms: Option<u64>,
    /// The Kafka partition the copy was read from.
    pub(crate) partition: Option<i32>,
    /// Its offset in that partition.
    pub(crate) offset: Option<i64>,
}

impl DuplicateFields {
    /// The fields for `message` at `now` (the store's clock), answered by a
    /// record made at `recorded_at`; partition and offset are read from a
    /// Kafka record's `TOPIC/PARTITION/OFFSET`.
    pub(crate) fn of(
        message: &Message,
        kafka: bool,
        recorded_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Self {
        let ms = |at: Timestamp| u64::try_from(at.until(now).as_millis()).unwrap_or(u64::MAX);
        let (partition, offset) = kafka.then(|| kafka_position(message)).flatten().unzip();
        Self {
            age_ms: recorded_at.map(ms),
            since_published_ms: message.published_at.map(ms),
            partition,
            offset,
        }
    }
}

/// Partition and offset of a Kafka record whose coordinates are
/// `TOPIC/PARTITION/OFFSET` (a topic name has no `/`).
fn kafka_position(message: &Message) -> Option<(i32, i64)> {
    let (partition, offset) = message
        .coordinates
        .as_deref()?
        .strip_prefix(message.subject.as_str())?
        .strip_prefix('/')?
        .split_once('/')?;
    Some((partition.parse().ok()?, offset.parse().ok()?))
}

/// Logs a settlement that could not be sent.
pub(crate) fn settle_lost(what: &str, error: &TransportError) {
    tracing::warn!(
        error = %idem_core::error_chain(error),
        "a message could not be {what} (its broker connection is gone); the broker delivers it again and the store answers the copy"
    );
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

/// A uniform draw from `[0, ceiling]`.
fn jitter(ceiling: Duration) -> Duration {
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
    fn a_duplicate_s_fields_carry_the_record_s_age_and_the_kafka_position() {
        let mut record = Message::new("x");
        record.subject = "payments".into();
        record.coordinates = Some("payments/3/1187".into());
        record.published_at = Some(Timestamp(1_000));
        let now = Timestamp(61_500);
        let fields = DuplicateFields::of(&record, true, Some(Timestamp(1_250)), now);
        assert_eq!(
            fields,
            DuplicateFields {
                age_ms: Some(60_250),
                since_published_ms: Some(60_500),
                partition: Some(3),
                offset: Some(1187),
            }
        );

        // A record made after `now` by a clock that moved back: age 0.
        let ahead = DuplicateFields::of(&record, true, Some(Timestamp(70_000)), now);
        assert_eq!(ahead.age_ms, Some(0));

        // Not Kafka (a JetStream position has two parts), or nothing known.
        let mut jet = Message::new("x");
        jet.subject = "orders.created".into();
        jet.coordinates = Some("ORDERS/42".into());
        let none = DuplicateFields::of(&jet, false, None, now);
        assert_eq!(
            none,
            DuplicateFields {
                age_ms: None,
                since_published_ms: None,
                partition: None,
                offset: None,
            }
        );
        assert_eq!(kafka_position(&jet), None);
    }

    #[test]
    fn keyless_messages_get_a_stable_placeholder() {
        let a = placeholder_key(&Message::new("x"));
        assert_eq!(a, placeholder_key(&Message::new("x")));
        assert_ne!(a, placeholder_key(&Message::new("y")));
        assert!(a.as_str().starts_with("no-key/"));
    }

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

//! The outbox relay: claims pending outbox rows, publishes each with its own
//! key, marks it sent; retries failures later with full jitter under a retry
//! budget; dead-letters a row after N attempts (5 by default).
//!
//! Why the retries live in the table and not in a loop around the publish:
//! a relay publishes many rows, and one slow destination must not hold up the
//! others, nor must a restart forget where each row stood. So a failed row is
//! given back with its attempt count and a due time drawn with full jitter
//! (`uniform(0, min(cap, base · 2^k))`, idem-retry's
//! [`Backoff`](idem_retry::Backoff)), raised to the destination's
//! `Retry-After` if it sent one; any relay picks it up when it is due. The attempt is counted when the row is *claimed*, so a relay that dies
//! mid-publish still uses one up and a message that crashes relays ends in the
//! dead letters instead of looping for ever.
//!
//! Why a budget on top: when a destination is down, every row fails, and
//! without a bound the relay would spend its time re-sending to it. Each row's
//! first attempt counts as a request in the shared [`RetryBudget`]; each retry
//! must withdraw from it (10 % of requests by default). A refused retry is
//! postponed by another backoff delay without using up an attempt.
//!
//! Delivery is at-least-once: a crash between the broker's confirmation and
//! the "sent" mark publishes the row again after its lease (30 s by default)
//! ends. The message's key (AMQP `message_id`, `Nats-Msg-Id`, `Idempotency-Key`)
//! lets the consumer suppress that duplicate.
//!
//! Wake-ups: on PostgreSQL the relay LISTENs for the outbox's insert trigger
//! and polls as a fallback; on SQLite it polls (1 s by default). Sent rows and
//! dead letters are swept after the retention (7 days by default).
//!
//! The relay reaches the outbox and the dead letters through the store's
//! contracts ([`OutboxStore`], [`DeadLetterStore`]): it is written once for
//! every store.
//!
//! Modules: the run loop and the sweep here; the settings in `config`; one
//! pass (claim, publish, settle) in `pass`; the publisher cache in `publishers`.

mod config;
mod pass;
mod publishers;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use idem_core::health;
use idem_core::{DeadLetterStore, Error, OutboxStore, SharedClock, Timestamp};
use idem_retry::RetryBudget;

use crate::{dead_letter, outbox};

pub use self::config::{
    DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS, DEFAULT_POLL_INTERVAL, DEFAULT_PUBLISH_TIMEOUT,
    DEFAULT_RETENTION, DEFAULT_WATCHDOG, FailPoint, RelayConfig,
};
pub use self::pass::Pass;
use self::pass::Relaying;
use self::publishers::Publishers;

/// What the sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Sent outbox rows.
    pub sent_rows: u64,
    /// Dead letters.
    pub dead_letters: u64,
}

/// The outbox relay over a store.
///
/// ```no_run
/// # async fn demo(store: idem::AnyStore) -> Result<(), idem_core::Error> {
/// use idem_broker::relay::{Relay, RelayConfig};
///
/// let config = RelayConfig::default()
///     .with_default_destination("nats://127.0.0.1:4222/orders.created".parse().unwrap());
/// let relay = Relay::new(store, config);
/// relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Relay<S> {
    store: S,
    config: RelayConfig,
    owner: String,
    clock: SharedClock,
    budget: Arc<RetryBudget>,
    publishers: Publishers,
    fail_point: Option<FailPoint>,
}

impl<S: OutboxStore + DeadLetterStore> Relay<S> {
    /// A relay on `store`'s clock with a budget of its own (10 % of requests).
    pub fn new(store: S, config: RelayConfig) -> Self {
        let clock = store.outbox_clock();
        let owner = format!("relay-{}-{:08x}", std::process::id(), rand::random::<u32>());
        let publishers = Publishers::new(
            config.connect.clone(),
            config.reconnect.connect_timeout_value(),
        );
        Self {
            store,
            config,
            owner,
            clock,
            budget: Arc::new(RetryBudget::default()),
            publishers,
            fail_point: None,
        }
    }

    /// The same relay sharing `budget` (one per process, shared with the
    /// other clients of the same destinations).
    pub fn with_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// The same relay stopping at `point` in every pass, as if it crashed there.
    /// For crash tests.
    pub fn with_fail_point(mut self, point: FailPoint) -> Self {
        self.fail_point = Some(point);
        self
    }

    /// The name this relay's leases carry.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// One pass: claims up to `batch` due rows, publishes them, settles each
    /// (sent, retried later, or dead-lettered).
    pub async fn run_once(&self) -> Result<Pass, Error> {
        Relaying {
            store: &self.store,
            config: &self.config,
            owner: &self.owner,
            clock: &self.clock,
            budget: &self.budget,
            publishers: &self.publishers,
            fail_point: self.fail_point,
        }
        .pass()
        .await
    }

    /// Passes until no row is due, or a pass only gave rows back for later:
    /// what `idem relay --once` does. Rows whose retry is due later are left
    /// for a later run, so a destination that is down is not hammered.
    pub async fn drain(&self) -> Result<Pass, Error> {
        let mut total = Pass::default();
        loop {
            let pass = self.run_once().await?;
            total.add(&pass);
            if pass.claimed == 0 || pass.sent + pass.dead_lettered == 0 {
                return Ok(total);
            }
        }
    }

    /// Deletes sent rows and dead letters past the retention, in batches.
    pub async fn sweep(&self) -> Result<Swept, Error> {
        let batch = self.config.sweep_batch.max(1);
        let before =
            Timestamp(self.now().0.saturating_sub(
                i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX),
            ));
        let mut swept = Swept::default();
        loop {
            let n = self.store.sweep_sent(before, batch).await?;
            swept.sent_rows += n;
            if n < batch as u64 {
                break;
            }
        }
        loop {
            let n = self
                .store
                .sweep_dead_letters(self.config.retention, batch)
                .await?;
            swept.dead_letters += n;
            if n < batch as u64 {
                break;
            }
        }
        Ok(swept)
    }

    /// Sweeps and reports the outbox lag and the DLQ depth as gauges.
    pub async fn upkeep(&self) -> Result<Swept, Error> {
        let swept = self.sweep().await?;
        let now = self.now();
        outbox::observe_stats(&self.store.outbox_stats().await?, now);
        dead_letter::observe_stats(&self.store.dead_letter_stats().await?, now);
        Ok(swept)
    }

    /// Runs until `shutdown` completes: a pass whenever rows are enqueued
    /// (PostgreSQL NOTIFY) or the poll interval passes, right away again while
    /// passes come back full, and the upkeep every `upkeep_interval`.
    ///
    /// It outlives its connections. A pass that fails because the store
    /// cannot be reached is tried again after a full-jitter pause
    /// ([`RelayConfig::reconnect`]) for as long as it takes, and the process's
    /// health says the store is lost meanwhile; a destination whose
    /// connection was lost is connected again at its next publish (its rows
    /// retry on their own schedule); a pass that hangs past
    /// [`RelayConfig::watchdog`] is abandoned. Only a store failure that
    /// retrying cannot fix (a missing table, a refused login) ends the run.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let mut wake_ups = match self.store.wake_ups().await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "cannot LISTEN for new outbox rows; polling only");
                None
            }
        };
        tokio::pin!(shutdown);
        let store_health = health::Connection::register("the relay's outbox store");
        metrics::gauge!("relay_connected", "connection" => "store").set(1.0);
        let mut last_upkeep: Option<Instant> = None;
        let mut failures = 0u32;
        loop {
            if last_upkeep.is_none_or(|at| at.elapsed() >= self.config.upkeep_interval) {
                match self.upkeep().await {
                    Ok(swept) if swept != Swept::default() => {
                        tracing::info!(
                            sent_rows = swept.sent_rows,
                            dead_letters = swept.dead_letters,
                            "swept past retention"
                        );
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "outbox upkeep failed; trying again later")
                    }
                }
                last_upkeep = Some(Instant::now());
            }
            let pause = match self.watched_pass().await {
                Some(Ok(pass)) => {
                    if failures > 0 {
                        tracing::info!(failures, "the outbox store answers again");
                        store_health.up();
                        metrics::gauge!("relay_connected", "connection" => "store").set(1.0);
                    }
                    failures = 0;
                    if pass.claimed >= self.config.batch.max(1) {
                        continue;
                    }
                    self.config.poll_interval
                }
                Some(Err(error)) if error.is_retryable() => {
                    if failures == 0 {
                        metrics::counter!("relay_reconnects_total", "connection" => "store")
                            .increment(1);
                        metrics::gauge!("relay_connected", "connection" => "store").set(0.0);
                    }
                    store_health.down(&error);
                    let pause = self
                        .config
                        .reconnect
                        .delay(failures.min(16))
                        .max(self.config.poll_interval);
                    failures = failures.saturating_add(1);
                    tracing::warn!(%error, pause_ms = pause.as_millis() as u64, failures, "relay pass failed; trying again");
                    pause
                }
                Some(Err(error)) => return Err(error),
                None => self.config.poll_interval,
            };
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(pause) => {}
                () = async {
                    match wake_ups.as_mut() {
                        Some(listener) => listener.next().await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// One pass under the watchdog: `None` when it took longer than
    /// [`RelayConfig::watchdog`] and was abandoned (its connections dropped;
    /// its rows are published again when their claims end).
    async fn watched_pass(&self) -> Option<Result<Pass, Error>> {
        let Some(limit) = self.config.watchdog else {
            return Some(self.run_once().await);
        };
        match tokio::time::timeout(limit, self.run_once()).await {
            Ok(done) => Some(done),
            Err(_) => {
                tracing::error!(
                    limit_s = limit.as_secs(),
                    "a relay pass made no progress for too long; abandoning it and connecting again (its rows are published again when their claims end)"
                );
                metrics::counter!("relay_watchdog_restarts_total").increment(1);
                self.publishers.forget_all().await;
                None
            }
        }
    }
}

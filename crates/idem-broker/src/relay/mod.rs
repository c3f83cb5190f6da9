//! The outbox relay: claims pending outbox rows, publishes each with its own
//! key, marks it sent; retries failures later with full jitter under a retry
//! budget; dead-letters a row after N attempts (5 by default).
//!
//! Why the retries live in the table and not in a loop around the publish:
//! a relay publishes many rows, and one slow destination must not hold up the
//! others, nor must a restart forget where each row stood. So a failed row is
//! given back with its attempt count and a due time drawn with full jitter
//! (`uniform(0, min(cap, base · 2^k))`, idem-retry's [`Backoff`]), raised to the
//! destination's `Retry-After` if it sent one; any relay picks it up when it is
//! due. The attempt is counted when the row is *claimed*, so a relay that dies
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
//! Modules: configuration and the run loop here; one pass (claim, publish,
//! settle) in `pass`; the publisher cache in `publishers`.

mod pass;
mod publishers;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Error, SharedClock, Timestamp};
use idem_retry::{Backoff, RetryBudget};

use crate::dead_letter::{self, DeadLetterUpkeep};
use crate::outbox::{self, OutboxStore};
use crate::publish::Destination;

pub use self::pass::Pass;
use self::publishers::Publishers;

/// Attempts before a row is dead-lettered: 5.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// How long a claim protects a row from other relays.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long one publish may wait for its confirmation.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the relay looks for due rows when nothing woke it.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long sent rows and dead letters are kept.
pub const DEFAULT_RETENTION: Duration = idem_core::DEFAULT_RETENTION;

/// How a relay works. `RelayConfig::default()` uses the `DEFAULT_*` constants
/// of this module and the defaults given on each field.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Where rows enqueued with [`Route::Default`](crate::outbox::Route::Default)
    /// go. Rows with their own destination always go there. Without a default,
    /// such rows are left for a relay that has one.
    pub default_destination: Option<Destination>,
    /// Rows claimed per pass (default 100).
    pub batch: usize,
    /// Publishes in flight at once within a pass (default 16).
    pub concurrency: usize,
    /// How long a claim protects a row (default 30 s). It must be longer than
    /// a publish can take, or another relay sends the row again meanwhile.
    pub lease: Duration,
    /// How long one publish (connecting included) may wait for its
    /// confirmation (default 10 s; never more than half the lease).
    pub publish_timeout: Duration,
    /// Attempts before a row is dead-lettered (default 5).
    pub max_attempts: u32,
    /// Base and cap of the delay before retry k (default 200 ms, 20 s); its
    /// attempt limit is ignored in favour of `max_attempts`.
    pub backoff: Backoff,
    /// How often to look for due rows when nothing woke the relay (default 1 s).
    pub poll_interval: Duration,
    /// How long sent rows and dead letters are kept (default 7 days).
    pub retention: Duration,
    /// How often the sweep and the lag gauges run (default 60 s).
    pub upkeep_interval: Duration,
    /// Rows deleted per sweep transaction (default 1000).
    pub sweep_batch: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            default_destination: None,
            batch: 100,
            concurrency: 16,
            lease: DEFAULT_LEASE,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            retention: DEFAULT_RETENTION,
            upkeep_interval: Duration::from_secs(60),
            sweep_batch: 1000,
        }
    }
}

impl RelayConfig {
    /// How long after a row's first publish this relay's own schedule may
    /// publish it again: every attempt may hold its claim for a whole lease (a
    /// publish whose confirmation never came, a relay that died mid-publish),
    /// and the retries wait at most their backoff ceilings. A consumer whose
    /// dedupe window is shorter could apply a late copy a second time; give it
    /// to the consumer's [`producer_horizon`](crate::consume::ConsumerConfig::producer_horizon).
    ///
    /// What the schedule cannot know is not in it: a destination's
    /// `Retry-After` longer than the backoff's cap, retries postponed by an
    /// exhausted retry budget, and time when no relay runs at all. Add what
    /// you expect of those, or keep the window far above the horizon (7 days
    /// against 2 min 33 s by default).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_broker::relay::RelayConfig;
    /// // 5 attempts of a 30 s lease, and retries after at most 0.2 + 0.4 + 0.8 + 1.6 s.
    /// assert_eq!(RelayConfig::default().retry_horizon(), Duration::from_millis(153_000));
    /// ```
    pub fn retry_horizon(&self) -> Duration {
        self.lease
            .saturating_mul(self.max_attempts.max(1))
            .saturating_add(
                self.backoff
                    .total_ceiling(self.max_attempts.saturating_sub(1)),
            )
    }

    /// This configuration with a default destination.
    pub fn with_default_destination(mut self, destination: Destination) -> Self {
        self.default_destination = Some(destination);
        self
    }
}

/// A named place in a pass where a test can make the relay stop as if it had
/// crashed: the rows keep their leases, nothing after the point happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailPoint {
    /// Every row of the pass was published and confirmed; none is marked sent.
    AfterPublish,
}

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

impl<S: OutboxStore + DeadLetterUpkeep> Relay<S> {
    /// A relay on `store`'s clock with a budget of its own (10 % of requests).
    pub fn new(store: S, config: RelayConfig) -> Self {
        let clock = store.outbox_clock();
        let owner = format!("relay-{}-{:08x}", std::process::id(), rand::random::<u32>());
        Self {
            store,
            config,
            owner,
            clock,
            budget: Arc::new(RetryBudget::default()),
            publishers: Publishers::default(),
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
        pass::run(self).await
    }

    /// Passes until no row is due, or a pass only gave rows back for later:
    /// what `idem relay --once` does. Rows whose retry is due later are left
    /// for a later run, so a destination that is down is not hammered.
    pub async fn drain(&self) -> Result<Pass, Error> {
        self.store.migrate_outbox().await?;
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
        let before = Timestamp(
            self.now()
                .0
                .saturating_sub(outbox::millis(self.config.retention)),
        );
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
        dead_letter::observe_stats(&self.store.stats().await?, now);
        Ok(swept)
    }

    /// Runs until `shutdown` completes: a pass whenever rows are enqueued
    /// (PostgreSQL NOTIFY) or the poll interval passes, right away again while
    /// passes come back full, and the upkeep every `upkeep_interval`.
    /// Transient store failures are logged and retried; others end the run.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        self.store.migrate_outbox().await?;
        let mut wake_ups = match self.store.wake_ups().await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "cannot LISTEN for new outbox rows; polling only");
                None
            }
        };
        tokio::pin!(shutdown);
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
            let pause = match self.run_once().await {
                Ok(pass) => {
                    failures = 0;
                    if pass.claimed >= self.config.batch.max(1) {
                        continue;
                    }
                    self.config.poll_interval
                }
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    let pause = self
                        .config
                        .backoff
                        .ceiling(failures.min(16))
                        .max(self.config.poll_interval);
                    tracing::warn!(%error, pause_ms = pause.as_millis() as u64, "relay pass failed; trying again");
                    pause
                }
                Err(error) => return Err(error),
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
}

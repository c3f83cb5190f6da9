//! How a relay works: its settings with their defaults, and the fail point
//! crash tests stop it at. A module of its own so a pass and the run loop
//! both read it without reading each other.

use std::time::Duration;

use idem_retry::Backoff;
use idem_trace::KeyInSpans;

use crate::consume::Reconnect;
use crate::publish::{ConnectOptions, Destination};

/// Attempts before a row is dead-lettered: 5.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// How long a claim protects a row from other relays.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long one publish may wait for its confirmation.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the relay looks for due rows when nothing woke it.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long one pass may take before the watchdog restarts the relay's loop.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(300);
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
    /// How a row's key appears in its `publish` span (default as it is).
    pub key_in_spans: KeyInSpans,
    /// The pauses after a pass failed because the store could not be
    /// reached: full jitter from its min up to its max (default 100 ms to
    /// 30 s), never shorter than the poll interval, for as long as it takes.
    pub reconnect: Reconnect,
    /// How long one pass may take before the relay gives up on it, drops its
    /// broker connections and starts over (default 5 min; `None`: never).
    /// The rows of the abandoned pass keep their claims and are published
    /// again when their leases end.
    pub watchdog: Option<Duration>,
    /// What connecting to a destination may need beyond its URL (the TLS
    /// roots of `https://` webhooks).
    pub connect: ConnectOptions,
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
            key_in_spans: KeyInSpans::Raw,
            reconnect: Reconnect::default(),
            watchdog: Some(DEFAULT_WATCHDOG),
            connect: ConnectOptions::default(),
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

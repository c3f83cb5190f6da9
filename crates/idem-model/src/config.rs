//! What one run of the model covers: how many workers, how far the clock
//! goes, the lease and the window in ticks, which order a worker runs its
//! effect in, and an optional bug seeded into the store to show that the
//! checker finds it.

use std::time::Duration;

use idem_core::{Settings, Timestamp};

/// The order a worker runs its effect and records it in, as the two leased
/// calls of `LeaseStore` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// `apply_leased`: write to the resource, then complete the record
    /// (at-least-once: a crash in between repeats the effect after a takeover).
    EffectFirst,
    /// `apply_at_most_once`: complete the record, then write to the resource
    /// (at-most-once: a crash in between loses the effect).
    RecordFirst,
}

/// A mistake planted in the modelled store, to show that the checker catches
/// it with a counterexample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// `complete` settles any in-flight record, whatever token the caller holds.
    CompleteIgnoresToken,
    /// A takeover keeps the expired claim's token instead of the one `decide`
    /// gave it.
    TakeoverReusesToken,
}

/// The bounds and settings of one model check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Workers delivering the same key.
    pub workers: usize,
    /// The clock stops at this tick.
    pub horizon: i64,
    /// The lease, in ticks.
    pub lease: i64,
    /// The dedupe window (retention), in ticks.
    pub retention: i64,
    /// Claims granted in one run, at most (a release lets the next claim in
    /// without the clock moving, so this bounds the tokens).
    pub max_claims: u8,
    /// The order of effect and record.
    pub order: Order,
    /// Whether a sweeper may delete records past retention.
    pub sweeps: bool,
    /// A bug planted in the store, if any.
    pub bug: Option<Bug>,
}

impl Default for Config {
    /// Three workers, a clock of six ticks, a lease of two ticks, five claims and a
    /// window far longer than the run.
    fn default() -> Self {
        Self {
            workers: 3,
            horizon: 6,
            lease: 2,
            retention: 1_000,
            max_claims: 5,
            order: Order::EffectFirst,
            sweeps: true,
            bug: None,
        }
    }
}

impl Config {
    /// The same run with a window of `ticks`.
    pub fn with_retention(mut self, ticks: i64) -> Self {
        self.retention = ticks;
        self
    }

    /// The same run in another order.
    pub fn with_order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    /// The same run with or without a sweeper.
    pub fn with_sweeps(mut self, sweeps: bool) -> Self {
        self.sweeps = sweeps;
        self
    }

    /// The same run against a store with `bug`.
    pub fn with_bug(mut self, bug: Bug) -> Self {
        self.bug = Some(bug);
        self
    }

    /// The protocol's settings in these units: one tick is one millisecond of
    /// a [`Timestamp`].
    pub fn settings(&self) -> Settings {
        Settings::default()
            .with_lease(ticks(self.lease))
            .with_retention(ticks(self.retention))
    }

    /// The last tick of the clock.
    pub fn end(&self) -> Timestamp {
        Timestamp(self.horizon)
    }
}

fn ticks(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

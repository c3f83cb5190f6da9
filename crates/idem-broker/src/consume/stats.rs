//! Counters of what a running consumer did, readable while it runs (tests
//! and the benchmark wait on them; metrics carry the same events).

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared with [`Consumer::stats`](super::Consumer::stats).
#[derive(Debug, Default)]
pub struct Stats {
    received: AtomicU64,
    applied: AtomicU64,
    replayed: AtomicU64,
    dead_lettered: AtomicU64,
    requeued: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Deliveries received.
    pub received: u64,
    /// Effects applied now (committed, then acked).
    pub applied: u64,
    /// Duplicates answered from the store (acked, effect not run).
    pub replayed: u64,
    /// Messages recorded as dead letters (then acked).
    pub dead_lettered: u64,
    /// Deliveries given back for redelivery.
    pub requeued: u64,
}

impl StatsSnapshot {
    /// Deliveries acked: applied, replayed or dead-lettered.
    pub fn acked(&self) -> u64 {
        self.applied + self.replayed + self.dead_lettered
    }
}

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Applied,
    Replayed,
    DeadLettered,
    Requeued,
}

impl Settled {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Replayed => "replayed",
            Self::DeadLettered => "dead_lettered",
            Self::Requeued => "requeued",
        }
    }
}

impl Stats {
    pub(crate) fn received(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn settled(&self, what: Settled) {
        let counter = match what {
            Settled::Applied => &self.applied,
            Settled::Replayed => &self.replayed,
            Settled::DeadLettered => &self.dead_lettered,
            Settled::Requeued => &self.requeued,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            received: self.received.load(Ordering::Relaxed),
            applied: self.applied.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            requeued: self.requeued.load(Ordering::Relaxed),
        }
    }
}

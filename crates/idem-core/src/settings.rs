//! The protocol's settings: how long a claim is protected and how long a
//! record is kept, with their defaults.

use std::time::Duration;

use crate::clock::Timestamp;

/// How long records live and how long claims are protected. Lease and
/// retention are separate on purpose: a short, renewable lease lets a crashed
/// worker's claim be taken over quickly, while completed outcomes are kept for
/// the whole dedupe window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// How long an in-flight claim is protected before another worker may take it
    /// over. Default 60 s.
    pub lease: Duration,
    /// How long a record is kept after it was created (the dedupe window).
    /// Default 7 days.
    pub retention: Duration,
    /// The longest `retry_after` hint given to a concurrent duplicate. Default 1 s.
    pub in_flight_retry_after: Duration,
    /// How long a key is still remembered after its window ended, so that a
    /// late retry is refused ([`Error::Expired`](crate::Error::Expired))
    /// rather than applied again. The sweep leaves a tombstone (scope, key,
    /// fingerprint, when the window ended) in place of each record it
    /// deletes, and deletes the tombstone once this grace period is over.
    /// `None` (the default): past its window a key is new again.
    pub tombstones: Option<Duration>,
}

/// The default lease of an in-flight claim: 60 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default dedupe window: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            in_flight_retry_after: Duration::from_secs(1),
            tombstones: None,
        }
    }
}

impl Settings {
    /// These settings with another lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// These settings with tombstones kept for `grace` after a key's window
    /// ends (see [`tombstones`](Self::tombstones)), or none.
    pub fn with_tombstones(mut self, grace: Option<Duration>) -> Self {
        self.tombstones = grace;
        self
    }

    /// Whether a key whose window ended at `expired_at` is still refused at
    /// `now` (tombstones are kept and the grace period is not over).
    pub fn refuses_late(&self, expired_at: Timestamp, now: Timestamp) -> bool {
        self.tombstones
            .is_some_and(|grace| expired_at <= now && now < expired_at.plus(grace))
    }

    /// These settings with another retention.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
}

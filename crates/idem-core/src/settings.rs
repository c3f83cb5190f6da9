//! The protocol's settings: how long a claim is protected and how long a
//! record is kept, with their defaults.

use std::time::Duration;

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
        }
    }
}

impl Settings {
    /// These settings with another lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// These settings with another retention.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
}

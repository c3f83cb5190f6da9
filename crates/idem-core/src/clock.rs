//! Time behind a trait, so lease and retention tests move time instead of
//! sleeping.
//!
//! Stores compare times in whole milliseconds since the Unix epoch, computed by
//! the application's clock and passed to the database as parameters. The
//! database's own clock is never consulted, so a test that advances a
//! [`ManualClock`] sees leases end exactly when it says.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// This instant as a wall-clock time (milliseconds since the Unix epoch).
    pub fn system_time(self) -> std::time::SystemTime {
        let since = Duration::from_millis(self.0.unsigned_abs());
        if self.0 >= 0 {
            std::time::UNIX_EPOCH + since
        } else {
            std::time::UNIX_EPOCH - since
        }
    }

    /// This instant in RFC 3339 form, to the millisecond, in UTC
    /// (`2026-12-05T16:40:00.000Z`).
    pub fn rfc3339(self) -> String {
        humantime::format_rfc3339_millis(self.system_time()).to_string()
    }

    /// The instant `by` after this one.
    pub fn plus(self, by: Duration) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// The instant `by` before this one.
    pub fn minus(self, by: Duration) -> Self {
        Self(
            self.0
                .saturating_sub(i64::try_from(by.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long from `self` until `later`; zero if `later` is not later.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(later.0 - self.0).unwrap_or(0))
    }

    /// As a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        match u64::try_from(self.0) {
            Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
            Err(_) => UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs()),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A source of the current time.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// let start = clock.now();
/// clock.advance(Duration::from_secs(61));
/// assert_eq!(start.until(clock.now()), Duration::from_secs(61));
/// ```
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `millis` since the epoch.
    pub fn new(millis: i64) -> Self {
        Self(Arc::new(AtomicI64::new(millis)))
    }

    /// A clock standing at the current wall-clock time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now().0)
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(
            i64::try_from(by.as_millis()).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Sets the clock.
    pub fn set(&self, at: Timestamp) {
        self.0.store(at.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// A shared clock handle, as stores hold it.
pub type SharedClock = Arc<dyn Clock>;

//! Monotonic time and sleeping behind a trait, so no test waits for a backoff.
//!
//! Why not the [`idem_core::Clock`]: that clock is wall time in milliseconds,
//! which is what leases, retention and the budget's window are measured in.
//! A retry loop needs two other things: a monotonic "now" to measure its
//! deadline against, and a way to sleep. Production uses tokio's timer (which
//! also follows tokio's paused test time); tests and simulations use
//! [`VirtualTimer`], whose sleeps return at once and are written down, so a test
//! can assert the exact delays a loop asked for.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A sleep in progress.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock that can sleep.
///
/// ```
/// use std::time::Duration;
/// use idem_retry::{Timer, VirtualTimer};
///
/// # futures::executor::block_on(async {
/// let timer = VirtualTimer::new();
/// let start = timer.now();
/// timer.sleep(Duration::from_secs(30)).await; // returns at once
/// assert_eq!(timer.now() - start, Duration::from_secs(30));
/// assert_eq!(timer.slept(), [Duration::from_secs(30)]);
/// # });
/// ```
pub trait Timer: Send + Sync + fmt::Debug {
    /// Now, on a clock that never goes back.
    fn now(&self) -> Instant;
    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// Tokio's timer. Honours `tokio::time::pause` and `#[tokio::test(start_paused = true)]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A timer whose sleeps complete at once and move its own clock forward by the
/// time asked for. Clones share the clock and the record.
#[derive(Debug, Clone)]
pub struct VirtualTimer {
    start: Instant,
    state: Arc<Mutex<VirtualState>>,
}

#[derive(Debug, Default)]
struct VirtualState {
    elapsed: Duration,
    slept: Vec<Duration>,
}

/// How far a virtual clock can run before it stops moving: a century, which no
/// sensible backoff reaches and which `Instant` can always represent.
const VIRTUAL_HORIZON: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Default for VirtualTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtualTimer {
    /// A virtual timer standing at the real "now".
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            state: Arc::default(),
        }
    }

    /// Every sleep asked for so far, in order.
    pub fn slept(&self) -> Vec<Duration> {
        self.lock().slept.clone()
    }

    /// The virtual time that has passed.
    pub fn elapsed(&self) -> Duration {
        self.lock().elapsed
    }

    /// Moves the clock forward without recording a sleep (time spent working).
    pub fn advance(&self, by: Duration) {
        let mut state = self.lock();
        state.elapsed = state.elapsed.saturating_add(by).min(VIRTUAL_HORIZON);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VirtualState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Timer for VirtualTimer {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.advance(duration);
        self.lock().slept.push(duration);
        Box::pin(std::future::ready(()))
    }
}

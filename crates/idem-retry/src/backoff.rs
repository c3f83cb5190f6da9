//! How long to wait before each retry: exponential growth, a cap, and full jitter.
//!
//! Why jitter at all: clients that failed together retry together. Without
//! jitter every client of a struggling service comes back at the same instants
//! (200 ms, 400 ms, 800 ms after the failure), and the service sees periodic
//! spikes exactly when it can least afford them. *Full* jitter draws each delay
//! uniformly from `[0, ceiling]` instead of adding a little noise around the
//! ceiling: it spreads retries over the whole interval, which is what takes the
//! spikes away, and on average it waits half as long as a fixed backoff.
//!
//! Why an iterator: a backoff is just a sequence of delays. The retry loop
//! asks for the next one and stops when there is none; it does not need to know
//! how they were made, and a test can read the sequence without running a loop.
//!
//! Retry `k` (counting from 0 for the first retry) waits
//! `uniform(0, min(cap, base * 2^k))`. The arithmetic saturates: a large `k`
//! or a huge base gives the cap, never an overflow.

use std::iter::FusedIterator;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Default first ceiling: 200 ms.
pub const DEFAULT_BASE: Duration = Duration::from_millis(200);
/// Default largest ceiling: 20 s.
pub const DEFAULT_CAP: Duration = Duration::from_secs(20);
/// Default number of attempts, the first one included: 6.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;

/// The settings of a full-jitter backoff. A value: cheap to copy, and every call
/// to [`delays`](Self::delays) starts a fresh sequence.
///
/// ```
/// use std::time::Duration;
/// use idem_retry::Backoff;
///
/// let backoff = Backoff::default(); // 200 ms, 20 s, 6 attempts
/// let delays: Vec<Duration> = backoff.delays().collect();
/// assert_eq!(delays.len(), 5); // 6 attempts = 1 first try + 5 retries
/// for (k, delay) in delays.iter().enumerate() {
///     assert!(*delay <= backoff.ceiling(k as u32));
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    max_attempts: u32,
    seed: Option<u64>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(DEFAULT_BASE, DEFAULT_CAP, DEFAULT_MAX_ATTEMPTS)
    }
}

impl Backoff {
    /// A backoff whose first ceiling is `base`, doubling up to `cap`, allowing
    /// `max_attempts` attempts in all (the first one included; 0 counts as 1).
    pub fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        Self {
            base,
            cap,
            max_attempts: max_attempts.max(1),
            seed: None,
        }
    }

    /// The same backoff with another first ceiling.
    pub fn with_base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The same backoff with another cap.
    pub fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// The same backoff with another attempt limit (the first attempt included;
    /// 0 counts as 1).
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// The same backoff drawing from a fixed seed, so every sequence it makes is
    /// the same. For tests and simulations: in production a shared seed would
    /// put every client back in step, which is what jitter is there to prevent.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The first ceiling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest ceiling.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// How many attempts are allowed, the first one included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The upper bound of the delay before retry `k` (0 for the first retry):
    /// `min(cap, base * 2^k)`, saturating instead of overflowing.
    pub fn ceiling(&self, k: u32) -> Duration {
        let doubled = 1u32
            .checked_shl(k)
            .and_then(|factor| self.base.checked_mul(factor));
        match doubled {
            Some(ceiling) => ceiling.min(self.cap),
            None => self.cap,
        }
    }

    /// One full-jitter draw for retry `k`, uniform in `[0, ceiling(k)]`, for a
    /// loop that keeps its own count and has no attempt limit (reconnecting
    /// to a broker until it answers). Drawn from fresh entropy; the seed is
    /// not used.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_retry::Backoff;
    ///
    /// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 1);
    /// assert!(backoff.draw(50) <= Duration::from_secs(1));
    /// ```
    pub fn draw(&self, k: u32) -> Duration {
        let ceiling = self.ceiling(k);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// The most that the delays before the first `retries` retries can add
    /// up to: the sum of their ceilings. With the attempts' own durations, it
    /// bounds how long after a first attempt the last one can start.
    pub fn total_ceiling(&self, retries: u32) -> Duration {
        (0..retries).fold(Duration::ZERO, |total, k| {
            total.saturating_add(self.ceiling(k))
        })
    }

    /// A fresh sequence of delays, one per retry: `max_attempts - 1` of them.
    /// Seeded if [`with_seed`](Self::with_seed) was used, otherwise drawn from
    /// fresh entropy.
    pub fn delays(&self) -> FullJitter {
        let rng = match self.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        self.delays_from(rng)
    }

    /// A fresh sequence of delays drawn from `rng`.
    pub fn delays_from(&self, rng: StdRng) -> FullJitter {
        FullJitter {
            backoff: *self,
            next_retry: 0,
            rng,
        }
    }
}

/// The delays of one call's retries, drawn with full jitter. Yields
/// `max_attempts - 1` delays, then `None` for ever.
#[derive(Debug, Clone)]
pub struct FullJitter {
    backoff: Backoff,
    next_retry: u32,
    rng: StdRng,
}

impl FullJitter {
    /// How many retries this sequence still allows.
    pub fn retries_left(&self) -> u32 {
        (self.backoff.max_attempts - 1).saturating_sub(self.next_retry)
    }
}

impl Iterator for FullJitter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.retries_left() == 0 {
            return None;
        }
        let ceiling = self.backoff.ceiling(self.next_retry);
        self.next_retry += 1;
        // Durations past u64::MAX nanoseconds (584 years) are clamped there.
        let ceiling_nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Some(Duration::from_nanos(
            self.rng.random_range(0..=ceiling_nanos),
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.retries_left()).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl ExactSizeIterator for FullJitter {}
impl FusedIterator for FullJitter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_from_base_up_to_cap() {
        let backoff = Backoff::default();
        let ceilings: Vec<u128> = (0..9).map(|k| backoff.ceiling(k).as_millis()).collect();
        assert_eq!(
            ceilings,
            [200, 400, 800, 1_600, 3_200, 6_400, 12_800, 20_000, 20_000]
        );
    }

    #[test]
    fn total_ceiling_adds_the_ceilings_and_saturates() {
        let backoff = Backoff::default();
        assert_eq!(backoff.total_ceiling(0), Duration::ZERO);
        assert_eq!(backoff.total_ceiling(4), Duration::from_millis(3_000));
        assert_eq!(backoff.total_ceiling(9), Duration::from_millis(65_400));
        let huge = Backoff::new(Duration::MAX, Duration::MAX, 3);
        assert_eq!(huge.total_ceiling(3), Duration::MAX);
    }

    #[test]
    fn large_exponents_and_bases_saturate_to_the_cap() {
        let backoff = Backoff::default();
        assert_eq!(backoff.ceiling(31), DEFAULT_CAP);
        assert_eq!(backoff.ceiling(32), DEFAULT_CAP);
        assert_eq!(backoff.ceiling(u32::MAX), DEFAULT_CAP);

        let huge = Backoff::new(Duration::MAX, Duration::MAX, u32::MAX).with_seed(1);
        assert_eq!(huge.ceiling(40), Duration::MAX);
        let far = huge.delays().nth(300).expect("plenty of retries left");
        assert!(far <= Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn yields_one_delay_per_retry_and_then_stops() {
        let mut delays = Backoff::default().with_max_attempts(3).delays();
        assert_eq!(delays.len(), 2);
        assert!(delays.next().is_some());
        assert!(delays.next().is_some());
        assert_eq!(delays.next(), None);
        assert_eq!(delays.next(), None);

        assert_eq!(Backoff::default().with_max_attempts(0).delays().count(), 0);
        assert_eq!(Backoff::default().with_max_attempts(1).delays().count(), 0);
    }

    #[test]
    fn a_seed_repeats_the_sequence() {
        let backoff = Backoff::default().with_seed(7);
        let first: Vec<_> = backoff.delays().collect();
        let second: Vec<_> = backoff.delays().collect();
        assert_eq!(first, second);
        let other: Vec<_> = backoff.with_seed(8).delays().collect();
        assert_ne!(first, other);
    }
}

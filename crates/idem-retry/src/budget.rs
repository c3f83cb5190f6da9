//! A retry budget: retries as a share of requests, shared by every client in a
//! process.
//!
//! Why budgets and not a maximum number of attempts: a per-call limit bounds one
//! call, not the load. When a service fails, *every* call hits its limit, and
//! limits multiply down a call chain: three levels that each try three times
//! send 3 × 3 × 3 = 27 requests to the bottom service for every request at the
//! top, exactly when it is least able to take them. Retries then keep the outage
//! going after its cause is gone. A budget bounds retries by the traffic that is
//! actually flowing: with the default 10 %, each level adds at most a tenth to
//! the load below it (1.1³ ≈ 1.33 over three levels instead of 27), however
//! many attempts each call would have been allowed. While things are healthy
//! few calls fail, the budget is never touched, and single failures are still
//! retried at once.
//!
//! The budget counts over a sliding window (10 s by default, in ten slots) so a
//! burst of failures spends the allowance earned by the recent past, not by the
//! last hour. A small minimum (10 retries per second by default) keeps retries
//! possible for a process that makes few calls, where 10 % of almost nothing
//! would be nothing.
//!
//! It is meant to be shared: one `Arc<RetryBudget>` for every client of a
//! process (or of one downstream), so the share holds for the process as a
//! whole. The state sits behind a mutex held for a few additions. Time comes
//! from an [`idem_core::Clock`], so tests move a
//! [`ManualClock`](idem_core::ManualClock) instead of sleeping.
//!
//! When it runs out, [`RetryBudget::try_withdraw`] refuses with
//! [`BudgetExhausted`] and counts `retry_budget_exhausted_total`: the call
//! fails fast with its last outcome instead of adding load.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_core::{SharedClock, SystemClock};

use crate::observe;

/// Default share of requests that may be retried: 10 %, the per-client retry
/// ratio the Google SRE book suggests.
pub const DEFAULT_RETRY_RATIO: f64 = 0.1;
/// Default window over which requests and retries are counted: 10 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// Default number of retries allowed in any second whatever the ratio: 10.
pub const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 10;

/// Number of slots the window is divided into; it slides one slot at a time.
const SLOTS: usize = 10;

/// How much retrying a [`RetryBudget`] allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSettings {
    /// Retries allowed as a share of the requests in the window (0.1 = 10 %).
    pub retry_ratio: f64,
    /// How far back requests and retries are counted.
    pub window: Duration,
    /// Retries allowed in any one second even when the ratio is used up.
    pub min_retries_per_second: u32,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            retry_ratio: DEFAULT_RETRY_RATIO,
            window: DEFAULT_WINDOW,
            min_retries_per_second: DEFAULT_MIN_RETRIES_PER_SECOND,
        }
    }
}

/// Settings a budget cannot work with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidBudget {
    /// The ratio was negative, infinite or not a number.
    #[error("retry ratio {0} must be a finite number of at least 0 (0.1 means 10 % of requests)")]
    Ratio(f64),
    /// The window was shorter than one millisecond per slot.
    #[error("retry budget window {window:?} is too short: it must be at least {minimum:?}")]
    WindowTooShort {
        /// The window given.
        window: Duration,
        /// The shortest window accepted.
        minimum: Duration,
    },
}

/// A retry was refused because the budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "retry budget exhausted: {retries} retries already made against {requests} requests in the last {window:?} (allowed: {ratio_percent} % of requests, or {min_per_second} per second); failing fast instead of adding load to a struggling service"
)]
pub struct BudgetExhausted {
    /// Retries counted in the window.
    pub retries: u64,
    /// Requests counted in the window.
    pub requests: u64,
    /// The window.
    pub window: Duration,
    /// The ratio, in percent.
    pub ratio_percent: f64,
    /// The per-second minimum.
    pub min_per_second: u32,
}

/// What a budget has counted in its current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetUsage {
    /// Requests (first attempts) in the window.
    pub requests: u64,
    /// Retries granted in the window.
    pub retries: u64,
}

/// Retries limited to a share of requests over a sliding window, plus a small
/// per-second minimum. Share one per process: `Arc<RetryBudget>`.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::ManualClock;
/// use idem_retry::{BudgetSettings, RetryBudget};
///
/// let clock = ManualClock::new(0);
/// let settings = BudgetSettings { min_retries_per_second: 0, ..BudgetSettings::default() };
/// let budget = Arc::new(RetryBudget::with_clock(settings, Arc::new(clock)).unwrap());
/// for _ in 0..20 {
///     budget.record_request();
/// }
/// // 10 % of 20 requests: two retries, then the budget refuses.
/// assert!(budget.try_withdraw().is_ok());
/// assert!(budget.try_withdraw().is_ok());
/// assert!(budget.try_withdraw().is_err());
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    limits: Option<Limits>,
    clock: SharedClock,
    window: Mutex<Window>,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    settings: BudgetSettings,
    slot_ms: i64,
}

impl Default for RetryBudget {
    /// The default budget (10 % over 10 s, at least 10 retries per second) on
    /// the system clock.
    fn default() -> Self {
        Self::with_clock(BudgetSettings::default(), Arc::new(SystemClock))
            .expect("the default settings are valid")
    }
}

impl RetryBudget {
    /// A budget with these settings on the system clock.
    pub fn new(settings: BudgetSettings) -> Result<Self, InvalidBudget> {
        Self::with_clock(settings, Arc::new(SystemClock))
    }

    /// A budget with these settings, reading time from `clock`.
    pub fn with_clock(settings: BudgetSettings, clock: SharedClock) -> Result<Self, InvalidBudget> {
        if !settings.retry_ratio.is_finite() || settings.retry_ratio < 0.0 {
            return Err(InvalidBudget::Ratio(settings.retry_ratio));
        }
        let minimum = Duration::from_millis(SLOTS as u64);
        let window_ms = i64::try_from(settings.window.as_millis()).unwrap_or(i64::MAX);
        if settings.window < minimum {
            return Err(InvalidBudget::WindowTooShort {
                window: settings.window,
                minimum,
            });
        }
        Ok(Self {
            limits: Some(Limits {
                settings,
                slot_ms: window_ms / SLOTS as i64,
            }),
            clock,
            window: Mutex::new(Window::default()),
        })
    }

    /// A budget that never refuses: every retry the backoff allows is made.
    /// For comparisons and for callers that bound load another way; it still
    /// counts, so [`usage`](Self::usage) works.
    pub fn unlimited() -> Self {
        Self {
            limits: None,
            clock: Arc::new(SystemClock),
            window: Mutex::new(Window::default()),
        }
    }

    /// The settings, or `None` for an unlimited budget.
    pub fn settings(&self) -> Option<BudgetSettings> {
        self.limits.map(|limits| limits.settings)
    }

    /// Counts a request (a first attempt): it earns the share of a retry.
    pub fn record_request(&self) {
        self.update(|window, now| window.slot(now).requests += 1);
    }

    /// Asks to make one retry. Granted retries are counted; a refusal counts
    /// `retry_budget_exhausted_total` and says how the window stood.
    pub fn try_withdraw(&self) -> Result<(), BudgetExhausted> {
        let Some(limits) = self.limits else {
            self.update(|window, now| window.grant(now));
            return Ok(());
        };
        let outcome = self.update(|window, now| {
            let usage = window.usage(now);
            // The small allowance absorbs float rounding (0.1 × 30 is not quite 3).
            let within_ratio = (usage.retries + 1) as f64
                <= limits.settings.retry_ratio * usage.requests as f64 + 1e-9;
            let within_minimum =
                window.retries_this_second(now) < u64::from(limits.settings.min_retries_per_second);
            if within_ratio || within_minimum {
                window.grant(now);
                Ok(())
            } else {
                Err(BudgetExhausted {
                    retries: usage.retries,
                    requests: usage.requests,
                    window: limits.settings.window,
                    ratio_percent: limits.settings.retry_ratio * 100.0,
                    min_per_second: limits.settings.min_retries_per_second,
                })
            }
        });
        if outcome.is_err() {
            observe::budget_exhausted();
        }
        outcome
    }

    /// Requests and retries counted in the current window.
    pub fn usage(&self) -> BudgetUsage {
        self.update(|window, now| window.usage(now))
    }

    fn update<R>(&self, change: impl FnOnce(&mut Window, Now) -> R) -> R {
        let slot_ms = self.limits.map_or(1_000, |limits| limits.slot_ms);
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        // Wall clocks can step back; the window never does.
        let millis = self.clock.now().0.max(window.latest_ms);
        window.latest_ms = millis;
        let now = Now {
            slot: millis.div_euclid(slot_ms),
            second: millis.div_euclid(1_000),
        };
        change(&mut window, now)
    }
}

/// The current slot and second numbers.
#[derive(Debug, Clone, Copy)]
struct Now {
    slot: i64,
    second: i64,
}

#[derive(Debug, Default)]
struct Window {
    slots: [Slot; SLOTS],
    latest_ms: i64,
    second: i64,
    retries_in_second: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    number: i64,
    requests: u64,
    retries: u64,
}

impl Window {
    /// The slot for `now`, emptied first if it last held an older slot.
    fn slot(&mut self, now: Now) -> &mut Slot {
        let slot = &mut self.slots[now.slot.rem_euclid(SLOTS as i64) as usize];
        if slot.number != now.slot {
            *slot = Slot {
                number: now.slot,
                ..Slot::default()
            };
        }
        slot
    }

    fn usage(&self, now: Now) -> BudgetUsage {
        let oldest = now.slot - (SLOTS as i64 - 1);
        self.slots
            .iter()
            .filter(|slot| (oldest..=now.slot).contains(&slot.number))
            .fold(BudgetUsage::default(), |sum, slot| BudgetUsage {
                requests: sum.requests + slot.requests,
                retries: sum.retries + slot.retries,
            })
    }

    fn retries_this_second(&self, now: Now) -> u64 {
        if self.second == now.second {
            self.retries_in_second
        } else {
            0
        }
    }

    fn grant(&mut self, now: Now) {
        self.slot(now).retries += 1;
        if self.second != now.second {
            self.second = now.second;
            self.retries_in_second = 0;
        }
        self.retries_in_second += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::ManualClock;

    fn budget(settings: BudgetSettings) -> (RetryBudget, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        let budget = RetryBudget::with_clock(settings, Arc::new(clock.clone())).unwrap();
        (budget, clock)
    }

    fn grants(budget: &RetryBudget, asks: usize) -> usize {
        (0..asks).filter(|_| budget.try_withdraw().is_ok()).count()
    }

    #[test]
    fn allows_a_tenth_of_requests() {
        let (budget, _) = budget(BudgetSettings {
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        });
        for _ in 0..1_000 {
            budget.record_request();
        }
        assert_eq!(grants(&budget, 500), 100);
        assert_eq!(
            budget.usage(),
            BudgetUsage {
                requests: 1_000,
                retries: 100
            }
        );
    }

    #[test]
    fn the_window_slides() {
        let (budget, clock) = budget(BudgetSettings {
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        });
        for _ in 0..100 {
            budget.record_request();
        }
        assert_eq!(grants(&budget, 50), 10);
        // Half a window later the old requests still count, and so do the retries.
        clock.advance(Duration::from_secs(5));
        assert_eq!(grants(&budget, 50), 0);
        for _ in 0..100 {
            budget.record_request();
        }
        assert_eq!(grants(&budget, 50), 10);
        // Once the first batch has slid out, only the second counts: 100
        // requests against 20 retries, of which 10 slid out with it.
        clock.advance(Duration::from_secs(5));
        assert_eq!(
            budget.usage(),
            BudgetUsage {
                requests: 100,
                retries: 10
            }
        );
        assert_eq!(grants(&budget, 50), 0);
        clock.advance(Duration::from_secs(10));
        assert_eq!(budget.usage(), BudgetUsage::default());
    }

    #[test]
    fn a_quiet_process_still_gets_its_minimum_per_second() {
        let (budget, clock) = budget(BudgetSettings::default());
        assert_eq!(grants(&budget, 50), 10);
        clock.advance(Duration::from_millis(999));
        assert_eq!(grants(&budget, 50), 0, "still the same second");
        clock.advance(Duration::from_millis(1));
        assert_eq!(grants(&budget, 50), 10);
    }

    #[test]
    fn a_clock_stepping_back_does_not_rewind_the_window() {
        let (budget, clock) = budget(BudgetSettings {
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        });
        for _ in 0..10 {
            budget.record_request();
        }
        clock.set(idem_core::Timestamp(0));
        assert_eq!(budget.usage().requests, 10);
        assert_eq!(grants(&budget, 5), 1);
    }

    #[test]
    fn unlimited_never_refuses_but_counts() {
        let budget = RetryBudget::unlimited();
        assert_eq!(grants(&budget, 1_000), 1_000);
        assert_eq!(budget.usage().retries, 1_000);
        assert_eq!(budget.settings(), None);
    }

    #[test]
    fn refuses_settings_it_cannot_work_with() {
        for ratio in [-0.1, f64::NAN, f64::INFINITY] {
            let settings = BudgetSettings {
                retry_ratio: ratio,
                ..BudgetSettings::default()
            };
            assert!(matches!(
                RetryBudget::new(settings),
                Err(InvalidBudget::Ratio(_))
            ));
        }
        let settings = BudgetSettings {
            window: Duration::from_millis(5),
            ..BudgetSettings::default()
        };
        assert!(matches!(
            RetryBudget::new(settings),
            Err(InvalidBudget::WindowTooShort { .. })
        ));
    }

    #[test]
    fn the_refusal_says_how_the_window_stood() {
        let (budget, _) = budget(BudgetSettings {
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        });
        for _ in 0..30 {
            budget.record_request();
        }
        assert_eq!(grants(&budget, 3), 3);
        let refusal = budget.try_withdraw().unwrap_err();
        assert_eq!((refusal.retries, refusal.requests), (3, 30));
        let text = refusal.to_string();
        assert!(
            text.contains("3 retries") && text.contains("30 requests"),
            "{text}"
        );
    }
}

//! Why budgets: a deterministic simulation of a three-level call chain over a
//! bottom service that always fails.
//!
//! Top-level requests arrive at 1,000 per second for 5 simulated seconds. Each
//! of the three levels calls the one below through its own `Retrier` with three
//! attempts, and each level is a separate process with its own budget. Service
//! time and backoff sleeps are collapsed to zero (a `VirtualTimer`); the
//! budgets' clock is driven by the arrivals, 1 ms per top-level request. The
//! same idempotency key flows from the top to the bottom.
//!
//! Without budgets every level multiplies by three: 3³ = 27 calls reach the
//! bottom per top-level request. With the default budget (10 % of requests,
//! at least 10 retries per second) each level adds at most a tenth of its own
//! traffic: 1.1³ ≈ 1.33, plus the per-second minimum that matters only at the
//! start.
//!
//! Run with `--nocapture` to see the figures.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{IdempotencyKey, ManualClock};
use idem_retry::{
    Backoff, BudgetSettings, Retrier, RetryBudget, RetryConfig, Verdict, VirtualTimer,
};

const LEVELS: usize = 3;
const ATTEMPTS_PER_LEVEL: u32 = 3;
const REQUESTS_PER_SECOND: u64 = 1_000;
const SECONDS: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Unavailable;

type Level = Retrier<fn(&Result<(), Unavailable>) -> Verdict, VirtualTimer>;

fn retry_unavailable(outcome: &Result<(), Unavailable>) -> Verdict {
    match outcome {
        Ok(()) => Verdict::DontRetry,
        Err(Unavailable) => Verdict::Retry,
    }
}

struct Chain {
    levels: Vec<Level>,
    bottom_calls: Cell<u64>,
    expected_key: RefCell<Option<IdempotencyKey>>,
    foreign_keys: Cell<u64>,
}

impl Chain {
    fn new(budget: impl Fn() -> RetryBudget) -> Self {
        let config = RetryConfig::default().with_backoff(
            Backoff::default()
                .with_max_attempts(ATTEMPTS_PER_LEVEL)
                .with_seed(3),
        );
        let levels = (0..LEVELS)
            .map(|_| {
                Retrier::new(
                    config,
                    Arc::new(budget()),
                    retry_unavailable as fn(&Result<(), Unavailable>) -> Verdict,
                )
                .with_timer(VirtualTimer::new())
            })
            .collect();
        Self {
            levels,
            bottom_calls: Cell::new(0),
            expected_key: RefCell::new(None),
            foreign_keys: Cell::new(0),
        }
    }

    /// Level `level` handles a request: it calls the level below (or the bottom
    /// service) through its retrier, forwarding the key it was given.
    fn call<'a>(
        &'a self,
        level: usize,
        key: &'a IdempotencyKey,
    ) -> Pin<Box<dyn Future<Output = Result<(), Unavailable>> + 'a>> {
        Box::pin(async move {
            if level == LEVELS {
                return self.bottom(key);
            }
            let outcome = self.levels[level]
                .run(key.clone(), |key: IdempotencyKey, _| async move {
                    self.call(level + 1, &key).await
                })
                .await;
            match outcome {
                Ok(result) => result,
                Err(_gave_up) => Err(Unavailable),
            }
        })
    }

    /// The failing bottom service: counts the call, checks the key, fails.
    fn bottom(&self, key: &IdempotencyKey) -> Result<(), Unavailable> {
        self.bottom_calls.set(self.bottom_calls.get() + 1);
        if self.expected_key.borrow().as_ref() != Some(key) {
            self.foreign_keys.set(self.foreign_keys.get() + 1);
        }
        Err(Unavailable)
    }

    /// Sends the top-level traffic and returns the bottom's load per request.
    fn amplification(&self, clock: &ManualClock) -> f64 {
        let requests = REQUESTS_PER_SECOND * SECONDS;
        let step = Duration::from_secs(1) / REQUESTS_PER_SECOND as u32;
        futures::executor::block_on(async {
            for n in 0..requests {
                let key = IdempotencyKey::new(format!("req-{n}")).unwrap();
                *self.expected_key.borrow_mut() = Some(key.clone());
                assert_eq!(self.call(0, &key).await, Err(Unavailable));
                clock.advance(step);
            }
        });
        assert_eq!(
            self.foreign_keys.get(),
            0,
            "the key changed on the way down"
        );
        self.bottom_calls.get() as f64 / requests as f64
    }
}

#[test]
fn a_budget_keeps_a_failing_bottom_service_from_drowning() {
    let clock = ManualClock::new(0);
    let unbudgeted = Chain::new(RetryBudget::unlimited).amplification(&clock);

    let clock = ManualClock::new(0);
    let budget_clock = clock.clone();
    let budgeted = Chain::new(|| {
        RetryBudget::with_clock(BudgetSettings::default(), Arc::new(budget_clock.clone())).unwrap()
    })
    .amplification(&clock);

    println!(
        "three levels x {ATTEMPTS_PER_LEVEL} attempts, bottom always failing, {} top-level requests:",
        REQUESTS_PER_SECOND * SECONDS
    );
    println!("  bottom load without a retry budget:  {unbudgeted:.2}x the top-level load");
    println!(
        "  bottom load with the default budget: {budgeted:.3}x the top-level load (10 %, 10/s minimum)"
    );

    assert!(
        (unbudgeted - 27.0).abs() < 1e-9,
        "without a budget: {unbudgeted}"
    );
    assert!(budgeted <= 1.4, "with the default budget: {budgeted}");
    assert!(
        budgeted > 1.0,
        "the budget still allows some retries: {budgeted}"
    );
}

//! The retry loop: the mechanism that runs attempts, asking the other pieces
//! what to do.
//!
//! Why the key is an argument of the loop and not of each attempt: an
//! idempotency key only works if every attempt of one logical operation sends
//! the same one. A key made inside the attempt (a fresh UUID per try) defeats
//! dedupe on the receiver silently, and nothing fails until money moves twice.
//! So [`Retrier::run`] and [`retry`] take the key once, before the first
//! attempt, own it for the whole call, and hand every attempt that same key.
//! There is no way to give an attempt another key through them.
//!
//! Each attempt receives the key as an owned `IdempotencyKey` (a copy of the
//! one immutable value) rather than a `&IdempotencyKey`, so that its future can
//! hold the key across `.await` and still be `Send`: the futures of closures
//! that borrow an argument cannot yet be proven `Send`, which would rule out
//! `tokio::spawn` and axum handlers.
//!
//! Each round: run the attempt; ask the [`Classify`] for a verdict; take the
//! next delay from the [`Backoff`] (none left: stop); raise it to
//! the server's hint and check it against the deadline
//! ([`next_delay`]); ask the [`RetryBudget`] for a retry
//! (refused: stop at once, without sleeping); sleep; go again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::IdempotencyKey;
use tracing::Instrument;

use crate::policy::ErrorsOnly;
use crate::{
    Backoff, Classify, GaveUp, RetryBudget, RetryError, StopReason, Timer, TokioTimer, Verdict,
    next_delay, observe,
};

/// How one call retries: its backoff and, optionally, a deadline for the whole
/// call (all attempts and the waits between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryConfig {
    /// Delays between attempts and the attempt limit.
    pub backoff: Backoff,
    /// The time after which no further attempt is started, counted from the
    /// first attempt's start. `None`: no deadline.
    pub deadline: Option<Duration>,
}

impl RetryConfig {
    /// These settings with another backoff.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// These settings with a deadline for the whole call.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

/// Which attempt of a call this is: 1 for the first, 2 for the first retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt(u32);

impl Attempt {
    /// The first attempt.
    pub const FIRST: Attempt = Attempt(1);

    /// The attempt's number, from 1.
    pub fn number(self) -> u32 {
        self.0
    }

    /// Whether this attempt is a retry.
    pub fn is_retry(self) -> bool {
        self.0 > 1
    }
}

/// Runs operations with retries: a backoff, a shared budget, a classification
/// and a timer, put together once and used for many calls.
///
/// The key is given once per call and lent, unchanged, to every attempt:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use idem_core::IdempotencyKey;
/// use idem_retry::{Attempt, Retrier, RetryBudget, RetryConfig, Verdict, VirtualTimer};
///
/// #[derive(Debug, PartialEq)]
/// enum Charge { Done(String), Unavailable }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let budget = Arc::new(RetryBudget::default()); // one per process
/// let classify = |outcome: &Charge| match outcome {
///     Charge::Unavailable => Verdict::Retry,
///     Charge::Done(_) => Verdict::DontRetry,
/// };
/// let timer = VirtualTimer::new(); // tests: no real sleeping
/// let retrier = Retrier::new(RetryConfig::default(), budget, classify).with_timer(timer.clone());
///
/// // The key is made once, where the intent is formed...
/// let key = IdempotencyKey::new("order-42/charge").unwrap();
/// let seen = AtomicU32::new(0);
/// let seen = &seen;
/// let outcome = retrier
///     .run(key, |key: IdempotencyKey, attempt: Attempt| async move {
///         // ...and every attempt gets that same key.
///         assert_eq!(key.as_str(), "order-42/charge");
///         seen.fetch_add(1, Ordering::Relaxed);
///         if attempt.number() < 3 { Charge::Unavailable } else { Charge::Done(key.to_string()) }
///     })
///     .await
///     .unwrap();
/// assert_eq!(outcome, Charge::Done("order-42/charge".into()));
/// assert_eq!(seen.load(Ordering::Relaxed), 3);
/// assert_eq!(timer.slept().len(), 2);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Retrier<C, T = TokioTimer> {
    config: RetryConfig,
    budget: Arc<RetryBudget>,
    classify: C,
    timer: T,
}

impl<C> Retrier<C, TokioTimer> {
    /// A retrier on tokio's timer.
    pub fn new(config: RetryConfig, budget: Arc<RetryBudget>, classify: C) -> Self {
        Self {
            config,
            budget,
            classify,
            timer: TokioTimer,
        }
    }
}

impl<C, T: Timer> Retrier<C, T> {
    /// The same retrier on another timer.
    pub fn with_timer<T2: Timer>(self, timer: T2) -> Retrier<C, T2> {
        Retrier {
            config: self.config,
            budget: self.budget,
            classify: self.classify,
            timer,
        }
    }

    /// The settings.
    pub fn config(&self) -> &RetryConfig {
        &self.config
    }

    /// The shared budget.
    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// Runs `attempt` until its outcome needs no retry, handing every attempt
    /// the same `key`. Returns that outcome, or [`GaveUp`] with the last outcome
    /// when retrying stopped while the outcome was still retryable (attempts,
    /// budget or deadline).
    pub async fn run<O, F, Fut>(&self, key: IdempotencyKey, attempt: F) -> Result<O, GaveUp<O>>
    where
        C: Classify<O>,
        F: FnMut(IdempotencyKey, Attempt) -> Fut,
        Fut: Future<Output = O>,
    {
        run_attempts(
            &self.config,
            &self.budget,
            &self.classify,
            &self.timer,
            key,
            attempt,
        )
        .await
        .map(|finished| finished.outcome)
    }
}

/// Retries a fallible operation: `classify` judges its errors, a success is
/// returned at once. The key is taken once and the same key is handed to every
/// attempt. Sleeps on tokio's timer.
///
/// ```
/// use std::time::Duration;
/// use idem_core::IdempotencyKey;
/// use idem_retry::{Backoff, RetryBudget, RetryConfig, StopReason, Verdict, retry};
///
/// #[derive(Debug)]
/// struct Refused;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let config = RetryConfig::default().with_backoff(Backoff::default().with_max_attempts(3));
/// let budget = RetryBudget::default();
/// let key = IdempotencyKey::new("invoice-7/send").unwrap();
/// let result: Result<(), _> = retry(&config, &budget, &|_: &Refused| Verdict::Retry, key, |_key, _attempt| async {
///     Err(Refused)
/// })
/// .await;
/// let error = result.unwrap_err();
/// assert_eq!(error.attempts, 3);
/// assert_eq!(error.reason, StopReason::AttemptsExhausted { max_attempts: 3 });
/// # }
/// ```
pub async fn retry<T, E, C, F, Fut>(
    config: &RetryConfig,
    budget: &RetryBudget,
    classify: &C,
    key: IdempotencyKey,
    operation: F,
) -> Result<T, RetryError<E>>
where
    C: Classify<E> + ?Sized,
    F: FnMut(IdempotencyKey, Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let outcome = run_attempts(
        config,
        budget,
        &ErrorsOnly(classify),
        &TokioTimer,
        key,
        operation,
    )
    .await;
    match outcome {
        Ok(Finished {
            outcome: Ok(value), ..
        }) => Ok(value),
        Ok(Finished {
            outcome: Err(last),
            attempts,
        }) => Err(RetryError {
            reason: StopReason::NotRetryable,
            attempts,
            last,
        }),
        Err(GaveUp {
            reason,
            attempts,
            last: Err(last),
        }) => Err(RetryError {
            reason,
            attempts,
            last,
        }),
        // `ErrorsOnly` never asks to retry a success, so a call cannot give up
        // on one; should it, the success is the caller's answer.
        Err(GaveUp {
            last: Ok(value), ..
        }) => Ok(value),
    }
}

/// An outcome that needed no retry, and how many attempts it took.
#[derive(Debug)]
struct Finished<O> {
    outcome: O,
    attempts: u32,
}

/// The loop shared by [`Retrier::run`] and [`retry`].
async fn run_attempts<O, C, T, F, Fut>(
    config: &RetryConfig,
    budget: &RetryBudget,
    classify: &C,
    timer: &T,
    key: IdempotencyKey,
    mut attempt: F,
) -> Result<Finished<O>, GaveUp<O>>
where
    C: Classify<O> + ?Sized,
    T: Timer + ?Sized,
    F: FnMut(IdempotencyKey, Attempt) -> Fut,
    Fut: Future<Output = O>,
{
    let span = tracing::debug_span!("retry", idempotency_key = %key);
    async move {
        let started = timer.now();
        let mut delays = config.backoff.delays();
        budget.record_request();
        observe::request_started();
        let mut number = 1;
        loop {
            let outcome = attempt(key.clone(), Attempt(number)).await;
            let hint = match classify.classify(&outcome) {
                Verdict::DontRetry => {
                    return Ok(Finished {
                        outcome,
                        attempts: number,
                    });
                }
                Verdict::Retry => None,
                Verdict::RetryAfter(hint) => Some(hint),
            };
            let give_up = |reason: StopReason| {
                observe::gave_up(number, &reason);
                Err(GaveUp {
                    reason,
                    attempts: number,
                    last: outcome,
                })
            };
            let Some(backoff) = delays.next() else {
                return give_up(StopReason::AttemptsExhausted {
                    max_attempts: config.backoff.max_attempts(),
                });
            };
            let remaining = config
                .deadline
                .map(|deadline| deadline.saturating_sub(timer.now().duration_since(started)));
            let delay = match next_delay(backoff, hint, remaining) {
                Ok(delay) => delay,
                Err(reached) => return give_up(reached.into()),
            };
            if let Err(exhausted) = budget.try_withdraw() {
                return give_up(exhausted.into());
            }
            number += 1;
            observe::retry_granted(number, delay);
            timer.sleep(delay).await;
        }
    }
    .instrument(span)
    .await
}

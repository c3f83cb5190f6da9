//! Why retrying stopped, and the errors that carry the reason with the last
//! outcome.
//!
//! Every way out of the loop other than "the outcome needs no retry" has its own
//! [`StopReason`], so a caller can tell "the service kept failing" from "the
//! budget stopped us" from "the server wants more time than we have", and can
//! still read the last outcome.

use std::fmt;

use crate::{BudgetExhausted, DeadlineReached};

/// Why the loop stopped retrying.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StopReason {
    /// The classification said another attempt cannot help.
    #[error("the outcome is not retryable")]
    NotRetryable,
    /// Every attempt the backoff allows was made.
    #[error("all {max_attempts} attempts failed")]
    AttemptsExhausted {
        /// The attempt limit.
        max_attempts: u32,
    },
    /// The retry budget refused another retry.
    #[error(transparent)]
    BudgetExhausted(#[from] BudgetExhausted),
    /// The next wait would end past the deadline.
    #[error(transparent)]
    Deadline(#[from] DeadlineReached),
}

/// The outcome of the last attempt of a call that stopped while it was still
/// retryable, with the reason it stopped. Returned by
/// [`Retrier::run`](crate::Retrier::run).
#[derive(Debug)]
#[non_exhaustive]
pub struct GaveUp<O> {
    /// Why retrying stopped.
    pub reason: StopReason,
    /// How many attempts were made.
    pub attempts: u32,
    /// The last attempt's outcome.
    pub last: O,
}

impl<O> fmt::Display for GaveUp<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt(s): {}",
            self.attempts, self.reason
        )
    }
}

impl<O: fmt::Debug> std::error::Error for GaveUp<O> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

/// A fallible operation failed for good: the last error, how many attempts were
/// made and why there was no other. Returned by [`retry`](crate::retry).
#[derive(Debug)]
#[non_exhaustive]
pub struct RetryError<E> {
    /// Why there was no further attempt.
    pub reason: StopReason,
    /// How many attempts were made.
    pub attempts: u32,
    /// The last attempt's error.
    pub last: E,
}

impl<E> RetryError<E> {
    /// The last attempt's error.
    pub fn into_last(self) -> E {
        self.last
    }

    /// Whether the budget stopped the retries.
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(self.reason, StopReason::BudgetExhausted(_))
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "failed after {} attempt(s) ({}): {}",
            self.attempts, self.reason, self.last
        )
    }
}

impl<E> std::error::Error for RetryError<E>
where
    E: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.last)
    }
}

//! Which outcomes are worth another attempt: the decision, kept apart from the
//! loop that acts on it.
//!
//! Why a separate piece: the retry loop, the backoff and the budget are the same
//! for an HTTP call, a database transaction and a broker publish; what differs is
//! which failures a second attempt can fix. A 400 or a 422 will fail the same way
//! every time, and retrying it spends the retry budget exactly when it is
//! needed most; a 503, a timeout or a reset connection may well succeed. Keeping
//! that judgement in a [`Classify`] implementation lets each integration bring
//! its own without touching the loop.
//!
//! Provided classifications:
//! - [`HttpPolicy`] (feature `http`): status codes,
//!   `Retry-After` and transport errors;
//! - [`ProtocolErrorPolicy`]: Idem's own [`idem_core::Error`] and
//!   [`idem_core::ApplyError`];
//! - any `Fn(&Outcome) -> Verdict` closure.

#[cfg(feature = "http")]
mod http;
mod protocol;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use http::HttpPolicy;
pub use protocol::ProtocolErrorPolicy;

use std::time::Duration;

/// What to do with one attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the outcome to the caller: it succeeded, or another attempt would
    /// meet the same answer (400, 401, 403, 404, 422, a bare 409, a key reused
    /// with another payload).
    DontRetry,
    /// Try again after the backoff's jittered delay.
    Retry,
    /// Try again, but not before this delay: the server said when
    /// (`Retry-After`, or an in-flight duplicate's hint).
    RetryAfter(Duration),
}

impl Verdict {
    /// Whether another attempt is wanted.
    pub fn is_retry(self) -> bool {
        !matches!(self, Self::DontRetry)
    }

    /// The server's hint, if it gave one.
    pub fn hint(self) -> Option<Duration> {
        match self {
            Self::RetryAfter(hint) => Some(hint),
            Self::DontRetry | Self::Retry => None,
        }
    }
}

/// Decides, for one attempt's outcome, whether to retry.
///
/// Implemented by [`HttpPolicy`],
/// [`ProtocolErrorPolicy`] and every `Fn(&Outcome) -> Verdict`, so a one-off
/// classification is just a closure:
///
/// ```
/// use std::time::Duration;
/// use idem_retry::{Classify, Verdict};
///
/// #[derive(Debug)]
/// enum PublishError { Throttled { wait: Duration }, BrokerDown, Rejected }
///
/// let classify = |error: &PublishError| match error {
///     PublishError::Throttled { wait } => Verdict::RetryAfter(*wait),
///     PublishError::BrokerDown => Verdict::Retry,
///     PublishError::Rejected => Verdict::DontRetry,
/// };
/// assert_eq!(classify.classify(&PublishError::BrokerDown), Verdict::Retry);
/// assert_eq!(classify.classify(&PublishError::Rejected), Verdict::DontRetry);
/// assert_eq!(
///     classify.classify(&PublishError::Throttled { wait: Duration::from_secs(2) }),
///     Verdict::RetryAfter(Duration::from_secs(2))
/// );
/// ```
pub trait Classify<Outcome: ?Sized> {
    /// The verdict for `outcome`.
    fn classify(&self, outcome: &Outcome) -> Verdict;
}

impl<Outcome: ?Sized, F> Classify<Outcome> for F
where
    F: Fn(&Outcome) -> Verdict,
{
    fn classify(&self, outcome: &Outcome) -> Verdict {
        self(outcome)
    }
}

/// Lifts a classification of errors to one of `Result`s: a success is never
/// retried.
#[derive(Debug)]
pub(crate) struct ErrorsOnly<'a, C: ?Sized>(pub(crate) &'a C);

impl<T, E, C> Classify<Result<T, E>> for ErrorsOnly<'_, C>
where
    C: Classify<E> + ?Sized,
{
    fn classify(&self, outcome: &Result<T, E>) -> Verdict {
        match outcome {
            Ok(_) => Verdict::DontRetry,
            Err(error) => self.0.classify(error),
        }
    }
}

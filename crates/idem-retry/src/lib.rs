//! Retries that do not turn a slow service into a dead one.
//!
//! At-least-once delivery means retries, and retries amplify load exactly when
//! a system is already degraded. This crate keeps them safe: full-jitter
//! backoff with a cap, respect for `Retry-After`, retrying only what a second
//! attempt can fix, a retry budget shared by the whole process, and an API in
//! which the idempotency key is made once above the loop and handed unchanged
//! to every attempt, so the receiver can dedupe them.
//!
//! Mechanism apart from decision, in small pieces:
//!
//! | module | what it is for |
//! | --- | --- |
//! | [`backoff`] | full-jitter delays as an iterator: base, cap, attempt limit, seedable |
//! | [`retry_after`] | reads `Retry-After` (seconds or HTTP-date); raises the next delay to it; stops at the deadline |
//! | [`policy`] | the [`Classify`] trait and its [`Verdict`]; the default [`HttpPolicy`] and [`ProtocolErrorPolicy`] |
//! | [`budget`] | retries as a share of requests over a sliding window, shared through `Arc` |
//! | [`retrier`] | the loop: [`Retrier::run`] for any outcome, [`retry`] for fallible operations |
//! | [`timer`] | monotonic time and sleeping: tokio's, or a [`VirtualTimer`] for tests |
//! | [`error`] | why retrying stopped: [`StopReason`], [`GaveUp`], [`RetryError`] |
//! | [`tower_policy`] | (feature `http`) a `tower::retry::Policy` and layer for HTTP clients such as hyper-util's |
//! | [`observe`] | the metrics: `requests_total`, `retries_total`, `retry_budget_exhausted_total` |
//!
//! Everything public is also re-exported here, at the crate root.
//!
//! Defaults: base 200 ms, cap 20 s, 6 attempts ([`backoff`]), and a budget of
//! 10 % of requests over 10 s with at least 10 retries per second ([`budget`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
pub mod budget;
pub mod error;
pub mod observe;
pub mod policy;
pub mod retrier;
pub mod retry_after;
pub mod timer;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod tower_policy;

pub use backoff::{Backoff, DEFAULT_BASE, DEFAULT_CAP, DEFAULT_MAX_ATTEMPTS, FullJitter};
pub use budget::{
    BudgetExhausted, BudgetSettings, BudgetUsage, DEFAULT_MIN_RETRIES_PER_SECOND,
    DEFAULT_RETRY_RATIO, DEFAULT_WINDOW, InvalidBudget, RetryBudget,
};
pub use error::{GaveUp, RetryError, StopReason};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use policy::HttpPolicy;
pub use policy::{Classify, ProtocolErrorPolicy, Verdict};
pub use retrier::{Attempt, Retrier, RetryConfig, retry};
pub use retry_after::{DeadlineReached, InvalidRetryAfter, RetryAfter, next_delay};
pub use timer::{Sleep, Timer, TokioTimer, VirtualTimer};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use tower_policy::{
    AttemptFuture, AttemptService, BoxError, HttpRetryError, HttpRetryLayer, HttpRetryPolicy,
    IDEMPOTENCY_KEY, RetryingClient, key_header_value, with_idempotency_key,
};

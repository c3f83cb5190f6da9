//! Metrics for retries, emitted in one place so the loop, the tower policy and
//! the budget report them the same way.
//!
//! Why these three: `retries_total / requests_total` is the retry ratio, the
//! number to alert on (above the budget's 10 % something is wrong downstream),
//! and `retry_budget_exhausted_total` says the budget is what stopped the
//! retries, so a rising error rate can be told apart from a storm that the
//! budget absorbed. Counters go through the `metrics` facade; whatever exporter
//! the application installs picks them up.

/// Name of the counter of logical requests (first attempts).
pub const REQUESTS_TOTAL: &str = "requests_total";
/// Name of the counter of retries made (attempts after the first).
pub const RETRIES_TOTAL: &str = "retries_total";
/// Name of the counter of retries refused by a budget.
pub const RETRY_BUDGET_EXHAUSTED_TOTAL: &str = "retry_budget_exhausted_total";

/// A logical request started (its first attempt).
pub(crate) fn request_started() {
    metrics::counter!(REQUESTS_TOTAL).increment(1);
}

/// A retry was granted and is about to be made.
pub(crate) fn retry_granted(attempt: u32, delay: std::time::Duration) {
    metrics::counter!(RETRIES_TOTAL).increment(1);
    tracing::debug!(
        attempt,
        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        "retrying"
    );
}

/// A budget refused a retry.
pub(crate) fn budget_exhausted() {
    metrics::counter!(RETRY_BUDGET_EXHAUSTED_TOTAL).increment(1);
    tracing::info!("retry budget exhausted; failing fast");
}

/// Retrying stopped while the outcome was still retryable.
pub(crate) fn gave_up(attempts: u32, reason: &crate::StopReason) {
    tracing::info!(attempts, %reason, "gave up retrying");
}

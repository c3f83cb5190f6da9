//! The proxy's own metrics, on the admin listener's `/metrics`.

use super::verdict::Verdict;

/// Requests forwarded (each counted once, however many times it was sent).
pub const REQUESTS_TOTAL: &str = "dup_proxy_requests_total";
/// Copies sent.
pub const DUPLICATES_SENT_TOTAL: &str = "dup_proxy_duplicates_sent_total";
/// Pairs compared, labelled `verdict` (`same`, `replayed`, `refused`,
/// `different`, `no_answer`).
pub const PAIRS_TOTAL: &str = "dup_proxy_pairs_total";
/// Copies answered differently, labelled `route`.
pub const DIVERGENT_ANSWERS_TOTAL: &str = "dup_proxy_divergent_answers_total";
/// Effects counted during second sends, labelled `route`.
pub const EXTRA_EFFECTS_TOTAL: &str = "dup_proxy_extra_effects_total";

pub(crate) fn forwarded() {
    metrics::counter!(REQUESTS_TOTAL).increment(1);
}

pub(crate) fn copy_sent() {
    metrics::counter!(DUPLICATES_SENT_TOTAL).increment(1);
}

pub(crate) fn compared(route: &str, verdict: Verdict, extra_effects: Option<u64>) {
    metrics::counter!(PAIRS_TOTAL, "verdict" => verdict.as_str()).increment(1);
    if verdict == Verdict::Different {
        metrics::counter!(DIVERGENT_ANSWERS_TOTAL, "route" => route.to_owned()).increment(1);
    }
    if let Some(extra) = extra_effects.filter(|extra| *extra > 0) {
        metrics::counter!(EXTRA_EFFECTS_TOTAL, "route" => route.to_owned()).increment(extra);
    }
}

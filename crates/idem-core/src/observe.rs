//! Metrics and logs for protocol events, emitted in one place so every store
//! reports them the same way.
//!
//! Counters go through the `metrics` facade (any exporter the application
//! installs picks them up), labelled with the scope's family (its first
//! segment, see [`Scope::family`]) so per-tenant scopes do not multiply
//! series. The HTTP layer counts its own scopes' duplicates, conflicts and
//! reused keys, with their route ([`HTTP_FAMILY`]). Duplicates are logged at info: suppressing them is the
//! library doing its job, not an error. Events carry the scope, not the key:
//! the key travels in the caller's tracing span, where the application decides
//! whether spans are recorded.

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::Scope;
use crate::record::FencingToken;

/// Duplicates answered with the stored outcome, labelled `scope`.
pub const DUPLICATES_SUPPRESSED_TOTAL: &str = "duplicates_suppressed_total";
/// Concurrent duplicates answered `InFlight`, labelled `scope`.
pub const KEY_CONFLICTS_TOTAL: &str = "idempotency_key_conflicts_total";
/// Keys refused for a different payload, labelled `scope`.
pub const KEY_REUSE_TOTAL: &str = "idempotency_key_reuse_total";
/// Late retries refused by a tombstone (the key's window had ended), by scope.
pub const LATE_RETRIES_TOTAL: &str = "idempotency_late_retries_total";

/// Records found fingerprinted under another fingerprint rule than the
/// request's, and answered as if the fingerprints matched, labelled `scope`.
pub const FINGERPRINT_RULE_CHANGED_TOTAL: &str = "idempotency_fingerprint_rule_changed_total";

/// The family of the HTTP layer's scopes (`http:{principal}:{METHOD}:{route}`).
/// Their duplicates, conflicts and reused keys are counted by the HTTP layer,
/// which adds the request's route to the labels; the stores only log them.
pub const HTTP_FAMILY: &str = "http";

/// Whether the protocol counters of `scope` are counted here (every family
/// but [`HTTP_FAMILY`]).
fn counted_here(scope: &Scope) -> bool {
    scope.family() != HTTP_FAMILY
}

/// A duplicate was answered with the stored outcome.
pub fn replayed(scope: &Scope) {
    if counted_here(scope) {
        metrics::counter!(DUPLICATES_SUPPRESSED_TOTAL, "scope" => scope.family().to_owned())
            .increment(1);
    }
    tracing::info!(
        scope = scope.as_str(),
        "duplicate suppressed; stored outcome replayed"
    );
}

/// A record was fingerprinted under another rule than `current`: the two
/// cannot be compared, so the record is answered as if they matched (a
/// retry is replayed, not refused as key reuse). Counted for every family
/// and logged at warn, with both rules' ids (`default` for the whole body).
pub fn fingerprint_rule_changed(scope: &Scope, stored: &Fingerprint, current: &Fingerprint) {
    metrics::counter!(FINGERPRINT_RULE_CHANGED_TOTAL, "scope" => scope.family().to_owned())
        .increment(1);
    let id = |fingerprint: &Fingerprint| {
        fingerprint
            .rule_id()
            .map_or_else(|| "default".to_owned(), |id| id.to_string())
    };
    tracing::warn!(
        scope = scope.as_str(),
        stored_rule = id(stored),
        current_rule = id(current),
        "the key's record was fingerprinted under another fingerprint rule; its payload cannot be compared, so it is answered as a retry"
    );
}

/// An in-flight claim whose lease ended was taken over.
pub fn took_over(scope: &Scope, token: FencingToken) {
    metrics::counter!("lease_takeovers_total", "scope" => scope.family().to_owned()).increment(1);
    tracing::info!(
        scope = scope.as_str(),
        token = token.get(),
        "expired lease taken over"
    );
}

/// A refusal produced by the protocol.
pub fn refused(error: &Error) {
    match error {
        Error::KeyReuse { scope, .. } => {
            if counted_here(scope) {
                metrics::counter!(KEY_REUSE_TOTAL, "scope" => scope.family().to_owned())
                    .increment(1);
            }
            tracing::info!(
                scope = scope.as_str(),
                "key reused with a different payload"
            );
        }
        Error::Expired {
            scope, expired_at, ..
        } => {
            metrics::counter!(LATE_RETRIES_TOTAL, "scope" => scope.family().to_owned())
                .increment(1);
            tracing::warn!(
                scope = scope.as_str(),
                expired_at = %expired_at.rfc3339(),
                "a late retry met its key's tombstone and was refused"
            );
        }
        Error::InFlight { scope, .. } => {
            if counted_here(scope) {
                metrics::counter!(KEY_CONFLICTS_TOTAL, "scope" => scope.family().to_owned())
                    .increment(1);
            }
            tracing::info!(
                scope = scope.as_str(),
                "concurrent duplicate answered as in flight"
            );
        }
        Error::Fenced {
            scope,
            held,
            current,
            ..
        } => {
            metrics::counter!("fenced_total", "kind" => "record").increment(1);
            tracing::warn!(
                scope = scope.as_str(),
                held = held.get(),
                current = current.map(FencingToken::get),
                "fenced: a newer owner holds this record; the stale worker's write was rejected"
            );
        }
        Error::Stale {
            target,
            carried,
            stored,
        } => {
            metrics::counter!("fenced_total", "kind" => "guarded_write").increment(1);
            tracing::warn!(
                target = target.as_str(),
                carried,
                stored,
                "stale write rejected: a newer owner or version exists"
            );
        }
        Error::LeaseHeld { .. } | Error::InvalidKey(_) | Error::Store(_) => {}
    }
}

//! The layer's metrics, through the `metrics` crate (exported by whatever
//! recorder the process installs, as `idem serve`'s `/metrics`): what each
//! service answer meant for its key, and what the reconcile hook said.
//! Named like the HTTP layer's (`http_*` there, `grpc_*` here); the
//! `method` label is one of the protected unary methods, a bounded set.

use idem_http::Verdict;

use crate::reconcile::GrpcReconciled;

/// Answers of the service to keyed calls, labelled `verdict` (`store`,
/// `release`, `unknown`) and `method`.
pub const VERDICTS_TOTAL: &str = "grpc_verdicts_total";

/// Questions put to the reconcile hook before a takeover, labelled `result`
/// (`applied`, `not_applied`, `unknown`) and `method`.
pub const RECONCILES_TOTAL: &str = "grpc_reconciles_total";

/// Counts one answer's verdict.
pub(crate) fn verdict(method: &str, verdict: Verdict) {
    metrics::counter!(VERDICTS_TOTAL, "verdict" => verdict.as_str(), "method" => method.to_owned())
        .increment(1);
}

/// Counts one answer of the reconcile hook.
pub(crate) fn reconciled(method: &str, reconciled: &GrpcReconciled) {
    let result = match reconciled {
        GrpcReconciled::Applied(_) => "applied",
        GrpcReconciled::NotApplied => "not_applied",
        GrpcReconciled::Unknown(_) => "unknown",
    };
    metrics::counter!(RECONCILES_TOTAL, "result" => result, "method" => method.to_owned())
        .increment(1);
}

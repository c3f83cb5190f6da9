//! The gateway's own metrics: requests by outcome and route.
//! The protocol's counters (`duplicates_suppressed_total`,
//! `idempotency_key_conflicts_total`, `idempotency_key_reuse_total`) come
//! from the layer with the same `route` label ([`crate::observe`]);
//! `lease_takeovers_total` from the store; shed requests are counted in
//! `http_requests_shed_total` too ([`crate::shed`]).
//!
//! A request's outcome is read from its response, never from its body: the
//! layer's refusals carry their problem type, upstream answers carry a marker,
//! and replays carry `Idempotent-Replayed`.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use axum::response::Response;
use http::Request;
use metrics::Counter;

use super::proxy::FromUpstream;
use idem_http::IdempotencyConfig;
use idem_http::Refused;
use idem_http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use idem_http::{Judged, Verdict};

/// Requests answered by the gateway, labelled `outcome` and `route` (see
/// [`idem_http::observe`] for the route's bounded form).
pub const REQUESTS_TOTAL: &str = "gateway_requests_total";

/// Whether the layer treats `request` as keyed (a malformed key counts: the
/// layer refuses it).
pub(crate) fn is_keyed<B>(config: &IdempotencyConfig, request: &Request<B>) -> bool {
    config.accepts_key(request.method()) && request.headers().contains_key(IDEMPOTENCY_KEY)
}

/// The `outcome` label of a request's answer:
///
/// - `forwarded_stored`: keyed, the upstream answered, and the answer was stored;
/// - `forwarded_released`: keyed, the upstream answered with a status that
///   releases the key (503, 408, 429 by default);
/// - `forwarded_unknown`: keyed, the upstream answered with a status whose
///   outcome is unknown (502, 504 by default), so the key was kept;
/// - `passed_through`: no key (or a safe method), forwarded as is;
/// - `replayed`: a duplicate, answered from the store;
/// - otherwise the refusal's problem type: `idempotency-key-in-flight`,
///   `idempotency-key-reused`, `missing-idempotency-key`,
///   `malformed-idempotency-key`, `request-too-large`,
///   `upstream-timeout-outcome-unknown`, `upstream-broke-outcome-unknown`,
///   `upstream-unreachable`, `store-unavailable`, `idempotency-store-failure`,
///   `overloaded` (shed: the limit of requests in flight was reached), ...
pub(crate) fn outcome(keyed: bool, response: &Response) -> &'static str {
    if let Some(Refused(problem)) = response.extensions().get::<Refused>() {
        return problem;
    }
    if response.extensions().get::<FromUpstream>().is_some() {
        let judged = response.extensions().get::<Judged>().map(|j| j.0);
        return match (keyed, judged) {
            (false, _) | (true, None) => "passed_through",
            (true, Some(Verdict::Store)) => "forwarded_stored",
            (true, Some(Verdict::Release)) => "forwarded_released",
            (true, Some(Verdict::Unknown)) => "forwarded_unknown",
        };
    }
    if response.headers().contains_key(IDEMPOTENT_REPLAYED) {
        return "replayed";
    }
    "other"
}

/// The gateway's request counters, one handle per outcome and route, made
/// on first use: counting a request costs a look-up, not the labels'
/// allocation and the registry's hashing.
#[derive(Default)]
pub(crate) struct Answered {
    by_outcome: RwLock<HashMap<&'static str, HashMap<Arc<str>, Counter>>>,
}

impl Answered {
    /// Counts one answered request.
    pub(crate) fn count(&self, outcome: &'static str, route: &Arc<str>) {
        let known = self
            .by_outcome
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(outcome)
            .and_then(|routes| routes.get(&**route))
            .cloned();
        let counter = known.unwrap_or_else(|| {
            let counter =
                metrics::counter!(REQUESTS_TOTAL, "outcome" => outcome, "route" => route.to_string());
            self.by_outcome
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(outcome)
                .or_default()
                .insert(Arc::clone(route), counter.clone());
            counter
        });
        counter.increment(1);
    }
}

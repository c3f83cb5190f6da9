//! The answers the layer gives itself, instead of the inner service: the rows of
//! the status table, in either vocabulary.
//!
//! | refusal                           | status | IETF body           | Stripe body `error.type` |
//! |-----------------------------------|--------|---------------------|--------------------------|
//! | key missing where required        | 400    | problem+json        | `idempotency_error`      |
//! | key malformed, or several keys    | 400    | problem+json        | `idempotency_error`      |
//! | same key, different payload       | 422 / Stripe 400 | problem+json | `idempotency_error`   |
//! | same key, original still running  | 409 + `Retry-After` | problem+json | `idempotency_error`  |
//! | key past its window, tombstone kept (a late retry) | 410 + `Idempotency-Key-Expires` | problem+json with `expired_at` | `idempotency_error` |
//! | body over the limit               | 413    | problem+json        | `invalid_request_error`  |
//! | body could not be read            | 400    | problem+json        | `invalid_request_error`  |
//! | outcome unknown (inner failed)    | 502    | problem+json        | `api_error`              |
//! | gateway: upstream timed out after the request was sent | 504 (+ `Retry-After` when keyed) | problem+json | `api_error` |
//! | gateway: upstream broke off after the request was sent | 502 (+ `Retry-After` when keyed) | problem+json | `api_error` |
//! | gateway: upstream unreachable, nothing sent | 502 + `Retry-After` | problem+json | `api_error`     |
//! | atomic handler failed (rolled back) | 500  | problem+json        | `api_error`              |
//! | store busy or unreachable, or its connection lost before the commit (nothing kept) | 503 + `Retry-After` | problem+json | `api_error` |
//! | store's connection lost during the commit (outcome unknown) | 503 (+ `Retry-After` when keyed) | problem+json | `api_error` |
//! | store failed otherwise            | 500    | problem+json        | `api_error`              |
//! | earlier attempt unknown and the service cannot say (reconcile) | 503 + `Retry-After` | problem+json | `api_error` |
//! | earlier attempt unknown, no probe: key held until its lease ends | 409 + `Retry-After` (the time left) | problem+json | `idempotency_error` |
//! | too many requests in flight (shed, nothing done) | 503 + `Retry-After` | problem+json | `api_error` |
//!
//! Statuses are decided in one function, [`Refusal::status`]; everything else
//! here only writes bodies.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use idem_core::{Error, ErrorKind};
use serde_json::json;

use super::config::Mode;
use crate::key_header::KeyHeaderError;

/// Why the layer answered a keyed request itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The route requires a key and the request carried none.
    #[error(
        "this request requires an Idempotency-Key header: make one key per operation (a UUID) and send it with every retry"
    )]
    MissingKey,
    /// The key header was malformed or repeated.
    #[error(transparent)]
    Header(#[from] KeyHeaderError),
    /// The body is larger than the configured limit.
    #[error(
        "the request body is larger than {limit} bytes, the most this endpoint reads for a keyed request"
    )]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body could not be read.
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
    /// The protocol refused the request (reused key, in flight) or the store failed.
    #[error(transparent)]
    Protocol(#[from] Error),
    /// The request reached the service, but no complete answer came back: the
    /// effect may or may not have happened. The claim is kept until its lease
    /// ends; a retry after that runs the request again.
    #[error(
        "the request was handed to the service but no complete response came back, so whether it took effect is unknown; the key stays reserved until its lease ends, then a retry with the same key runs it again"
    )]
    OutcomeUnknown,
    /// An atomic handler failed: its writes were rolled back and the key released.
    #[error(
        "the request failed and nothing it wrote was kept; the key was released, so a retry with the same key runs it again"
    )]
    HandlerFailed,
    /// The store could not be reached, went away or was too busy before
    /// anything was committed (on the claim, or under an atomic handler whose
    /// SQL failed on the lost connection): nothing was kept.
    #[error("{}", if *keyed { STORE_UNAVAILABLE_KEYED } else { STORE_UNAVAILABLE })]
    StoreUnavailable {
        /// Whether the request carried an idempotency key.
        keyed: bool,
    },
    /// The store's connection broke while an atomic request's writes were
    /// being committed: whether they were kept is unknown.
    #[error("{}", if *keyed { COMMIT_UNKNOWN_KEYED } else { COMMIT_UNKNOWN })]
    CommitUnknown {
        /// Whether the request carried an idempotency key.
        keyed: bool,
    },
    /// The stored outcome could not be turned back into a response.
    #[error("the stored response for this key cannot be replayed: {0}")]
    Corrupt(String),
    /// (Gateway) The upstream did not answer in time after the request was
    /// sent: whether it took effect is unknown.
    #[error("{}", unknown_outcome(&format!("the upstream did not answer within {}", humane(*after)), *held))]
    UpstreamTimeout {
        /// The upstream timeout that ran out.
        after: Duration,
        /// What becomes of the request's key.
        held: KeyHeld,
    },
    /// (Gateway) The connection to the upstream broke after the request was
    /// sent, before a complete response came back: whether it took effect is
    /// unknown.
    #[error("{}", unknown_outcome(&format!("the connection to the upstream broke before a complete response came back ({cause})"), *held))]
    UpstreamBroke {
        /// What broke, as the HTTP client reported it.
        cause: String,
        /// What becomes of the request's key.
        held: KeyHeld,
    },
    /// (Gateway) The upstream could not be reached, so nothing was sent; a
    /// keyed request's key is released and a retry is forwarded at once.
    #[error(
        "the upstream could not be reached ({cause}), so the request was not sent and took no effect; retry it (with the same Idempotency-Key, if it had one)"
    )]
    UpstreamUnreachable {
        /// Why, as the HTTP client reported it.
        cause: String,
    },
    /// An earlier attempt with this key ended with an unknown outcome, and the
    /// service could not say whether it was applied (see
    /// [`Reconcile`](super::Reconcile)). Nothing was run; the key stays
    /// reserved, and the next retry asks again.
    #[error(
        "an earlier attempt with this Idempotency-Key ended with an unknown outcome, and the service could not say whether it took effect ({cause}); nothing was run now. Retry with the same key after {} (Retry-After): the service is asked again before anything runs", humane(*retry_after)
    )]
    ReconcileUnknown {
        /// What the service answered, or why it could not be asked.
        cause: String,
        /// When to ask again.
        retry_after: Duration,
    },
    /// An earlier attempt with this key ended with an unknown outcome (the
    /// upstream answered 502 or 504, timed out or broke off after the request
    /// was sent) and there is no probe to ask: the key stays reserved until
    /// its lease ends, then a retry is forwarded again.
    #[error(
        "an earlier attempt with this Idempotency-Key ended with an unknown outcome: it may have taken effect. The key stays reserved for {} more (Retry-After); a retry with the same key after that is forwarded again, with the key, so the upstream can recognise the repeat", humane(*left)
    )]
    HeldUnknown {
        /// How long the key stays reserved.
        left: Duration,
    },
    /// The limit of requests in flight was reached, so this one was answered
    /// at once without being read or run.
    #[error(
        "the server is already answering {limit} requests, its limit, so this one was not run and took no effect; retry it after the Retry-After delay (with the same Idempotency-Key, if it had one)"
    )]
    Overloaded {
        /// The limit of requests in flight.
        limit: usize,
    },
}

const STORE_UNAVAILABLE_KEYED: &str = "the database could not be reached, went away or was too busy before this request's writes were committed, so nothing was kept. Retrying with the same Idempotency-Key after the Retry-After delay is safe: the stored response is replayed if an earlier attempt took effect, otherwise the request runs";
const STORE_UNAVAILABLE: &str = "the database could not be reached, went away or was too busy before this request's writes were committed, so nothing was kept; the request can be sent again after the Retry-After delay";
const COMMIT_UNKNOWN_KEYED: &str = "the connection to the database broke while this request's writes were being committed, so whether they were kept is unknown. Retrying with the same Idempotency-Key after the Retry-After delay is safe and tells: if the writes were kept, the stored response is replayed; if not, the request runs";
const COMMIT_UNKNOWN: &str = "the connection to the database broke while this request's writes were being committed, so whether they were kept is unknown. The request carried no Idempotency-Key: retrying it may apply it twice";

/// What becomes of a request's key after an answer whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeld {
    /// The request carried no key: a retry may apply it twice.
    NoKey,
    /// Reserved until its lease (this long) ends; a retry after that is
    /// forwarded again.
    ForLease(Duration),
    /// Reserved until the next retry, which asks the upstream's probe
    /// whether this attempt was applied before anything runs again.
    UntilAsked,
}

/// The detail of an outcome-unknown answer: what happened, and what a retry
/// does.
fn unknown_outcome(what: &str, held: KeyHeld) -> String {
    match held {
        KeyHeld::UntilAsked => format!(
            "{what} after the request was sent, so whether it took effect is unknown. Retry with the same Idempotency-Key: the upstream is asked whether this attempt was applied, and its answer is replayed if it was; the request is forwarded again only if it was not"
        ),
        KeyHeld::ForLease(lease) => format!(
            "{what} after the request was sent, so whether it took effect is unknown. The Idempotency-Key stays reserved until its lease ends: retry with the same key after {} (Retry-After) and the request is forwarded again, with the same key, so the upstream can recognise the repeat",
            humane(lease)
        ),
        KeyHeld::NoKey => format!(
            "{what} after the request was sent, so whether it took effect is unknown. The request carried no Idempotency-Key: retrying it may apply it twice"
        ),
    }
}

/// A duration for people: whole seconds when it is at least one, else milliseconds.
fn humane(duration: Duration) -> String {
    if duration >= Duration::from_secs(1) {
        format!("{} s", duration.as_millis().div_ceil(1000))
    } else {
        format!("{} ms", duration.as_millis().max(1))
    }
}

/// A response extension on every answer the layer (or the gateway) gave
/// itself, naming the refusal by its problem type: how the gateway counts
/// requests by outcome without reading bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

impl Refused {
    /// A concurrent duplicate answered 409: its original is still running.
    pub fn is_in_flight(&self) -> bool {
        self.0 == IN_FLIGHT
    }

    /// A key sent again with a different request.
    pub fn is_key_reuse(&self) -> bool {
        self.0 == KEY_REUSED
    }
}

const IN_FLIGHT: &str = "idempotency-key-in-flight";
const KEY_REUSED: &str = "idempotency-key-reused";

impl Refusal {
    /// The HTTP status of this refusal in `mode`: the only place refusals and
    /// store errors become statuses.
    pub fn status(&self, mode: Mode) -> StatusCode {
        match self {
            Self::MissingKey | Self::Header(_) | Self::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::OutcomeUnknown
            | Self::UpstreamBroke { .. }
            | Self::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::HandlerFailed | Self::Corrupt(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::HeldUnknown { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable { .. }
            | Self::CommitUnknown { .. }
            | Self::ReconcileUnknown { .. }
            | Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Protocol(error) => match error {
                Error::KeyReuse { .. } => match mode {
                    Mode::Ietf => StatusCode::UNPROCESSABLE_ENTITY,
                    Mode::Stripe => StatusCode::BAD_REQUEST,
                },
                Error::InFlight { .. } => StatusCode::CONFLICT,
                Error::Expired { .. } => StatusCode::GONE,
                Error::InvalidKey(_) => StatusCode::BAD_REQUEST,
                Error::Store(store) if store.kind().is_transient() => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// How long the client should wait before retrying, for refusals where a
    /// retry can succeed: whole seconds, at least one.
    pub fn retry_after(&self) -> Option<u64> {
        let wait = match self {
            Self::Protocol(Error::InFlight { retry_after, .. }) => *retry_after,
            Self::Protocol(Error::Store(store)) if store.kind().is_transient() => {
                Duration::from_secs(1)
            }
            Self::UpstreamTimeout { held, .. } | Self::UpstreamBroke { held, .. } => match held {
                KeyHeld::NoKey => return None,
                KeyHeld::ForLease(lease) => *lease,
                KeyHeld::UntilAsked => Duration::from_secs(1),
            },
            Self::ReconcileUnknown { retry_after, .. } => *retry_after,
            Self::HeldUnknown { left } => *left,
            Self::UpstreamUnreachable { .. }
            | Self::StoreUnavailable { .. }
            | Self::CommitUnknown { keyed: true }
            | Self::Overloaded { .. } => Duration::from_secs(1),
            _ => return None,
        };
        Some(wait.as_millis().div_ceil(1000).max(1) as u64)
    }

    fn problem_type(&self) -> &'static str {
        match self {
            Self::MissingKey => "missing-idempotency-key",
            Self::Header(_) | Self::Protocol(Error::InvalidKey(_)) => "malformed-idempotency-key",
            Self::Protocol(Error::KeyReuse { .. }) => KEY_REUSED,
            Self::Protocol(Error::InFlight { .. }) => IN_FLIGHT,
            Self::Protocol(Error::Expired { .. }) => "idempotency-key-expired",
            Self::BodyTooLarge { .. } => "request-too-large",
            Self::BodyUnreadable(_) => "request-unreadable",
            Self::OutcomeUnknown => "outcome-unknown",
            Self::HandlerFailed => "handler-failed",
            Self::StoreUnavailable { .. } => "store-unavailable",
            Self::CommitUnknown { .. } => "commit-outcome-unknown",
            Self::Corrupt(_) | Self::Protocol(_) => "idempotency-store-failure",
            Self::UpstreamTimeout { .. } => "upstream-timeout-outcome-unknown",
            Self::UpstreamBroke { .. } => "upstream-broke-outcome-unknown",
            Self::UpstreamUnreachable { .. } => "upstream-unreachable",
            Self::ReconcileUnknown { .. } => "reconcile-outcome-unknown",
            Self::HeldUnknown { .. } => "idempotency-key-held-outcome-unknown",
            Self::Overloaded { .. } => "overloaded",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key is missing",
            Self::Header(_) | Self::Protocol(Error::InvalidKey(_)) => {
                "Idempotency-Key is malformed"
            }
            Self::Protocol(Error::KeyReuse { .. }) => {
                "Idempotency-Key was already used with another request"
            }
            Self::Protocol(Error::InFlight { .. }) => {
                "A request with this Idempotency-Key is still being processed"
            }
            Self::Protocol(Error::Expired { .. }) => {
                "Idempotency-Key expired; a late retry is not run"
            }
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::BodyUnreadable(_) => "Request body unreadable",
            Self::OutcomeUnknown => "Outcome unknown",
            Self::HandlerFailed => "Request failed; nothing was kept",
            Self::StoreUnavailable { .. } => "Database unavailable; nothing was kept",
            Self::CommitUnknown { .. } => {
                "Database connection broke during the commit; outcome unknown"
            }
            Self::Corrupt(_) | Self::Protocol(_) => "Idempotency store failure",
            Self::UpstreamTimeout { .. } => "Upstream timed out; outcome unknown",
            Self::UpstreamBroke { .. } => "Upstream connection broke; outcome unknown",
            Self::UpstreamUnreachable { .. } => "Upstream unreachable; nothing was sent",
            Self::ReconcileUnknown { .. } => "Earlier attempt unresolved; nothing was run",
            Self::HeldUnknown { .. } => {
                "An earlier attempt with this Idempotency-Key has an unknown outcome"
            }
            Self::Overloaded { .. } => "Too many requests in flight; nothing was done",
        }
    }

    fn stripe_type(&self) -> &'static str {
        match self {
            Self::MissingKey | Self::Header(_) => "idempotency_error",
            Self::Protocol(
                Error::InvalidKey(_)
                | Error::KeyReuse { .. }
                | Error::InFlight { .. }
                | Error::Expired { .. },
            ) => "idempotency_error",
            Self::BodyTooLarge { .. } | Self::BodyUnreadable(_) => "invalid_request_error",
            Self::HeldUnknown { .. } => "idempotency_error",
            Self::OutcomeUnknown
            | Self::HandlerFailed
            | Self::StoreUnavailable { .. }
            | Self::CommitUnknown { .. }
            | Self::Corrupt(_)
            | Self::Protocol(_)
            | Self::UpstreamTimeout { .. }
            | Self::UpstreamBroke { .. }
            | Self::UpstreamUnreachable { .. }
            | Self::ReconcileUnknown { .. }
            | Self::Overloaded { .. } => "api_error",
        }
    }

    /// The refusal for `error`, met by the store on a request with or without
    /// a key: a store that is unreachable, gone or busy, and a commit whose
    /// fate is unknown, are answered as such (503, with what a retry does);
    /// anything else as the protocol's refusal. The store's own message,
    /// which names the server, is logged here and not sent.
    pub(crate) fn from_store(error: Error, keyed: bool) -> Self {
        let kind = match &error {
            Error::Store(store) => store.kind(),
            _ => return Self::Protocol(error),
        };
        if kind == ErrorKind::CommitUnknown {
            tracing::warn!(%error, "the store's connection broke during the commit");
            Self::CommitUnknown { keyed }
        } else if kind.is_transient() {
            tracing::warn!(%error, "the store is unavailable");
            Self::StoreUnavailable { keyed }
        } else {
            Self::Protocol(error)
        }
    }

    /// The response for this refusal in `mode`.
    pub fn to_response(&self, mode: Mode) -> Response {
        let status = self.status(mode);
        if status.is_server_error() {
            tracing::warn!(error = %self, "idempotency layer answered {status}");
        } else {
            tracing::debug!(error = %self, "idempotency layer answered {status}");
        }
        let expired_at = match self {
            Self::Protocol(Error::Expired { expired_at, .. }) => Some(*expired_at),
            _ => None,
        };
        let (content_type, mut body) = match mode {
            Mode::Ietf => (
                "application/problem+json",
                json!({
                    "type": format!("urn:idem:problem:{}", self.problem_type()),
                    "title": self.title(),
                    "status": status.as_u16(),
                    "detail": self.to_string(),
                }),
            ),
            Mode::Stripe => (
                "application/json",
                json!({ "error": { "type": self.stripe_type(), "message": self.to_string() } }),
            ),
        };
        if let Some(at) = expired_at {
            let member = match mode {
                Mode::Ietf => &mut body,
                Mode::Stripe => &mut body["error"],
            };
            member["expired_at"] = json!(at.rfc3339());
        }
        let mut response = Response::new(Body::from(body.to_string()));
        *response.status_mut() = status;
        response
            .extensions_mut()
            .insert(Refused(self.problem_type()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(seconds) = self.retry_after() {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(at) = expired_at {
            crate::key_header::mark_expiry(headers, at);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{ErrorKind, IdempotencyKey, Scope, StoreError};

    use super::*;

    fn in_flight(ms: u64) -> Refusal {
        Refusal::Protocol(Error::InFlight {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::new("k").unwrap(),
            retry_after: Duration::from_millis(ms),
        })
    }

    #[test]
    fn every_row_has_its_status_in_both_modes() {
        let reuse = Refusal::Protocol(Error::KeyReuse {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::new("k").unwrap(),
        });
        assert_eq!(reuse.status(Mode::Ietf), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(reuse.status(Mode::Stripe), StatusCode::BAD_REQUEST);
        for mode in [Mode::Ietf, Mode::Stripe] {
            assert_eq!(Refusal::MissingKey.status(mode), StatusCode::BAD_REQUEST);
            assert_eq!(in_flight(10).status(mode), StatusCode::CONFLICT);
            assert_eq!(
                Refusal::BodyTooLarge { limit: 1 }.status(mode),
                StatusCode::PAYLOAD_TOO_LARGE
            );
            let busy = Refusal::Protocol(Error::Store(StoreError::new(ErrorKind::Busy, "busy")));
            assert_eq!(busy.status(mode), StatusCode::SERVICE_UNAVAILABLE);
            let shed = Refusal::Overloaded { limit: 8 };
            assert_eq!(shed.status(mode), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(shed.retry_after(), Some(1));
        }
    }

    #[test]
    fn a_lost_store_is_503_and_says_what_a_retry_does() {
        let lost = |kind| Error::Store(StoreError::new(kind, "gone"));
        for (kind, problem) in [
            (ErrorKind::Unavailable, "store-unavailable"),
            (ErrorKind::Busy, "store-unavailable"),
            (ErrorKind::CommitUnknown, "commit-outcome-unknown"),
        ] {
            let refusal = Refusal::from_store(lost(kind), true);
            assert_eq!(refusal.problem_type(), problem);
            assert_eq!(refusal.status(Mode::Ietf), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(refusal.retry_after(), Some(1));
            assert!(refusal.to_string().contains("same Idempotency-Key"));
        }
        let keyless = Refusal::from_store(lost(ErrorKind::CommitUnknown), false);
        assert_eq!(keyless.retry_after(), None);
        assert!(keyless.to_string().contains("may apply it twice"));
        let corrupt = Refusal::from_store(lost(ErrorKind::Corrupt), true);
        assert_eq!(corrupt.problem_type(), "idempotency-store-failure");
        assert_eq!(
            corrupt.status(Mode::Ietf),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        assert_eq!(in_flight(0).retry_after(), Some(1));
        assert_eq!(in_flight(400).retry_after(), Some(1));
        assert_eq!(in_flight(1000).retry_after(), Some(1));
        assert_eq!(in_flight(1001).retry_after(), Some(2));
        assert_eq!(Refusal::MissingKey.retry_after(), None);
        let response = in_flight(2500).to_response(Mode::Stripe);
        assert_eq!(response.headers()[RETRY_AFTER], "3");
    }
}

//! Retries for HTTP clients built on tower: a `tower::retry::Policy` made of the
//! same pieces as [`Retrier`](crate::Retrier).
//!
//! Why a policy and not a loop around the client: tower's `Retry` middleware
//! already owns "call, wait, call again"; what it needs from us is the
//! decision. [`HttpRetryPolicy`] brings the backoff, the `Retry-After` hint, the
//! deadline, the shared budget and the classification, and [`HttpRetryLayer`]
//! stacks it with the [`AttemptService`] that writes the key on every attempt.
//!
//! The key, once: attach an [`IdempotencyKey`](idem_core::IdempotencyKey) to the
//! request with [`with_idempotency_key`] before sending it. Every attempt is a
//! clone of that one request, and each is stamped with `Idempotency-Key` from
//! it, so the first attempt and the fifth carry the same key; nothing in the
//! loop can make another.
//!
//! What is retried: only requests it is safe to send twice. A request with a
//! key, whatever its method (the receiver dedupes: `idem-http`'s layer and
//! gateway honour a key on POST, PUT, PATCH, DELETE alike), with a safe method (GET, HEAD, OPTIONS, TRACE),
//! or on a route the caller named with
//! [`HttpRetryPolicy::resend_without_key`]. A POST, PUT, PATCH or DELETE
//! without a key is otherwise sent once: the handler is idempotent or not,
//! whatever the verb says, and after a reset nobody knows whether it was
//! applied. Bodies must be cloneable (`http_body_util::Full<Bytes>`, `String`).
//!
//! How it ends: when the outcome needs no retry or the attempts run out, the
//! caller gets the last answer as it is (a 422, the last 503). When the budget
//! refuses a retry or the next wait would pass the deadline, the caller gets
//! [`HttpRetryError::Stopped`] with the reason and the last status or error.

mod attempt;
mod error;
mod key_header;
mod layer;
mod resend;

pub use attempt::{AttemptFuture, AttemptService};
pub use error::{BoxError, HttpRetryError};
pub use key_header::{IDEMPOTENCY_KEY, key_header_value, with_idempotency_key};
pub use layer::{HttpRetryLayer, RetryingClient};

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};

use resend::{PromisedRoutes, resend_reason};

use crate::{
    Classify, FullJitter, HttpPolicy, RetryBudget, RetryConfig, Sleep, StopReason, Timer,
    TokioTimer, Verdict, next_delay, observe,
};

/// The retry decisions for one HTTP client, for tower's `Retry` middleware.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use http::{Request, Response, StatusCode};
/// use idem_core::IdempotencyKey;
/// use idem_retry::{HttpRetryLayer, HttpRetryPolicy, RetryBudget, RetryConfig, VirtualTimer, with_idempotency_key};
/// use tower::{Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A stand-in upstream: 503 with Retry-After on the first call, then 200.
/// let seen_keys = Arc::new(Mutex::new(Vec::new()));
/// let seen = seen_keys.clone();
/// let upstream = tower::service_fn(move |request: Request<String>| {
///     let seen = seen.clone();
///     async move {
///         let key = request.headers()["idempotency-key"].to_str().unwrap().to_owned();
///         let first = { let mut seen = seen.lock().unwrap(); seen.push(key); seen.len() == 1 };
///         let status = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
///         Ok::<_, std::convert::Infallible>(Response::builder().status(status).header("retry-after", "1").body(()).unwrap())
///     }
/// });
///
/// let timer = VirtualTimer::new();
/// let policy = HttpRetryPolicy::new(RetryConfig::default(), Arc::new(RetryBudget::default()))
///     .with_timer(timer.clone());
/// let mut client = HttpRetryLayer::new(policy).layer(upstream);
///
/// let key = IdempotencyKey::new("order-42/charge").unwrap(); // made once
/// let request = with_idempotency_key(Request::post("/charges").body("{}".to_owned()).unwrap(), key);
/// let response = client.ready().await.unwrap().call(request).await.unwrap();
///
/// assert_eq!(response.status(), StatusCode::OK);
/// assert_eq!(*seen_keys.lock().unwrap(), ["\"order-42/charge\"", "\"order-42/charge\""]);
/// assert_eq!(timer.slept(), [std::time::Duration::from_secs(1)]); // the server's hint
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HttpRetryPolicy<C = HttpPolicy, T = TokioTimer> {
    config: RetryConfig,
    budget: Arc<RetryBudget>,
    classify: C,
    timer: T,
    /// Routes resent without a key on the caller's word.
    promised: Arc<PromisedRoutes>,
    /// The call in progress. Tower clones the policy for every request, right
    /// after `clone_request`, so each call's clone carries its own state.
    call: Option<CallState>,
}

#[derive(Debug, Clone)]
struct CallState {
    started: Instant,
    attempts: u32,
    delays: FullJitter,
    /// A retry was granted, so the next `clone_request` belongs to this call.
    resending: bool,
}

impl HttpRetryPolicy {
    /// A policy with the default HTTP classification, on tokio's timer.
    pub fn new(config: RetryConfig, budget: Arc<RetryBudget>) -> Self {
        Self {
            config,
            budget,
            classify: HttpPolicy::new(),
            timer: TokioTimer,
            promised: Arc::default(),
            call: None,
        }
    }
}

impl<C, T> HttpRetryPolicy<C, T> {
    /// The same policy with another classification.
    pub fn with_classify<C2>(self, classify: C2) -> HttpRetryPolicy<C2, T> {
        HttpRetryPolicy {
            config: self.config,
            budget: self.budget,
            classify,
            timer: self.timer,
            promised: self.promised,
            call: None,
        }
    }

    /// The same policy on another timer.
    pub fn with_timer<T2: Timer>(self, timer: T2) -> HttpRetryPolicy<C, T2> {
        HttpRetryPolicy {
            config: self.config,
            budget: self.budget,
            classify: self.classify,
            timer,
            promised: self.promised,
            call: None,
        }
    }

    /// Resends requests to `route` with `method` even without a key — the
    /// caller's promise that this handler tolerates a second copy (a PUT that
    /// overwrites a whole resource, a DELETE by id). `route` is a path whose
    /// `{name}` segments match any one segment: `"/users/{id}/avatar"`.
    /// Without a promise, only keyed requests and safe methods are resent.
    pub fn resend_without_key(mut self, method: http::Method, route: &str) -> Self {
        Arc::make_mut(&mut self.promised).add(method, route);
        self
    }

    /// A layer applying this policy.
    pub fn into_layer(self) -> HttpRetryLayer<C, T> {
        HttpRetryLayer::new(self)
    }
}

impl<C, T: Timer> HttpRetryPolicy<C, T> {
    fn start_call(&mut self) {
        self.call = Some(CallState {
            started: self.timer.now(),
            attempts: 1,
            delays: self.config.backoff.delays(),
            resending: false,
        });
        self.budget.record_request();
        observe::request_started();
    }
}

/// Replaces a retryable outcome with the typed error saying why retrying
/// stopped early.
fn stop_early<R>(
    result: &mut Result<Response<R>, HttpRetryError>,
    reason: StopReason,
    attempts: u32,
) {
    observe::gave_up(attempts, &reason);
    let placeholder = Err(HttpRetryError::transport("replaced by the stop reason"));
    let (last_status, last_error) = match std::mem::replace(result, placeholder) {
        Ok(response) => (Some(response.status()), None),
        Err(HttpRetryError::Transport(error)) => (None, Some(error)),
        Err(other) => (None, Some(Box::new(other) as BoxError)),
    };
    *result = Err(HttpRetryError::Stopped {
        reason,
        attempts,
        last_status,
        last_error,
    });
}

impl<B, R, C, T> tower::retry::Policy<Request<B>, Response<R>, HttpRetryError>
    for HttpRetryPolicy<C, T>
where
    B: Clone,
    C: Classify<Result<Response<R>, HttpRetryError>>,
    T: Timer,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        _request: &mut Request<B>,
        result: &mut Result<Response<R>, HttpRetryError>,
    ) -> Option<Sleep> {
        let hint = match self.classify.classify(result) {
            Verdict::DontRetry => return None,
            Verdict::Retry => None,
            Verdict::RetryAfter(hint) => Some(hint),
        };
        if self.call.is_none() {
            self.start_call();
        }
        let call = self.call.as_mut()?;
        let Some(backoff) = call.delays.next() else {
            let reason = StopReason::AttemptsExhausted {
                max_attempts: self.config.backoff.max_attempts(),
            };
            observe::gave_up(call.attempts, &reason);
            return None;
        };
        let remaining = self
            .config
            .deadline
            .map(|deadline| deadline.saturating_sub(self.timer.now().duration_since(call.started)));
        let delay = match next_delay(backoff, hint, remaining) {
            Ok(delay) => delay,
            Err(reached) => {
                stop_early(result, reached.into(), call.attempts);
                return None;
            }
        };
        if let Err(exhausted) = self.budget.try_withdraw() {
            stop_early(result, exhausted.into(), call.attempts);
            return None;
        }
        call.attempts += 1;
        call.resending = true;
        observe::retry_granted(call.attempts, delay);
        Some(self.timer.sleep(delay))
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        match &mut self.call {
            Some(call) if call.resending => call.resending = false,
            _ => {
                self.start_call();
                if resend_reason(request, &self.promised).is_none() {
                    tracing::debug!(
                        method = %request.method(),
                        path = request.uri().path(),
                        "not retrying: the request has no idempotency key, its method is not safe and its route was not named idempotent"
                    );
                    return None;
                }
            }
        }
        Some(request.clone())
    }
}

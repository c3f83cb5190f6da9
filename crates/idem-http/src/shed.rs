//! [`LoadShedLayer`]: past a number of requests in flight, answer at once
//! with 503 and `Retry-After` instead of queueing.
//!
//! Why shed and not queue: a service that is saturated answers later and
//! later, until clients time out and retry, which adds more load. A quick 503
//! costs nothing, changes nothing (no key is claimed, no body is read, the
//! service never sees the request) and tells a retrying client when to come
//! back; the requests that were admitted keep a bounded latency.
//!
//! The refusal is in the layer's vocabulary (problem+json, or Stripe's
//! `api_error`) and counted in [`REQUESTS_SHED_TOTAL`]. tower's `load_shed`
//! and `concurrency_limit` do the same job but answer with an error that an
//! axum router first has to turn into a response (`HandleErrorLayer`); this
//! layer is both in one, answering like the rest of the crate.
//!
//! Put it outside the [`IdempotencyLayer`](crate::IdempotencyLayer), so a
//! shed request claims nothing and its retry, with the same key, runs as if it
//! were the first:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use idem_http::{IdempotencyConfig, IdempotencyLayer, LoadShedLayer, Mode};
//!
//! let dir = tempfile::tempdir()?;
//! let store = idem::SqliteStore::open(dir.path().join("idem.db")).await?;
//! let idempotency = IdempotencyLayer::new(store, IdempotencyConfig::default());
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(idempotency)
//!     // The last layer is the outermost: at most 256 requests in flight.
//!     .layer(LoadShedLayer::new(256, Mode::Ietf));
//! # drop(app); Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::Response;
use futures::future::BoxFuture;
use http::Request;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::{Mode, Refusal};

/// Requests answered 503 because the limit of requests in flight was reached.
pub const REQUESTS_SHED_TOTAL: &str = "http_requests_shed_total";

/// A limit of requests in flight, shared by every clone: the gateway's
/// `--max-in-flight` and [`LoadShedLayer`].
#[derive(Clone)]
pub struct InFlightLimit {
    permits: Arc<Semaphore>,
    limit: usize,
    mode: Mode,
}

impl InFlightLimit {
    /// At most `limit` (at least one) requests in flight; refusals in `mode`.
    pub fn new(limit: usize, mode: Mode) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            mode,
        }
    }

    /// A place for one more request, held until it is dropped; `None`, and
    /// the request counted as shed, when every place is taken.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let admitted = Arc::clone(&self.permits).try_acquire_owned().ok();
        if admitted.is_none() {
            metrics::counter!(REQUESTS_SHED_TOTAL).increment(1);
            tracing::debug!(
                limit = self.limit,
                "request shed: the limit of requests in flight is reached"
            );
        }
        admitted
    }

    /// The answer to a request that was not admitted: 503 + `Retry-After`.
    pub fn shed(&self) -> Response {
        Refusal::Overloaded { limit: self.limit }.to_response(self.mode)
    }
}

impl fmt::Debug for InFlightLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("limit", &self.limit)
            .field("free", &self.permits.available_permits())
            .finish()
    }
}

/// Answers 503 + `Retry-After` at once when `max_in_flight` requests are
/// already being answered by the services it wraps (all of them together: the
/// limit is shared by every route of a router). A request holds its place
/// until its response head is ready.
#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    limit: InFlightLimit,
}

impl LoadShedLayer {
    /// At most `max_in_flight` requests in flight (at least one); refusals in
    /// `mode`'s vocabulary.
    pub fn new(max_in_flight: usize, mode: Mode) -> Self {
        Self {
            limit: InFlightLimit::new(max_in_flight, mode),
        }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> LoadShed<S> {
        LoadShed {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// The service [`LoadShedLayer`] makes.
#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    limit: InFlightLimit,
}

impl<S, B> Service<Request<B>> for LoadShed<S>
where
    S: Service<Request<B>, Response = Response>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.limit.admit() {
            Some(permit) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let answered = answer.await;
                    drop(permit);
                    answered
                })
            }
            None => Box::pin(std::future::ready(Ok(self.limit.shed()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use http::header::RETRY_AFTER;

    use super::*;

    #[test]
    fn the_limit_admits_that_many_and_sheds_the_rest_until_one_leaves() {
        let limit = InFlightLimit::new(2, Mode::Ietf);
        let first = limit.admit().expect("first admitted");
        let _second = limit.admit().expect("second admitted");
        assert!(limit.admit().is_none(), "third shed");
        let shed = limit.shed();
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed.headers()[RETRY_AFTER], "1");
        drop(first);
        assert!(limit.admit().is_some());
        assert_eq!(InFlightLimit::new(0, Mode::Ietf).limit, 1);
    }
}

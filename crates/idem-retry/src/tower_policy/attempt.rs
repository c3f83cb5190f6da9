//! The service each attempt goes through: stamps the key header and gives the
//! transport's error one type the policy can judge.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Request;
use tower::Service;

use super::error::{BoxError, HttpRetryError};
use super::key_header;

/// Wraps the HTTP client inside the retry layer. On every attempt it writes the
/// request's attached [`IdempotencyKey`](idem_core::IdempotencyKey) into the
/// `Idempotency-Key` header (the same key each time, since every attempt is a
/// clone of the one request), and wraps the client's errors in
/// [`HttpRetryError::Transport`].
#[derive(Debug, Clone)]
pub struct AttemptService<S> {
    inner: S,
}

impl<S> AttemptService<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped client.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, B> Service<Request<B>> for AttemptService<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = HttpRetryError;
    type Future = AttemptFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(HttpRetryError::transport)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        key_header::stamp(&mut request);
        AttemptFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// One attempt in flight.
    #[derive(Debug)]
    pub struct AttemptFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, T, E> Future for AttemptFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, HttpRetryError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .inner
            .poll(cx)
            .map_err(HttpRetryError::transport)
    }
}

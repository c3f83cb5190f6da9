//! [`ResponseFuture`]: what [`IdempotencyService`](super::IdempotencyService)
//! returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::response::Response;
use futures::future::BoxFuture;

/// The response of the idempotency service: a replay, a refusal, or the inner
/// service's answer.
pub struct ResponseFuture<E> {
    inner: BoxFuture<'static, Result<Response, E>>,
}

impl<E> ResponseFuture<E> {
    pub(super) fn new(future: impl Future<Output = Result<Response, E>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

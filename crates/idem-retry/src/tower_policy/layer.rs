//! The tower `Layer` that puts the retry policy and the per-attempt service
//! around an HTTP client.

use tower::Layer;
use tower::retry::Retry;

use super::{AttemptService, HttpRetryPolicy};

/// A client wrapped for retries: `Retry` driven by [`HttpRetryPolicy`], around
/// the [`AttemptService`] that stamps the key and types the errors.
pub type RetryingClient<S, C = crate::HttpPolicy, T = crate::TokioTimer> =
    Retry<HttpRetryPolicy<C, T>, AttemptService<S>>;

/// Wraps an HTTP client (hyper-util's legacy `Client`, or any tower service
/// over `http` requests) in [`HttpRetryPolicy`].
#[derive(Debug, Clone)]
pub struct HttpRetryLayer<C = crate::HttpPolicy, T = crate::TokioTimer> {
    policy: HttpRetryPolicy<C, T>,
}

impl<C, T> HttpRetryLayer<C, T> {
    /// A layer retrying with `policy`.
    pub fn new(policy: HttpRetryPolicy<C, T>) -> Self {
        Self { policy }
    }
}

impl<S, C: Clone, T: Clone> Layer<S> for HttpRetryLayer<C, T> {
    type Service = RetryingClient<S, C, T>;

    fn layer(&self, client: S) -> Self::Service {
        Retry::new(self.policy.clone(), AttemptService::new(client))
    }
}

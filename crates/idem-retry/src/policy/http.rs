//! The default classification of HTTP outcomes: status codes, `Retry-After`
//! and transport errors.

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Response, StatusCode, header::RETRY_AFTER};
use idem_core::{SharedClock, SystemClock};

use super::{Classify, Verdict};
use crate::RetryAfter;

/// Retries what a second attempt can fix and nothing else.
///
/// | outcome | verdict |
/// | --- | --- |
/// | 408, 429, any 5xx | retry; after `Retry-After` if the server sent one |
/// | 409 with `Retry-After` (an idempotent endpoint's "still in flight") | retry after that delay |
/// | 409 without `Retry-After` | don't retry: it is a real conflict |
/// | any other status (400, 401, 403, 404, 422, 2xx, 3xx, ...) | don't retry |
/// | timeout, connection refused, reset, aborted, closed before the answer | retry |
/// | any other transport error (bad URI, TLS configuration, ...) | don't retry |
///
/// Transport errors are recognised by walking the error's `source()` chain for
/// `std::io::Error` kinds, `hyper::Error` timeouts, incomplete messages and
/// cancellations, and `tokio::time::error::Elapsed`, so it works on
/// hyper-util's legacy client error and on anything that wraps it.
///
/// A `Retry-After` HTTP-date is turned into a delay with the policy's clock
/// (the system clock unless [`with_clock`](Self::with_clock) says otherwise).
///
/// ```
/// use http::{Response, StatusCode};
/// use idem_retry::{Classify, HttpPolicy, Verdict};
/// use std::time::Duration;
///
/// let policy = HttpPolicy::new();
/// let unavailable = Response::builder().status(503).header("retry-after", "2").body(()).unwrap();
/// assert_eq!(policy.classify(&unavailable), Verdict::RetryAfter(Duration::from_secs(2)));
/// let invalid = Response::builder().status(StatusCode::UNPROCESSABLE_ENTITY).body(()).unwrap();
/// assert_eq!(policy.classify(&invalid), Verdict::DontRetry);
/// ```
#[derive(Debug, Clone)]
pub struct HttpPolicy {
    clock: SharedClock,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpPolicy {
    /// The default policy, reading HTTP-dates against the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// The default policy, reading HTTP-dates against `clock`.
    pub fn with_clock(clock: SharedClock) -> Self {
        Self { clock }
    }

    /// The server's `Retry-After`, as a delay from now. `None` when it is
    /// absent or unreadable (an unreadable hint is ignored, not obeyed).
    pub fn retry_after(&self, headers: &HeaderMap) -> Option<Duration> {
        let value = headers.get(RETRY_AFTER)?;
        match RetryAfter::parse_bytes(value.as_bytes()) {
            Ok(hint) => Some(hint.delay_from(self.clock.now().to_system_time())),
            Err(error) => {
                tracing::debug!(%error, "ignoring an unreadable Retry-After");
                None
            }
        }
    }

    /// The verdict for a response's status and headers.
    pub fn classify_status(&self, status: StatusCode, headers: &HeaderMap) -> Verdict {
        let retryable = matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
        ) || status.is_server_error();
        if retryable {
            return self
                .retry_after(headers)
                .map_or(Verdict::Retry, Verdict::RetryAfter);
        }
        if status == StatusCode::CONFLICT {
            // Only an idempotent endpoint's "still in flight" carries a hint; a
            // bare 409 is a conflict that a retry cannot resolve.
            return self
                .retry_after(headers)
                .map_or(Verdict::DontRetry, Verdict::RetryAfter);
        }
        Verdict::DontRetry
    }

    /// The verdict for a transport error: retry timeouts and broken
    /// connections, nothing else.
    pub fn classify_error(&self, error: &(dyn StdError + 'static)) -> Verdict {
        if causes(error).any(is_transient) {
            Verdict::Retry
        } else {
            Verdict::DontRetry
        }
    }
}

impl<B> Classify<Response<B>> for HttpPolicy {
    fn classify(&self, response: &Response<B>) -> Verdict {
        self.classify_status(response.status(), response.headers())
    }
}

impl<B, E> Classify<Result<Response<B>, E>> for HttpPolicy
where
    E: StdError + 'static,
{
    fn classify(&self, outcome: &Result<Response<B>, E>) -> Verdict {
        match outcome {
            Ok(response) => self.classify(response),
            Err(error) => self.classify_error(error),
        }
    }
}

/// The error and everything below it. `io::Error` hides a custom inner error
/// from `source()` (it forwards to the inner error's own source), so the walk
/// looks inside it explicitly.
fn causes<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), next_cause)
}

fn next_cause<'a>(current: &&'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    let current: &'a (dyn StdError + 'static) = *current;
    match current
        .downcast_ref::<io::Error>()
        .and_then(io::Error::get_ref)
    {
        Some(inner) => Some(inner),
        None => current.source(),
    }
}

fn is_transient(error: &(dyn StdError + 'static)) -> bool {
    if let Some(io) = error.downcast_ref::<io::Error>() {
        return matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::NotConnected
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::TimedOut
                | io::ErrorKind::UnexpectedEof
        );
    }
    if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
        return hyper.is_timeout() || hyper.is_incomplete_message() || hyper.is_canceled();
    }
    error.is::<tokio::time::error::Elapsed>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{ManualClock, Timestamp};

    fn response(status: u16, retry_after: Option<&str>) -> Response<()> {
        let mut builder = Response::builder().status(status);
        if let Some(value) = retry_after {
            builder = builder.header(RETRY_AFTER, value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn retries_408_429_and_every_5xx() {
        let policy = HttpPolicy::new();
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(
                policy.classify(&response(status, None)),
                Verdict::Retry,
                "{status}"
            );
        }
        assert_eq!(
            policy.classify(&response(429, Some("3"))),
            Verdict::RetryAfter(Duration::from_secs(3))
        );
    }

    #[test]
    fn never_retries_client_errors_or_successes() {
        let policy = HttpPolicy::new();
        for status in [200, 201, 204, 301, 304, 400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(
                policy.classify(&response(status, Some("1"))),
                Verdict::DontRetry,
                "{status}"
            );
        }
    }

    #[test]
    fn a_409_is_retried_only_when_it_carries_retry_after() {
        let policy = HttpPolicy::new();
        assert_eq!(
            policy.classify(&response(409, Some("1"))),
            Verdict::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(policy.classify(&response(409, None)), Verdict::DontRetry);
        assert_eq!(
            policy.classify(&response(409, Some("whenever"))),
            Verdict::DontRetry
        );
    }

    #[test]
    fn an_http_date_hint_is_read_against_the_policy_clock() {
        // 1994-11-06T08:49:37Z
        let clock = ManualClock::new(784_111_777_000);
        let policy = HttpPolicy::with_clock(Arc::new(clock.clone()));
        let at = Some("Sun, 06 Nov 1994 08:50:07 GMT");
        assert_eq!(
            policy.classify(&response(503, at)),
            Verdict::RetryAfter(Duration::from_secs(30))
        );
        clock.set(Timestamp(784_111_797_000));
        assert_eq!(
            policy.classify(&response(503, at)),
            Verdict::RetryAfter(Duration::from_secs(10))
        );
    }

    #[test]
    fn transport_errors_are_found_anywhere_in_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("request failed")]
        struct Wrapper(#[source] io::Error);

        let policy = HttpPolicy::new();
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            let wrapped = Wrapper(io::Error::new(kind, "boom"));
            assert_eq!(policy.classify_error(&wrapped), Verdict::Retry, "{kind:?}");
        }
        let nested = io::Error::other(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(policy.classify_error(&nested), Verdict::Retry);

        let not_found = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(policy.classify_error(&not_found), Verdict::DontRetry);
        let bad_uri = "no scheme".parse::<http::Uri>().map(|_| ()).err();
        if let Some(bad_uri) = bad_uri {
            assert_eq!(policy.classify_error(&bad_uri), Verdict::DontRetry);
        }
    }
}

//! The client side: which gRPC status codes are retried ([`GrpcRetryPolicy`]),
//! and a retried call that sets its idempotency key once and sends it with
//! every attempt ([`GrpcRetry::call`]).
//!
//! | code | retried |
//! |---|---|
//! | `UNAVAILABLE` | yes, after the backoff's jittered delay (or the server's pushback) |
//! | `DEADLINE_EXCEEDED` | only for a call that carries a key: without one, the first attempt may have taken effect |
//! | `RESOURCE_EXHAUSTED` | yes, not before the server's `grpc-retry-pushback-ms` hint when it sent one |
//! | `ABORTED` | only with a key and a `grpc-retry-pushback-ms` hint: a duplicate of a call still in flight |
//! | `UNKNOWN` raised by the client because the connection broke (an I/O error under the status) | only with a key: whether the call reached the server is unknown, and the key makes a second attempt safe |
//! | `INVALID_ARGUMENT`, `NOT_FOUND`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, and every other code | never |
//!
//! A pushback that is negative or not a number means "do not retry", as
//! gRPC's retry design has it. The delays are the [`Backoff`](idem_retry::Backoff)'s full jitter,
//! raised to the pushback; every retry is withdrawn from a [`RetryBudget`]
//! shared by the process, so a failing server gets a bounded share of extra
//! calls, not a multiple of its load.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::IdempotencyKey;
use idem_retry::{Attempt, Classify, RetryBudget, RetryConfig, RetryError, Verdict};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::status::RETRY_PUSHBACK;

/// The metadata entry the key is sent in unless configured otherwise.
const IDEMPOTENCY_KEY_NAME: &str = "idempotency-key";

/// Which failed calls are retried (see the [module](self) table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcRetryPolicy {
    keyed: bool,
}

impl GrpcRetryPolicy {
    /// The policy for calls that carry an idempotency key: a timed-out call
    /// is retried, the server dedupes it.
    pub fn keyed() -> Self {
        Self { keyed: true }
    }

    /// The policy for calls without a key: a timed-out call is not retried.
    pub fn unkeyed() -> Self {
        Self { keyed: false }
    }
}

/// The server's pushback: `Ok(None)` without one, `Err(())` for "do not
/// retry" (negative or not a number).
fn pushback(status: &Status) -> Result<Option<Duration>, ()> {
    let Some(value) = status.metadata().get(RETRY_PUSHBACK) else {
        return Ok(None);
    };
    let millis: i64 = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or(())?;
    u64::try_from(millis)
        .map(|millis| Some(Duration::from_millis(millis)))
        .map_err(|_| ())
}

/// Whether the client raised `status` because its connection broke: an I/O
/// error under it (a server's own `UNKNOWN` has no source).
fn connection_broke(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.is::<std::io::Error>() {
            return true;
        }
        cause = error.source();
    }
    false
}

impl Classify<Status> for GrpcRetryPolicy {
    fn classify(&self, status: &Status) -> Verdict {
        let retryable = match status.code() {
            Code::Unavailable | Code::ResourceExhausted => true,
            Code::DeadlineExceeded => self.keyed,
            Code::Aborted => self.keyed && status.metadata().contains_key(RETRY_PUSHBACK),
            Code::Unknown => self.keyed && connection_broke(status),
            _ => false,
        };
        if !retryable {
            return Verdict::DontRetry;
        }
        match pushback(status) {
            Ok(Some(hint)) => Verdict::RetryAfter(hint),
            Ok(None) => Verdict::Retry,
            Err(()) => Verdict::DontRetry,
        }
    }
}

/// Retried unary calls with an idempotency key.
///
/// ```no_run
/// # async fn charge(_: tonic::Request<u32>) -> Result<tonic::Response<u32>, tonic::Status> { unimplemented!() }
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use idem::IdempotencyKey;
/// use idem_grpc::GrpcRetry;
/// use idem_retry::{RetryBudget, RetryConfig};
///
/// let retry = GrpcRetry::new(RetryConfig::default(), Arc::new(RetryBudget::default()));
/// let key = IdempotencyKey::new("order-42/charge")?;
/// let reply = retry.call(key, 1250, |request| charge(request)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct GrpcRetry {
    config: RetryConfig,
    budget: Arc<RetryBudget>,
    key_metadata: &'static str,
}

impl GrpcRetry {
    /// Retries with `config`'s backoff and deadline, drawing on `budget`
    /// (share one budget across the process).
    pub fn new(config: RetryConfig, budget: Arc<RetryBudget>) -> Self {
        Self {
            config,
            budget,
            key_metadata: IDEMPOTENCY_KEY_NAME,
        }
    }

    /// Sends the key in this metadata entry instead of `idempotency-key`.
    pub fn key_metadata(mut self, name: &'static str) -> Self {
        self.key_metadata = name;
        self
    }

    /// The budget retries are drawn from.
    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// Calls `attempt` with a request carrying `message` and `key` until the
    /// answer needs no retry. Every attempt carries the same key; the key is
    /// set here, once, and `attempt` only sends the request.
    pub async fn call<M, R, F, Fut>(
        &self,
        key: IdempotencyKey,
        message: M,
        mut attempt: F,
    ) -> Result<tonic::Response<R>, RetryError<Status>>
    where
        M: Clone,
        F: FnMut(tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let name = self.key_metadata;
        let policy = GrpcRetryPolicy::keyed();
        idem_retry::retry(
            &self.config,
            &self.budget,
            &policy,
            key,
            |key: IdempotencyKey, _: Attempt| {
                let mut request = tonic::Request::new(message.clone());
                let value: MetadataValue<_> = key
                    .as_str()
                    .parse()
                    .expect("an idempotency key is visible ASCII");
                request.metadata_mut().insert(name, value);
                attempt(request)
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn with_pushback(code: Code, millis: &str) -> Status {
        let mut metadata = MetadataMap::new();
        metadata.insert(RETRY_PUSHBACK, millis.parse().unwrap());
        Status::with_metadata(code, "x", metadata)
    }

    #[test]
    fn status_codes_are_classified_as_documented() {
        let keyed = GrpcRetryPolicy::keyed();
        let unkeyed = GrpcRetryPolicy::unkeyed();
        assert_eq!(keyed.classify(&Status::unavailable("x")), Verdict::Retry);
        assert_eq!(
            keyed.classify(&Status::deadline_exceeded("x")),
            Verdict::Retry
        );
        assert_eq!(
            unkeyed.classify(&Status::deadline_exceeded("x")),
            Verdict::DontRetry
        );
        assert_eq!(
            keyed.classify(&with_pushback(Code::ResourceExhausted, "1500")),
            Verdict::RetryAfter(Duration::from_millis(1500))
        );
        assert_eq!(
            keyed.classify(&with_pushback(Code::ResourceExhausted, "-1")),
            Verdict::DontRetry
        );
        assert_eq!(
            keyed.classify(&with_pushback(Code::Unavailable, "soon")),
            Verdict::DontRetry
        );
        assert_eq!(
            keyed.classify(&with_pushback(Code::Aborted, "20")),
            Verdict::RetryAfter(Duration::from_millis(20))
        );
        assert_eq!(keyed.classify(&Status::aborted("x")), Verdict::DontRetry);
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed",
        )));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(keyed.classify(&broken), Verdict::Retry);
        assert_eq!(unkeyed.classify(&broken), Verdict::DontRetry);
        assert_eq!(keyed.classify(&Status::unknown("x")), Verdict::DontRetry);
        for never in [
            Status::invalid_argument("x"),
            Status::not_found("x"),
            Status::permission_denied("x"),
            Status::failed_precondition("x"),
            Status::internal("x"),
        ] {
            assert_eq!(keyed.classify(&never), Verdict::DontRetry, "{never:?}");
        }
    }
}

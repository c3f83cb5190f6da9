//! Why a publish failed, and whether another attempt may help.
//!
//! One error for every transport, with a [`PublishErrorKind`] that the relay and
//! the consumers decide on; the driver's own error stays available as the
//! `source()`, never in the API.

use std::fmt;
use std::time::Duration;

use idem_retry::Verdict;

use super::destination::DestinationError;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What kind of failure a publish met, whatever the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The destination could not be reached or the connection broke (refused,
    /// reset, timed out, channel closed). Retried.
    Unavailable,
    /// The destination was reached but did not take the message this time: a
    /// broker nack, an unroutable message, a missing stream, an HTTP 5xx, 408 or
    /// 429. Retried.
    NotTaken,
    /// The destination refused the message for good (an HTTP 4xx other than
    /// 408/409-with-Retry-After/429). Another attempt would get the same answer:
    /// dead-letter it.
    Rejected,
    /// The destination is written wrongly or names something unsupported. Not retried.
    Config,
}

impl PublishErrorKind {
    fn describe(self) -> &'static str {
        match self {
            Self::Unavailable => "destination unavailable",
            Self::NotTaken => "message not taken",
            Self::Rejected => "message rejected",
            Self::Config => "destination misconfigured",
        }
    }
}

impl fmt::Display for PublishErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A publish that failed: its kind, the destination (as
/// [`Destination::redacted`](super::Destination::redacted) writes it), a message
/// for people, an optional server hint of when to retry, and the driver's error
/// as the source.
#[derive(Debug, thiserror::Error)]
#[error("{kind} at {destination}: {message}")]
pub struct PublishError {
    kind: PublishErrorKind,
    destination: String,
    message: String,
    retry_after: Option<Duration>,
    #[source]
    source: Option<BoxError>,
}

impl PublishError {
    /// An error of `kind` at `destination` (already redacted).
    pub fn new(
        kind: PublishErrorKind,
        destination: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            destination: destination.into(),
            message: message.into(),
            retry_after: None,
            source: None,
        }
    }

    /// The same error with its underlying cause.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The same error with the server's hint of when to try again.
    pub fn with_retry_after(mut self, hint: Option<Duration>) -> Self {
        self.retry_after = hint;
        self
    }

    /// The kind.
    pub fn kind(&self) -> PublishErrorKind {
        self.kind
    }

    /// The destination, as [`Destination::redacted`](super::Destination::redacted) writes it.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The server's `Retry-After`, if it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        self.verdict().is_retry()
    }

    /// The retry decision, in idem-retry's terms (usable as a
    /// [`Classify`](idem_retry::Classify) through [`classify`]).
    pub fn verdict(&self) -> Verdict {
        match self.kind {
            PublishErrorKind::Unavailable | PublishErrorKind::NotTaken => {
                self.retry_after.map_or(Verdict::Retry, Verdict::RetryAfter)
            }
            PublishErrorKind::Rejected | PublishErrorKind::Config => Verdict::DontRetry,
        }
    }
}

/// The classification of publish errors, for [`idem_retry::retry`] and
/// [`idem_retry::Retrier`].
pub fn classify(error: &PublishError) -> Verdict {
    error.verdict()
}

impl From<DestinationError> for PublishError {
    fn from(error: DestinationError) -> Self {
        Self::new(
            PublishErrorKind::Config,
            "(unparsed destination)",
            error.to_string(),
        )
        .with_source(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_kinds_are_retried() {
        let at = "nats://h:4222/s";
        assert_eq!(
            PublishError::new(PublishErrorKind::Unavailable, at, "refused").verdict(),
            Verdict::Retry
        );
        assert_eq!(
            PublishError::new(PublishErrorKind::NotTaken, at, "503")
                .with_retry_after(Some(Duration::from_secs(2)))
                .verdict(),
            Verdict::RetryAfter(Duration::from_secs(2))
        );
        assert!(!PublishError::new(PublishErrorKind::Rejected, at, "422").is_retryable());
        assert!(!PublishError::new(PublishErrorKind::Config, at, "bad").is_retryable());
    }
}

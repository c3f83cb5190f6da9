//! The error of a retried HTTP call: the transport failed, or retrying stopped
//! for a reason the server's last answer does not explain.

use http::StatusCode;

use crate::StopReason;

/// Any error, boxed: what a transport (hyper-util's client, a timeout layer)
/// fails with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a call through [`HttpRetryLayer`](crate::HttpRetryLayer) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpRetryError {
    /// The last attempt's transport error (connection refused or reset, a
    /// timeout, ...), when it was not retried or the attempts ran out.
    #[error("HTTP request failed: {0}")]
    Transport(#[source] BoxError),
    /// Retrying stopped early, while the last outcome was still retryable: the
    /// budget refused another retry, or the wait would have ended past the
    /// deadline. The last answer's status or error is kept. (When the attempts
    /// simply run out, the last answer is returned as it is instead.)
    #[error("gave up after {attempts} attempt(s){}: {reason}", last_status.map(|s| format!(", last status {s}")).unwrap_or_default())]
    Stopped {
        /// Why retrying stopped.
        reason: StopReason,
        /// How many attempts were made.
        attempts: u32,
        /// The last response's status, if there was a response.
        last_status: Option<StatusCode>,
        /// The last transport error, if there was no response.
        #[source]
        last_error: Option<BoxError>,
    },
}

impl HttpRetryError {
    /// Wraps a transport's error.
    pub fn transport(error: impl Into<BoxError>) -> Self {
        Self::Transport(error.into())
    }

    /// Why retrying stopped early, if it did.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        match self {
            Self::Stopped { reason, .. } => Some(reason),
            Self::Transport(_) => None,
        }
    }
}

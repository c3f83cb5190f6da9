//! gRPC status codes: what the layer does with each code a service answers,
//! and the codes of the layer's own refusals.
//!
//! | service's code | layer |
//! |---|---|
//! | `OK` | stored (a success) and replayed |
//! | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `UNAUTHENTICATED` | stored (a terminal failure) and replayed: the same call fails the same way |
//! | `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL` | the key is released: the next retry runs the call |
//! | `CANCELLED`, `UNKNOWN`, `DATA_LOSS`, no status | whether the effect happened is unknown: the key stays reserved until its lease ends, then a retry runs the call |

use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderValue;
use tonic::{Code, Status};

/// The trailer (or, in a trailers-only answer, header) through which a
/// server tells a client when to retry, in milliseconds.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// What the layer does with a service's answer, by its status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Stored and replayed to every duplicate.
    Store,
    /// The key is released: the next retry runs the call.
    Release,
    /// Whether the effect happened is unknown: the key stays reserved until
    /// its lease ends.
    Keep,
}

/// What the layer does with an answer whose status is `code` (`None`: the
/// answer carried no `grpc-status`).
pub fn disposition(code: Option<Code>) -> Disposition {
    match code {
        Some(
            Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated,
        ) => Disposition::Store,
        Some(
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal,
        ) => Disposition::Release,
        Some(Code::Cancelled | Code::Unknown | Code::DataLoss) | None => Disposition::Keep,
    }
}

/// The status code of an answer: `grpc-status` from its trailers, or from its
/// headers when it is trailers-only.
pub(crate) fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Option<Code> {
    let value = trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))?;
    let code: i32 = value.to_str().ok()?.trim().parse().ok()?;
    Some(Code::from_i32(code))
}

/// Why the layer answered a call itself.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("this method requires an idempotency key in the `{0}` metadata entry")]
    MissingKey(String),
    #[error("the idempotency key is malformed: {0}")]
    MalformedKey(String),
    #[error("a unary call's request must be exactly one length-prefixed message")]
    NotOneMessage,
    #[error("the request message is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the request body broke off: {0}")]
    Broken(String),
    #[error("{0}")]
    KeyReuse(String),
    #[error("{message}")]
    InFlight {
        message: String,
        retry_after: Duration,
    },
    #[error("the store is unavailable: {0}")]
    StoreUnavailable(String),
    #[error("the stored answer cannot be read: {0}")]
    Corrupt(String),
    #[error(
        "the service failed while holding the key; whether the call took effect is unknown, and the key stays reserved until its lease ends"
    )]
    OutcomeUnknown,
}

impl Refusal {
    /// From a store's refusal of a claim.
    pub(crate) fn from_store(error: idem::Error) -> Self {
        match error {
            idem::Error::KeyReuse { .. } => Self::KeyReuse(error.to_string()),
            idem::Error::InFlight { retry_after, .. } => Self::InFlight {
                message: error.to_string(),
                retry_after,
            },
            other if other.is_retryable() => Self::StoreUnavailable(other.to_string()),
            other => Self::Corrupt(other.to_string()),
        }
    }

    /// The status code the refusal is sent with.
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::MissingKey(_) | Self::MalformedKey(_) | Self::NotOneMessage => {
                Code::InvalidArgument
            }
            Self::TooLarge(_) => Code::ResourceExhausted,
            Self::Broken(_) => Code::Cancelled,
            // The key and the message are each valid; what fails is the
            // key's record, which holds another message. The same call with
            // a new key, or after the record's window, succeeds: a failed
            // precondition on the system's state, not a bad argument.
            Self::KeyReuse(_) => Code::FailedPrecondition,
            Self::InFlight { .. } => Code::Aborted,
            Self::StoreUnavailable(_) => Code::Unavailable,
            Self::Corrupt(_) => Code::Internal,
            Self::OutcomeUnknown => Code::Unavailable,
        }
    }

    /// The refusal as a status, with a retry hint where there is one.
    pub(crate) fn to_status(&self) -> Status {
        let mut status = Status::new(self.code(), self.to_string());
        if let Self::InFlight { retry_after, .. } = self {
            let millis = retry_after.as_millis().max(1).to_string();
            status.metadata_mut().insert(
                RETRY_PUSHBACK,
                millis.parse().expect("digits are valid metadata"),
            );
        }
        status
    }

    /// The refusal as a trailers-only answer.
    pub(crate) fn to_response(&self) -> http::Response<tonic::body::Body> {
        let mut response: http::Response<tonic::body::Body> = self.to_status().into_http();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stored_released_or_kept_as_documented() {
        assert_eq!(disposition(Some(Code::Ok)), Disposition::Store);
        assert_eq!(
            disposition(Some(Code::FailedPrecondition)),
            Disposition::Store
        );
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Internal,
        ] {
            assert_eq!(disposition(Some(code)), Disposition::Release, "{code:?}");
        }
        assert_eq!(disposition(Some(Code::Unknown)), Disposition::Keep);
        assert_eq!(disposition(None), Disposition::Keep);
    }

    #[test]
    fn an_in_flight_refusal_carries_a_pushback() {
        let refusal = Refusal::InFlight {
            message: "busy".into(),
            retry_after: Duration::from_millis(250),
        };
        let status = refusal.to_status();
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "250");
    }
}

//! [`StoredCall`]: a unary call's answer as it is stored and replayed — its
//! response headers (initial metadata), its message frames and its trailers.
//!
//! The headers and the message go through the HTTP layer's own encoding
//! ([`idem_http::StoredResponse`]: hop-by-hop headers, `content-length` and
//! `date` are never stored); the trailers are one more metadata entry of the
//! outcome, `grpc.trailers`, a JSON list of `[name, value]` pairs. An answer
//! whose status is `OK` is stored as a success, any other stored status as a
//! terminal failure; both are replayed the same way.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use idem_core::{Outcome, OutcomeKind};
use idem_http::StoredResponse;
use tonic::Code;

use crate::body::ReplayBody;
use crate::status::status_of;

const TRAILERS: &str = "grpc.trailers";

/// The metadata entry on every replayed answer: `idempotent-replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = idem_http::IDEMPOTENT_REPLAYED;

/// A stored outcome that is not a gRPC answer (written by another front end,
/// or damaged).
#[derive(Debug, thiserror::Error)]
#[error("the stored outcome is not a gRPC answer: {0}")]
pub struct NotAnAnswer(String);

/// A complete unary answer: response headers, the message frames as sent
/// (length-prefixed), and the trailers (`grpc-status`, `grpc-message`, custom
/// trailing metadata). A trailers-only answer (an error status sent in the
/// headers) has an empty message and no trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCall {
    headers: HeaderMap,
    message: Bytes,
    trailers: Option<HeaderMap>,
}

impl StoredCall {
    /// An answer from its parts.
    pub fn new(headers: HeaderMap, message: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            headers,
            message,
            trailers,
        }
    }

    /// This answer with one more response header (initial metadata entry),
    /// stored and replayed with it.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The message frames, length-prefixed as on the wire.
    pub fn message(&self) -> &Bytes {
        &self.message
    }

    /// The trailers, if the answer had any.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_ref()
    }

    /// The answer's status code: `grpc-status` from the trailers, or from the
    /// headers of a trailers-only answer. `None` if neither has one.
    pub fn code(&self) -> Option<Code> {
        status_of(&self.headers, self.trailers.as_ref())
    }

    /// The outcome stored with the record: a success for `OK`, a terminal
    /// failure for any other status.
    pub fn to_outcome(&self) -> Outcome {
        let mut outcome =
            StoredResponse::from_parts(StatusCode::OK, self.headers.clone(), self.message.clone())
                .to_outcome();
        outcome.kind = match self.code() {
            Some(Code::Ok) => OutcomeKind::Success,
            _ => OutcomeKind::TerminalFailure,
        };
        if let Some(trailers) = &self.trailers {
            let pairs: Vec<(&str, &str)> = trailers
                .iter()
                .filter_map(|(name, value)| match value.to_str() {
                    Ok(text) => Some((name.as_str(), text)),
                    Err(_) => {
                        tracing::debug!(
                            trailer = name.as_str(),
                            "trailer value is not ASCII; not stored"
                        );
                        None
                    }
                })
                .collect();
            outcome.meta.insert(
                TRAILERS.to_owned(),
                serde_json::to_string(&pairs).expect("string pairs always serialize"),
            );
        }
        outcome
    }

    /// Reads a stored outcome back.
    pub fn from_outcome(mut outcome: Outcome) -> Result<Self, NotAnAnswer> {
        let trailers = match outcome.meta.remove(TRAILERS) {
            Some(text) => {
                let pairs: Vec<(String, String)> = serde_json::from_str(&text)
                    .map_err(|e| NotAnAnswer(format!("{TRAILERS} is not a list of pairs: {e}")))?;
                let mut trailers = HeaderMap::with_capacity(pairs.len());
                for (name, value) in pairs {
                    let name = HeaderName::try_from(name.as_str())
                        .map_err(|e| NotAnAnswer(format!("trailer name {name:?}: {e}")))?;
                    let value = HeaderValue::try_from(value.as_str())
                        .map_err(|e| NotAnAnswer(format!("value of trailer {name}: {e}")))?;
                    trailers.append(name, value);
                }
                Some(trailers)
            }
            None => None,
        };
        let response =
            StoredResponse::from_outcome(outcome).map_err(|e| NotAnAnswer(e.to_string()))?;
        Ok(Self {
            headers: response.headers().clone(),
            message: response.body().clone(),
            trailers,
        })
    }

    /// The answer as an HTTP response (status 200, as every gRPC answer).
    pub fn into_response(self) -> http::Response<tonic::body::Body> {
        let mut response = http::Response::new(tonic::body::Body::new(ReplayBody::new(
            self.message,
            self.trailers,
        )));
        *response.headers_mut() = self.headers;
        response
    }

    /// The answer sent to a duplicate: this one with `idempotent-replayed: true`.
    pub fn into_replay(self) -> http::Response<tonic::body::Body> {
        let mut response = self.into_response();
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_message_and_trailers_round_trip_through_an_outcome() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("x-request-tag", HeaderValue::from_static("a"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.append("x-charge-tag", HeaderValue::from_static("one"));
        trailers.append("x-charge-tag", HeaderValue::from_static("two"));
        let call = StoredCall::new(
            headers,
            Bytes::from_static(b"\0\0\0\0\x01z"),
            Some(trailers),
        );
        let outcome = call.to_outcome();
        assert!(!outcome.is_failure());
        let back = StoredCall::from_outcome(outcome).unwrap();
        assert_eq!(back, call);
        assert_eq!(back.code(), Some(Code::Ok));
    }

    #[test]
    fn an_error_status_is_a_terminal_failure() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("5"));
        let call = StoredCall::new(headers, Bytes::new(), None);
        assert!(call.to_outcome().is_failure());
        let back = StoredCall::from_outcome(call.to_outcome()).unwrap();
        assert_eq!(back.code(), Some(Code::NotFound));
        assert!(back.trailers().is_none());
    }
}

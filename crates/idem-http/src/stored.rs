//! [`StoredResponse`]: a response as it is stored with the record and replayed
//! to every duplicate, and its one conversion to and from an [`Outcome`].
//!
//! The outcome's body is the response body; its metadata holds the status
//! (`http.status`) and the end-to-end headers (`http.headers`, a JSON list of
//! `[name, value]` pairs, so repeated headers and their order survive). Some
//! headers are never stored: hop-by-hop headers, `Content-Length` (recomputed),
//! `Date` (the replay gets its own) and `Set-Cookie` (session secrets do not
//! belong in the dedupe table, which keeps records for days). Header values
//! that are not UTF-8 are dropped too, with a debug log.
//!
//! A stored 2xx becomes [`OutcomeKind::Success`](idem_core::OutcomeKind) (the record
//! is `completed`); anything else stored (4xx by default) becomes a terminal
//! failure (`failed`). Both are replayed the same way.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use idem_core::Outcome;
use serde::Serialize;

use crate::key_header::IDEMPOTENT_REPLAYED;

const STATUS: &str = "http.status";
const HEADERS: &str = "http.headers";

/// Response headers that are never stored or replayed.
const NOT_STORED: [HeaderName; 11] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::CONTENT_LENGTH,
    header::DATE,
    header::SET_COOKIE,
];

/// A stored outcome that is not an HTTP response (written by another front end,
/// or damaged).
#[derive(Debug, thiserror::Error)]
#[error("the stored outcome is not an HTTP response: {0}")]
pub struct NotAResponse(String);

/// A complete response: status, headers and body. What an atomic handler
/// returns, and what the layer stores for a response it keeps.
///
/// ```
/// use http::StatusCode;
/// use idem_http::StoredResponse;
///
/// let created = StoredResponse::json(StatusCode::CREATED, &serde_json::json!({"id": 7}))
///     .with_header(http::header::LOCATION, "/payments/7");
/// assert_eq!(created.status(), StatusCode::CREATED);
/// assert_eq!(created.body().as_ref(), br#"{"id":7}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl StoredResponse {
    /// A response with `status`, no headers and `body`.
    pub fn new(status: StatusCode, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers: HeaderMap::new(),
            body: body.into(),
        }
    }

    /// A JSON response (`Content-Type: application/json`).
    pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Self {
        let body = serde_json::to_vec(value).expect("a JSON value always serializes");
        Self::new(status, body).with_header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )
    }

    /// A plain-text response (`Content-Type: text/plain; charset=utf-8`).
    pub fn text(status: StatusCode, text: impl Into<String>) -> Self {
        Self::new(status, text.into()).with_header(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )
    }

    /// This response with one more header value.
    ///
    /// # Panics
    ///
    /// If `value` is not a valid header value.
    pub fn with_header<V>(mut self, name: HeaderName, value: V) -> Self
    where
        V: TryInto<HeaderValue>,
        V::Error: std::fmt::Debug,
    {
        let value = value.try_into().expect("a valid header value");
        self.headers.append(name, value);
        self
    }

    /// Builds one from parts already at hand.
    pub fn from_parts(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
        }
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The outcome stored with the record: a success for 2xx, a terminal failure
    /// otherwise.
    pub fn to_outcome(&self) -> Outcome {
        let mut outcome = if self.status.is_success() {
            Outcome::success(self.body.to_vec())
        } else {
            Outcome::terminal_failure(self.body.to_vec())
        };
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .filter(|(name, _)| !NOT_STORED.contains(name))
            .filter_map(|(name, value)| match value.to_str() {
                Ok(text) => Some((name.as_str(), text)),
                Err(_) => {
                    tracing::debug!(
                        header = name.as_str(),
                        "header value is not UTF-8; not stored"
                    );
                    None
                }
            })
            .collect();
        outcome
            .meta
            .insert(STATUS.to_owned(), self.status.as_u16().to_string());
        outcome.meta.insert(
            HEADERS.to_owned(),
            serde_json::to_string(&headers).expect("string pairs always serialize"),
        );
        outcome
    }

    /// Reads a stored outcome back.
    pub fn from_outcome(outcome: Outcome) -> Result<Self, NotAResponse> {
        let status = outcome
            .meta
            .get(STATUS)
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .ok_or_else(|| NotAResponse(format!("no valid {STATUS} entry")))?;
        let pairs: Vec<(String, String)> = match outcome.meta.get(HEADERS) {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| NotAResponse(format!("{HEADERS} is not a list of pairs: {e}")))?,
            None => Vec::new(),
        };
        let mut headers = HeaderMap::with_capacity(pairs.len());
        for (name, value) in pairs {
            let name = HeaderName::try_from(name.as_str())
                .map_err(|e| NotAResponse(format!("header name {name:?}: {e}")))?;
            let value = HeaderValue::try_from(value.as_str())
                .map_err(|e| NotAResponse(format!("value of header {name}: {e}")))?;
            headers.append(name, value);
        }
        Ok(Self {
            status,
            headers,
            body: Bytes::from(outcome.body),
        })
    }

    /// The response sent to a duplicate: this one plus `Idempotent-Replayed: true`.
    pub fn into_replay(self) -> Response {
        let mut response = self.into_response();
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response.extensions_mut().insert(Replayed);
        response
    }
}

impl IntoResponse for StoredResponse {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

/// A response extension on every replay this crate produced (a header can
/// come from anywhere, an extension only from this process): how replays are
/// counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replayed;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_headers_and_body_round_trip_through_an_outcome() {
        let original = StoredResponse::json(StatusCode::CREATED, &serde_json::json!({"id": 1}))
            .with_header(header::LOCATION, "/things/1")
            .with_header(HeaderName::from_static("x-tag"), "a")
            .with_header(HeaderName::from_static("x-tag"), "b")
            .with_header(header::SET_COOKIE, "session=secret")
            .with_header(header::CONTENT_LENGTH, "8");
        let outcome = original.to_outcome();
        assert!(!outcome.is_failure());
        assert!(!outcome.meta_json().contains("secret"));
        let back = StoredResponse::from_outcome(outcome).unwrap();
        assert_eq!(back.status(), StatusCode::CREATED);
        assert_eq!(back.body(), original.body());
        assert_eq!(back.headers()[header::LOCATION], "/things/1");
        let tags: Vec<_> = back.headers().get_all("x-tag").iter().collect();
        assert_eq!(tags, ["a", "b"]);
        assert!(back.headers().get(header::SET_COOKIE).is_none());
        assert!(back.headers().get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn client_errors_are_terminal_failures_and_foreign_outcomes_are_refused() {
        let declined = StoredResponse::text(StatusCode::PAYMENT_REQUIRED, "declined");
        assert!(declined.to_outcome().is_failure());
        assert!(StoredResponse::from_outcome(Outcome::success("raw")).is_err());
    }

    #[test]
    fn replays_say_so() {
        let replay = StoredResponse::text(StatusCode::OK, "ok").into_replay();
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
    }
}

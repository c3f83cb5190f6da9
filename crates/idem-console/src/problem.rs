//! Errors of the JSON API as RFC 9457 problem documents
//! (`application/problem+json`), and the one place where a store's or a
//! redrive's error becomes an HTTP status.
//!
//! Handlers answer [`Problem`] for what they refuse; [`problems_only`] turns
//! every other error the router makes by itself (an unknown path, a wrong
//! method, a query that does not parse) into a problem too, so a client
//! reads one error shape whatever went wrong.

use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error of the API, as RFC 9457 describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem; `about:blank` when the status says it all.
    #[serde(rename = "type")]
    pub kind: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What was wrong, and what to do about it.
    pub detail: String,
}

impl Problem {
    /// A problem with `status` and `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            kind: "about:blank".to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
        }
    }

    /// 400: the request is wrong.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 404: what it names does not exist.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    /// 409: the thing changed since it was shown, or is not in a state for this.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, detail)
    }

    /// 403: the caller may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, detail)
    }

    /// The status as a [`StatusCode`].
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl From<idem::Error> for Problem {
    /// A store's error: a store that may answer on a retry (unavailable,
    /// busy) is 503, anything else 500, each with the store's own words.
    fn from(error: idem::Error) -> Self {
        let status = match &error {
            idem::Error::Store(store) if store.kind().is_transient() => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        tracing::warn!(error = %idem::error_chain(&error), "the console's store failed");
        Self::new(status, idem::error_chain(&error))
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, Json(self)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idem console\""),
            );
        }
        response
    }
}

/// Middleware for the API: an error answer that is not a problem document
/// already (the router's own 404 and 405, an extractor's rejection) becomes
/// one, keeping its status and its text as the detail.
pub async fn problems_only(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let detail = match (status, text.is_empty()) {
        (StatusCode::NOT_FOUND, true) => {
            "no such API path; the OpenAPI document at /api/v1/openapi.json lists them".to_owned()
        }
        (StatusCode::METHOD_NOT_ALLOWED, true) => {
            "this path does not take that method; the OpenAPI document at /api/v1/openapi.json lists the methods".to_owned()
        }
        (_, true) => status.canonical_reason().unwrap_or("error").to_owned(),
        (_, false) => text,
    };
    let mut answer = Problem::new(status, detail).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}

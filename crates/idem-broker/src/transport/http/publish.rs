//! HTTP webhook publisher: `POST` the payload with `Idempotency-Key: "key"`,
//! `Ok` on a 2xx, every other answer classified by idem-retry's [`HttpPolicy`].
//!
//! The receiver is expected to dedupe on the key (an `idem-http` layer, or
//! `idem serve` in front of it), so a webhook that the relay sends again after a
//! crash is answered from the stored response instead of being applied twice.
//! 408, 429 and 5xx (and a 409 with `Retry-After`, an idempotent receiver's
//! "still in flight") are retried, honouring `Retry-After`; other 4xx answers are
//! rejections that go to the dead letters.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use idem_core::error_chain;
use idem_retry::{HttpPolicy, IDEMPOTENCY_KEY, Verdict, key_header_value};

use super::{HttpClient, client};
use crate::publish::destination::Destination;
use crate::publish::error::{PublishError, PublishErrorKind};
use crate::publish::message::{Message, Publish};

/// How long one webhook call may take, answer included.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Posts to one URL.
#[derive(Debug, Clone)]
pub struct HttpPublisher {
    destination: Destination,
    uri: Uri,
    client: HttpClient,
    policy: HttpPolicy,
    timeout: Duration,
}

impl HttpPublisher {
    /// A publisher for an `http://` or `https://` destination. Connections are
    /// opened per call and kept alive between calls.
    pub fn new(destination: &Destination) -> Result<Self, PublishError> {
        Self::with_tls(destination, None)
    }

    /// [`new`](Self::new), reaching an `https://` destination with `tls`
    /// (its roots, a client certificate) instead of webpki's bundled roots.
    pub fn with_tls(
        destination: &Destination,
        tls: Option<&rustls::ClientConfig>,
    ) -> Result<Self, PublishError> {
        let Destination::Http { url } = destination else {
            return Err(PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                "not an http(s):// destination",
            ));
        };
        let uri: Uri = url.parse().map_err(|e: http::uri::InvalidUri| {
            PublishError::new(
                PublishErrorKind::Config,
                destination.redacted(),
                format!("not a valid HTTP URI: {e}"),
            )
            .with_source(e)
        })?;
        Ok(Self {
            destination: destination.clone(),
            uri,
            client: client(tls),
            policy: HttpPolicy::new(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same publisher with another per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Where this publisher sends.
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    fn fail(&self, kind: PublishErrorKind, message: impl Into<String>) -> PublishError {
        PublishError::new(kind, self.destination.redacted(), message)
    }

    fn request(&self, message: &Message) -> Result<Request<Full<Bytes>>, PublishError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .body(Full::new(Bytes::from(message.payload.clone())))
            .map_err(|e| self.fail(PublishErrorKind::Config, e.to_string()))?;
        let headers = request.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        for (name, value) in &message.headers {
            let bad = |what: &str| {
                self.fail(
                    PublishErrorKind::Rejected,
                    format!("message header {name:?} is not a valid HTTP {what}"),
                )
            };
            let name = HeaderName::try_from(name.as_str()).map_err(|_| bad("header name"))?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|_| bad("header value"))?;
            headers.insert(name, value);
        }
        headers.insert(IDEMPOTENCY_KEY, key_header_value(&message.key));
        Ok(request)
    }
}

impl Publish for HttpPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let request = self.request(message)?;
        let call = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            // Read the answer so the connection can be reused; its text helps
            // explain a rejection.
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, hyper_util::client::legacy::Error>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                return Err(self.fail(
                    PublishErrorKind::Unavailable,
                    format!("no answer within {} ms", self.timeout.as_millis()),
                ));
            }
            Ok(Err(error)) => {
                let kind = match self.policy.classify_error(&error) {
                    Verdict::DontRetry if !error.is_connect() => PublishErrorKind::Config,
                    _ => PublishErrorKind::Unavailable,
                };
                // The whole chain: hyper's own text ("client error
                // (Connect)") leaves out why, e.g. a certificate that did
                // not verify.
                let why = error_chain(&error);
                return Err(self
                    .fail(kind, format!("the request failed: {why}"))
                    .with_source(error));
            }
            Ok(Ok(answer)) => answer,
        };
        if parts.status.is_success() {
            return Ok(());
        }
        let verdict = self.policy.classify_status(parts.status, &parts.headers);
        let kind = if verdict.is_retry() {
            PublishErrorKind::NotTaken
        } else {
            PublishErrorKind::Rejected
        };
        Err(self
            .fail(kind, explain(parts.status, &body))
            .with_retry_after(verdict.hint()))
    }
}

fn explain(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let shown: String = text.chars().take(200).collect();
    if shown.is_empty() {
        format!("the webhook answered {status}")
    } else {
        format!("the webhook answered {status}: {shown}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::IdempotencyKey;

    #[test]
    fn the_key_goes_as_an_rfc_8941_string_and_https_is_supported() {
        let destination: Destination = "https://hooks.example.invalid/orders".parse().unwrap();
        let publisher = HttpPublisher::new(&destination).expect("https needs no extra set-up");
        let message = Message::new(IdempotencyKey::new("a\"b").unwrap(), b"{}".to_vec())
            .with_header("x-tenant", "7");
        let request = publisher.request(&message).unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.headers()["idempotency-key"], "\"a\\\"b\"");
        assert_eq!(request.headers()["x-tenant"], "7");
        let bad =
            Message::new(IdempotencyKey::new("k").unwrap(), vec![]).with_header("bad name", "v");
        assert_eq!(
            publisher.request(&bad).unwrap_err().kind(),
            PublishErrorKind::Rejected
        );
    }

    #[test]
    fn answers_are_explained_briefly() {
        assert_eq!(
            explain(StatusCode::BAD_GATEWAY, b""),
            "the webhook answered 502 Bad Gateway"
        );
        let long = "x".repeat(500);
        assert!(explain(StatusCode::UNPROCESSABLE_ENTITY, long.as_bytes()).len() < 260);
    }
}

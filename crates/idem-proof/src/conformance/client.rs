//! Sending one request of a rule and writing down what was sent and what
//! came back, as the report shows it.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use idem_gateway::{UpstreamConnector, upstream_client};
use idem_http::{IDEMPOTENCY_RECONCILED, IDEMPOTENT_REPLAYED};
use serde::Serialize;

/// The longest part of an answer's body the report keeps.
const SHOWN_BODY: usize = 300;

/// One request and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Exchange {
    /// `METHOD path`.
    pub request: String,
    /// The key header's value as sent (lossy for bytes that are not UTF-8),
    /// or `None` when the request had no key.
    pub key: Option<String>,
    /// Which principal sent the request, when the rule set one (the
    /// header's name and a label; never the credential itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Other headers the rule added (the fail trigger).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
    /// The request body.
    pub body: String,
    /// The answer's status; `None` when no answer came.
    pub status: Option<u16>,
    /// Whether the answer said it was a replay (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// Whether the answer said the server asked its upstream what an earlier
    /// attempt did before answering (`Idempotency-Reconciled: true`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reconciled: bool,
    /// The answer's `Retry-After`, as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    /// The answer's body, cut to its first 300 bytes.
    pub answer: String,
    /// Why no answer came.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The whole answer body, for comparisons.
    #[serde(skip)]
    pub(crate) answer_bytes: Bytes,
}

impl Exchange {
    /// Whether the answer was 2xx.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// Whether `other` has the same status and the same body, byte for byte.
    pub(crate) fn same_answer(&self, other: &Exchange) -> bool {
        self.status.is_some()
            && self.status == other.status
            && self.answer_bytes == other.answer_bytes
    }

    /// `status` or `no answer`, for the report's summaries.
    pub(crate) fn status_text(&self) -> String {
        match self.status {
            Some(status) if self.replayed && self.reconciled => {
                format!("{status} (replayed, reconciled)")
            }
            Some(status) if self.replayed => format!("{status} (replayed)"),
            Some(status) => status.to_string(),
            None => "no answer".to_owned(),
        }
    }
}

/// What the key header carries in one request.
#[derive(Debug, Clone)]
pub(crate) enum KeyValue {
    /// No key header.
    None,
    /// A key, written as the mode writes keys.
    Key(String),
    /// Raw bytes, for malformed keys.
    Raw(Vec<u8>),
}

/// One request a rule sends.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) uri: Uri,
    pub(crate) key: KeyValue,
    pub(crate) body: String,
    pub(crate) principal: Option<(HeaderName, HeaderValue)>,
    pub(crate) extra: Vec<(HeaderName, HeaderValue)>,
}

/// The client every request of a run goes through, with the headers every
/// request carries.
#[derive(Clone)]
pub(crate) struct Sender {
    client: Client<UpstreamConnector, Body>,
    method: Method,
    content_type: HeaderValue,
    key_header: HeaderName,
    quote_keys: bool,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
}

impl Sender {
    pub(crate) fn new(
        method: Method,
        content_type: HeaderValue,
        key_header: HeaderName,
        quote_keys: bool,
        headers: Vec<(HeaderName, HeaderValue)>,
        timeout: Duration,
    ) -> Self {
        Self {
            client: upstream_client(timeout),
            method,
            content_type,
            key_header,
            quote_keys,
            headers,
            timeout,
        }
    }

    /// Sends `outgoing` and waits for its whole answer.
    pub(crate) async fn send(&self, outgoing: Outgoing) -> Exchange {
        let key_bytes = match &outgoing.key {
            KeyValue::None => None,
            KeyValue::Key(key) if self.quote_keys => Some(format!("\"{key}\"").into_bytes()),
            KeyValue::Key(key) => Some(key.clone().into_bytes()),
            KeyValue::Raw(bytes) => Some(bytes.clone()),
        };
        let mut exchange = Exchange {
            request: format!("{} {}", self.method, path_of(&outgoing.uri)),
            key: key_bytes
                .as_ref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned()),
            // A principal is a credential: its value is never shown.
            principal: outgoing
                .principal
                .as_ref()
                .map(|(name, _)| name.to_string()),
            extra: outgoing
                .extra
                .iter()
                .map(|(name, value)| {
                    format!("{name}: {}", String::from_utf8_lossy(value.as_bytes()))
                })
                .collect(),
            body: outgoing.body.clone(),
            status: None,
            replayed: false,
            reconciled: false,
            retry_after: None,
            answer: String::new(),
            error: None,
            answer_bytes: Bytes::new(),
        };
        let mut request = Request::new(Body::from(outgoing.body));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = outgoing.uri;
        let headers = request.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, self.content_type.clone());
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        for (name, value) in outgoing.principal.into_iter().chain(outgoing.extra) {
            headers.insert(name, value);
        }
        if let Some(bytes) = key_bytes {
            match HeaderValue::from_bytes(&bytes) {
                Ok(value) => {
                    headers.insert(self.key_header.clone(), value);
                }
                Err(_) => {
                    exchange.error = Some("the key cannot be written in a header".to_owned());
                    return exchange;
                }
            }
        }
        let answered = tokio::time::timeout(self.timeout, async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body))
        })
        .await;
        match answered {
            Ok(Ok((parts, body))) => {
                exchange.status = Some(parts.status.as_u16());
                exchange.replayed = parts
                    .headers
                    .get(IDEMPOTENT_REPLAYED)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                exchange.reconciled = parts
                    .headers
                    .get(IDEMPOTENCY_RECONCILED)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                exchange.retry_after = parts
                    .headers
                    .get(http::header::RETRY_AFTER)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                let shown = &body[..body.len().min(SHOWN_BODY)];
                exchange.answer = String::from_utf8_lossy(shown).into_owned();
                exchange.answer_bytes = body;
            }
            Ok(Err(error)) => exchange.error = Some(idem::error_chain(error.as_ref())),
            Err(_) => {
                exchange.error = Some(format!("no answer within {:?}", self.timeout));
            }
        }
        exchange
    }

    /// A GET of `uri`, its status and body.
    pub(crate) async fn get(&self, uri: &Uri) -> Result<(u16, Bytes), String> {
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = uri.clone();
        let answered = tokio::time::timeout(self.timeout, async {
            let response = self.client.request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        })
        .await;
        match answered {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(idem::error_chain(error.as_ref())),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

fn path_of(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

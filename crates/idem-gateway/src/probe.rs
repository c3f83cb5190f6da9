//! The gateway's [`Reconcile`]: `--probe 'GET /payments/by-key/{key}'` asks
//! the upstream, before a retry takes over a claim whose earlier attempt
//! ended unknown, whether that attempt was applied.
//!
//! The probe's contract, for upstream authors:
//!
//! | probe answer                 | meaning          | the gateway                                        |
//! |------------------------------|------------------|----------------------------------------------------|
//! | 2xx                          | applied          | stores the answer and replays it (`Idempotent-Replayed: true`, `Idempotency-Reconciled: true`) |
//! | 404                          | not applied      | forwards the retry                                 |
//! | anything else, timeout, unreachable | unknown   | 503 + `Retry-After` (the lease); the key stays reserved and the next takeover probes again |
//!
//! An applied answer is stored with the probe's body and headers, and the
//! status in its `Idempotency-Original-Status` header (when that is a valid
//! status), else the probe's own status. The probe request carries the key
//! in `Idempotency-Key` (an RFC 8941 String, `"key"`, as clients send it;
//! and percent-encoded in the path), and the caller's principal header
//! (`Authorization` by default), so the upstream can look the key up the
//! way it stored it; the upstream URL's credentials as `Authorization:
//! Basic` when there is no `Authorization`, and the gateway's `Via` entry,
//! as on a forwarded request.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use futures::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use idem::{IdempotencyKey, Scope, error_chain};

use super::config::Upstream;
use super::hop;
use idem_http::IDEMPOTENCY_KEY;
use idem_http::{Reconcile, Reconciled, StoredResponse};

/// The header in which a probe's 2xx answer may give the status the
/// original request was answered with (`Idempotency-Original-Status: 201`).
pub const IDEMPOTENCY_ORIGINAL_STATUS: HeaderName =
    HeaderName::from_static("idempotency-original-status");

/// Where `{key}` goes in a probe's path.
const KEY_SLOT: &str = "{key}";

/// A probe: `GET` and a path on the upstream with `{key}` where the
/// (percent-encoded) key goes.
///
/// ```
/// use idem_gateway::Probe;
///
/// let probe: Probe = "GET /payments/by-key/{key}".parse()?;
/// assert_eq!(probe.to_string(), "GET /payments/by-key/{key}");
/// assert!("GET /payments".parse::<Probe>().unwrap_err().to_string().contains("{key}"));
/// # Ok::<(), idem_gateway::ProbeError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    path: String,
}

/// A probe template that cannot be used; the message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a probe ({reason}); write GET and a path with {{key}} where the key goes, such as 'GET /payments/by-key/{{key}}'"
)]
pub struct ProbeError {
    text: String,
    reason: String,
}

impl FromStr for Probe {
    type Err = ProbeError;

    fn from_str(text: &str) -> Result<Self, ProbeError> {
        let refuse = |reason: &str| ProbeError {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        let words: Vec<&str> = text.split_whitespace().collect();
        let [method, path] = words.as_slice() else {
            return Err(refuse("expected a method and a path, separated by a space"));
        };
        if !method.eq_ignore_ascii_case("GET") {
            return Err(refuse(
                "the method must be GET: a probe reads, it never changes anything",
            ));
        }
        if !path.starts_with('/') {
            return Err(refuse("the path must start with /"));
        }
        if !path.contains(KEY_SLOT) {
            return Err(refuse("the path has no {key}"));
        }
        let rest = path.replace(KEY_SLOT, "");
        if rest.contains(['{', '}']) {
            return Err(refuse("the only placeholder is {key}"));
        }
        if rest.contains('#') {
            return Err(refuse("the path cannot have a fragment (#)"));
        }
        PathAndQuery::from_str(&path.replace(KEY_SLOT, "k"))
            .map_err(|e| refuse(&format!("the path is not a valid request target: {e}")))?;
        Ok(Self {
            path: (*path).to_owned(),
        })
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GET {}", self.path)
    }
}

impl Probe {
    /// The target for `key`: the path with the key percent-encoded in place
    /// of `{key}`.
    pub fn target_for(&self, key: &IdempotencyKey) -> String {
        let mut encoded = String::with_capacity(key.as_str().len());
        for byte in key.as_str().bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                encoded.push(char::from(byte));
            } else {
                encoded.push_str(&format!("%{byte:02X}"));
            }
        }
        self.path.replace(KEY_SLOT, &encoded)
    }
}

/// The probe sent to the upstream, as the layer's [`Reconcile`] hook.
pub(crate) struct UpstreamProbe {
    pub(crate) probe: Probe,
    pub(crate) client: Client<super::UpstreamConnector, Body>,
    pub(crate) upstream: Upstream,
    pub(crate) timeout: Duration,
    pub(crate) principal_header: Option<HeaderName>,
    /// This gateway's name in `Via`.
    pub(crate) instance: super::loops::Instance,
}

/// The probe as the layer's [`Reconcile`] hook: shared by every request.
#[derive(Clone)]
pub(crate) struct Asked(pub(crate) Arc<UpstreamProbe>);

impl Reconcile for Asked {
    fn reconcile<'a>(
        &'a self,
        _scope: &'a Scope,
        key: &'a IdempotencyKey,
        request: &'a http::request::Parts,
    ) -> BoxFuture<'a, Reconciled> {
        Box::pin(self.0.ask(key, request))
    }
}

impl UpstreamProbe {
    async fn ask(&self, key: &IdempotencyKey, original: &http::request::Parts) -> Reconciled {
        let target = self.probe.target_for(key);
        let request = match self.request(key, original, &target) {
            Ok(request) => request,
            Err(error) => {
                return Reconciled::Unknown(format!("the probe could not be made: {error}"));
            }
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                return Reconciled::Unknown(format!(
                    "the probe failed: {}",
                    super::proxy::explained(&error)
                ));
            }
            Err(_) => {
                return Reconciled::Unknown(format!(
                    "the probe did not answer within {}",
                    humantime::format_duration(self.timeout)
                ));
            }
        };
        let status = answer.status();
        if status == StatusCode::NOT_FOUND {
            return Reconciled::NotApplied;
        }
        if !status.is_success() {
            return Reconciled::Unknown(format!("the probe answered {status}"));
        }
        let (mut parts, body) = answer.into_parts();
        let body = match tokio::time::timeout_at(deadline, body.collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) => {
                return Reconciled::Unknown(format!(
                    "the probe's answer broke off: {}",
                    error_chain(&error)
                ));
            }
            Err(_) => {
                return Reconciled::Unknown("the probe's answer did not finish in time".to_owned());
            }
        };
        hop::strip(&mut parts.headers);
        let original_status = parts
            .headers
            .remove(IDEMPOTENCY_ORIGINAL_STATUS)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u16>().ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .filter(|code| (200..600).contains(&code.as_u16()));
        Reconciled::Applied(StoredResponse::from_parts(
            original_status.unwrap_or(status),
            parts.headers,
            body,
        ))
    }

    fn request(
        &self,
        key: &IdempotencyKey,
        original: &http::request::Parts,
        target: &str,
    ) -> Result<Request<Body>, http::Error> {
        let target = PathAndQuery::from_str(target)?;
        let uri = self.upstream.uri_for(Some(&target))?;
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(IDEMPOTENCY_KEY, HeaderValue::from_str(&quoted(key))?);
        if let Some(name) = &self.principal_header {
            for value in original.headers.get_all(name) {
                request = request.header(name, value);
            }
        }
        let mut request = request.body(Body::empty())?;
        let headers = request.headers_mut();
        if let Some(basic) = self.upstream.basic_auth() {
            headers
                .entry(AUTHORIZATION)
                .or_insert_with(|| basic.clone());
        }
        self.instance.stamp(original.version, headers);
        Ok(request)
    }
}

/// The key as an RFC 8941 String, the form the header takes on requests.
fn quoted(key: &IdempotencyKey) -> String {
    let escaped = key.as_str().replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_as_strings() {
        assert_eq!(
            quoted(&IdempotencyKey::new(r#"a"b\c"#).unwrap()),
            r#""a\"b\\c""#
        );
    }

    #[test]
    fn probes_read_back_and_bad_ones_say_what_to_write() {
        let probe: Probe = "get  /api/payments/by-key/{key}?full=1".parse().unwrap();
        assert_eq!(probe.to_string(), "GET /api/payments/by-key/{key}?full=1");
        assert_eq!(probe.to_string().parse::<Probe>().unwrap(), probe);
        assert_eq!(
            probe.target_for(&IdempotencyKey::new("k/1%").unwrap()),
            "/api/payments/by-key/k%2F1%25?full=1"
        );
        for (bad, says) in [
            ("", "a method and a path"),
            ("/payments/{key}", "a method and a path"),
            ("POST /payments/{key}", "must be GET"),
            ("GET payments/{key}", "start with /"),
            ("GET /payments", "no {key}"),
            ("GET /payments/{id}/{key}", "only placeholder"),
            ("GET /p/{key}#x", "fragment"),
            ("GET /p/{key} extra", "a method and a path"),
        ] {
            let error = bad.parse::<Probe>().unwrap_err().to_string();
            assert!(
                error.contains(says) && error.contains("GET /payments/by-key/{key}"),
                "{bad}: {error}"
            );
        }
    }
}

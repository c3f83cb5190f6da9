//! [`GrpcReconcile`]: asking the service whether an earlier call whose
//! outcome is unknown was applied, before a retry runs it again; and
//! [`ProbeMethod`], the ready answer that asks a lookup method of the
//! service itself over gRPC.
//!
//! # Why
//!
//! A claim taken over from an ended lease means an earlier call ended
//! without a stored answer: it answered `DEADLINE_EXCEEDED` or `UNKNOWN`
//! (or `INTERNAL`, with a hook), its answer broke off, or the process
//! holding the claim died. Whether its effect happened is unknown, and
//! running the retry may apply it twice. Many services can tell — the charge
//! is in their table, under the key they were sent — so the layer asks
//! first:
//!
//! | the hook says | the layer |
//! |---|---|
//! | applied, with the call's answer | stores the answer and replays it (`idempotent-replayed: true`, `idempotency-reconciled: true`) |
//! | not applied | runs the call |
//! | cannot tell | answers `UNAVAILABLE` with `grpc-retry-pushback-ms`, runs nothing, and ends the lease again so the next retry asks again |
//!
//! # The probe method's contract
//!
//! [`ProbeMethod`] calls a unary method of the upstream, `/pkg.Service/Lookup`
//! ([`GrpcProbe`] names it, for every protected method or per method), with
//! the retry's own metadata (its `idempotency-key` entry, its
//! `authorization`, its deadline) and the retry's own request message, so
//! the service can look the call up by the key it was sent, or by a natural
//! key in the message. The lookup method therefore takes the protected
//! method's request type and answers with its reply type:
//!
//! | the lookup answers | meaning |
//! |---|---|
//! | `OK` | applied; its reply (headers, message, trailers) is the answer stored and replayed |
//! | `NOT_FOUND` | not applied |
//! | any other code, no answer in time, unreachable | cannot tell |
//!
//! The message is sent rather than an empty one because a lookup method with
//! a request type of its own would need a second message definition per
//! method for no gain: the key is in the metadata either way.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use idem_core::{IdempotencyKey, Scope};
use tonic::Code;
use tower::{Service, ServiceExt};

use crate::StoredCall;
use crate::status::status_of;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future a [`GrpcReconcile`] hook answers with.
pub type ReconcileFuture<'a> = Pin<Box<dyn Future<Output = GrpcReconciled> + Send + 'a>>;

/// What the service says about an earlier call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcReconciled {
    /// It was applied, and this is its answer: it is stored and replayed.
    Applied(StoredCall),
    /// It was not applied: the retry runs.
    NotApplied,
    /// The service cannot tell now (it failed, timed out, was unreachable):
    /// the retry is refused with `UNAVAILABLE`, and the next one asks again.
    Unknown(String),
}

/// Asks whether the call keyed `key` in `scope` was applied. Called by the
/// layer before it runs a call whose claim took over an earlier one;
/// `request` is the retry's head (its path and metadata) and `message` its
/// request message, length-prefixed as on the wire.
///
/// ```
/// use idem::{IdempotencyKey, Scope};
/// use idem_grpc::{GrpcReconcile, GrpcReconciled, ReconcileFuture};
///
/// /// Keys whose charge this service knows it has not made.
/// struct NeverApplied;
///
/// impl GrpcReconcile for NeverApplied {
///     fn reconcile<'a>(
///         &'a self,
///         _scope: &'a Scope,
///         _key: &'a IdempotencyKey,
///         _request: &'a http::request::Parts,
///         _message: &'a bytes::Bytes,
///     ) -> ReconcileFuture<'a> {
///         Box::pin(async { GrpcReconciled::NotApplied })
///     }
/// }
/// ```
pub trait GrpcReconcile: Send + Sync + 'static {
    /// The service's word on the earlier call.
    fn reconcile<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        request: &'a http::request::Parts,
        message: &'a Bytes,
    ) -> ReconcileFuture<'a>;

    /// Whether calls to `method` (`/pkg.Service/Method`) can be asked about.
    /// For one that cannot, an unknown outcome is held until its lease ends,
    /// as without a hook. Every method by default.
    fn covers(&self, method: &str) -> bool {
        let _ = method;
        true
    }
}

/// Whether `text` is a method path, `/package.Service/Method`.
pub(crate) fn is_method_path(text: &str) -> bool {
    let parts: Vec<&str> = text.split('/').collect();
    parts.len() == 3
        && parts[0].is_empty()
        && !parts[1].is_empty()
        && !parts[2].is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_'))
}

/// Which lookup method is asked about which protected method: one for
/// every method (`/pkg.Payments/Lookup`), one per method
/// (`/pkg.Payments/Charge=/pkg.Payments/LookupCharge`), or both, a method's
/// own winning.
///
/// ```
/// use idem_grpc::GrpcProbe;
///
/// let probe: GrpcProbe = "/p.Payments/Lookup, /p.Payments/Refund=/p.Payments/LookupRefund".parse()?;
/// assert_eq!(probe.method_for("/p.Payments/Charge"), Some("/p.Payments/Lookup"));
/// assert_eq!(probe.method_for("/p.Payments/Refund"), Some("/p.Payments/LookupRefund"));
/// assert_eq!(probe.to_string(), "/p.Payments/Lookup,/p.Payments/Refund=/p.Payments/LookupRefund");
/// assert!("Lookup".parse::<GrpcProbe>().is_err());
/// # Ok::<(), idem_grpc::GrpcProbeError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcProbe {
    every: Option<String>,
    by_method: BTreeMap<String, String>,
}

/// A probe that cannot be used; the message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a gRPC probe ({reason}); write the lookup method's path, such as /payments.v1.Payments/Lookup, or METHOD=LOOKUP pairs separated by commas"
)]
pub struct GrpcProbeError {
    text: String,
    reason: String,
}

impl GrpcProbe {
    /// `lookup` asked about every protected method.
    ///
    /// # Panics
    ///
    /// If `lookup` is not a method path (`/package.Service/Method`).
    pub fn every(lookup: &str) -> Self {
        assert!(is_method_path(lookup), "a method path: {lookup:?}");
        Self {
            every: Some(lookup.to_owned()),
            by_method: BTreeMap::new(),
        }
    }

    /// This probe with `lookup` asked about `method`.
    ///
    /// # Panics
    ///
    /// If either is not a method path.
    pub fn method(mut self, method: &str, lookup: &str) -> Self {
        assert!(
            is_method_path(method) && is_method_path(lookup),
            "method paths: {method:?}, {lookup:?}"
        );
        self.by_method.insert(method.to_owned(), lookup.to_owned());
        self
    }

    /// The lookup method asked about calls to `method`, if any.
    pub fn method_for(&self, method: &str) -> Option<&str> {
        self.by_method
            .get(method)
            .or(self.every.as_ref())
            .map(String::as_str)
    }
}

impl FromStr for GrpcProbe {
    type Err = GrpcProbeError;

    fn from_str(text: &str) -> Result<Self, GrpcProbeError> {
        let refuse = |reason: String| GrpcProbeError {
            text: text.to_owned(),
            reason,
        };
        let mut probe = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (method, lookup) = match part.split_once('=') {
                Some((method, lookup)) => (Some(method.trim()), lookup.trim()),
                None => (None, part),
            };
            for path in method.into_iter().chain([lookup]) {
                if !is_method_path(path) {
                    return Err(refuse(format!("{path:?} is not a method path")));
                }
            }
            match method {
                Some(method) => {
                    probe.by_method.insert(method.to_owned(), lookup.to_owned());
                }
                None if probe.every.as_deref().is_some_and(|every| every != lookup) => {
                    return Err(refuse("two lookup methods for every method".to_owned()));
                }
                None => probe.every = Some(lookup.to_owned()),
            }
        }
        if probe.every.is_none() && probe.by_method.is_empty() {
            return Err(refuse("no method given".to_owned()));
        }
        Ok(probe)
    }
}

impl fmt::Display for GrpcProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs = self
            .by_method
            .iter()
            .map(|(method, lookup)| format!("{method}={lookup}"));
        let all: Vec<String> = self.every.iter().cloned().chain(pairs).collect();
        f.write_str(&all.join(","))
    }
}

/// How long a lookup is awaited by default.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The [`GrpcReconcile`] hook that calls the service's lookup method (see
/// the module's contract) through `S`: a tonic `Channel` to the service, or
/// any service over `http` types that reaches it.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, GrpcProbe, ProbeMethod};
///
/// let store = idem::SqliteStore::open("idem.db").await?;
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let layer = GrpcIdempotencyLayer::new(
///     store,
///     GrpcIdempotencyConfig::default().unary("/payments.v1.Payments/Charge"),
/// )
/// .with_reconcile(ProbeMethod::new(GrpcProbe::every("/payments.v1.Payments/Lookup"), channel));
/// # Ok(()) }
/// ```
pub struct ProbeMethod<S> {
    probe: GrpcProbe,
    service: Mutex<S>,
    timeout: Duration,
}

impl<S> fmt::Debug for ProbeMethod<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeMethod")
            .field("probe", &self.probe)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<S> ProbeMethod<S> {
    /// Asks `probe`'s lookup methods through `service`.
    pub fn new(probe: GrpcProbe, service: S) -> Self {
        Self {
            probe,
            service: Mutex::new(service),
            timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }

    /// Waits at most `timeout` for a lookup's whole answer (10 s by
    /// default); past it, the service cannot tell.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl<S, B> GrpcReconcile for ProbeMethod<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn reconcile<'a>(
        &'a self,
        _scope: &'a Scope,
        _key: &'a IdempotencyKey,
        request: &'a http::request::Parts,
        message: &'a Bytes,
    ) -> ReconcileFuture<'a> {
        Box::pin(async move {
            let Some(lookup) = self.probe.method_for(request.uri.path()) else {
                return GrpcReconciled::Unknown("no lookup method for this method".to_owned());
            };
            let service = self
                .service
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            match tokio::time::timeout(self.timeout, ask(service, lookup, request, message)).await {
                Ok(reconciled) => reconciled,
                Err(_) => GrpcReconciled::Unknown(format!(
                    "{lookup} did not answer within {} ms",
                    self.timeout.as_millis()
                )),
            }
        })
    }

    fn covers(&self, method: &str) -> bool {
        self.probe.method_for(method).is_some()
    }
}

/// Calls `lookup` with the retry's metadata and message, and reads its
/// answer.
async fn ask<S, B>(
    service: S,
    lookup: &str,
    original: &http::request::Parts,
    message: &Bytes,
) -> GrpcReconciled
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut uri = http::uri::Parts::default();
    uri.scheme = original.uri.scheme().cloned();
    uri.authority = original.uri.authority().cloned();
    uri.path_and_query = lookup.parse().ok();
    let uri = match http::Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(error) => {
            return GrpcReconciled::Unknown(format!("{lookup} cannot be called: {error}"));
        }
    };
    let mut request = http::Request::new(tonic::body::Body::new(http_body_util::Full::new(
        message.clone(),
    )));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.version_mut() = original.version;
    *request.headers_mut() = original.headers.clone();
    request.headers_mut().remove(http::header::CONTENT_LENGTH);
    let answer = match service.oneshot(request).await {
        Ok(answer) => answer,
        Err(error) => {
            let error: BoxError = error.into();
            return GrpcReconciled::Unknown(format!("{lookup} could not be called: {error}"));
        }
    };
    let (parts, body) = answer.into_parts();
    let collected = match body.collect().await {
        Ok(collected) => collected,
        Err(error) => {
            let error: BoxError = error.into();
            return GrpcReconciled::Unknown(format!("{lookup}'s answer broke off: {error}"));
        }
    };
    let trailers = collected.trailers().cloned();
    let code = status_of(&parts.headers, trailers.as_ref());
    match code {
        Some(Code::Ok) => GrpcReconciled::Applied(StoredCall::new(
            parts.headers,
            collected.to_bytes(),
            trailers,
        )),
        Some(Code::NotFound) => GrpcReconciled::NotApplied,
        Some(code) => {
            let said = trailers
                .as_ref()
                .and_then(tonic::Status::from_header_map)
                .or_else(|| tonic::Status::from_header_map(&parts.headers))
                .map(|status| format!(": {}", status.message()))
                .unwrap_or_default();
            GrpcReconciled::Unknown(format!("{lookup} answered {code:?}{said}"))
        }
        None => GrpcReconciled::Unknown(format!("{lookup} answered without a status")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_read_back_and_bad_ones_say_what_to_write() {
        let probe: GrpcProbe = "/a.B/Charge=/a.B/LookupCharge".parse().unwrap();
        assert_eq!(probe.method_for("/a.B/Charge"), Some("/a.B/LookupCharge"));
        assert_eq!(probe.method_for("/a.B/Refund"), None);
        assert_eq!(probe.to_string().parse::<GrpcProbe>().unwrap(), probe);
        assert_eq!(
            GrpcProbe::every("/a.B/Lookup").method("/a.B/C", "/a.B/D"),
            "/a.B/C=/a.B/D, /a.B/Lookup".parse().unwrap()
        );
        for (bad, says) in [
            ("", "no method given"),
            ("Lookup", "not a method path"),
            ("/a.B/C=Lookup", "not a method path"),
            ("/a.B/C/D", "not a method path"),
            ("/a.B/L,/a.B/M", "two lookup methods"),
        ] {
            let error = bad.parse::<GrpcProbe>().unwrap_err().to_string();
            assert!(
                error.contains(says) && error.contains("/payments.v1.Payments/Lookup"),
                "{bad}: {error}"
            );
        }
    }
}

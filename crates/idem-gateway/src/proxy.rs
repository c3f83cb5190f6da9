//! [`Proxy`]: the reverse proxy behind the gateway's idempotency layer. It
//! forwards every request to the upstream on hyper-util's pooled client and
//! tells the layer, by the [`UnknownOutcome`] marker, when a request was sent
//! but no complete answer came back.
//!
//! What it changes on the way, and nothing else:
//!
//! - hop-by-hop headers are removed in both directions ([`hop`](super::hop));
//! - the target is rewritten onto the upstream (its base path in front), the
//!   `Host` becomes the upstream's, and `X-Forwarded-For`, `X-Forwarded-Host`
//!   and `X-Forwarded-Proto` say where the request came from;
//! - `Idempotency-Key` is forwarded as it came, so the upstream can dedupe too
//!   (whatever the client's `Connection` header names);
//! - a user and password in the upstream URL become `Authorization: Basic`
//!   on a request that carries no `Authorization` of its own;
//! - a `Via` entry names this gateway instance, so a request that comes back
//!   is refused (see `loops`);
//! - `traceparent` (and `tracestate`) name the gateway's span, so the
//!   upstream's spans join the request's trace under it.
//!
//! Requests without a key, and their responses, stream through untouched. For
//! a keyed request the response body is read whole before it is handed back
//! (the layer stores it anyway), within the same deadline as the head, so a
//! body that breaks off is an unknown outcome and not a truncated replay; its
//! trailers (a gRPC answer's status) are kept.
//!
//! An `h2c://` upstream is spoken to in HTTP/2 with prior knowledge, whatever
//! version the client used, and every answer goes back in the client's
//! version, whatever the upstream's; `TE: trailers`, which gRPC servers expect, is the
//! one hop-by-hop header kept for it. A gRPC call (`content-type:
//! application/grpc…`) is answered in gRPC's terms when the upstream fails it:
//! a trailers-only answer with `UNAVAILABLE` (nothing sent) or
//! `DEADLINE_EXCEEDED`/`UNAVAILABLE` marked outcome-unknown.
//!
//! How a failure is told apart:
//!
//! | what happened                               | answer | keyed request's claim   |
//! |---------------------------------------------|--------|-------------------------|
//! | no connection could be opened (nothing sent) | 502    | released ([`NothingApplied`]): retry at once |
//! | no answer within the upstream timeout        | 504    | kept: the outcome is unknown ([`UnknownOutcome`]) |
//! | connection broke after the request was sent  | 502    | kept: the outcome is unknown |
//! | the upstream answered                        | its own | by the layer's status policy |

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::future::BoxFuture;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue, TE};
use http::{Request, Version};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use idem::error_chain;
use tower::Service;

use super::GatewayConfig;
use super::config::Upstream;
use super::hop;
use super::loops::Instance;
use idem_http::IDEMPOTENCY_KEY;
use idem_http::{IdempotencyConfig, KeyHeld, Mode, NothingApplied, Refusal, UnknownOutcome};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The address of the client a request came from; the gateway's accept loop
/// puts it in the request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// A request extension: the request came in over TLS, so the upstream is
/// told `X-Forwarded-Proto: https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverTls;

/// The connector the upstream client opens connections with: plain TCP for
/// an `http://` upstream, TLS (rustls, *ring*) for an `https://` one.
pub type UpstreamConnector = HttpsConnector<HttpConnector>;

/// A response extension on every answer that came from the upstream (as
/// opposed to one the layer or the gateway wrote), for counting outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FromUpstream;

/// The reverse proxy. Cheap to clone: clones share the connection pool.
#[derive(Clone)]
pub(crate) struct Proxy {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client<UpstreamConnector, Body>,
    upstream: Upstream,
    timeout: Duration,
    idempotency: IdempotencyConfig,
    /// Whether a probe is asked about unknown outcomes.
    probed: bool,
    /// Whether a lookup method is asked about gRPC calls' unknown outcomes.
    grpc_probed: bool,
    /// This gateway's name in `Via`.
    instance: Instance,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.shared.upstream)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    pub(crate) fn new(
        config: &GatewayConfig,
        idempotency: IdempotencyConfig,
        instance: Instance,
    ) -> Self {
        let client = upstream_client_for(
            &config.upstream,
            config.connect_timeout(),
            config.upstream_tls.as_deref().cloned(),
        );
        Self {
            shared: Arc::new(Shared {
                client,
                upstream: config.upstream.clone(),
                timeout: config.upstream_timeout,
                idempotency,
                probed: config.probe.is_some(),
                grpc_probed: config.grpc_probed,
                instance,
            }),
        }
    }
}

impl Service<Request<Body>> for Proxy {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { Ok(shared.forward(request).await) })
    }
}

impl Shared {
    async fn forward(&self, request: Request<Body>) -> Response {
        let mode = self.idempotency.vocabulary();
        // The layer sends a keyed request here only once it holds its claim.
        let keyed = self.idempotency.accepts_key(request.method())
            && request.headers().contains_key(IDEMPOTENCY_KEY);
        let grpc = is_grpc(request.headers());
        let probed = if grpc { self.grpc_probed } else { self.probed };
        let held = match (keyed, probed) {
            (false, _) => KeyHeld::NoKey,
            (true, true) => KeyHeld::UntilAsked,
            (true, false) => KeyHeld::ForLease(self.idempotency.lease_length()),
        };
        let answer_as = if grpc {
            AnswerAs::Grpc
        } else {
            AnswerAs::Http(mode)
        };
        let version = request.version();
        let outgoing = match rewrite_for(&self.upstream, request) {
            Ok(mut outgoing) => {
                self.instance.stamp(version, outgoing.headers_mut());
                outgoing
            }
            Err(error) => {
                return nothing_sent(
                    Refusal::UpstreamUnreachable {
                        cause: format!(
                            "the request could not be rewritten for the upstream: {error}"
                        ),
                    },
                    answer_as,
                );
            }
        };

        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = match tokio::time::timeout_at(deadline, self.client.request(outgoing)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) if error.is_connect() => {
                return nothing_sent(
                    Refusal::UpstreamUnreachable {
                        cause: explained(&error),
                    },
                    answer_as,
                );
            }
            Ok(Err(error)) => {
                let cause = error_chain(&error);
                return unknown(Refusal::UpstreamBroke { cause, held }, answer_as);
            }
            Err(_elapsed) => {
                let after = self.timeout;
                return unknown(Refusal::UpstreamTimeout { after, held }, answer_as);
            }
        };

        let (mut parts, body) = answer.into_parts();
        hop::strip(&mut parts.headers);
        // The answer goes out in the client's version, not the upstream's
        // (an HTTP/1.0 upstream must not turn a client's HTTP/1.1 answer
        // into HTTP/1.0, which ends its keep-alive).
        parts.version = version;
        parts.extensions.insert(FromUpstream);
        if !keyed {
            return Response::from_parts(parts, Body::new(body));
        }
        match tokio::time::timeout_at(deadline, body.collect()).await {
            // `Collected` is itself a body: the data, then the trailers.
            Ok(Ok(collected)) => Response::from_parts(parts, Body::new(collected)),
            Ok(Err(error)) => {
                let cause = error_chain(&error);
                unknown(Refusal::UpstreamBroke { cause, held }, answer_as)
            }
            Err(_elapsed) => {
                let after = self.timeout;
                unknown(Refusal::UpstreamTimeout { after, held }, answer_as)
            }
        }
    }
}

/// The request as the upstream gets it: its target on the upstream, the
/// hop-by-hop headers removed, the `X-Forwarded-*` headers set, the
/// upstream URL's credentials as `Authorization: Basic` when the request
/// has no `Authorization`, and the current span named in `traceparent`.
pub fn rewrite_for<B>(upstream: &Upstream, request: Request<B>) -> Result<Request<B>, http::Error> {
    let (parts, body) = request.into_parts();
    let uri = upstream.uri_for(parts.uri.path_and_query())?;
    let mut headers = parts.headers;
    let trailers_accepted = headers
        .get_all(TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("trailers"));
    hop::strip(&mut headers);
    let host = headers
        .remove(HOST)
        .or_else(|| parts.uri.authority().and_then(|a| a.as_str().parse().ok()));
    if let Some(ClientAddr(peer)) = parts.extensions.get::<ClientAddr>() {
        let mut forwarded_for = String::with_capacity(48);
        for earlier in headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
        {
            forwarded_for.push_str(earlier);
            forwarded_for.push_str(", ");
        }
        write!(forwarded_for, "{}", peer.ip()).expect("writing to a String does not fail");
        headers.insert(X_FORWARDED_FOR, HeaderValue::try_from(forwarded_for)?);
    }
    if let Some(host) = host {
        headers.entry(X_FORWARDED_HOST).or_insert(host);
    }
    let proto = if parts.extensions.get::<OverTls>().is_some() {
        "https"
    } else {
        "http"
    };
    headers
        .entry(X_FORWARDED_PROTO)
        .or_insert(HeaderValue::from_static(proto));
    if let Some(basic) = upstream.basic_auth() {
        // The client's own credentials, when it sent some, go through.
        headers
            .entry(AUTHORIZATION)
            .or_insert_with(|| basic.clone());
    }
    // The upstream joins the request's trace as a child of the gateway's
    // span; without OpenTelemetry here, the incoming traceparent goes on
    // unchanged.
    idem_trace::inject_current(&mut idem_trace::HttpHeadersMut(&mut headers));

    if upstream.is_http2() && trailers_accepted {
        // The one connection-specific header HTTP/2 allows; gRPC servers
        // require it.
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }

    let mut outgoing = Request::new(body);
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = uri;
    *outgoing.version_mut() = if upstream.is_http2() {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    *outgoing.headers_mut() = headers;
    Ok(outgoing)
}

/// The pooled HTTP/1 client a proxy forwards on; opening a connection
/// (with its TLS handshake for an `https://` upstream, trusting webpki's
/// bundled roots) may take at most `connect_timeout`.
pub fn upstream_client(connect_timeout: Duration) -> Client<UpstreamConnector, Body> {
    upstream_client_with_tls(connect_timeout, None)
}

/// [`upstream_client`] with the TLS configuration for `https://` upstreams
/// (see [`UpstreamTls`](super::UpstreamTls)); `None` for the defaults.
pub fn upstream_client_with_tls(
    connect_timeout: Duration,
    tls: Option<rustls::ClientConfig>,
) -> Client<UpstreamConnector, Body> {
    client_builder(false).build(connector(connect_timeout, tls))
}

/// The pooled client for `upstream`: HTTP/2 with prior knowledge for an
/// `h2c://` upstream (one connection carries every request), HTTP/1.1
/// otherwise, as [`upstream_client_with_tls`].
pub fn upstream_client_for(
    upstream: &Upstream,
    connect_timeout: Duration,
    tls: Option<rustls::ClientConfig>,
) -> Client<UpstreamConnector, Body> {
    client_builder(upstream.is_http2()).build(connector(connect_timeout, tls))
}

fn client_builder(http2: bool) -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .http2_only(http2);
    builder
}

fn connector(connect_timeout: Duration, tls: Option<rustls::ClientConfig>) -> UpstreamConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(false);
    let tls = tls.unwrap_or_else(|| {
        super::UpstreamTls::default()
            .client_config()
            .expect("the default TLS client configuration reads no file and cannot fail")
    });
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// Why a connection to the upstream could not be opened: the error's chain,
/// and what to do about the TLS refusals whose names alone do not say it.
pub(crate) fn explained(error: &(dyn std::error::Error + 'static)) -> String {
    let chain = error_chain(error);
    match tls_hint(error) {
        Some(hint) => format!("{chain}; {hint}"),
        None => chain,
    }
}

/// What a TLS refusal found in `error`'s sources means, when rustls names it
/// only by its webpki code.
fn tls_hint(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut source = Some(error);
    while let Some(error) = source {
        // An `io::Error` hides what it wraps from `source()`: look inside,
        // through as many of them as there are.
        let mut inner = error;
        while let Some(wrapped) = inner
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            inner = wrapped;
        }
        if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))) =
            inner.downcast_ref::<rustls::Error>()
            && format!("{other:?}").contains("CaUsedAsEndEntity")
        {
            return Some(CA_USED_AS_END_ENTITY);
        }
        source = error.source();
    }
    None
}

/// What `CaUsedAsEndEntity` means and how to fix it.
const CA_USED_AS_END_ENTITY: &str = "the upstream serves a CA certificate (basicConstraints CA:TRUE) as its own server certificate, and TLS refuses a CA certificate there. `openssl req -x509` makes such a certificate unless told otherwise. Either make it a server certificate (add -addext basicConstraints=critical,CA:FALSE to that command, and give the same file to --upstream-ca), or keep it as a CA: make the upstream a key and a certificate for its name signed by that CA (openssl req -new, then openssl x509 -req -CA ca.pem -CAkey ca.key with the subjectAltName), serve those, and give the CA to --upstream-ca";

/// An answer for a request that was never sent: the refusal's response,
/// marked so the layer releases the key whatever the status.
fn nothing_sent(refusal: Refusal, answer_as: AnswerAs) -> Response {
    let mut response = answer_as.refusal(refusal);
    response.extensions_mut().insert(NothingApplied);
    response
}

/// An outcome-unknown answer: the refusal's response (logged as a warning by
/// [`Refusal::to_response`]), marked so the layer keeps the claim until its
/// lease ends.
fn unknown(refusal: Refusal, answer_as: AnswerAs) -> Response {
    let mut response = answer_as.refusal(refusal);
    response.extensions_mut().insert(UnknownOutcome);
    response
}

/// Whether a request is a gRPC call: `content-type: application/grpc`, bare
/// or with a suffix (`+proto`, `+json`); gRPC-Web, which carries its status
/// in the body over HTTP/1.1, is not.
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// How the proxy's own refusals are written: as the layer's HTTP problems,
/// or as gRPC statuses for a gRPC call.
#[derive(Debug, Clone, Copy)]
enum AnswerAs {
    Http(Mode),
    Grpc,
}

impl AnswerAs {
    fn refusal(self, refusal: Refusal) -> Response {
        match self {
            Self::Http(mode) => refusal.to_response(mode),
            Self::Grpc => {
                // What a gRPC client would have seen had it called directly:
                // nothing sent is `UNAVAILABLE` (retry at once); no answer in
                // time is `DEADLINE_EXCEEDED`; a connection that broke is
                // `UNAVAILABLE`.
                let code = match refusal {
                    Refusal::UpstreamTimeout { .. } => GRPC_DEADLINE_EXCEEDED,
                    _ => GRPC_UNAVAILABLE,
                };
                tracing::warn!(error = %refusal, code, "the gateway answered a gRPC call itself");
                grpc_status(code, &refusal.to_string())
            }
        }
    }
}

/// gRPC's `DEADLINE_EXCEEDED` code.
const GRPC_DEADLINE_EXCEEDED: u16 = 4;
/// gRPC's `INTERNAL` code.
pub(crate) const GRPC_INTERNAL: u16 = 13;
/// gRPC's `UNAVAILABLE` code.
pub(crate) const GRPC_UNAVAILABLE: u16 = 14;

/// A trailers-only gRPC answer: HTTP 200 with `grpc-status` and
/// `grpc-message` (percent-encoded, as the protocol says) in the head.
pub(crate) fn grpc_status(code: u16, message: &str) -> Response {
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(message) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
    response
}

/// gRPC's percent-encoding of `grpc-message`: every byte outside printable
/// ASCII, and `%` itself, as `%XX`.
fn percent_encode(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (b' '..=b'~').contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let with = |value: &'static str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            headers
        };
        assert!(is_grpc(&with("application/grpc")));
        assert!(is_grpc(&with("application/grpc+proto")));
        assert!(!is_grpc(&with("application/grpc-web")));
        assert!(!is_grpc(&with("application/json")));
        assert!(!is_grpc(&http::HeaderMap::new()));
    }

    #[test]
    fn grpc_refusals_are_trailers_only_with_an_encoded_message() {
        let response = AnswerAs::Grpc.refusal(Refusal::UpstreamTimeout {
            after: Duration::from_secs(3),
            held: KeyHeld::NoKey,
        });
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "4");
        assert_eq!(percent_encode("50% – ok"), "50%25 %E2%80%93 ok");
    }
}

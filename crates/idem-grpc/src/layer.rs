//! [`GrpcIdempotencyLayer`] and the [`GrpcIdempotencyService`] it wraps around
//! a tonic server's routes (or any service over `http` types that speaks gRPC).
//!
//! A protected call runs the leased protocol, as the HTTP layer does:
//!
//! 1. read the key from the metadata (none: pass through, or
//!    `INVALID_ARGUMENT` where one is required), read the one request message
//!    under the limit, and fingerprint the method path with the message bytes;
//! 2. **claim** the key: a settled record is replayed with
//!    `idempotent-replayed: true`; another message under the same key is
//!    refused with `FAILED_PRECONDITION`; a live claim with `ABORTED` and a
//!    `grpc-retry-pushback-ms` hint;
//! 3. call the service in a task of its own (a client that hangs up does not
//!    strand the claim), renewing the claim every third of the lease;
//! 4. read the whole answer (headers, message, trailers) and **complete** the
//!    record with it, **release** the key, or keep it reserved until its
//!    lease ends, by the answer's status code ([`disposition`](crate::disposition));
//!    an answer marked [`UnknownOutcome`](idem_http::UnknownOutcome) (a proxy
//!    that sent the call and got no answer) keeps it reserved whatever its code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use idem::{Claim, Claimed, Fingerprint, IdempotencyKey, LeaseStore, Scope};
use idem_retry::Backoff;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::GrpcIdempotencyConfig;
use crate::body::{Unread, read_one_message};
use crate::status::{Disposition, Refusal, disposition, status_of};
use crate::stored::StoredCall;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response type of the layered service.
pub type GrpcResponse = http::Response<tonic::body::Body>;

/// The future of a [`GrpcIdempotencyService`] call.
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<GrpcResponse, E>> + Send>>;

struct Shared<St> {
    store: Arc<St>,
    config: GrpcIdempotencyConfig,
}

/// A tower layer that gives a gRPC server's unary methods idempotency keys.
///
/// Put it on a tonic server with `Server::builder().layer(...)`; it sees every
/// call and protects those whose method path the config names.
pub struct GrpcIdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for GrpcIdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> std::fmt::Debug for GrpcIdempotencyLayer<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyLayer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<St: LeaseStore> GrpcIdempotencyLayer<St> {
    /// A layer over `store` with `config`. The store's own lease applies;
    /// open it with the config's lease (the layer renews claims every third
    /// of it).
    pub fn new(store: St, config: GrpcIdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                store: Arc::new(store),
                config,
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.shared.store
    }
}

impl<S, St> Layer<S> for GrpcIdempotencyLayer<St> {
    type Service = GrpcIdempotencyService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotencyService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The middleware made by [`GrpcIdempotencyLayer`]. Runs on Tokio.
pub struct GrpcIdempotencyService<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for GrpcIdempotencyService<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for GrpcIdempotencyService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcIdempotencyService<S, St>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: LeaseStore + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = GrpcResponse;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the service that was polled ready is the one used.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(Arc::clone(&self.shared), inner, request))
    }
}

async fn serve<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    request: http::Request<ReqBody>,
) -> Result<GrpcResponse, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: LeaseStore + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let config = &shared.config;
    let path = request.uri().path().to_owned();
    if !config.protects(&path) {
        // Streaming calls and unlisted methods: untouched.
        return pass_through(inner, request).await;
    }
    let key = match read_key(request.headers(), &config.key_metadata) {
        Ok(Some(key)) => key,
        Ok(None) if config.require_key => {
            return Ok(Refusal::MissingKey(config.key_metadata.to_string()).to_response());
        }
        Ok(None) => return pass_through(inner, request).await,
        Err(refusal) => return Ok(refusal.to_response()),
    };
    let (parts, body) = request.into_parts();
    let message = match read_one_message(body, config.message_limit).await {
        Ok(message) => message,
        Err(Unread::TooLarge(limit)) => return Ok(Refusal::TooLarge(limit).to_response()),
        Err(Unread::NotOneMessage) => return Ok(Refusal::NotOneMessage.to_response()),
        Err(Unread::Broken(error)) => return Ok(Refusal::Broken(error.to_string()).to_response()),
    };
    let scope = config.scope(&parts.headers, &path);
    let fingerprint = Fingerprint::of_parts([b"grpc".as_slice(), path.as_bytes(), &message]);
    let span = tracing::info_span!(
        "idempotency",
        scope = scope.as_str(),
        idempotency_key = key.as_str(),
        method = path.as_str(),
    );
    // A retry of the call continues the trace its client sent.
    idem_trace::continue_trace(&span, &idem_trace::HttpHeaders(&parts.headers));
    keyed(shared, inner, parts, message, scope, key, fingerprint)
        .instrument(span)
        .await
}

/// The key from the configured metadata entry: `None` if absent; refused if
/// repeated or not a valid key.
fn read_key(
    headers: &http::HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<IdempotencyKey>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Refusal::MalformedKey(format!(
            "the `{name}` metadata entry appears more than once"
        )));
    }
    let text = value
        .to_str()
        .map_err(|_| Refusal::MalformedKey("it is not visible ASCII".to_owned()))?;
    IdempotencyKey::new(text.trim())
        .map(Some)
        .map_err(|e| Refusal::MalformedKey(e.to_string()))
}

/// A keyed call, read: claim its key, then replay the stored answer or run
/// the service.
async fn keyed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: http::request::Parts,
    message: Bytes,
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
) -> Result<GrpcResponse, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: LeaseStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let claim = match shared.store.claim(&scope, &key, fingerprint).await {
        Ok(Claimed::Fresh(claim)) => claim,
        Ok(Claimed::Replayed(replay)) => {
            tracing::debug!("replaying the stored answer");
            return Ok(match StoredCall::from_outcome(replay.outcome) {
                Ok(stored) => stored.into_replay(),
                Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(),
            });
        }
        Err(refused) => return Ok(Refusal::from_store(refused).to_response()),
    };
    let request = http::Request::from_parts(
        parts,
        tonic::body::Body::new(http_body_util::Full::new(message)),
    );
    let settle =
        tokio::spawn(run_claimed(Arc::clone(&shared), inner, request, claim).in_current_span());
    match settle.await {
        Ok(answer) => answer,
        Err(failed) => {
            tracing::error!(error = %failed, "the service failed while holding a claim; the key stays reserved until its lease ends");
            Ok(Refusal::OutcomeUnknown.to_response())
        }
    }
}

/// Renews the claim every third of the lease while the service works.
async fn renew_while_running<St: LeaseStore>(store: Arc<St>, lease: Duration, mut claim: Claim) {
    let every = (lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        match store.renew(&claim).await {
            Ok(renewed) => claim = renewed,
            Err(error) => {
                tracing::warn!(%error, "could not renew the claim; a retry may take it over when its lease ends");
                return;
            }
        }
    }
}

async fn run_claimed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    request: http::Request<tonic::body::Body>,
    claim: Claim,
) -> Result<GrpcResponse, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    St: LeaseStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let heartbeat = tokio::spawn(renew_while_running(
        Arc::clone(&shared.store),
        shared.config.lease,
        claim.clone(),
    ));
    let called = inner.call(request).await;
    let response = match called {
        Ok(response) => response,
        Err(error) => {
            heartbeat.abort();
            tracing::warn!(
                "the service failed without an answer; the key stays reserved until its lease ends"
            );
            return Err(error);
        }
    };
    // The status is in the trailers: the whole answer is read first (a unary
    // answer is one message), with the claim still renewed.
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(Into::<BoxError>::into);
    heartbeat.abort();
    let collected = match collected {
        Ok(collected) => collected,
        Err(error) => {
            tracing::warn!(%error, "the answer broke off; the key stays reserved until its lease ends");
            return Ok(Refusal::OutcomeUnknown.to_response());
        }
    };
    let trailers = collected.trailers().cloned();
    let message = collected.to_bytes();
    let code = status_of(&parts.headers, trailers.as_ref());
    let answer = StoredCall::new(parts.headers.clone(), message, trailers);
    // A forwarding service (the gateway's) marks an answer it wrote because
    // the call was sent and no answer came: whatever its code, whether the
    // effect happened is unknown.
    let unknown = parts
        .extensions
        .get::<idem_http::UnknownOutcome>()
        .is_some();
    let disposition = if unknown {
        Disposition::Keep
    } else {
        disposition(code)
    };
    match disposition {
        Disposition::Store => store_answer(&shared, claim, answer.to_outcome()).await,
        Disposition::Release => {
            if let Err(error) = shared.store.release(&claim).await {
                tracing::warn!(%error, "could not release the key; it is freed when its lease ends");
            }
        }
        Disposition::Keep => {
            tracing::info!(
                ?code,
                "the answer does not tell whether the call took effect; the key stays reserved until its lease ends"
            );
        }
    }
    let mut response = answer.into_response();
    *response.headers_mut() = parts.headers;
    *response.extensions_mut() = parts.extensions;
    Ok(response)
}

/// Stores the answer; if the store does not take it now, the completion is
/// retried in the background (the client gets the answer at once, and copies
/// meanwhile are told the call is in flight) until stored or taken over.
async fn store_answer<St: LeaseStore + 'static>(
    shared: &Arc<Shared<St>>,
    claim: Claim,
    outcome: idem::Outcome,
) {
    let error = match shared.store.complete(&claim, &outcome).await {
        Ok(()) => return,
        Err(idem::Error::Fenced { current, .. }) if current == Some(claim.token) => return,
        Err(error @ idem::Error::Fenced { .. }) => {
            tracing::warn!(%error, "could not store the answer: its claim was taken over after its lease ran out");
            return;
        }
        Err(error) => error,
    };
    tracing::warn!(%error, "the store did not take the answer yet; the client gets it, and its completion is retried until stored");
    let store = Arc::clone(&shared.store);
    let lease = shared.config.lease;
    tokio::spawn(
        async move {
            let mut claim = claim;
            let mut delays =
                Backoff::new(Duration::from_millis(50), Duration::from_secs(2), u32::MAX).delays();
            let mut renewed = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(2))).await;
                if renewed.elapsed() >= lease / 3 {
                    if let Ok(longer) = store.renew(&claim).await {
                        claim = longer;
                    }
                    renewed = tokio::time::Instant::now();
                }
                match store.complete(&claim, &outcome).await {
                    Ok(()) => return,
                    Err(idem::Error::Fenced { current, .. }) if current == Some(claim.token) => {
                        return;
                    }
                    Err(error @ idem::Error::Fenced { .. }) => {
                        tracing::warn!(%error, "could not store the answer: its claim was taken over after its lease ran out");
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        .in_current_span(),
    );
}

async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    request: http::Request<ReqBody>,
) -> Result<GrpcResponse, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.call(request.map(tonic::body::Body::new)).await?;
    Ok(response.map(tonic::body::Body::new))
}

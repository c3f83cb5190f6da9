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
//!    `grpc-retry-pushback-ms` hint (the time the key really stays reserved,
//!    when an earlier call's outcome is unknown);
//! 3. a claim that took over an earlier one asks the [`GrpcReconcile`] hook
//!    first, when there is one: an applied call's answer is stored and
//!    replayed with `idempotency-reconciled: true`, a call not applied runs,
//!    and "cannot tell" is `UNAVAILABLE` with a pushback;
//! 4. call the service in a task of its own (a client that hangs up does not
//!    strand the claim), renewing the claim every third of the lease;
//! 5. read the whole answer (headers, message, trailers) and, by the verdict
//!    of its status code ([`GrpcStatusPolicy`](crate::GrpcStatusPolicy)),
//!    **complete** the record with it, **release** the key, or keep the
//!    claim (unknown): with a hook its lease is ended so the next retry asks
//!    at once, without one the key stays reserved for a lease. An answer
//!    marked [`UnknownOutcome`](idem_http::UnknownOutcome) (a proxy that sent
//!    the call and got no answer) is unknown whatever its code.
//!
//! An answer is never handed out without being kept: when the store refuses
//! the completion, the client gets the answer at once, it is appended to the
//! [`Spool`] (synced) when the layer has one, and the completion is retried
//! in the background until stored.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::BodyExt;
use idem_core::{Claim, Claimed, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope};
use idem_http::{IDEMPOTENCY_RECONCILED, Spool, SpoolError, Verdict};
use idem_retry::Backoff;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::GrpcIdempotencyConfig;
use crate::body::{Unread, read_one_message};
use crate::held::Held;
use crate::observe;
use crate::reconcile::{GrpcReconcile, GrpcReconciled};
use crate::status::{Refusal, status_of};
use crate::stored::StoredCall;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response type of the layered service.
pub type GrpcResponse = http::Response<tonic::body::Body>;

/// The future of a [`GrpcIdempotencyService`] call.
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<GrpcResponse, E>> + Send>>;

/// How soon a retry may ask the reconcile hook again after it could not tell.
const RECONCILE_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// The first delay between completion attempts of a kept answer, and the
/// longest one.
const FIRST_DELAY: Duration = Duration::from_millis(50);
const LONGEST_DELAY: Duration = Duration::from_secs(2);

struct Shared<St> {
    store: Arc<St>,
    config: GrpcIdempotencyConfig,
    /// Asked before a takeover runs the call again.
    reconcile: Option<Arc<dyn GrpcReconcile>>,
    /// Where answers the store has not taken yet are kept.
    spool: Option<Spool>,
    /// Keys held after an unknown outcome, for an exact pushback.
    held: Arc<Held>,
}

impl<St> Shared<St> {
    /// The hook, if it can be asked about calls to `method`.
    fn reconcile_for(&self, method: &str) -> Option<&Arc<dyn GrpcReconcile>> {
        self.reconcile.as_ref().filter(|hook| hook.covers(method))
    }
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
            .field("reconciles", &self.shared.reconcile.is_some())
            .field("spool", &self.shared.spool)
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
                reconcile: None,
                spool: None,
                held: Arc::default(),
            }),
        }
    }

    /// The same layer (the same store, config and held keys) with `change`
    /// made to its hook or spool.
    fn changed(
        self,
        change: impl FnOnce(&mut Option<Arc<dyn GrpcReconcile>>, &mut Option<Spool>),
    ) -> Self {
        let mut reconcile = self.shared.reconcile.clone();
        let mut spool = self.shared.spool.clone();
        change(&mut reconcile, &mut spool);
        Self {
            shared: Arc::new(Shared {
                store: Arc::clone(&self.shared.store),
                config: self.shared.config.clone(),
                reconcile,
                spool,
                held: Arc::clone(&self.shared.held),
            }),
        }
    }

    /// Asks `reconcile` before running a call whose claim took over an
    /// earlier one (whose outcome is unknown); see [`GrpcReconcile`]. With a
    /// hook, an unknown outcome ends its claim's lease at once, so the next
    /// retry asks, and `INTERNAL` is unknown by default instead of released.
    pub fn with_reconcile(self, reconcile: impl GrpcReconcile) -> Self {
        self.changed(|hook, _| *hook = Some(Arc::new(reconcile)))
    }

    /// Keeps answers the store cannot take yet in `spool` (synced before the
    /// answer is sent) as well as in memory, so they are stored even if this
    /// process stops first: call [`flush_spool`](Self::flush_spool) at the
    /// next start, before serving. The HTTP layer's spool can be shared.
    pub fn with_spool(self, spool: Spool) -> Self {
        self.changed(|_, kept| *kept = Some(spool))
    }

    /// The spool, if the layer has one.
    pub fn spool(&self) -> Option<&Spool> {
        self.shared.spool.as_ref()
    }

    /// Stores the answers an earlier run left in the spool (see
    /// [`Spool::flush`]); 0 without a spool.
    pub async fn flush_spool(&self) -> Result<usize, SpoolError> {
        match &self.shared.spool {
            Some(spool) => {
                spool
                    .flush(&*self.shared.store, self.shared.config.lease)
                    .await
            }
            None => Ok(0),
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
            shared.held.forget(&scope, &key);
            return Ok(match StoredCall::from_outcome(replay.outcome) {
                Ok(stored) => stored.into_replay(),
                Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(),
            });
        }
        Err(in_flight @ idem_core::Error::InFlight { .. }) => {
            if let Some(left) = shared.held.left(&scope, &key, std::time::Instant::now()) {
                // Nothing runs for this key until its lease ends: say so,
                // and for how long.
                return Ok(Refusal::HeldUnknown { left }.to_response());
            }
            return Ok(Refusal::from_store(in_flight).to_response());
        }
        Err(refused) => return Ok(Refusal::from_store(refused).to_response()),
    };
    let settle = tokio::spawn(
        run_claimed(Arc::clone(&shared), inner, parts, message, claim).in_current_span(),
    );
    match settle.await {
        Ok(answer) => answer,
        Err(failed) => {
            tracing::error!(error = %failed, "the service failed while holding a claim; the key stays reserved until its lease ends");
            Ok(Refusal::OutcomeUnknown.to_response())
        }
    }
}

/// Runs `work` while renewing the claim every third of the lease, in the
/// same task, so a slow call is not taken over by its own retry.
async fn renewing<St: LeaseStore, T>(
    shared: &Shared<St>,
    claim: &Claim,
    work: impl Future<Output = T>,
) -> T {
    tokio::select! {
        done = work => done,
        never = renew_while_running(shared, claim) => match never {},
    }
}

/// Renews `first` every third of the lease, for ever; after a failed renewal
/// it only waits.
async fn renew_while_running<St: LeaseStore>(shared: &Shared<St>, first: &Claim) -> Infallible {
    let every = (shared.config.lease / 3).max(Duration::from_millis(10));
    let mut renewed: Option<Claim> = None;
    loop {
        tokio::time::sleep(every).await;
        let claim = renewed.as_ref().unwrap_or(first);
        match shared.store.renew(claim).await {
            Ok(next) => renewed = Some(next),
            Err(error) => {
                tracing::warn!(%error, "could not renew the claim; a retry may take it over when its lease ends");
                return std::future::pending().await;
            }
        }
    }
}

/// What a claimed call answers: the hook's word first on a takeover, then
/// the service's answer, judged by its status.
async fn run_claimed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    parts: http::request::Parts,
    message: Bytes,
    claim: Claim,
) -> Result<GrpcResponse, S::Error>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>,
    St: LeaseStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let method = parts.uri.path().to_owned();
    let reconcile = shared.reconcile_for(&method).cloned();
    let probed = reconcile.is_some();
    if let Some(reconcile) = reconcile.filter(|_| claim.took_over) {
        let asked = reconcile.reconcile(&claim.scope, &claim.key, &parts, &message);
        let reconciled = renewing(&shared, &claim, asked).await;
        observe::reconciled(&method, &reconciled);
        match reconciled {
            GrpcReconciled::NotApplied => {
                tracing::info!("the earlier call was not applied; running the call");
            }
            GrpcReconciled::Applied(stored) => {
                tracing::info!("the earlier call was applied; storing and replaying its answer");
                let stored =
                    stored.with_header(IDEMPOTENCY_RECONCILED, HeaderValue::from_static("true"));
                shared.held.forget(&claim.scope, &claim.key);
                store_answer(&shared, claim, stored.to_outcome()).await;
                return Ok(stored.into_replay());
            }
            GrpcReconciled::Unknown(cause) => {
                tracing::warn!(%cause, "the service cannot tell whether the earlier call was applied; nothing runs");
                // The key stays reserved; its lease is ended so that the
                // next retry asks again at once.
                end_lease(&shared, &claim).await;
                return Ok(Refusal::ReconcileUnknown {
                    cause,
                    retry_after: RECONCILE_AGAIN_AFTER,
                }
                .to_response());
            }
        }
    }
    let request = http::Request::from_parts(
        parts,
        tonic::body::Body::new(http_body_util::Full::new(message)),
    );
    let response = match renewing(&shared, &claim, inner.call(request)).await {
        Ok(response) => response,
        Err(error) => {
            tracing::warn!(
                "the service failed without an answer; whether it took effect is unknown"
            );
            observe::verdict(&method, Verdict::Unknown);
            hold_unknown(&shared, &claim, probed).await;
            return Err(error);
        }
    };
    // The status is in the trailers: the whole answer is read first (a unary
    // answer is one message), with the claim still renewed.
    let (parts, body) = response.into_parts();
    let collected = renewing(&shared, &claim, body.collect()).await;
    let collected = match collected.map_err(Into::<BoxError>::into) {
        Ok(collected) => collected,
        Err(error) => {
            tracing::warn!(%error, "the answer broke off; whether the call took effect is unknown");
            observe::verdict(&method, Verdict::Unknown);
            hold_unknown(&shared, &claim, probed).await;
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
    let marked_unknown = parts
        .extensions
        .get::<idem_http::UnknownOutcome>()
        .is_some();
    let verdict = if marked_unknown {
        Verdict::Unknown
    } else {
        shared.config.on_code.verdict(code, probed)
    };
    observe::verdict(&method, verdict);
    match verdict {
        Verdict::Store => {
            shared.held.forget(&claim.scope, &claim.key);
            store_answer(&shared, claim, answer.to_outcome()).await;
        }
        Verdict::Release => {
            shared.held.forget(&claim.scope, &claim.key);
            if let Err(error) = shared.store.release(&claim).await {
                tracing::warn!(%error, "could not release the key; it is freed when its lease ends");
            }
        }
        Verdict::Unknown => {
            tracing::info!(
                ?code,
                "the answer does not tell whether the call took effect; the key stays reserved"
            );
            hold_unknown(&shared, &claim, probed).await;
        }
    }
    let mut response = answer.into_response();
    *response.headers_mut() = parts.headers;
    *response.extensions_mut() = parts.extensions;
    response.extensions_mut().insert(idem_http::Judged(verdict));
    Ok(response)
}

/// Keeps the key of a call whose outcome is unknown. With a hook for its
/// method the lease ends now, so the next retry takes the claim over and
/// asks before anything runs again; without one the key stays reserved for
/// a lease from now (renewed once, so the time a refused retry is told is
/// exact), then a retry runs the call again.
async fn hold_unknown<St: LeaseStore>(shared: &Shared<St>, claim: &Claim, probed: bool) {
    if probed {
        end_lease(shared, claim).await;
        return;
    }
    match shared.store.renew(claim).await {
        Ok(_) => {
            let now = std::time::Instant::now();
            shared
                .held
                .hold(&claim.scope, &claim.key, now + shared.config.lease, now);
        }
        Err(error) => {
            tracing::warn!(%error, "could not renew the claim of an unknown outcome; the key stays reserved until its lease ends");
        }
    }
}

/// Ends the lease of a claim whose outcome is unknown, so the next retry
/// takes it over and reconciles at once.
async fn end_lease<St: LeaseStore>(shared: &Shared<St>, claim: &Claim) {
    if let Err(error) = shared.store.end_lease(claim).await {
        tracing::warn!(%error, "could not end the lease of an unknown outcome; the next retry asks after the lease ends");
    }
}

/// What a completion attempt told.
enum Completion {
    /// The record holds the answer.
    Stored,
    /// Another claim holds the key: this answer can no longer be stored.
    TakenOver(idem_core::Error),
    /// The store did not take it this time.
    Failed(idem_core::Error),
}

fn judge(claim: &Claim, result: Result<(), idem_core::Error>) -> Completion {
    match result {
        Ok(()) => Completion::Stored,
        // The key is no longer in flight under this token: an earlier
        // attempt whose answer was lost did commit.
        Err(idem_core::Error::Fenced { current, .. }) if current == Some(claim.token) => {
            Completion::Stored
        }
        Err(error @ idem_core::Error::Fenced { .. }) => Completion::TakenOver(error),
        Err(error) => Completion::Failed(error),
    }
}

/// Stores the answer; if the store does not take it now, it is kept (in the
/// spool, synced, when there is one) and the completion is retried in the
/// background until stored or taken over. The client gets the answer at
/// once, and copies meanwhile are told the call is in flight.
async fn store_answer<St: LeaseStore + 'static>(
    shared: &Arc<Shared<St>>,
    claim: Claim,
    outcome: Outcome,
) {
    let error = match judge(&claim, shared.store.complete(&claim, &outcome).await) {
        Completion::Stored => return,
        Completion::TakenOver(error) => return given_up(&error),
        Completion::Failed(error) => error,
    };
    let spooled = match &shared.spool {
        Some(spool) => match spool.keep(&claim, &outcome).await {
            Ok(id) => Some((spool.clone(), id)),
            Err(spool_error) => {
                tracing::error!(%spool_error, "the answer could not be written to the spool; it is kept in memory only, and lost if this process stops before the store takes it");
                None
            }
        },
        None => None,
    };
    tracing::warn!(%error, spooled = spooled.is_some(), "the store did not take the answer yet; the client gets it, and its completion is retried until stored");
    let store = Arc::clone(&shared.store);
    let lease = shared.config.lease;
    tokio::spawn(
        async move {
            match complete_until_stored(&*store, claim, &outcome, lease).await {
                Ok(()) => tracing::info!("the answer kept while the store was away is stored"),
                Err(error) => given_up(&error),
            }
            if let Some((spool, id)) = spooled
                && let Err(error) = spool.stored(id).await
            {
                tracing::warn!(%error, "could not mark a spooled answer stored; it is completed again (harmlessly) at the next start");
            }
        }
        .in_current_span(),
    );
}

/// Completes `claim` with `outcome`, retrying with full-jitter backoff and
/// renewing the claim every third of `lease`, until the store has the answer
/// (`Ok`) or the claim was taken over (the fencing error).
async fn complete_until_stored<St: LeaseStore>(
    store: &St,
    mut claim: Claim,
    outcome: &Outcome,
    lease: Duration,
) -> Result<(), idem_core::Error> {
    let mut delays = Backoff::new(FIRST_DELAY, LONGEST_DELAY, u32::MAX).delays();
    let renew_every = (lease / 3).max(Duration::from_millis(10));
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(delays.next().unwrap_or(LONGEST_DELAY)).await;
        if renewed.elapsed() >= renew_every {
            // While the store is away this fails too; the completion tells
            // what matters.
            if let Ok(longer) = store.renew(&claim).await {
                claim = longer;
            }
            renewed = tokio::time::Instant::now();
        }
        match judge(&claim, store.complete(&claim, outcome).await) {
            Completion::Stored => return Ok(()),
            Completion::TakenOver(error) => return Err(error),
            Completion::Failed(_) => {}
        }
    }
}

/// Logs an answer that can no longer be stored: the one case in which a
/// retry after the lease may run the call again.
fn given_up(error: &idem_core::Error) {
    tracing::warn!(%error, "could not store the answer: its claim was taken over after its lease ran out, so a retry may run again");
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

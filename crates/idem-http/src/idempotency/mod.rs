//! The `Idempotency-Key` middleware for any tower service: [`IdempotencyLayer`]
//! and the [`IdempotencyService`] it wraps around an inner service.
//!
//! # Why the leased protocol
//!
//! The inner service is opaque (an axum router, a reverse proxy, anything that
//! answers HTTP), so its effect cannot join the store's transaction. The layer
//! therefore uses the *leased* protocol:
//!
//! 1. read the key of a request with an unsafe method (none: pass through
//!    untouched, or 400 where one is required; a safe method passes through
//!    key or not, its key ignored and said so), read the body under the limit (413 over it), derive the
//!    scope (principal hash, method, route) and fingerprint (method, route,
//!    target, canonical body);
//! 2. **claim** `(scope, key)`: a settled record is replayed with
//!    `Idempotent-Replayed: true`; a different payload is refused (422, Stripe
//!    400); a live claim is refused at once (409 + `Retry-After`), or, with
//!    [`Concurrent::Wait`], the duplicate waits (bounded) for the original's
//!    stored answer and gets it as a replay;
//! 3. call the inner service, renewing the claim every third of the lease
//!    while it works (so a slow request is not taken over by its own retry);
//! 4. give the answer its [`Verdict`] by its status ([`StatusPolicy`]):
//!    **store** it (2xx and 4xx except 408/409/425/429 by default),
//!    **release** the key so the next retry runs again (503, 429, 408, ...),
//!    or keep the claim of an **unknown** outcome (502, 504, and 500 when a
//!    [`Reconcile`] hook can be asked).
//!
//! An answer is never handed out without being kept: when the store refuses
//! the completion (the database restarts), the answer is kept — in a
//! [`Spool`] file, synced before the answer is sent, when the layer has one —
//! and the completion is retried in the background until stored, renewing
//! the claim meanwhile. Copies that arrive meanwhile get 409, then the
//! replay. [`IdempotencyLayer::flush_spool`] stores what a previous process
//! left in the spool; call it before serving.
//!
//! An unknown outcome — the service failed without a response, its body
//! broke off, it answered with the [`UnknownOutcome`] marker or with a status
//! whose verdict is unknown — may follow an applied effect, so its key is
//! never freed on a guess. With a [`Reconcile`] hook the claim's lease is
//! ended at once, and the next retry takes it over and asks the hook before
//! anything runs: an applied attempt's answer is stored and replayed (with
//! `Idempotency-Reconciled: true`), a missing one lets the retry run, and
//! "cannot tell" is a 503 after which the next retry asks again. The same
//! question is asked on every takeover of a claim whose holder died. Without
//! a hook the claim is kept for a lease from the answer, and a refused retry
//! is told the time left.
//!
//! From the claim on, the work runs in a task of its own, so a client that
//! hangs up does not strand the claim: the request runs and its answer is
//! kept for the retry. The gap between an opaque service's effect and the
//! record cannot be closed; it is narrowed. Services whose effect is a write
//! to the store's own database should use [`atomic`](crate::atomic) handlers
//! instead, where there is no gap at all.
//!
//! # Tracing
//!
//! A keyed request runs in an `idempotency` span with its scope and key (or
//! the key's hash: [`IdempotencyConfig::key_in_spans`]). The span continues the
//! `traceparent` the client sent, so a request and its retries are children
//! of the client's span in one trace.
//!
//! # Layout
//!
//! - [`config`](IdempotencyConfig): what is keyed, required, stored, and how long;
//! - `layer`: [`IdempotencyLayer`], which holds the store and the config;
//! - `future`: [`ResponseFuture`];
//! - `keep`: the completion retried until stored, and the spool flushed at start-up;
//! - `spool`: [`Spool`], the local file of answers the store has not taken yet;
//! - `reconcile`: [`Reconcile`], the question asked about an unknown outcome;
//! - `on_status`: [`StatusPolicy`], what each answer status means for its key;
//! - `held`: the keys this process holds after an unknown outcome;
//! - `wait`: a concurrent duplicate waiting for its original, and the
//!   waiters of a process;
//! - `notices`: [`WaitableStore`], the store's side of waiting: a read that
//!   claims nothing, and PostgreSQL's notifications;
//! - `problem`: [`Refusal`], the answers the layer gives itself, and the one
//!   function that maps them (and store errors) to HTTP statuses.

mod cache;
mod config;
mod future;
mod held;
mod keep;
mod layer;
mod notices;
mod on_status;
pub(crate) mod problem;
mod reconcile;
mod spool;
mod wait;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use idem_core::{Claim, Claimed, Error, LeaseStore, Outcome};
use tower::Service;
use tracing::Instrument;

pub use cache::{
    DEFAULT_REPLAY_CACHE_BYTES, DEFAULT_REPLAY_CACHE_STALENESS, REPLAY_CACHE_BYTES,
    REPLAY_CACHE_ENTRIES, REPLAY_CACHE_LOOKUPS_TOTAL, ReplayCache,
};
pub use config::{
    Concurrent, DEFAULT_BODY_LIMIT, DEFAULT_WAITERS, DEFAULT_WAITERS_PER_KEY, IdempotencyConfig,
    KeyRequirement, Mode, WaiterCaps,
};
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use notices::{Notices, WaitableStore};
pub use on_status::{StatusPolicy, StatusPolicyError, StatusRule, Verdict};
pub use problem::{KeyHeld, Refusal, Refused};
pub use reconcile::{Reconcile, Reconciled};
pub use spool::{Spool, SpoolError};
pub use wait::CONCURRENT_WAITS_TOTAL;

use crate::StoredResponse;
use crate::body::read_limited;
use crate::identity::{fingerprint_of, principal_of, route_of, scope_of};
use crate::key_header::{IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_IGNORED, mark_expiry, read_key};
use crate::observe::{self, route_label};

/// A response extension an inner service sets to say "I may or may not have
/// applied the effect" (an upstream timed out after the request was sent, say).
/// The layer then neither stores the response nor releases the key: the claim
/// is kept until its lease ends, and the response goes to the client as it is.
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use http::StatusCode;
/// use idem_http::UnknownOutcome;
///
/// let mut response = StatusCode::GATEWAY_TIMEOUT.into_response();
/// response.extensions_mut().insert(UnknownOutcome);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnknownOutcome;

/// A response extension an inner service sets to say "nothing was applied"
/// (an upstream that could not be reached, so the request was never sent).
/// The layer then releases the key whatever the status, and the next retry
/// runs at once.
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use http::StatusCode;
/// use idem_http::NothingApplied;
///
/// let mut response = StatusCode::BAD_GATEWAY.into_response();
/// response.extensions_mut().insert(NothingApplied);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NothingApplied;

/// The header on an answer the service confirmed through [`Reconcile`]
/// instead of running the request again: `Idempotency-Reconciled: true`,
/// stored with the answer, so every replay of it says so too.
pub const IDEMPOTENCY_RECONCILED: http::HeaderName =
    http::HeaderName::from_static("idempotency-reconciled");

pub(crate) struct Shared<St> {
    pub(crate) store: Arc<St>,
    pub(crate) config: IdempotencyConfig,
    /// Keys held after an unknown outcome, for an exact `Retry-After`.
    pub(crate) held: Arc<held::HeldUnknown>,
    pub(crate) answers: Answers,
    pub(crate) waiters: Arc<wait::Waiters>,
    pub(crate) cache: Arc<cache::AnswerCache>,
}

/// What the leased layer does about answers beyond the store: where it keeps
/// those the store could not take yet, and whom it asks about an earlier
/// attempt whose outcome is unknown.
#[derive(Clone, Default)]
pub(crate) struct Answers {
    pub(crate) spool: Option<Spool>,
    pub(crate) reconcile: Option<Arc<dyn Reconcile>>,
}

/// The middleware: applies `Idempotency-Key` semantics in front of `S`. Made by
/// [`IdempotencyLayer`]. Runs on Tokio: the work on a claimed key is spawned,
/// so it finishes even if the client disconnects.
pub struct IdempotencyService<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for IdempotencyService<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for IdempotencyService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, St>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: WaitableStore + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the service that was polled ready is the one used.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(serve(Arc::clone(&self.shared), inner, request))
    }
}

async fn serve<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: WaitableStore + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let config = &shared.config;
    let mode = config.mode;
    if !config.accepts_key(request.method()) {
        // A safe method changes nothing: it runs as usual, key or not.
        let keyed = request.headers().contains_key(IDEMPOTENCY_KEY);
        let mut response = pass_through(inner, request).await?;
        if keyed {
            tracing::debug!("Idempotency-Key ignored on a request with a safe method");
            response
                .headers_mut()
                .insert(IDEMPOTENCY_KEY_IGNORED, HeaderValue::from_static("true"));
        }
        return Ok(response);
    }
    let key = match read_key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => {
            let route = route_of(request.uri(), request.extensions());
            if config.requires_key(request.method(), &route) {
                return Ok(Refusal::MissingKey.to_response(mode));
            }
            return pass_through(inner, request).await;
        }
        Err(malformed) => return Ok(Refusal::Header(malformed).to_response(mode)),
    };
    let route = route_of(request.uri(), request.extensions());
    let label = route_label(request.method(), request.uri(), request.extensions());

    let (parts, body) = request.into_parts();
    let body = match read_limited(&parts.headers, body, config.body_limit).await {
        Ok(body) => body,
        Err(refusal) => return Ok(refusal.to_response(mode)),
    };
    let principal = principal_of(&parts.headers, config.principal_header.as_ref());
    let scope = scope_of(&principal, &parts.method, &route);
    let fingerprint = fingerprint_of(&config.fingerprint, &parts.method, &route, &parts, &body);

    let span = tracing::info_span!(
        "idempotency",
        scope = scope.as_str(),
        idempotency_key = config.key_in_spans.show(&key),
        method = %parts.method,
        route = route.as_str(),
    );
    // A retry of the request continues the trace its client sent.
    idem_trace::continue_trace(&span, &idem_trace::HttpHeaders(&parts.headers));
    let answered = keyed(shared, inner, parts, body, scope, key, fingerprint)
        .instrument(span)
        .await;
    if let Ok(response) = &answered {
        observe::keyed_answer(&label, response);
    }
    answered
}

/// A keyed request, read: claim its key, then replay the stored answer or run
/// the service.
async fn keyed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: http::request::Parts,
    body: Bytes,
    scope: idem_core::Scope,
    key: idem_core::IdempotencyKey,
    fingerprint: idem_core::Fingerprint,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: WaitableStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let mode = shared.config.mode;
    if let Some(cached) = shared.cache.get(&scope, &key, shared.store.now())
        && fingerprint.compare(&cached.fingerprint) == idem_core::FingerprintMatch::Same
    {
        // A settled answer this process has seen, inside its window: the
        // store would replay it too.
        return Ok(
            match StoredResponse::from_outcome(Outcome::clone(&cached.outcome)) {
                Ok(stored) => {
                    let mut response = stored.into_replay();
                    mark_expiry(response.headers_mut(), cached.expires_at);
                    response
                }
                Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(mode),
            },
        );
    }
    // From the claim on, the work runs in a task of its own and finishes even
    // if the client goes away: a claim committed while the request was being
    // dropped would answer every retry 409 until its lease ended.
    let settle = tokio::spawn(
        claim_and_answer(
            Arc::clone(&shared),
            inner,
            parts,
            body,
            scope,
            key,
            fingerprint,
        )
        .in_current_span(),
    );
    match settle.await {
        Ok(answer) => answer,
        Err(failed) => {
            tracing::error!(error = %failed, "the service failed while holding a claim; the key stays reserved until its lease ends");
            Ok(Refusal::OutcomeUnknown.to_response(mode))
        }
    }
}

/// Claims the key, then replays the stored answer, refuses the duplicate, or
/// runs the service.
async fn claim_and_answer<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: http::request::Parts,
    body: Bytes,
    scope: idem_core::Scope,
    key: idem_core::IdempotencyKey,
    fingerprint: idem_core::Fingerprint,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: WaitableStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let mode = shared.config.mode;
    let claim = match shared.store.claim(&scope, &key, fingerprint).await {
        Ok(Claimed::Fresh(claim)) => claim,
        Ok(Claimed::Replayed(replay)) => {
            shared.held.forget(&scope, &key);
            shared.cache.put(
                &scope,
                &key,
                fingerprint,
                Arc::new(replay.outcome.clone()),
                replay.expires_at,
            );
            return Ok(match StoredResponse::from_outcome(replay.outcome) {
                Ok(stored) => {
                    let mut response = stored.into_replay();
                    mark_expiry(response.headers_mut(), replay.expires_at);
                    response
                }
                Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(mode),
            });
        }
        Err(in_flight @ Error::InFlight { .. }) => {
            if let Some(left) = shared.held.left(&scope, &key, shared.store.now()) {
                // Nothing runs for this key until its lease ends: say so, and
                // for how long.
                return Ok(Refusal::HeldUnknown { left }.to_response(mode));
            }
            return Ok(wait::for_original(&shared, &scope, &key, fingerprint, in_flight).await);
        }
        Err(refused) => return Ok(Refusal::from_store(refused, true).to_response(mode)),
    };

    idem_core::crash::point(idem_core::crash::AFTER_CLAIM);
    let request = Request::from_parts(parts, Body::from(body));
    // Tells waiting duplicates what became of this original, however it ends.
    let announce = wait::Announce::new(&shared, &scope, &key, fingerprint);
    run_claimed(shared, inner, request, claim, announce).await
}

/// Runs `work` while renewing the claim every third of the lease, in the
/// same task (no task of its own to spawn and abort per request), so a slow
/// request is not taken over by its own retry. If this process dies the
/// renewals stop, and the lease runs out as usual.
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
    let every = (shared.config.lease / 3).max(std::time::Duration::from_millis(10));
    let mut renewed: Option<Claim> = None;
    loop {
        tokio::time::sleep(every).await;
        let claim = renewed.as_ref().unwrap_or(first);
        match shared.store.renew(claim).await {
            Ok(next) => renewed = Some(next),
            Err(error) => {
                tracing::warn!(scope = first.scope.as_str(), %error, "could not renew the claim; a retry may take it over when its lease ends");
                return std::future::pending().await;
            }
        }
    }
}

/// Calls the inner service for a claimed key, then completes or releases the
/// claim according to the response, and says on the answer until when the
/// key is remembered.
async fn run_claimed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    request: Request<Body>,
    claim: Claim,
    announce: wait::Announce<St>,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    St: WaitableStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let expires_at = claim.expires_at;
    let mut answer = answer_claimed(shared, inner, request, claim, announce).await?;
    mark_expiry(answer.headers_mut(), expires_at);
    Ok(answer)
}

/// What [`run_claimed`] answers. A claim that took over an expired one asks
/// the [`Reconcile`] hook first, when there is one.
async fn answer_claimed<S, St, ResBody>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    request: Request<Body>,
    claim: Claim,
    announce: wait::Announce<St>,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    St: WaitableStore + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let config = &shared.config;
    let scope = claim.scope.as_str();
    let request = match (&shared.answers.reconcile, claim.took_over) {
        (Some(reconcile), true) => {
            let (parts, body) = request.into_parts();
            let reconciled = renewing(
                &shared,
                &claim,
                reconcile.reconcile(&claim.scope, &claim.key, &parts),
            )
            .await;
            match reconciled {
                Reconciled::NotApplied => {
                    tracing::info!(
                        scope,
                        "the earlier attempt was not applied; running the request"
                    );
                    Request::from_parts(parts, body)
                }
                Reconciled::Applied(stored) => {
                    tracing::info!(
                        scope,
                        "the earlier attempt was applied; storing and replaying its answer"
                    );
                    let stored = stored.with_header(
                        IDEMPOTENCY_RECONCILED,
                        http::HeaderValue::from_static("true"),
                    );
                    keep::store_answer(&shared, claim, stored.to_outcome(), announce).await;
                    return Ok(stored.into_replay());
                }
                Reconciled::Unknown(cause) => {
                    // Nothing runs, and the key stays reserved; its lease is
                    // ended so that the next retry asks again at once.
                    end_lease(&shared, &claim).await;
                    return Ok(Refusal::ReconcileUnknown {
                        cause,
                        retry_after: RECONCILE_AGAIN_AFTER,
                    }
                    .to_response(config.mode));
                }
            }
        }
        _ => request,
    };
    let called = renewing(&shared, &claim, inner.call(request)).await;
    let response = match called {
        Ok(response) => response,
        Err(error) => {
            tracing::warn!(
                scope,
                "the service failed without a response; whether it took effect is unknown"
            );
            hold_unknown(&shared, &claim).await;
            return Err(error);
        }
    };
    if response.extensions().get::<UnknownOutcome>().is_some() {
        tracing::info!(
            scope,
            "the service reported an unknown outcome; the key stays reserved"
        );
        hold_unknown(&shared, &claim).await;
        return Ok(judged(response.map(Body::new), Verdict::Unknown));
    }
    let verdict = if response.extensions().get::<NothingApplied>().is_some() {
        Verdict::Release
    } else {
        config
            .on_status
            .verdict(response.status(), shared.answers.reconcile.is_some())
    };
    match verdict {
        Verdict::Store => {}
        Verdict::Release => {
            shared.held.forget(&claim.scope, &claim.key);
            if let Err(error) = shared.store.release(&claim).await {
                tracing::warn!(scope, %error, "could not release the key; it is freed when its lease ends");
            }
            return Ok(judged(response.map(Body::new), verdict));
        }
        Verdict::Unknown => {
            tracing::info!(
                scope,
                status = response.status().as_u16(),
                "the service answered with a status whose outcome is unknown; the key stays reserved"
            );
            hold_unknown(&shared, &claim).await;
            return Ok(judged(response.map(Body::new), verdict));
        }
    }

    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(Into::<BoxError>::into);
    let body = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            tracing::warn!(scope, %error, "the response body broke off; whether the request took effect is unknown");
            hold_unknown(&shared, &claim).await;
            return Ok(Refusal::OutcomeUnknown.to_response(config.mode));
        }
    };
    let stored = StoredResponse::from_parts(parts.status, parts.headers.clone(), body.clone());
    idem_core::crash::point(idem_core::crash::INSIDE_EFFECT);
    // The effect happened and this is its answer: it is stored before the
    // client gets it, or kept (spooled) and stored as soon as the store
    // takes it.
    shared.held.forget(&claim.scope, &claim.key);
    keep::store_answer(&shared, claim, stored.to_outcome(), announce).await;
    idem_core::crash::point(idem_core::crash::BEFORE_ANSWER);
    let answer = Response::from_parts(parts, Body::from(body)).into_response();
    Ok(judged(answer, Verdict::Store))
}

/// How soon a retry may ask the reconcile hook again after it could not tell.
const RECONCILE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Marks an answer of the service with what it meant for its key.
fn judged(mut response: Response, verdict: Verdict) -> Response {
    response.extensions_mut().insert(Judged(verdict));
    response
}

/// A response extension on a layer's answers to keyed requests that the
/// service gave: what the answer meant for its key. The HTTP and gRPC
/// layers set it; the gateway counts requests by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged(pub Verdict);

/// Keeps the key of an attempt whose outcome is unknown. With a reconcile
/// hook the lease ends now, so the next retry takes the claim over and asks
/// the hook before anything runs again; without one the key stays reserved
/// for a lease from now (renewed once, so the time a refused retry is told
/// is exact), then a retry runs the request again.
async fn hold_unknown<St: WaitableStore>(shared: &Shared<St>, claim: &Claim) {
    if shared.answers.reconcile.is_some() {
        end_lease(shared, claim).await;
        return;
    }
    match shared.store.renew(claim).await {
        Ok(renewed) => shared.held.hold(
            &claim.scope,
            &claim.key,
            renewed.lease_until,
            shared.store.now(),
        ),
        Err(error) => {
            tracing::warn!(scope = claim.scope.as_str(), %error, "could not renew the claim of an unknown outcome; the key stays reserved until its lease ends");
        }
    }
}

/// Ends the lease of a claim whose outcome is unknown, so the next retry
/// takes it over and reconciles at once.
async fn end_lease<St: WaitableStore>(shared: &Shared<St>, claim: &Claim) {
    if let Err(error) = shared.store.end_lease(claim).await {
        tracing::warn!(scope = claim.scope.as_str(), %error, "could not end the lease of an unknown outcome; the next retry asks after the lease ends");
    }
}

async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.call(request.map(Body::new)).await?;
    Ok(response.map(Body::new))
}

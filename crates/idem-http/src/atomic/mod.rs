//! Atomic handlers: route handlers whose own SQL and the stored response commit
//! in **one** transaction, on any [`AtomicStore`] — SQLite,
//! PostgreSQL, or the facade's `idem::AnyStore` chosen at run time.
//!
//! # Why a route wrapper and not an extractor
//!
//! The stores' atomic `apply` owns the transaction from `BEGIN` to `COMMIT`: it
//! claims the key inside it, runs the effect with it, writes the record
//! (with the outcome) inside it, and commits once. For the response to be that
//! outcome, `apply` has to see the handler's *response* before it commits. An
//! axum extractor sees neither: it runs before the handler and is gone when
//! the response is made, and the connection it would hand out is a borrow
//! that cannot be parked in a `'static` request extension while `apply`
//! waits. So the handler runs *inside* `apply`:
//!
//! 1. the [`route`] reads the key (400 when missing on a route that requires
//!    one, or malformed), reads the body under the limit (413), and derives the
//!    scope and fingerprint exactly as the [layer](crate::IdempotencyLayer) does;
//! 2. it calls the store's atomic `apply`; a duplicate is answered from the
//!    store (the stored response, `Idempotent-Replayed: true`), a reused key
//!    and a concurrent duplicate are refused (422 / 409) — the handler does
//!    not run;
//! 3. otherwise, inside the transaction that already holds the claim, your
//!    handler gets the parsed [`AtomicRequest`] and its effect runs with the
//!    store's connection, returning a [`StoredResponse`];
//! 4. a response whose status is stored (2xx, 4xx but 408/409/425/429 by default)
//!    becomes the record's outcome and commits **with your writes**; any other
//!    status, or a [`Failure`], rolls everything back — your writes and the
//!    claim — so the next retry runs again.
//!
//! A crash anywhere leaves both the writes and the record, or neither. The
//! fresh response and every replay are built from the same stored outcome, so
//! they are identical apart from `Idempotent-Replayed`.
//!
//! When the database goes away under a request — the store cannot be
//! reached, or the handler's SQL fails because the connection broke — nothing
//! was kept, and the answer is 503 `store-unavailable` with `Retry-After`. When
//! the connection breaks while the commit itself is on its way, nobody knows
//! whether it committed: the answer is 503 `commit-outcome-unknown`, and a
//! retry with the same key tells (the stored response if it committed, a fresh
//! run if not).
//!
//! Requests without a key on a route that does not require one run the effect
//! each time in a plain transaction of the store
//! ([`AtomicStore::transaction`]), committed or
//! rolled back by the same rule.
//!
//! # The handler
//!
//! The handler is called with the parsed [`AtomicRequest`] of each request
//! that is to run, and returns the effect: an `async` closure that takes the
//! store's connection (`&mut rusqlite::Connection` on SQLite,
//! `&mut PgConnection` on PostgreSQL, `&mut dyn AnyTx` on an `AnyStore`) and
//! returns a [`HandlerResult`]. The effect owns the request (it is `'static`);
//! its future may borrow the connection. Only the SQL is written per database;
//! the route is the same for every store.
//!
//! On SQLite the effect runs on the store's single writer thread, which drives
//! its future to the end: every other write waits for it, so keep it to SQL
//! and never await the network in it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, body::Body, routing::post_service};
//! use http::{Request, StatusCode};
//! use idem::SqliteStore;
//! use idem_http::atomic::{self, AtomicRequest, HandlerResult};
//! use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
//! use tower::ServiceExt;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("app.db")).await?;
//! store
//!     .with_connection(|conn| conn.execute("CREATE TABLE orders (body BLOB)", []))
//!     .await??;
//! let config = IdempotencyConfig::default().require_key(KeyRequirement::Always);
//! let app: Router = Router::new().route(
//!     "/orders",
//!     post_service(atomic::route(store, config, |request: AtomicRequest| {
//!         async move |tx| -> HandlerResult {
//!             tx.execute("INSERT INTO orders VALUES (?1)", [request.body().as_ref()])?;
//!             Ok(StoredResponse::text(StatusCode::CREATED, "created"))
//!         }
//!     })),
//! );
//!
//! for replayed in [false, true] {
//!     let order = Request::post("/orders")
//!         .header("idempotency-key", "\"order-1\"")
//!         .body(Body::from("one pot of tea"))?;
//!     let response = app.clone().oneshot(order).await?;
//!     assert_eq!(response.status(), StatusCode::CREATED);
//!     assert_eq!(response.headers().contains_key("idempotent-replayed"), replayed);
//! }
//! # Ok(()) }
//! ```

mod route;

use std::fmt;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri};
use idem_core::{Applied, ApplyError, AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope};
use serde::de::DeserializeOwned;

pub use route::{AtomicRoute, route};

use crate::body::read_limited;
use crate::identity::{fingerprint_of, principal_of, route_of, scope_of};
use crate::key_header::read_key;
use crate::{IdempotencyConfig, Mode, Refusal, StatusPolicy, StoredResponse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request as an atomic handler sees it: its head, its whole body, and
/// its key.
#[derive(Debug)]
pub struct AtomicRequest {
    parts: Parts,
    body: Bytes,
    key: Option<IdempotencyKey>,
    route: String,
}

impl AtomicRequest {
    /// The method.
    pub fn method(&self) -> &Method {
        &self.parts.method
    }

    /// The URI.
    pub fn uri(&self) -> &Uri {
        &self.parts.uri
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.parts.headers
    }

    /// The extensions (axum's `MatchedPath`, anything earlier layers added).
    pub fn extensions(&self) -> &Extensions {
        &self.parts.extensions
    }

    /// The route template (or the path outside a router).
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The whole body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The idempotency key; `None` on a keyless request to a route that does
    /// not require one.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// A handler failure that is nobody's final answer: everything the handler
/// wrote is rolled back, the key is released, and the client gets a 500 that
/// says a retry is safe. The error itself is logged, not sent.
///
/// Any error converts into it, so handlers can use `?` on driver calls. When
/// the error (or one of its causes) is the store's driver error saying the
/// database went away or was busy, the client gets a 503 with `Retry-After`
/// instead: the failure was the database's, not the request's.
pub struct Failure(BoxError);

impl Failure {
    /// Wraps an error.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

impl Failure {
    /// The error, for the store to classify.
    fn cause(&self) -> &(dyn std::error::Error + 'static) {
        &*self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Failure {
    fn from(error: E) -> Self {
        Self(Box::new(error))
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Failure").field(&self.0).finish()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What an atomic handler returns.
pub type HandlerResult = Result<StoredResponse, Failure>;

/// Why a handler's transaction was rolled back: the error type of the atomic
/// `apply` calls.
#[derive(Debug)]
pub(crate) enum Rollback {
    /// The handler failed.
    Failed(Failure),
    /// The handler answered with a status that is not stored (5xx, 408, 429 by default).
    NotStored(Box<StoredResponse>),
}

/// Turns a handler's answer into the outcome to commit, or the reason to roll back.
pub(crate) fn settle(stored: &StatusPolicy, answer: HandlerResult) -> Result<Outcome, Rollback> {
    match answer {
        Ok(response) if stored.stores(response.status()) => Ok(response.to_outcome()),
        Ok(response) => Err(Rollback::NotStored(Box::new(response))),
        Err(failure) => Err(Rollback::Failed(failure)),
    }
}

/// A request that passed the checks: its key, scope and fingerprint (when it
/// has a key) and the request for the handler.
pub(crate) struct Admitted {
    pub(crate) keyed: Option<(Scope, IdempotencyKey, Fingerprint)>,
    pub(crate) request: AtomicRequest,
}

/// Reads the key and the body, refusing what the layer would refuse.
pub(crate) async fn admit<B>(
    config: &IdempotencyConfig,
    request: Request<B>,
) -> Result<Admitted, Refusal>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let route = route_of(request.uri(), request.extensions());
    let key = read_key(request.headers())?;
    if key.is_none() && config.require_key.applies_to(&route) {
        return Err(Refusal::MissingKey);
    }
    let (parts, body) = request.into_parts();
    let body = read_limited(&parts.headers, body, config.body_limit).await?;
    let keyed = key.clone().map(|key| {
        let principal = principal_of(&parts.headers, config.principal_header.as_ref());
        let scope = scope_of(&principal, &parts.method, &route);
        let fingerprint = fingerprint_of(&config.fingerprint, &parts.method, &route, &parts, &body);
        (scope, key, fingerprint)
    });
    Ok(Admitted {
        keyed,
        request: AtomicRequest {
            parts,
            body,
            key,
            route,
        },
    })
}

/// The response for what an atomic `apply` (or a keyless transaction) on
/// `store` returned, for a request with a key or without.
pub(crate) fn answer<S: AtomicStore>(
    store: &S,
    applied: Result<Applied, ApplyError<Rollback>>,
    keyed: bool,
    mode: Mode,
) -> Response {
    match applied {
        Ok(Applied::Fresh(outcome)) => match StoredResponse::from_outcome(outcome) {
            Ok(stored) => stored.into_response(),
            Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(mode),
        },
        Ok(Applied::Replayed(outcome)) => match StoredResponse::from_outcome(outcome) {
            Ok(stored) => stored.into_replay(),
            Err(damaged) => Refusal::Corrupt(damaged.to_string()).to_response(mode),
        },
        Err(ApplyError::Effect(Rollback::NotStored(response))) => response.into_response(),
        Err(ApplyError::Effect(Rollback::Failed(failure))) => {
            match store.effect_error_kind(failure.cause()) {
                Some(kind) if kind.is_transient() => {
                    tracing::warn!(error = %failure, "atomic handler failed on the store's connection ({kind}); its writes were rolled back and the key released");
                    Refusal::StoreUnavailable { keyed }.to_response(mode)
                }
                _ => {
                    tracing::warn!(error = %failure, "atomic handler failed; its writes were rolled back and the key released");
                    Refusal::HandlerFailed.to_response(mode)
                }
            }
        }
        Err(ApplyError::Protocol(error)) => Refusal::from_store(error, keyed).to_response(mode),
    }
}

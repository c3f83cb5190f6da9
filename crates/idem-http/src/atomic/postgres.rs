//! Atomic handlers on PostgreSQL: the handler gets the connection of the
//! store's transaction, which already holds the key's advisory lock and will
//! write the record.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::Response;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use http::Request;
use idem::{Applied, ApplyError, Error, ErrorKind, PgStore, StoreError};
use sqlx::PgConnection;
use tower::Service;

use super::{AtomicRequest, BoxError, HandlerResult, Rollback, admit, answer, settle};
use crate::IdempotencyConfig;

/// A route whose handler's SQL commits with the stored response, on
/// PostgreSQL. Made by [`postgres`]; mount it with axum's `post_service` (or
/// `route_service`).
pub struct PgRoute<H> {
    store: PgStore,
    config: Arc<IdempotencyConfig>,
    handler: Arc<H>,
}

/// An atomic route on PostgreSQL: `handler` gets the transaction's connection
/// (the key's claim is already held) and the request, and its response is
/// committed with its writes. See the [module docs](crate::atomic).
///
/// ```no_run
/// # async fn demo(store: idem::PgStore) {
/// use futures::FutureExt;
/// use http::StatusCode;
/// use idem_http::{IdempotencyConfig, StoredResponse, atomic};
///
/// let route = atomic::postgres(store, IdempotencyConfig::default(), |conn, request| {
///     async move {
///         sqlx::query("INSERT INTO orders (body) VALUES ($1)")
///             .bind(request.body().to_vec())
///             .execute(&mut *conn)
///             .await?;
///         Ok(StoredResponse::text(StatusCode::CREATED, "created"))
///     }
///     .boxed()
/// });
/// let app: axum::Router = axum::Router::new().route("/orders", axum::routing::post_service(route));
/// # }
/// ```
pub fn postgres<H>(store: PgStore, config: IdempotencyConfig, handler: H) -> PgRoute<H>
where
    H: for<'c> Fn(&'c mut PgConnection, AtomicRequest) -> BoxFuture<'c, HandlerResult>
        + Send
        + Sync
        + 'static,
{
    PgRoute {
        store,
        config: Arc::new(config),
        handler: Arc::new(handler),
    }
}

impl<H> Clone for PgRoute<H> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: Arc::clone(&self.config),
            handler: Arc::clone(&self.handler),
        }
    }
}

impl<H> fmt::Debug for PgRoute<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgRoute")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<H, B> Service<Request<B>> for PgRoute<H>
where
    H: for<'c> Fn(&'c mut PgConnection, AtomicRequest) -> BoxFuture<'c, HandlerResult>
        + Send
        + Sync
        + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let route = self.clone();
        Box::pin(async move { Ok(route.respond(request).await) })
    }
}

impl<H> PgRoute<H>
where
    H: for<'c> Fn(&'c mut PgConnection, AtomicRequest) -> BoxFuture<'c, HandlerResult>
        + Send
        + Sync
        + 'static,
{
    async fn respond<B>(self, request: Request<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mode = self.config.mode;
        let admitted = match admit(&self.config, request).await {
            Ok(admitted) => admitted,
            Err(refusal) => return refusal.to_response(mode),
        };
        let stored = self.config.stored.clone();
        let handler = Arc::clone(&self.handler);
        let request = admitted.request;
        let applied = match admitted.keyed {
            Some((scope, key, fingerprint)) => {
                self.store
                    .apply(&scope, &key, fingerprint, move |conn| {
                        async move { settle(&stored, handler(conn, request).await) }.boxed()
                    })
                    .await
            }
            None => self.keyless(request).await,
        };
        answer(applied, mode)
    }

    /// A request without a key: the handler once, in a plain transaction.
    async fn keyless(&self, request: AtomicRequest) -> Result<Applied, ApplyError<Rollback>> {
        let mut tx = self.store.pool().begin().await.map_err(failed("begin"))?;
        let answer = (self.handler)(&mut tx, request).await;
        match settle(&self.config.stored, answer) {
            Ok(outcome) => {
                tx.commit().await.map_err(failed("commit"))?;
                Ok(Applied::Fresh(outcome))
            }
            Err(rollback) => {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "rollback failed; the connection is discarded");
                }
                Err(ApplyError::Effect(rollback))
            }
        }
    }
}

/// Maps a driver error of the keyless path (where the store's own mapping is
/// not reachable) to a store error.
fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> ApplyError<Rollback> {
    move |error| {
        ApplyError::Protocol(Error::Store(StoreError::with_source(
            ErrorKind::Other,
            format!("PostgreSQL could not {what} the request's transaction"),
            error,
        )))
    }
}

//! Atomic handlers on the embedded SQLite store: the handler gets the store's
//! `BEGIN IMMEDIATE` transaction, on the store's writer thread.
//!
//! The handler is synchronous (rusqlite is) and runs on the one writer thread,
//! so every other write waits for it: keep it to SQL, and never block it on the
//! network.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::Request;
use idem::sqlite::rusqlite::{Transaction, TransactionBehavior};
use idem::{Applied, ApplyError, Error, ErrorKind, SqliteStore, StoreError};
use tower::Service;

use super::{AtomicRequest, BoxError, HandlerResult, Rollback, admit, answer, settle};
use crate::IdempotencyConfig;

/// A route whose handler's SQL commits with the stored response, on SQLite.
/// Made by [`sqlite`]; mount it with axum's `post_service` (or `route_service`).
pub struct SqliteRoute<H> {
    store: SqliteStore,
    config: Arc<IdempotencyConfig>,
    handler: Arc<H>,
}

/// An atomic route on SQLite: `handler` gets the open transaction (already
/// holding the key's claim) and the request, and its response is committed
/// with its writes. See the [module docs](crate::atomic).
pub fn sqlite<H>(store: SqliteStore, config: IdempotencyConfig, handler: H) -> SqliteRoute<H>
where
    H: Fn(&Transaction<'_>, AtomicRequest) -> HandlerResult + Send + Sync + 'static,
{
    SqliteRoute {
        store,
        config: Arc::new(config),
        handler: Arc::new(handler),
    }
}

impl<H> Clone for SqliteRoute<H> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: Arc::clone(&self.config),
            handler: Arc::clone(&self.handler),
        }
    }
}

impl<H> fmt::Debug for SqliteRoute<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRoute")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<H, B> Service<Request<B>> for SqliteRoute<H>
where
    H: Fn(&Transaction<'_>, AtomicRequest) -> HandlerResult + Send + Sync + 'static,
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

impl<H> SqliteRoute<H>
where
    H: Fn(&Transaction<'_>, AtomicRequest) -> HandlerResult + Send + Sync + 'static,
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
                    .apply(&scope, &key, fingerprint, move |tx| {
                        settle(&stored, handler(tx, request))
                    })
                    .await
            }
            None => self
                .store
                .with_connection(move |conn| {
                    let tx = conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .map_err(failed("begin"))?;
                    let outcome =
                        settle(&stored, handler(&tx, request)).map_err(ApplyError::Effect)?;
                    tx.commit().map_err(failed("commit"))?;
                    Ok(Applied::Fresh(outcome))
                })
                .await
                .unwrap_or_else(|error| Err(error.into())),
        };
        answer(applied, mode)
    }
}

/// Maps a driver error of the keyless path (where the store's own mapping is
/// not reachable) to a store error.
fn failed(what: &'static str) -> impl Fn(idem::sqlite::rusqlite::Error) -> ApplyError<Rollback> {
    move |error| {
        ApplyError::Protocol(Error::Store(StoreError::with_source(
            ErrorKind::Other,
            format!("SQLite could not {what} the request's transaction"),
            error,
        )))
    }
}

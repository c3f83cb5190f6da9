//! [`AtomicRoute`]: the tower service that runs a handler's effect inside the
//! store's transaction, written once for every [`AtomicStore`].

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::Request;
use idem_core::TxCall;
use idem_core::{Applied, AtomicEffect, AtomicStore, Outcome};
use tower::Service;

use super::{AtomicRequest, BoxError, Failure, Rollback, admit, answer, settle};
use crate::observe::{self, route_label};
use crate::{IdempotencyConfig, StatusPolicy, StoredResponse};

/// A route whose handler's writes commit with the stored response, in the
/// transaction of `S`. Made by [`route`]; mount it with axum's `post_service`
/// (or `route_service`).
pub struct AtomicRoute<S, H> {
    store: S,
    config: Arc<IdempotencyConfig>,
    handler: Arc<H>,
}

/// An atomic route on `store`: when a request's effect is to run, `handler`
/// gets the parsed [`AtomicRequest`] and returns the effect — an `async`
/// closure over the store's connection, run inside the transaction that
/// already holds the key's claim. The [`StoredResponse`] it answers is
/// committed with its writes, or everything is rolled back (see the
/// [module docs](crate::atomic)).
///
/// `handler` is a factory rather than the effect itself because an effect is
/// run once and owns what it uses (on SQLite it runs on the store's writer
/// thread): the route moves each request into the effect made for it. The
/// factory is called inside the transaction, and not at all for a duplicate
/// or a refused request.
pub fn route<S, H, F>(store: S, config: IdempotencyConfig, handler: H) -> AtomicRoute<S, H>
where
    S: AtomicStore + Clone + 'static,
    H: Fn(AtomicRequest) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, StoredResponse, Failure>,
{
    AtomicRoute {
        store,
        config: Arc::new(config),
        handler: Arc::new(handler),
    }
}

impl<S: Clone, H> Clone for AtomicRoute<S, H> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: Arc::clone(&self.config),
            handler: Arc::clone(&self.handler),
        }
    }
}

impl<S: fmt::Debug, H> fmt::Debug for AtomicRoute<S, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtomicRoute")
            .field("store", &self.store)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, H, F, B> Service<Request<B>> for AtomicRoute<S, H>
where
    S: AtomicStore + Clone + 'static,
    H: Fn(AtomicRequest) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, StoredResponse, Failure>,
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

impl<S, H, F> AtomicRoute<S, H>
where
    S: AtomicStore + Clone + 'static,
    H: Fn(AtomicRequest) -> F + Send + Sync + 'static,
    F: AtomicEffect<S::Tx, StoredResponse, Failure>,
{
    async fn respond<B>(self, request: Request<B>) -> Response
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mode = self.config.mode;
        let label = route_label(request.method(), request.uri(), request.extensions());
        let admitted = match admit(&self.config, request).await {
            Ok(admitted) => admitted,
            Err(refusal) => return refusal.to_response(mode),
        };
        let effect = effect_for(
            Arc::clone(&self.handler),
            admitted.request,
            self.config.on_status.clone(),
        );
        let keyed = admitted.keyed.is_some();
        let applied = match admitted.keyed {
            Some((scope, key, fingerprint)) => {
                self.store.apply(&scope, &key, fingerprint, effect).await
            }
            // No key on a route that does not require one: the handler runs
            // each time, committed or rolled back by the same rule.
            None => self.store.transaction(effect).await.map(Applied::Fresh),
        };
        if keyed && applied.is_ok() {
            idem_core::crash::point(idem_core::crash::BEFORE_ANSWER);
        }
        let response = answer(&self.store, applied, keyed, mode);
        if keyed {
            observe::keyed_answer(&label, &response);
        }
        response
    }
}

/// The effect the store runs for `request`: the handler's, made inside the
/// transaction, with its answer settled — a stored status becomes the outcome
/// committed with its writes; anything else rolls them back.
fn effect_for<Tx, H, F>(
    handler: Arc<H>,
    request: AtomicRequest,
    stored: StatusPolicy,
) -> impl AtomicEffect<Tx, Outcome, Rollback>
where
    Tx: ?Sized + Send + 'static,
    H: Fn(AtomicRequest) -> F + Send + Sync + 'static,
    F: AtomicEffect<Tx, StoredResponse, Failure>,
{
    async move |tx: &mut Tx| {
        let answer = TxCall::call(handler(request), tx).await;
        settle(&stored, answer)
    }
}

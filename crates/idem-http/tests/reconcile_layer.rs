//! The layer as a library user puts it in front of an axum service: a
//! handler that commits a charge and then fails with 500 (it crashed after
//! its commit). With a `Reconcile` hook that reads the service's own table,
//! the 500 is an unknown outcome and the retry gets the charge's answer; with
//! none, the 500 releases the key and the retry charges again, as the status
//! policy says. Each test counts the charges.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{Client, Server};
use futures::future::BoxFuture;
use idem::{IdempotencyKey, Scope};
use idem_http::{
    IdempotencyConfig, IdempotencyLayer, Reconcile, Reconciled, StoredResponse, parse_key,
};

/// The service's table of charges by key, and how many were made.
#[derive(Clone, Default)]
struct Ledger {
    charges: Arc<AtomicUsize>,
    by_key: Arc<Mutex<HashMap<String, usize>>>,
}

/// Commits a charge, then fails the first attempt of each key with 500.
async fn charge(State(ledger): State<Ledger>, headers: HeaderMap) -> Response {
    let key = parse_key(headers["idempotency-key"].as_bytes()).unwrap();
    let first = !ledger.by_key.lock().unwrap().contains_key(key.as_str());
    let n = ledger.charges.fetch_add(1, Ordering::SeqCst) + 1;
    ledger
        .by_key
        .lock()
        .unwrap()
        .insert(key.as_str().to_owned(), n);
    if first {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "crashed after the commit",
        )
            .into_response();
    }
    (StatusCode::CREATED, format!("charge {n}")).into_response()
}

impl Reconcile for Ledger {
    fn reconcile<'a>(
        &'a self,
        _scope: &'a Scope,
        key: &'a IdempotencyKey,
        _request: &'a http::request::Parts,
    ) -> BoxFuture<'a, Reconciled> {
        Box::pin(async move {
            match self.by_key.lock().unwrap().get(key.as_str()) {
                Some(n) => Reconciled::Applied(StoredResponse::text(
                    StatusCode::CREATED,
                    format!("charge {n}"),
                )),
                None => Reconciled::NotApplied,
            }
        })
    }
}

async fn start(reconciled: bool) -> (Ledger, Client, Server, tempfile::TempDir) {
    let ledger = Ledger::default();
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let mut layer = IdempotencyLayer::new(store, IdempotencyConfig::default());
    if reconciled {
        layer = layer.with_reconcile(ledger.clone());
    }
    let app = Router::new()
        .route("/charges", post(charge))
        .with_state(ledger.clone())
        .layer(layer);
    let server = Server::start(app).await;
    (ledger, server.client(), server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_hook_a_500_after_the_commit_is_reconciled_by_the_retry() {
    let (ledger, client, _server, _dir) = start(true).await;
    let failed = client.post("/charges").key("c-1").send().await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);

    let retried = client.post("/charges").key("c-1").send().await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    assert!(retried.replayed());
    assert_eq!(retried.header("idempotency-reconciled"), Some("true"));
    assert_eq!(retried.body.as_ref(), b"charge 1");
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1, "charged once");

    let again = client.post("/charges").key("c-1").send().await;
    assert!(again.replayed());
    assert_eq!(ledger.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_hook_a_500_releases_the_key_as_the_policy_says() {
    let (ledger, client, _server, _dir) = start(false).await;
    let failed = client.post("/charges").key("c-2").send().await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retried = client.post("/charges").key("c-2").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(
        ledger.charges.load(Ordering::SeqCst),
        2,
        "500 without a hook releases: the retry charges again"
    );
}

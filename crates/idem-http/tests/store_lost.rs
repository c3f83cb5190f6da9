//! PostgreSQL going away under a request. The test kills the backend of a
//! request's transaction while its handler waits, and checks what the client
//! hears (503 with `Retry-After`, and what a retry does) and that the retry
//! with the same key then pays exactly once. The layer in front of a store it
//! cannot reach answers the same way.

#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;

use axum::Router;
use axum::routing::{post, post_service};
use http::StatusCode;
use idem::sqlx::{self, Connection, PgConnection};
use idem::{AtomicStore, PgStore};
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, IdempotencyLayer, KeyRequirement, StoredResponse};
use tokio::sync::{Notify, mpsc};

use common::pg::PgDatabase;
use common::{Reply, Server};

/// Where a paused request's handler waits for the test: before its write, or
/// after it (so the next thing sent on the connection is the commit).
const PAUSE: &str = "x-pause";

/// A payments route whose handler, on a request with [`PAUSE`], reports its
/// backend's pid and waits for `resume` at the point the header names.
struct Payments {
    db: PgDatabase,
    server: Server,
    paused: mpsc::UnboundedReceiver<i32>,
    resume: Arc<Notify>,
}

impl Payments {
    async fn open() -> Option<Payments> {
        let db = PgDatabase::create().await?;
        let store = PgStore::connect(&db.url).await.expect("store");
        store
            .transaction(async |tx: &mut PgConnection| {
                sqlx::raw_sql("CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, note TEXT)")
                    .execute(tx)
                    .await
                    .map(drop)
            })
            .await
            .expect("payments table");
        let (report, paused) = mpsc::unbounded_channel();
        let resume = Arc::new(Notify::new());
        let waiting = Arc::clone(&resume);
        let config = IdempotencyConfig::default().require_key(KeyRequirement::Always);
        let route = atomic::route(store, config, move |request: AtomicRequest| {
            let (report, waiting) = (report.clone(), Arc::clone(&waiting));
            async move |tx: &mut PgConnection| -> HandlerResult {
                let pause = request
                    .headers()
                    .get(PAUSE)
                    .map(|v| v.to_str().unwrap_or_default().to_owned());
                if pause.is_some() {
                    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                        .fetch_one(&mut *tx)
                        .await?;
                    if pause.as_deref() == Some("after-write") {
                        pay(tx).await?;
                    }
                    report.send(pid).expect("the test listens");
                    waiting.notified().await;
                    if pause.as_deref() == Some("before-write") {
                        pay(tx).await?;
                    }
                } else {
                    pay(tx).await?;
                }
                Ok(StoredResponse::text(StatusCode::CREATED, "paid"))
            }
        });
        let server = Server::start(Router::new().route("/pay", post_service(route))).await;
        Some(Payments {
            db,
            server,
            paused,
            resume,
        })
    }

    /// Sends a payment with `key`, pausing its handler at `pause`, kills the
    /// backend of its transaction while it waits, lets it go on, and returns
    /// the answer.
    async fn pay_and_kill(&mut self, key: &str, pause: &str) -> Reply {
        let call = self
            .server
            .client()
            .post("/pay")
            .key(key)
            .header(PAUSE, pause);
        let sent = tokio::spawn(call.send());
        let pid = self.paused.recv().await.expect("the handler paused");
        let mut admin = PgConnection::connect(&self.db.url).await.expect("admin");
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .expect("terminate");
        assert!(
            killed,
            "the backend of the request's transaction was killed"
        );
        self.resume.notify_one();
        sent.await.expect("the request finished")
    }

    async fn pay(&self, key: &str) -> Reply {
        self.server.client().post("/pay").key(key).send().await
    }

    async fn payments(&self) -> i64 {
        let mut conn = PgConnection::connect(&self.db.url).await.expect("connect");
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(&mut conn)
            .await
            .expect("count")
    }
}

async fn pay(tx: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO payments (note) VALUES ('paid')")
        .execute(tx)
        .await
        .map(drop)
}

/// Checks `reply` is a 503 problem of `problem` with `Retry-After: 1` whose
/// detail says a retry with the same key is safe.
fn assert_retry_is_safe(reply: &Reply, problem: &str) {
    let detail = reply.problem(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["type"], format!("urn:idem:problem:{problem}"));
    assert_eq!(reply.retry_after(), 1);
    assert!(detail.contains("same Idempotency-Key"), "{detail}");
    assert!(detail.contains("safe"), "{detail}");
    assert!(
        !detail.contains("127.0.0.1"),
        "the server is not named: {detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_lost_mid_effect_is_503_and_the_retry_pays_once() {
    let Some(mut payments) = Payments::open().await else {
        return;
    };
    let lost = payments.pay_and_kill("pay-1", "before-write").await;
    assert_retry_is_safe(&lost, "store-unavailable");
    assert!(
        lost.json()["detail"]
            .as_str()
            .unwrap()
            .contains("nothing was kept")
    );
    assert_eq!(payments.payments().await, 0, "nothing was kept");

    let retried = payments.pay("pay-1").await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    assert!(!retried.replayed(), "the retry ran");
    let again = payments.pay("pay-1").await;
    assert!(again.replayed());
    assert_eq!(again.body, retried.body);
    assert_eq!(payments.payments().await, 1, "paid exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_lost_at_the_commit_is_outcome_unknown_and_the_retry_tells() {
    let Some(mut payments) = Payments::open().await else {
        return;
    };
    // The effect's write is done; the connection dies before the record and
    // the commit are sent, so the commit is what finds it broken.
    let lost = payments.pay_and_kill("pay-2", "after-write").await;
    assert_retry_is_safe(&lost, "commit-outcome-unknown");
    assert!(lost.json()["detail"].as_str().unwrap().contains("unknown"));

    // The server rolled back when the backend died; the retry finds no
    // record and runs.
    let retried = payments.pay("pay-2").await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    assert!(!retried.replayed());
    assert!(payments.pay("pay-2").await.replayed());
    assert_eq!(payments.payments().await, 1, "paid exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_answers_503_when_the_store_cannot_be_reached_on_claim() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let store = PgStore::connect(&db.url).await.expect("store");
    let app = Router::new()
        .route("/pay", post(|| async { (StatusCode::CREATED, "paid") }))
        .layer(IdempotencyLayer::new(
            store.clone(),
            IdempotencyConfig::default(),
        ));
    let server = Server::start(app).await;
    assert_eq!(
        server.client().post("/pay").key("k-1").send().await.status,
        StatusCode::CREATED
    );

    store.pool().close().await;
    let lost = server.client().post("/pay").key("k-2").send().await;
    assert_retry_is_safe(&lost, "store-unavailable");
}

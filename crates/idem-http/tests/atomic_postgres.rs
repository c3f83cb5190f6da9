//! Atomic handlers on PostgreSQL, over real sockets, each test in a database
//! of its own: the debit and the stored response commit together, once per key.

mod common;

use std::future::Future;
use std::pin::Pin;

use axum::Router;
use axum::routing::post_service;
use common::bank::{self, Debit, Ledger};
use common::pg::PgDatabase;
use common::{Client, Server};
use futures::FutureExt;
use futures::future::BoxFuture;
use idem::PgStore;
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement};
use sqlx::PgConnection;

fn debit(conn: &mut PgConnection, request: AtomicRequest) -> BoxFuture<'_, HandlerResult> {
    async move {
        let debit: Debit = match request.json() {
            Ok(debit) => debit,
            Err(error) => return Ok(bank::unreadable(error)),
        };
        let balance: Option<i64> =
            sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
                .bind(&debit.account)
                .fetch_optional(&mut *conn)
                .await?;
        let balance = balance.unwrap_or(0);
        if balance < debit.amount {
            return Ok(bank::insufficient(balance));
        }
        sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
            .bind(debit.amount)
            .bind(&debit.account)
            .execute(&mut *conn)
            .await?;
        let id: i64 =
            sqlx::query_scalar("INSERT INTO debits (account, amount) VALUES ($1, $2) RETURNING id")
                .bind(&debit.account)
                .bind(debit.amount)
                .fetch_one(&mut *conn)
                .await?;
        bank::debited(bank::then(&request), &debit, id, balance - debit.amount)
    }
    .boxed()
}

struct PgLedger(PgStore);

impl PgLedger {
    async fn scalar(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(self.0.pool())
            .await
            .expect("query")
    }
}

impl Ledger for PgLedger {
    fn balance(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>> {
        Box::pin(self.scalar("SELECT balance FROM accounts WHERE id = 'acc-1'"))
    }

    fn debits(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>> {
        Box::pin(self.scalar("SELECT count(*) FROM debits"))
    }
}

struct Bank {
    client: Client,
    ledger: PgLedger,
    _server: Server,
    _db: PgDatabase,
}

async fn bank() -> Option<Bank> {
    let db = PgDatabase::create().await?;
    let store = PgStore::connect(&db.url).await.expect("store");
    sqlx::raw_sql(
        "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
         CREATE TABLE debits (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);
         INSERT INTO accounts VALUES ('acc-1', 100);",
    )
    .execute(store.pool())
    .await
    .expect("schema");
    let required = IdempotencyConfig::default()
        .require_key(KeyRequirement::Always)
        .body_limit(16 * 1024);
    let app = Router::new()
        .route(
            "/debit",
            post_service(atomic::postgres(store.clone(), required, debit)),
        )
        .route(
            "/debit-optional",
            post_service(atomic::postgres(
                store.clone(),
                IdempotencyConfig::default(),
                debit,
            )),
        );
    let server = Server::start(app).await;
    Some(Bank {
        client: server.client(),
        ledger: PgLedger(store),
        _server: server,
        _db: db,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_debit_once() {
    let Some(b) = bank().await else { return };
    bank::duplicates_debit_once(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declined_debit_is_stored_and_replayed() {
    let Some(b) = bank().await else { return };
    bank::a_declined_debit_is_stored_and_replayed(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_debit_once() {
    let Some(b) = bank().await else { return };
    bank::concurrent_duplicates_debit_once(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_handler_leaves_nothing_and_the_retry_runs() {
    let Some(b) = bank().await else { return };
    bank::a_failed_handler_leaves_nothing_and_the_retry_runs(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_follow_the_table() {
    let Some(b) = bank().await else { return };
    bank::refusals_follow_the_table(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyless_requests_run_each_time_where_allowed() {
    let Some(b) = bank().await else { return };
    bank::refusals_follow_the_table(&b.client, &b.ledger).await;
    bank::keyless_requests_run_each_time_where_allowed(&b.client, &b.ledger).await;
}

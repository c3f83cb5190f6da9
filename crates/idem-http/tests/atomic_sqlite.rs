//! Atomic handlers on the embedded SQLite store, over real sockets: the debit
//! and the stored response commit together, once per key.

mod common;

use std::future::Future;
use std::pin::Pin;

use axum::Router;
use axum::routing::post_service;
use common::bank::{self, Debit, Ledger};
use common::{Client, Server};
use idem::SqliteStore;
use idem::sqlite::rusqlite::{OptionalExtension, Transaction, params};
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement};

fn debit(tx: &Transaction<'_>, request: AtomicRequest) -> HandlerResult {
    let debit: Debit = match request.json() {
        Ok(debit) => debit,
        Err(error) => return Ok(bank::unreadable(error)),
    };
    let balance: Option<i64> = tx
        .query_row(
            "SELECT balance FROM accounts WHERE id = ?1",
            [&debit.account],
            |row| row.get(0),
        )
        .optional()?;
    let balance = balance.unwrap_or(0);
    if balance < debit.amount {
        return Ok(bank::insufficient(balance));
    }
    tx.execute(
        "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2",
        params![debit.amount, debit.account],
    )?;
    tx.execute(
        "INSERT INTO debits (account, amount) VALUES (?1, ?2)",
        params![debit.account, debit.amount],
    )?;
    let id = tx.last_insert_rowid();
    bank::debited(bank::then(&request), &debit, id, balance - debit.amount)
}

struct SqliteLedger(SqliteStore);

impl SqliteLedger {
    async fn scalar(&self, sql: &'static str) -> i64 {
        self.0
            .with_connection(move |conn| conn.query_row(sql, [], |row| row.get(0)))
            .await
            .expect("store")
            .expect("query")
    }
}

impl Ledger for SqliteLedger {
    fn balance(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>> {
        Box::pin(self.scalar("SELECT balance FROM accounts WHERE id = 'acc-1'"))
    }

    fn debits(&self) -> Pin<Box<dyn Future<Output = i64> + Send + '_>> {
        Box::pin(self.scalar("SELECT count(*) FROM debits"))
    }
}

struct Bank {
    client: Client,
    ledger: SqliteLedger,
    _server: Server,
    _dir: tempfile::TempDir,
}

async fn bank() -> Bank {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("bank.db"))
        .await
        .expect("store");
    store
        .with_connection(|conn| {
            conn.execute_batch(
                "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 CREATE TABLE debits (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL);
                 INSERT INTO accounts VALUES ('acc-1', 100);",
            )
        })
        .await
        .expect("store")
        .expect("schema");
    let required = IdempotencyConfig::default()
        .require_key(KeyRequirement::Always)
        .body_limit(16 * 1024);
    let app = Router::new()
        .route(
            "/debit",
            post_service(atomic::sqlite(store.clone(), required, debit)),
        )
        .route(
            "/debit-optional",
            post_service(atomic::sqlite(
                store.clone(),
                IdempotencyConfig::default(),
                debit,
            )),
        );
    let server = Server::start(app).await;
    Bank {
        client: server.client(),
        ledger: SqliteLedger(store),
        _server: server,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_debit_once() {
    let b = bank().await;
    bank::duplicates_debit_once(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declined_debit_is_stored_and_replayed() {
    let b = bank().await;
    bank::a_declined_debit_is_stored_and_replayed(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_debit_once() {
    let b = bank().await;
    bank::concurrent_duplicates_debit_once(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_handler_leaves_nothing_and_the_retry_runs() {
    let b = bank().await;
    bank::a_failed_handler_leaves_nothing_and_the_retry_runs(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_follow_the_table() {
    let b = bank().await;
    bank::refusals_follow_the_table(&b.client, &b.ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyless_requests_run_each_time_where_allowed() {
    let b = bank().await;
    bank::refusals_follow_the_table(&b.client, &b.ledger).await;
    bank::keyless_requests_run_each_time_where_allowed(&b.client, &b.ledger).await;
}

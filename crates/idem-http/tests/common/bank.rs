//! A small bank served by an atomic route, and the scenarios every store must
//! pass. Account `acc-1` starts with 100; `POST /debit` takes
//! `{"account": "...", "amount": N}`. A request header `x-then` makes the
//! handler misbehave *after* its writes: `fail` returns a [`Failure`], and
//! `unavailable` answers 503; both must leave nothing behind.
//!
//! The debit is written once, against [`AtomicStore`]; only its SQL differs
//! between databases, behind [`Accounts`], which each store's connection
//! implements.

use std::any::Any;
use std::future::Future;

use axum::Router;
use axum::routing::post_service;
use http::StatusCode;
use idem::rusqlite::{self, OptionalExtension, params};
use idem::{AnyConnection, AnyStore, AnyTx, AtomicEffect, AtomicStore, SqliteStore};
use idem_http::atomic::{self, AtomicRequest, Failure, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinSet;

use super::{Client, Server};

/// The bank's SQL on one database, run on the connection of the store's
/// transaction.
pub(crate) trait Accounts: Send {
    /// Creates the tables and `acc-1` with 100.
    fn create(&mut self) -> impl Future<Output = Result<(), Failure>> + Send;
    /// The balance of `account`, locked until the transaction ends.
    fn balance(
        &mut self,
        account: &str,
    ) -> impl Future<Output = Result<Option<i64>, Failure>> + Send;
    /// Takes `amount` from `account` and records the debit; its id.
    fn take(
        &mut self,
        account: &str,
        amount: i64,
    ) -> impl Future<Output = Result<i64, Failure>> + Send;
    /// How many debits were recorded.
    fn debits(&mut self) -> impl Future<Output = Result<i64, Failure>> + Send;
}

impl Accounts for rusqlite::Connection {
    async fn create(&mut self) -> Result<(), Failure> {
        self.execute_batch(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE debits (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL);
             INSERT INTO accounts VALUES ('acc-1', 100);",
        )?;
        Ok(())
    }

    async fn balance(&mut self, account: &str) -> Result<Option<i64>, Failure> {
        // The store's BEGIN IMMEDIATE already serialises writers.
        let balance = self
            .query_row(
                "SELECT balance FROM accounts WHERE id = ?1",
                [account],
                |row| row.get(0),
            )
            .optional()?;
        Ok(balance)
    }

    async fn take(&mut self, account: &str, amount: i64) -> Result<i64, Failure> {
        self.execute(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2",
            params![amount, account],
        )?;
        self.execute(
            "INSERT INTO debits (account, amount) VALUES (?1, ?2)",
            params![account, amount],
        )?;
        Ok(self.last_insert_rowid())
    }

    async fn debits(&mut self) -> Result<i64, Failure> {
        Ok(self.query_row("SELECT count(*) FROM debits", [], |row| row.get(0))?)
    }
}

#[cfg(feature = "postgres")]
impl Accounts for idem::sqlx::PgConnection {
    async fn create(&mut self) -> Result<(), Failure> {
        idem::sqlx::raw_sql(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
             CREATE TABLE debits (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);
             INSERT INTO accounts VALUES ('acc-1', 100);",
        )
        .execute(&mut *self)
        .await?;
        Ok(())
    }

    async fn balance(&mut self, account: &str) -> Result<Option<i64>, Failure> {
        let balance =
            idem::sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
                .bind(account)
                .fetch_optional(&mut *self)
                .await?;
        Ok(balance)
    }

    async fn take(&mut self, account: &str, amount: i64) -> Result<i64, Failure> {
        idem::sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
            .bind(amount)
            .bind(account)
            .execute(&mut *self)
            .await?;
        let id = idem::sqlx::query_scalar(
            "INSERT INTO debits (account, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(account)
        .bind(amount)
        .fetch_one(&mut *self)
        .await?;
        Ok(id)
    }

    async fn debits(&mut self) -> Result<i64, Failure> {
        let count = idem::sqlx::query_scalar("SELECT count(*) FROM debits")
            .fetch_one(&mut *self)
            .await?;
        Ok(count)
    }
}

/// The same call on whichever connection an [`AnyStore`](idem::AnyStore)
/// effect got.
macro_rules! on_any {
    ($tx:expr, $conn:ident => $call:expr) => {
        match $tx.connection() {
            AnyConnection::Sqlite($conn) => $call,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres($conn) => $call,
        }
    };
}

impl Accounts for dyn AnyTx {
    async fn create(&mut self) -> Result<(), Failure> {
        on_any!(self, conn => conn.create().await)
    }

    async fn balance(&mut self, account: &str) -> Result<Option<i64>, Failure> {
        on_any!(self, conn => conn.balance(account).await)
    }

    async fn take(&mut self, account: &str, amount: i64) -> Result<i64, Failure> {
        on_any!(self, conn => conn.take(account, amount).await)
    }

    async fn debits(&mut self) -> Result<i64, Failure> {
        on_any!(self, conn => conn.debits().await)
    }
}

/// A store the bank runs on: one whose connection speaks [`Accounts`].
pub(crate) trait BankStore: AtomicStore<Tx: Accounts> + Clone + 'static {}

impl<S: AtomicStore<Tx: Accounts> + Clone + 'static> BankStore for S {}

#[derive(Debug, Deserialize)]
pub(crate) struct Debit {
    pub account: String,
    pub amount: i64,
}

/// The handler: the debit's effect for one request.
pub(crate) fn debit<Tx>(request: AtomicRequest) -> impl AtomicEffect<Tx, StoredResponse, Failure>
where
    Tx: Accounts + ?Sized + 'static,
{
    async move |tx: &mut Tx| -> HandlerResult {
        let debit: Debit = match request.json() {
            Ok(debit) => debit,
            Err(error) => return Ok(unreadable(error)),
        };
        let balance = tx.balance(&debit.account).await?.unwrap_or(0);
        if balance < debit.amount {
            return Ok(insufficient(balance));
        }
        let id = tx.take(&debit.account, debit.amount).await?;
        debited(then(&request), &debit, id, balance - debit.amount)
    }
}

/// What the handler does after its writes.
enum Then {
    Answer,
    Fail,
    Unavailable,
}

fn then(request: &AtomicRequest) -> Then {
    match request
        .headers()
        .get("x-then")
        .and_then(|v| v.to_str().ok())
    {
        Some("fail") => Then::Fail,
        Some("unavailable") => Then::Unavailable,
        _ => Then::Answer,
    }
}

/// The answer after a debit of `debit` to `balance` (the new balance).
fn debited(then: Then, debit: &Debit, id: i64, balance: i64) -> HandlerResult {
    match then {
        Then::Answer => Ok(StoredResponse::json(
            StatusCode::CREATED,
            &json!({ "debit": id, "account": debit.account, "amount": debit.amount, "balance": balance }),
        )),
        Then::Fail => Err(Failure::new("injected failure after the writes")),
        Then::Unavailable => Ok(StoredResponse::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "try later",
        )),
    }
}

fn insufficient(balance: i64) -> StoredResponse {
    StoredResponse::json(
        StatusCode::PAYMENT_REQUIRED,
        &json!({ "error": "insufficient funds", "balance": balance }),
    )
}

fn unreadable(error: serde_json::Error) -> StoredResponse {
    StoredResponse::json(
        StatusCode::BAD_REQUEST,
        &json!({ "error": error.to_string() }),
    )
}

/// The bank served on a real socket: `/debit` requires a key (body limit
/// 16 KiB), `/debit-optional` does not.
pub(crate) struct Bank<S> {
    pub client: Client,
    store: S,
    _server: Server,
    _database: Box<dyn Any + Send + Sync>,
}

impl Bank<SqliteStore> {
    /// The bank on a SQLite file in a temporary directory.
    pub(crate) async fn sqlite() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("bank.db"))
            .await
            .expect("store");
        Some(Bank::open(store, dir).await)
    }
}

impl Bank<AnyStore> {
    /// The bank on a SQLite file behind an [`AnyStore`], whose effects get
    /// `&mut dyn AnyTx`.
    pub(crate) async fn any_sqlite() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let location = format!("sqlite://{}", dir.path().join("bank.db").display())
            .parse()
            .expect("location");
        let store = AnyStore::open(&location).await.expect("store");
        Some(Bank::open(store, dir).await)
    }
}

#[cfg(feature = "postgres")]
impl Bank<idem::PgStore> {
    /// The bank on a PostgreSQL database of its own; `None` when the server
    /// cannot be reached and services are not required.
    pub(crate) async fn postgres() -> Option<Self> {
        let db = super::pg::PgDatabase::create().await?;
        let store = idem::PgStore::connect(&db.url).await.expect("store");
        Some(Bank::open(store, db).await)
    }
}

impl<S: BankStore> Bank<S> {
    /// Creates the bank's tables on `store` and serves it; `database` is kept
    /// until the bank is dropped.
    pub(crate) async fn open(store: S, database: impl Any + Send + Sync) -> Self {
        store
            .transaction(async |tx: &mut S::Tx| tx.create().await)
            .await
            .expect("schema");
        let required = IdempotencyConfig::default()
            .require_key(KeyRequirement::Always)
            .body_limit(16 * 1024);
        let app = Router::new()
            .route(
                "/debit",
                post_service(atomic::route(store.clone(), required, debit)),
            )
            .route(
                "/debit-optional",
                post_service(atomic::route(
                    store.clone(),
                    IdempotencyConfig::default(),
                    debit,
                )),
            );
        let server = Server::start(app).await;
        Bank {
            client: server.client(),
            store,
            _server: server,
            _database: Box::new(database),
        }
    }

    /// The balance of `acc-1`.
    pub(crate) async fn balance(&self) -> i64 {
        self.store
            .transaction(async |tx: &mut S::Tx| tx.balance("acc-1").await)
            .await
            .expect("balance")
            .expect("acc-1 exists")
    }

    /// How many debits were recorded.
    pub(crate) async fn debits(&self) -> i64 {
        self.store
            .transaction(async |tx: &mut S::Tx| tx.debits().await)
            .await
            .expect("debits")
    }
}

fn body(amount: i64) -> serde_json::Value {
    json!({ "account": "acc-1", "amount": amount })
}

pub(crate) async fn duplicates_debit_once<S: BankStore>(bank: &Bank<S>) {
    let client = &bank.client;
    let first = client
        .post("/debit")
        .key("pay-1")
        .json(&body(30))
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(!first.replayed());
    assert_eq!(first.json()["balance"], 70);
    for _ in 0..3 {
        let again = client
            .post("/debit")
            .key("pay-1")
            .json(&body(30))
            .send()
            .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("content-type"), Some("application/json"));
    }
    assert_eq!(bank.balance().await, 70);
    assert_eq!(bank.debits().await, 1);

    let second = client
        .post("/debit")
        .key("pay-2")
        .json(&body(20))
        .send()
        .await;
    assert_eq!(second.json()["balance"], 50);
    assert_eq!(bank.balance().await, 50);
    assert_eq!(bank.debits().await, 2);
}

pub(crate) async fn a_declined_debit_is_stored_and_replayed<S: BankStore>(bank: &Bank<S>) {
    let client = &bank.client;
    let declined = client
        .post("/debit")
        .key("big")
        .json(&body(500))
        .send()
        .await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let again = client
        .post("/debit")
        .key("big")
        .json(&body(500))
        .send()
        .await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(again.body, declined.body);
    assert_eq!(bank.balance().await, 100);
    assert_eq!(bank.debits().await, 0);
}

pub(crate) async fn concurrent_duplicates_debit_once<S: BankStore>(bank: &Bank<S>) {
    let mut calls = JoinSet::new();
    for _ in 0..64 {
        let client = bank.client.clone();
        calls.spawn(async move {
            client
                .post("/debit")
                .key("race")
                .json(&body(10))
                .send()
                .await
        });
    }
    let replies = calls.join_all().await;
    let fresh: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one debit ran");
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.body, fresh[0].body),
            StatusCode::CONFLICT => assert!(reply.retry_after() >= 1),
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert_eq!(bank.balance().await, 90);
    assert_eq!(bank.debits().await, 1);
}

pub(crate) async fn a_failed_handler_leaves_nothing_and_the_retry_runs<S: BankStore>(
    bank: &Bank<S>,
) {
    let client = &bank.client;
    let failed = client
        .post("/debit")
        .key("f")
        .header("x-then", "fail")
        .json(&body(10))
        .send()
        .await;
    let detail = failed.problem(StatusCode::INTERNAL_SERVER_ERROR);
    assert!(detail.contains("retry"), "{detail}");
    assert!(
        !detail.contains("injected"),
        "the error itself is not sent: {detail}"
    );
    assert_eq!(bank.balance().await, 100);
    assert_eq!(bank.debits().await, 0);

    let unavailable = client
        .post("/debit")
        .key("f")
        .header("x-then", "unavailable")
        .json(&body(10))
        .send()
        .await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(unavailable.body.as_ref(), b"try later");
    assert_eq!(bank.balance().await, 100);
    assert_eq!(bank.debits().await, 0);

    let retried = client.post("/debit").key("f").json(&body(10)).send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(bank.balance().await, 90);
    assert_eq!(bank.debits().await, 1);
}

pub(crate) async fn refusals_follow_the_table<S: BankStore>(bank: &Bank<S>) {
    let client = &bank.client;
    client.post("/debit").key("k").json(&body(10)).send().await;
    let reused = client.post("/debit").key("k").json(&body(11)).send().await;
    reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let missing = client.post("/debit").json(&body(10)).send().await;
    missing.problem(StatusCode::BAD_REQUEST);
    let malformed = client
        .post("/debit")
        .raw_key(b"")
        .json(&body(10))
        .send()
        .await;
    malformed.problem(StatusCode::BAD_REQUEST);
    let big = client
        .post("/debit")
        .key("huge")
        .bytes(vec![b' '; 32 * 1024])
        .send()
        .await;
    big.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(bank.balance().await, 90);
    assert_eq!(bank.debits().await, 1);
}

pub(crate) async fn keyless_requests_run_each_time_where_allowed<S: BankStore>(bank: &Bank<S>) {
    let client = &bank.client;
    // After `refusals_follow_the_table`: 90, one debit.
    refusals_follow_the_table(bank).await;
    for _ in 0..2 {
        let reply = client.post("/debit-optional").json(&body(5)).send().await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed());
    }
    let failed = client
        .post("/debit-optional")
        .header("x-then", "fail")
        .json(&body(5))
        .send()
        .await;
    failed.problem(StatusCode::INTERNAL_SERVER_ERROR);
    let unavailable = client
        .post("/debit-optional")
        .header("x-then", "unavailable")
        .json(&body(5))
        .send()
        .await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    // Two more of 5; the failed and the unavailable one left nothing.
    assert_eq!(bank.balance().await, 80);
    assert_eq!(bank.debits().await, 3);
}

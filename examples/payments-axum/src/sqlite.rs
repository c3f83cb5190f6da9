//! The payments on the embedded SQLite store: the schema, the debit (an atomic
//! handler, run on the store's writer inside its transaction) and the balance.

use axum::Router;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::{get, post_service};
use idem::SqliteStore;
use idem::sqlite::rusqlite::{OptionalExtension, Transaction, params};
use idem_http::IdempotencyConfig;
use idem_http::atomic::{self, AtomicRequest, HandlerResult};

use crate::payment::{self, BalanceQuery};

/// Creates the tables and the demo account if they are missing.
pub async fn prepare(store: &SqliteStore) -> anyhow::Result<()> {
    let (account, balance) = crate::DEMO_ACCOUNT;
    store
        .with_connection(move |conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL);",
            )?;
            conn.execute(
                "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, ?2)",
                params![account, balance],
            )
        })
        .await??;
    Ok(())
}

pub fn router(store: SqliteStore, config: IdempotencyConfig) -> Router {
    Router::new()
        .route(
            "/payments",
            post_service(atomic::sqlite(store.clone(), config, debit)),
        )
        .route("/balance", get(balance))
        .with_state(store)
}

/// Debits the account once; runs inside the idempotency record's transaction.
fn debit(tx: &Transaction<'_>, request: AtomicRequest) -> HandlerResult {
    let payment = match payment::parse(request.body()) {
        Ok(payment) => payment,
        Err(problem) => return Ok(payment::invalid(problem)),
    };
    let balance: Option<i64> = tx
        .query_row(
            "SELECT balance FROM accounts WHERE id = ?1",
            [&payment.account],
            |row| row.get(0),
        )
        .optional()?;
    let Some(balance) = balance else {
        return Ok(payment::unknown_account(&payment));
    };
    if balance < payment.amount {
        return Ok(payment::declined(&payment, balance));
    }
    tx.execute(
        "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2",
        params![payment.amount, payment.account],
    )?;
    tx.execute(
        "INSERT INTO payments (account, amount) VALUES (?1, ?2)",
        params![payment.account, payment.amount],
    )?;
    Ok(payment::taken(
        tx.last_insert_rowid(),
        &payment,
        balance - payment.amount,
    ))
}

async fn balance(
    State(store): State<SqliteStore>,
    Query(query): Query<BalanceQuery>,
) -> impl IntoResponse {
    let account = query.account().to_owned();
    let read = {
        let account = account.clone();
        store
            .with_connection(move |conn| {
                conn.query_row(
                    "SELECT balance FROM accounts WHERE id = ?1",
                    [account],
                    |row| row.get::<_, i64>(0),
                )
                .optional()
            })
            .await
    };
    match read {
        Ok(Ok(found)) => payment::balance(&account, found).into_response(),
        Ok(Err(error)) => internal(error).into_response(),
        Err(error) => internal(error).into_response(),
    }
}

fn internal(error: impl std::fmt::Display) -> impl IntoResponse {
    tracing::error!(%error, "reading the balance failed");
    axum::http::StatusCode::INTERNAL_SERVER_ERROR
}

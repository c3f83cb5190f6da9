//! The payments on PostgreSQL: the schema, the debit (an atomic handler, run on
//! the connection of the idempotency record's transaction) and the balance.

use axum::Router;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::{get, post_service};
use futures::FutureExt;
use futures::future::BoxFuture;
use idem::PgStore;
use idem_http::IdempotencyConfig;
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use sqlx::PgConnection;

use crate::payment::{self, BalanceQuery};

/// Creates the tables and the demo account if they are missing.
pub async fn prepare(store: &PgStore) -> anyhow::Result<()> {
    let (account, balance) = crate::DEMO_ACCOUNT;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
         CREATE TABLE IF NOT EXISTS payments (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);",
    )
    .execute(store.pool())
    .await?;
    sqlx::query("INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING")
        .bind(account)
        .bind(balance)
        .execute(store.pool())
        .await?;
    Ok(())
}

pub fn router(store: PgStore, config: IdempotencyConfig) -> Router {
    Router::new()
        .route(
            "/payments",
            post_service(atomic::postgres(store.clone(), config, debit)),
        )
        .route("/balance", get(balance))
        .with_state(store)
}

/// Debits the account once; runs inside the idempotency record's transaction.
fn debit(conn: &mut PgConnection, request: AtomicRequest) -> BoxFuture<'_, HandlerResult> {
    async move {
        let payment = match payment::parse(request.body()) {
            Ok(payment) => payment,
            Err(problem) => return Ok(payment::invalid(problem)),
        };
        // FOR UPDATE: two different payments from one account serialise here.
        let balance: Option<i64> =
            sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
                .bind(&payment.account)
                .fetch_optional(&mut *conn)
                .await?;
        let Some(balance) = balance else {
            return Ok(payment::unknown_account(&payment));
        };
        if balance < payment.amount {
            return Ok(payment::declined(&payment, balance));
        }
        sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
            .bind(payment.amount)
            .bind(&payment.account)
            .execute(&mut *conn)
            .await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO payments (account, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(&payment.account)
        .bind(payment.amount)
        .fetch_one(&mut *conn)
        .await?;
        Ok(payment::taken(id, &payment, balance - payment.amount))
    }
    .boxed()
}

async fn balance(
    State(store): State<PgStore>,
    Query(query): Query<BalanceQuery>,
) -> impl IntoResponse {
    let account = query.account();
    let read: Result<Option<i64>, sqlx::Error> =
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(store.pool())
            .await;
    match read {
        Ok(found) => payment::balance(account, found).into_response(),
        Err(error) => {
            tracing::error!(%error, "reading the balance failed");
            axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

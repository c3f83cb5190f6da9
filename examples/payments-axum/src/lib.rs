//! The payments example: `POST /payments` debits an account once per
//! `Idempotency-Key`, `GET /balance` shows what is left.
//!
//! The debit is an [atomic route](idem_http::atomic): its `UPDATE` and
//! `INSERT` and the stored response commit in the same transaction as the
//! idempotency record, on SQLite or PostgreSQL. A retry of a debit that
//! committed gets the stored response; one that did not commit runs again.
//!
//! The API is written once, against [`AtomicStore`](idem::AtomicStore); only
//! its SQL is written per database. Modules:
//! - `payment`: the request and responses;
//! - `accounts`: the SQL, once for SQLite and once for PostgreSQL, behind one
//!   trait that each store's connection implements;
//! - `routes`: the debit (an atomic route) and the balance, on any store.

#![forbid(unsafe_code)]

mod accounts;
mod payment;
mod routes;

use std::future::Future;

use axum::Router;
use idem::{PgStore, SqliteStore, StoreLocation};
use idem_http::{IdempotencyConfig, KeyRequirement};
use routes::PaymentStore;

/// The account every fresh database starts with, and its balance in cents.
pub const DEMO_ACCOUNT: (&str, i64) = ("acc-1", 10_000);

/// The API on the database at `location`, schema created and the demo account
/// opened if they are missing.
pub async fn app(location: &StoreLocation) -> anyhow::Result<Router> {
    // Every POST /payments must carry a key: a debit without one could not be
    // retried safely.
    let config = IdempotencyConfig::default().require_key(KeyRequirement::Always);
    match location {
        StoreLocation::Sqlite(path) => api_on(SqliteStore::open(path).await?, config).await,
        StoreLocation::Postgres(url) => api_on(PgStore::connect(url).await?, config).await,
        StoreLocation::Redis(_) => anyhow::bail!(
            "{location} is a Redis store, which holds records only: the payments API debits in the transaction of its idempotency record (atomic mode), so give it a sqlite:// or postgres:// store"
        ),
        StoreLocation::DynamoDb(_) => anyhow::bail!(
            "{location} is a DynamoDB table: the payments API debits with SQL in the transaction of its idempotency record (atomic mode), so give it a sqlite:// or postgres:// store"
        ),
    }
}

/// The API on `store`, once its tables are there.
async fn api_on<S: PaymentStore>(store: S, config: IdempotencyConfig) -> anyhow::Result<Router> {
    routes::prepare(&store).await?;
    Ok(routes::router(store, config))
}

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn run(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

//! The payments example: `POST /payments` debits an account once per
//! `Idempotency-Key`, `GET /balance` shows what is left.
//!
//! The debit is an [atomic handler](idem_http::atomic): its `UPDATE` and
//! `INSERT` and the stored response commit in the same transaction as the
//! idempotency record, on SQLite or PostgreSQL. A retry of a debit that
//! committed gets the stored response; one that did not commit runs again.
//!
//! Modules:
//! - `payment`: the request and responses, the same on both databases;
//! - `sqlite`, `postgres`: the schema, the debit and the balance on each database.

#![forbid(unsafe_code)]

mod payment;
mod postgres;
mod sqlite;

use std::future::Future;

use axum::Router;
use idem::{PgStore, SqliteStore, StoreLocation};
use idem_http::{IdempotencyConfig, KeyRequirement};

/// The account every fresh database starts with, and its balance in cents.
pub const DEMO_ACCOUNT: (&str, i64) = ("acc-1", 10_000);

/// The API on the database at `location`, schema created and the demo account
/// opened if they are missing.
pub async fn app(location: &StoreLocation) -> anyhow::Result<Router> {
    // Every POST /payments must carry a key: a debit without one could not be
    // retried safely.
    let config = IdempotencyConfig::default().require_key(KeyRequirement::Always);
    Ok(match location {
        StoreLocation::Sqlite(path) => {
            let store = SqliteStore::open(path).await?;
            sqlite::prepare(&store).await?;
            sqlite::router(store, config)
        }
        StoreLocation::Postgres(url) => {
            let store = PgStore::connect(url).await?;
            postgres::prepare(&store).await?;
            postgres::router(store, config)
        }
    })
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

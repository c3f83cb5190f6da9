//! For unit tests that need a server but no tables: a connection to the
//! server's maintenance database, or `None` (after reporting it) when the
//! server cannot be reached and services are not required.

use sqlx::{Connection, PgConnection};

/// A connection to `IDEM_TEST_POSTGRES_URL`, by default
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub(crate) async fn connect() -> Option<PgConnection> {
    let url = std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    match PgConnection::connect(&url).await {
        Ok(conn) => Some(conn),
        Err(error) => {
            idem_testkit::services::missing_service("PostgreSQL", &error.to_string());
            None
        }
    }
}

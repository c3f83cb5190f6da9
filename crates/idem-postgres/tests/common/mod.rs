//! A fresh PostgreSQL database per test, dropped when the test ends (even when
//! it fails), plus the small bank the tests' effects write to.
//!
//! The server is `IDEM_TEST_POSTGRES_URL` if set, else
//! `postgres://postgres@127.0.0.1:5432/postgres`. When it cannot be reached the
//! test is skipped with a message, unless `IDEM_REQUIRE_SERVICES` is set (as in
//! CI), which makes it fail.

#![allow(dead_code)]

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use idem_core::{ManualClock, Settings, Timestamp};
use idem_postgres::PgStore;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// A throwaway database.
pub struct TestDb {
    /// URL of the database.
    pub url: String,
    admin_url: String,
    name: String,
}

fn admin_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A connection to the server's maintenance database, or `None` (after
/// reporting it) when the server cannot be reached.
pub async fn admin() -> Option<PgConnection> {
    match PgConnection::connect(&admin_url()).await {
        Ok(conn) => Some(conn),
        Err(error) => {
            idem_testkit::services::missing_service("PostgreSQL", &error.to_string());
            None
        }
    }
}

/// `url` with its database replaced by `database`.
pub fn server_url_with(database: &str) -> String {
    with_database(&admin_url(), database)
}

fn with_database(url: &str, database: &str) -> String {
    let base = url.rsplit_once('/').map(|(base, _)| base).unwrap_or(url);
    format!("{base}/{database}")
}

impl TestDb {
    /// Creates `idem_t_<random hex>` and a bank table in it:
    /// `accounts(id, balance)` with account 1 holding 100. `None` when the
    /// server cannot be reached and services are not required.
    pub async fn new() -> Option<TestDb> {
        let mut admin = admin().await?;
        let admin_url = admin_url();
        let name = format!(
            "idem_t_{:016x}",
            RandomState::new().hash_one(std::process::id())
        );
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let db = TestDb {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
        };
        let mut conn = PgConnection::connect(&db.url)
            .await
            .expect("connect test db");
        sqlx::raw_sql(
            "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
             INSERT INTO accounts VALUES (1, 100);",
        )
        .execute(&mut conn)
        .await
        .expect("create accounts");
        conn.close().await.ok();
        Some(db)
    }

    /// A migrated store with default settings and the system clock.
    pub async fn store(&self) -> PgStore {
        PgStore::connect(&self.url).await.expect("connect store")
    }

    /// A migrated store reading `clock`, with a 60 s lease and a 1 h retention.
    pub async fn store_at(&self, clock: &ManualClock) -> PgStore {
        PgStore::builder(&self.url)
            .clock(Arc::new(clock.clone()))
            .settings(
                Settings::default()
                    .with_lease(std::time::Duration::from_secs(60))
                    .with_retention(std::time::Duration::from_secs(3600)),
            )
            .connect()
            .await
            .expect("connect store")
    }

    /// The balance of account `id`.
    pub async fn balance(&self, store: &PgStore, id: i32) -> i64 {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .expect("read balance")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop may run inside the test's runtime: do the async work on a thread
        // with its own.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&admin_url).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                admin.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

/// A manual clock at a fixed, realistic time.
pub fn clock() -> ManualClock {
    let clock = ManualClock::new(0);
    clock.set(Timestamp(1_750_000_000_000));
    clock
}

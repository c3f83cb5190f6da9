//! A fresh PostgreSQL database per test, dropped when the test ends (even when
//! it fails), plus the small bank the tests' effects write to.
//!
//! The server is `IDEM_TEST_POSTGRES_URL` if set, else
//! `postgres://postgres@127.0.0.1:5432/postgres`. When it cannot be reached the
//! test is skipped with a message, unless `IDEM_REQUIRE_SERVICES` is set (as in
//! CI), which makes it fail.

#![allow(dead_code)]

use std::sync::Arc;

use idem_core::{ManualClock, Settings, Timestamp};
use idem_postgres::PgStore;
use idem_testkit::postgres::TestDatabase;
use sqlx::{Connection, PgConnection};

/// A throwaway database (see `idem_testkit::postgres`) with a small bank in it.
pub(crate) struct TestDb {
    /// URL of the database.
    pub url: String,
    _database: TestDatabase,
}

fn admin_url() -> String {
    idem_testkit::postgres::server_url()
}

/// A connection to the server's maintenance database, or `None` (after
/// reporting it) when the server cannot be reached.
pub(crate) async fn admin() -> Option<PgConnection> {
    match PgConnection::connect(&admin_url()).await {
        Ok(conn) => Some(conn),
        Err(error) => {
            idem_testkit::services::missing_service("PostgreSQL", &error.to_string());
            None
        }
    }
}

/// `url` with its database replaced by `database`.
pub(crate) fn server_url_with(database: &str) -> String {
    with_database(&admin_url(), database)
}

fn with_database(url: &str, database: &str) -> String {
    idem_testkit::postgres::with_database(url, database)
}

impl TestDb {
    /// Creates `idem_t_<random hex>` and a bank table in it:
    /// `accounts(id, balance)` with account 1 holding 100. `None` when the
    /// server cannot be reached and services are not required.
    pub(crate) async fn new() -> Option<TestDb> {
        let database = TestDatabase::create("idem_t").await?;
        let db = TestDb {
            url: database.url().to_owned(),
            _database: database,
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
    pub(crate) async fn store(&self) -> PgStore {
        PgStore::connect(&self.url).await.expect("connect store")
    }

    /// A migrated store reading `clock`, with a 60 s lease and a 1 h retention.
    pub(crate) async fn store_at(&self, clock: &ManualClock) -> PgStore {
        self.store_with(clock, false).await
    }

    /// As [`store_at`](Self::store_at), with leased claims and completions
    /// committed in groups.
    #[allow(dead_code)]
    pub(crate) async fn grouped_store_at(&self, clock: &ManualClock) -> PgStore {
        self.store_with(clock, true).await
    }

    async fn store_with(&self, clock: &ManualClock, group_commit: bool) -> PgStore {
        PgStore::builder(&self.url)
            .group_commit(group_commit)
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
    pub(crate) async fn balance(&self, store: &PgStore, id: i32) -> i64 {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .expect("read balance")
    }
}

/// A manual clock at a fixed, realistic time.
pub(crate) fn clock() -> ManualClock {
    let clock = ManualClock::new(0);
    clock.set(Timestamp(1_750_000_000_000));
    clock
}

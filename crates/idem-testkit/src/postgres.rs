//! A fresh PostgreSQL database per test, dropped when the test ends (even when
//! it fails), so tests never share state.
//!
//! The server is `IDEM_TEST_POSTGRES_URL` if set, else
//! `postgres://postgres@127.0.0.1:5432/postgres`. When it cannot be reached the
//! test is skipped with a message, unless `IDEM_REQUIRE_SERVICES` is set (as in
//! CI), which makes it fail.

use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};

use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The server tests create their databases on.
pub fn server_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

/// A database of its own for one test; dropped with the value.
#[derive(Debug)]
pub struct TestDatabase {
    url: String,
    name: String,
}

impl TestDatabase {
    /// Creates `<prefix>_<random hex>`; `None` (after saying so) when the server
    /// cannot be reached and services are not required.
    pub async fn create(prefix: &str) -> Option<TestDatabase> {
        let mut admin = match PgConnection::connect(&server_url()).await {
            Ok(admin) => admin,
            Err(error) => {
                crate::services::missing_service("PostgreSQL", &error.to_string());
                return None;
            }
        };
        let name = format!(
            "{prefix}_{:016x}",
            RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
        );
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        admin.close().await.ok();
        Some(TestDatabase {
            url: with_database(&server_url(), &name),
            name,
        })
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop may run inside the test's runtime: use a thread with its own.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&server_url()).await?;
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

/// Where Debian and Ubuntu install the PostgreSQL server programs, one
/// directory per major version.
pub const INSTALLED_SERVERS: &str = "/usr/lib/postgresql";

/// The newest `ROOT/VERSION/bin` that has `initdb`, `pg_ctl` and `postgres`,
/// for a test or a campaign that starts a PostgreSQL server of its own.
pub fn server_binaries(root: &Path) -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            let complete = ["initdb", "pg_ctl", "postgres"]
                .iter()
                .all(|program| bin.join(program).is_file());
            complete.then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

//! The store a test runs `idem` on, made for the test and removed after it:
//! an SQLite file in a temporary directory, a PostgreSQL database of its own
//! (on `IDEM_TEST_POSTGRES_URL`), a key prefix of its own on the machine's
//! Redis, one node or a cluster, or a table of its own on moto's DynamoDB
//! (left to moto, which keeps its tables in memory). Every process-level
//! test makes its store here.

use std::path::Path;

use idem::{AnyStore, StoreLocation};
use idem_testkit::postgres::TestDatabase;

/// A store of the test's own, kept (its directory, its database) as long as
/// the value lives.
pub(crate) struct TestStore {
    /// The store's URL, as `--store` takes it.
    pub(crate) url: String,
    _dir: Option<tempfile::TempDir>,
    _database: Option<TestDatabase>,
}

impl TestStore {
    /// An SQLite file in a temporary directory of its own.
    pub(crate) fn sqlite() -> TestStore {
        let dir = tempfile::tempdir().unwrap();
        TestStore {
            url: sqlite_in(dir.path()),
            _dir: Some(dir),
            _database: None,
        }
    }

    /// A PostgreSQL database named `<prefix>_<random>`, dropped after the
    /// test; `None` when the server cannot be reached and services are not
    /// required.
    pub(crate) async fn postgres(prefix: &str) -> Option<TestStore> {
        let database = TestDatabase::create(prefix).await?;
        Some(TestStore {
            url: database.url().to_owned(),
            _dir: None,
            _database: Some(database),
        })
    }

    /// The machine's Redis with a key prefix of the test's own; `None` when
    /// it does not answer.
    pub(crate) fn redis(prefix: &str) -> Option<TestStore> {
        if !idem_testkit::redis::machine_redis_answers() {
            return None;
        }
        let prefix = idem_testkit::redis::test_prefix(prefix);
        Some(TestStore {
            url: format!("{}?prefix={prefix}", idem_testkit::redis::redis_url()),
            _dir: None,
            _database: None,
        })
    }

    /// The machine's Redis Cluster with a key prefix of the test's own;
    /// `None` when it does not answer.
    pub(crate) fn redis_cluster(prefix: &str) -> Option<TestStore> {
        if !idem_testkit::redis::machine_cluster_answers() {
            return None;
        }
        let prefix = idem_testkit::redis::test_prefix(prefix);
        Some(TestStore {
            url: format!(
                "{}?prefix={prefix}",
                idem_testkit::redis::redis_cluster_url()
            ),
            _dir: None,
            _database: None,
        })
    }

    /// A table of its own on moto's DynamoDB (`idem_testkit::dynamodb`),
    /// created by the first command or library call that opens it; `None`
    /// when moto does not answer.
    pub(crate) fn dynamodb(name: &str) -> Option<TestStore> {
        Some(TestStore {
            url: idem_testkit::dynamodb::fresh_table_url(name)?,
            _dir: None,
            _database: None,
        })
    }

    /// The SQL stores: SQLite, and PostgreSQL unless it is missing and not
    /// required.
    pub(crate) async fn sqlite_and_postgres(prefix: &str) -> Vec<TestStore> {
        let mut stores = vec![TestStore::sqlite()];
        stores.extend(TestStore::postgres(prefix).await);
        stores
    }

    /// Where the store is.
    pub(crate) fn location(&self) -> StoreLocation {
        self.url.parse().unwrap()
    }

    /// The store, opened through the library as an application opens it
    /// (its schema created).
    pub(crate) async fn open(&self) -> AnyStore {
        AnyStore::open(&self.location()).await.unwrap()
    }
}

/// The URL of the SQLite store in `dir`, `sqlite://DIR/idem.db`, for a test
/// whose temporary directory holds other files too (a spool, a history).
pub(crate) fn sqlite_in(dir: &Path) -> String {
    sqlite_url(&dir.join("idem.db"))
}

/// The URL of an SQLite file, as `--store` takes it.
pub(crate) fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

//! A fresh PostgreSQL database per test (see `idem_testkit::postgres`).

use idem_testkit::postgres::TestDatabase;

/// A database of its own for one test.
pub(crate) struct PgDatabase {
    /// Its URL.
    pub url: String,
    _database: TestDatabase,
}

impl PgDatabase {
    /// Creates `idem_http_t_<random>`; `None` (after saying so) when the server
    /// cannot be reached and services are not required.
    pub(crate) async fn create() -> Option<PgDatabase> {
        let database = TestDatabase::create("idem_http_t").await?;
        Some(PgDatabase {
            url: database.url().to_owned(),
            _database: database,
        })
    }
}

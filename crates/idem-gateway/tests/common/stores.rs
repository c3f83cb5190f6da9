//! A fresh store of each kind for the tests that run on SQLite, PostgreSQL
//! (directly and through a PgBouncer in transaction pooling mode), Redis and
//! DynamoDB (moto's, a table per test) alike, and the macro that runs a case
//! on each.

use std::sync::Arc;

use idem::{AnyStore, SharedClock, StoreLocation, SystemClock};
use idem_http::IdempotencyConfig;

/// Runs a case on each store, as tests named after the store.
#[allow(unused_macros)]
macro_rules! on_each_store {
    ($case:ident) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$case($crate::common::stores::Kind::Sqlite).await
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$case($crate::common::stores::Kind::Postgres).await
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pgbouncer() {
                super::$case($crate::common::stores::Kind::PgBouncer).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$case($crate::common::stores::Kind::Redis).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dynamodb() {
                super::$case($crate::common::stores::Kind::DynamoDb).await
            }
        }
    };
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Sqlite,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
    /// PostgreSQL through a private PgBouncer in transaction pooling mode,
    /// the URL saying `pgbouncer=true`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    PgBouncer,
    Redis,
    /// A table of the test's own on moto's DynamoDB, created on first open.
    DynamoDb,
}

/// A fresh store, and what keeps it alive (its directory or database).
pub(crate) struct Store {
    location: StoreLocation,
    _dir: tempfile::TempDir,
    #[cfg(feature = "postgres")]
    _db: Option<super::pg::PgDatabase>,
    #[cfg(feature = "postgres")]
    _bouncer: Option<idem_testkit::pgbouncer::PgBouncer>,
}

impl Store {
    /// `None` when the store's server is not reachable (and not required).
    pub(crate) async fn fresh(kind: Kind) -> Option<Store> {
        let dir = tempfile::tempdir().expect("temp dir");
        #[cfg(feature = "postgres")]
        let mut db = None;
        #[cfg(feature = "postgres")]
        let mut bouncer = None;
        let location = match kind {
            Kind::Sqlite => StoreLocation::Sqlite(dir.path().join("idem.db")),
            Kind::Postgres => {
                #[cfg(feature = "postgres")]
                {
                    let created = super::pg::PgDatabase::create().await?;
                    let url = created.url.clone();
                    db = Some(created);
                    url.parse().expect("a PostgreSQL URL")
                }
                #[cfg(not(feature = "postgres"))]
                unreachable!("PostgreSQL cases are built with the postgres feature")
            }
            Kind::PgBouncer => {
                #[cfg(feature = "postgres")]
                {
                    let created = super::pg::PgDatabase::create().await?;
                    let started = idem_testkit::pgbouncer::PgBouncer::start()?;
                    let url = format!("{}?pgbouncer=true", started.route(&created.url));
                    db = Some(created);
                    bouncer = Some(started);
                    url.parse().expect("a PostgreSQL URL")
                }
                #[cfg(not(feature = "postgres"))]
                unreachable!("PostgreSQL cases are built with the postgres feature")
            }
            Kind::Redis => {
                if !idem_testkit::redis::machine_redis_answers() {
                    return None;
                }
                StoreLocation::Redis(idem_testkit::redis::redis_url())
            }
            Kind::DynamoDb => {
                StoreLocation::DynamoDb(idem_testkit::dynamodb::fresh_table_url("gateway")?)
            }
        };
        Some(Store {
            location,
            _dir: dir,
            #[cfg(feature = "postgres")]
            _db: db,
            #[cfg(feature = "postgres")]
            _bouncer: bouncer,
        })
    }

    pub(crate) async fn open(&self, config: &IdempotencyConfig) -> AnyStore {
        self.open_at(config, Arc::new(SystemClock)).await
    }

    /// The store with `config`'s settings, reading `clock`.
    pub(crate) async fn open_at(&self, config: &IdempotencyConfig, clock: SharedClock) -> AnyStore {
        AnyStore::open_with(&self.location, config.store_settings(), clock)
            .await
            .expect("open the store")
    }
}

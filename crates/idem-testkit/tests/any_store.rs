//! The shared conformance suite against `idem::AnyStore`, the store chosen at
//! run time, over each backend: the atomic paths go through `AnyStore`'s
//! `AtomicStore` (its effects get `&mut dyn AnyTx`), and the suite's SQL is
//! chosen by the connection the effect finds.

use std::path::PathBuf;
use std::sync::Arc;

use idem::postgres::sqlx;
use idem::rusqlite::params;
use idem::{AnyConnection, AnyStore, AtomicStore, Error, Guard, ManualClock, StoreLocation};
use idem_testkit::postgres::TestDatabase;
use idem_testkit::{Harness, TxOf};

/// An `AnyStore` under test; `POSTGRES` picks the backend.
struct Any<const POSTGRES: bool> {
    store: AnyStore,
    clock: ManualClock,
    location: String,
    _dir: Option<Arc<tempfile::TempDir>>,
    _db: Option<Arc<TestDatabase>>,
}

const TABLES_SQLITE: &str = "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS registers (name TEXT PRIMARY KEY, value INTEGER NOT NULL DEFAULT 0, \
     version INTEGER NOT NULL DEFAULT 0, fence INTEGER NOT NULL DEFAULT 0);";

const TABLES_POSTGRES: &str = "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL); \
     CREATE TABLE IF NOT EXISTS registers (name TEXT PRIMARY KEY, value BIGINT NOT NULL DEFAULT 0, \
     version BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0);";

impl<const POSTGRES: bool> Any<POSTGRES> {
    async fn at(
        location: String,
        clock: ManualClock,
        dir: Option<Arc<tempfile::TempDir>>,
        db: Option<Arc<TestDatabase>>,
    ) -> Self {
        Self::with_settings(location, clock, dir, db, Default::default()).await
    }

    async fn with_settings(
        location: String,
        clock: ManualClock,
        dir: Option<Arc<tempfile::TempDir>>,
        db: Option<Arc<TestDatabase>>,
        settings: idem::Settings,
    ) -> Self {
        let parsed: StoreLocation = location.parse().expect("a store location");
        let store = AnyStore::open_with(&parsed, settings, Arc::new(clock.clone()))
            .await
            .expect("open the store");
        store
            .transaction(async |tx| -> Result<(), String> {
                match tx.connection() {
                    AnyConnection::Sqlite(conn) => {
                        conn.execute_batch(TABLES_SQLITE).map_err(|e| e.to_string())
                    }
                    AnyConnection::Postgres(conn) => sqlx::raw_sql(TABLES_POSTGRES)
                        .execute(conn)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string()),
                }
            })
            .await
            .expect("create the test tables");
        Self {
            store,
            clock,
            location,
            _dir: dir,
            _db: db,
        }
    }
}

impl<const POSTGRES: bool> Harness for Any<POSTGRES> {
    type Store = AnyStore;
    const REPLAY_FIRST: bool = POSTGRES;

    async fn fresh() -> Option<Self> {
        let clock = ManualClock::starting_now();
        if POSTGRES {
            let db = Arc::new(TestDatabase::create("idem_any").await?);
            Some(Self::at(db.url().to_owned(), clock, None, Some(db)).await)
        } else {
            let dir = Arc::new(tempfile::tempdir().expect("temporary directory"));
            let path: PathBuf = dir.path().join("idem.db");
            Some(
                Self::at(
                    format!("sqlite://{}", path.display()),
                    clock,
                    Some(dir),
                    None,
                )
                .await,
            )
        }
    }

    async fn reopen(&self) -> Self {
        Self {
            store: self.store.clone(),
            clock: self.clock.clone(),
            location: self.location.clone(),
            _dir: self._dir.clone(),
            _db: self._db.clone(),
        }
    }

    async fn open(location: &str, clock: ManualClock) -> Self {
        Self::at(location.to_owned(), clock, None, None).await
    }

    async fn with_tombstones(&self, grace: std::time::Duration) -> Self {
        Self::with_settings(
            self.location.clone(),
            self.clock.clone(),
            self._dir.clone(),
            self._db.clone(),
            idem::Settings::default().with_tombstones(Some(grace)),
        )
        .await
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    fn store(&self) -> &AnyStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    async fn add(tx: &mut TxOf<Self>, counter: &str, amount: i64) -> Result<i64, String> {
        match tx.connection() {
            AnyConnection::Sqlite(conn) => conn
                .query_row(
                    "INSERT INTO counters (name, value) VALUES (?1, ?2) \
                     ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
                    params![counter, amount],
                    |row| row.get(0),
                )
                .map_err(|e| e.to_string()),
            AnyConnection::Postgres(conn) => sqlx::query_scalar(
                "INSERT INTO counters (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value RETURNING value",
            )
            .bind(counter)
            .bind(amount)
            .fetch_one(conn)
            .await
            .map_err(|e| e.to_string()),
        }
    }

    async fn guarded_set_in(
        store: &AnyStore,
        tx: &mut TxOf<Self>,
        guard: &Guard,
        register: &str,
        value: i64,
        carried: i64,
    ) -> Result<(), Error> {
        match (store, tx.connection()) {
            (AnyStore::Sqlite(sqlite), AnyConnection::Sqlite(conn)) => {
                conn.execute(
                    "INSERT INTO registers (name) VALUES (?1) ON CONFLICT (name) DO NOTHING",
                    params![register],
                )
                .unwrap();
                sqlite.advance(conn, guard, &register, carried)?;
                conn.execute(
                    "UPDATE registers SET value = ?1 WHERE name = ?2",
                    params![value, register],
                )
                .unwrap();
            }
            (AnyStore::Postgres(pg), AnyConnection::Postgres(conn)) => {
                sqlx::query(
                    "INSERT INTO registers (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
                )
                .bind(register)
                .execute(&mut *conn)
                .await
                .unwrap();
                pg.advance(&mut *conn, guard, register.to_owned(), carried)
                    .await?;
                sqlx::query("UPDATE registers SET value = $1 WHERE name = $2")
                    .bind(value)
                    .bind(register)
                    .execute(&mut *conn)
                    .await
                    .unwrap();
            }
            _ => unreachable!("a PostgreSQL connection comes from a PostgreSQL store"),
        }
        Self::add(tx, &format!("writes:{register}"), 1)
            .await
            .unwrap();
        Ok(())
    }

    async fn read_counter(tx: &mut TxOf<Self>, counter: &str) -> Result<i64, String> {
        match tx.connection() {
            AnyConnection::Sqlite(conn) => conn
                .query_row(
                    "SELECT coalesce((SELECT value FROM counters WHERE name = ?1), 0)",
                    params![counter],
                    |row| row.get(0),
                )
                .map_err(|e| e.to_string()),
            AnyConnection::Postgres(conn) => sqlx::query_scalar(
                "SELECT coalesce((SELECT value FROM counters WHERE name = $1), 0)",
            )
            .bind(counter)
            .fetch_one(conn)
            .await
            .map_err(|e| e.to_string()),
        }
    }

    async fn read_register(tx: &mut TxOf<Self>, register: &str) -> Result<(i64, i64, i64), String> {
        match tx.connection() {
            AnyConnection::Sqlite(conn) => conn
                .query_row(
                    "SELECT value, version, fence FROM registers WHERE name = ?1",
                    params![register],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .map_err(|e| e.to_string()),
            AnyConnection::Postgres(conn) => {
                sqlx::query_as("SELECT value, version, fence FROM registers WHERE name = $1")
                    .bind(register)
                    .fetch_one(conn)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }
}

mod sqlite {
    idem_testkit::conformance_suite!(super::Any<false>);
}

mod postgres {
    idem_testkit::conformance_suite!(super::Any<true>);
}

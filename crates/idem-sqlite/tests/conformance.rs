//! The shared conformance suite against the embedded SQLite store.

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use idem_core::{Error, Guard, ManualClock, Settings};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::{Connection, params};
use idem_testkit::Harness;

struct Sqlite {
    store: SqliteStore,
    clock: ManualClock,
    path: PathBuf,
    _dir: Option<Arc<tempfile::TempDir>>,
}

impl Sqlite {
    async fn at(path: PathBuf, clock: ManualClock, dir: Option<Arc<tempfile::TempDir>>) -> Self {
        Self::with_settings(path, clock, dir, Settings::default()).await
    }

    async fn with_settings(
        path: PathBuf,
        clock: ManualClock,
        dir: Option<Arc<tempfile::TempDir>>,
        settings: Settings,
    ) -> Self {
        let store = SqliteStore::builder(&path)
            .settings(settings)
            .clock(Arc::new(clock.clone()))
            .open()
            .await
            .expect("open the SQLite store");
        store
            .with_connection(|c| {
                c.execute_batch(
                    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL); \
                     CREATE TABLE IF NOT EXISTS registers (name TEXT PRIMARY KEY, value INTEGER NOT NULL DEFAULT 0, \
                     version INTEGER NOT NULL DEFAULT 0, fence INTEGER NOT NULL DEFAULT 0);",
                )
            })
            .await
            .unwrap()
            .unwrap();
        Self {
            store,
            clock,
            path,
            _dir: dir,
        }
    }
}

impl Harness for Sqlite {
    type Store = SqliteStore;

    async fn fresh() -> Option<Self> {
        let dir = Arc::new(tempfile::tempdir().expect("temporary directory"));
        let path = dir.path().join("idem.db");
        Some(Self::at(path, ManualClock::starting_now(), Some(dir)).await)
    }

    async fn reopen(&self) -> Self {
        Self {
            store: self.store.clone(),
            clock: self.clock.clone(),
            path: self.path.clone(),
            _dir: self._dir.clone(),
        }
    }

    async fn open(location: &str, clock: ManualClock) -> Self {
        Self::at(PathBuf::from(location), clock, None).await
    }

    async fn with_tombstones(&self, grace: Duration) -> Self {
        let settings = Settings::default().with_tombstones(Some(grace));
        Self::with_settings(
            self.path.clone(),
            self.clock.clone(),
            self._dir.clone(),
            settings,
        )
        .await
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    async fn add(tx: &mut Connection, counter: &str, amount: i64) -> Result<i64, String> {
        tx.query_row(
            "INSERT INTO counters (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
            params![counter, amount],
            |row| row.get(0),
        )
        .map_err(|e| e.to_string())
    }

    async fn guarded_set_in(
        store: &SqliteStore,
        tx: &mut Connection,
        guard: &Guard,
        register: &str,
        value: i64,
        carried: i64,
    ) -> Result<(), Error> {
        tx.execute(
            "INSERT INTO registers (name) VALUES (?1) ON CONFLICT (name) DO NOTHING",
            params![register],
        )
        .unwrap();
        store.advance(tx, guard, &register, carried)?;
        tx.execute(
            "UPDATE registers SET value = ?1 WHERE name = ?2",
            params![value, register],
        )
        .unwrap();
        Self::add(tx, &format!("writes:{register}"), 1)
            .await
            .unwrap();
        Ok(())
    }

    async fn read_counter(tx: &mut Connection, counter: &str) -> Result<i64, String> {
        tx.query_row(
            "SELECT coalesce((SELECT value FROM counters WHERE name = ?1), 0)",
            params![counter],
            |row| row.get(0),
        )
        .map_err(|e| e.to_string())
    }

    async fn read_register(tx: &mut Connection, register: &str) -> Result<(i64, i64, i64), String> {
        tx.query_row(
            "SELECT value, version, fence FROM registers WHERE name = ?1",
            params![register],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| e.to_string())
    }
}

idem_testkit::conformance_suite!(Sqlite);

/// The leased-mode rows alone, as a store without an atomic mode runs them.
mod leased {
    idem_testkit::leased_conformance_suite!(super::Sqlite);
}

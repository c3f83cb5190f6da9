//! The shared conformance suite against PostgreSQL, one fresh database per test,
//! run twice: atomic apply claiming the key first (`AtomicStore::apply`) with
//! leased claims and completions committed in groups, and atomic apply
//! looking for a stored outcome first (`AtomicStore::apply_replay_first`) with
//! each leased call in a transaction of its own. Both run again through a
//! private PgBouncer in transaction pooling mode (`idem_testkit::pgbouncer`),
//! the store's URL saying `pgbouncer=true` (claim first) or
//! `statement_cache=0` (replay first).

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, Guard, ManualClock, Settings};
use idem_postgres::PgStore;
use idem_testkit::Harness;
use idem_testkit::pgbouncer::PgBouncer;
use sqlx::PgConnection;

use common::TestDb;

/// The store under test; `REPLAY_FIRST` picks which atomic apply the suite's
/// operations go through, `BOUNCED` whether it talks to the server through a
/// PgBouncer in transaction pooling mode.
struct Postgres<const REPLAY_FIRST: bool, const BOUNCED: bool = false> {
    store: PgStore,
    clock: ManualClock,
    url: String,
    _db: Option<Arc<TestDb>>,
    _bouncer: Option<Arc<PgBouncer>>,
}

impl<const REPLAY_FIRST: bool, const BOUNCED: bool> Postgres<REPLAY_FIRST, BOUNCED> {
    async fn at(url: String, clock: ManualClock, db: Option<Arc<TestDb>>) -> Self {
        Self::with_settings(url, clock, db, Settings::default()).await
    }

    async fn with_settings(
        url: String,
        clock: ManualClock,
        db: Option<Arc<TestDb>>,
        settings: Settings,
    ) -> Self {
        let store = PgStore::builder(url.clone())
            .settings(settings)
            .clock(Arc::new(clock.clone()))
            .group_commit(!REPLAY_FIRST)
            .connect()
            .await
            .expect("connect the PostgreSQL store");
        let mut conn = store.pool().acquire().await.expect("a connection");
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL); \
             CREATE TABLE IF NOT EXISTS registers (name TEXT PRIMARY KEY, value BIGINT NOT NULL DEFAULT 0, \
             version BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0);",
        )
        .execute(&mut *conn)
        .await
        .expect("create counters");
        drop(conn);
        Self {
            store,
            clock,
            url,
            _db: db,
            _bouncer: None,
        }
    }
}

impl<const REPLAY_FIRST: bool, const BOUNCED: bool> Harness for Postgres<REPLAY_FIRST, BOUNCED> {
    type Store = PgStore;
    const REPLAY_FIRST: bool = REPLAY_FIRST;

    async fn fresh() -> Option<Self> {
        let db = Arc::new(TestDb::new().await?);
        if !BOUNCED {
            return Some(Self::at(db.url.clone(), ManualClock::starting_now(), Some(db)).await);
        }
        let bouncer = Arc::new(PgBouncer::start()?);
        // Claim first says `pgbouncer=true`, replay first only
        // `statement_cache=0` (this PgBouncer ignores `extra_float_digits`).
        let param = if REPLAY_FIRST {
            "statement_cache=0"
        } else {
            "pgbouncer=true"
        };
        let url = format!("{}?{param}", bouncer.route(&db.url));
        let mut harness = Self::at(url, ManualClock::starting_now(), Some(db)).await;
        harness._bouncer = Some(bouncer);
        Some(harness)
    }

    async fn reopen(&self) -> Self {
        Self {
            store: self.store.clone(),
            clock: self.clock.clone(),
            url: self.url.clone(),
            _db: self._db.clone(),
            _bouncer: self._bouncer.clone(),
        }
    }

    async fn open(location: &str, clock: ManualClock) -> Self {
        Self::at(location.to_owned(), clock, None).await
    }

    async fn with_tombstones(&self, grace: Duration) -> Self {
        let settings = Settings::default().with_tombstones(Some(grace));
        let mut harness = Self::with_settings(
            self.url.clone(),
            self.clock.clone(),
            self._db.clone(),
            settings,
        )
        .await;
        harness._bouncer = self._bouncer.clone();
        harness
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    async fn add(tx: &mut PgConnection, counter: &str, amount: i64) -> Result<i64, String> {
        sqlx::query_scalar(
            "INSERT INTO counters (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value RETURNING value",
        )
        .bind(counter)
        .bind(amount)
        .fetch_one(tx)
        .await
        .map_err(|e| e.to_string())
    }

    async fn guarded_set_in(
        store: &PgStore,
        tx: &mut PgConnection,
        guard: &Guard,
        register: &str,
        value: i64,
        carried: i64,
    ) -> Result<(), Error> {
        sqlx::query("INSERT INTO registers (name) VALUES ($1) ON CONFLICT (name) DO NOTHING")
            .bind(register)
            .execute(&mut *tx)
            .await
            .unwrap();
        store
            .advance(&mut *tx, guard, register.to_owned(), carried)
            .await?;
        sqlx::query("UPDATE registers SET value = $1 WHERE name = $2")
            .bind(value)
            .bind(register)
            .execute(&mut *tx)
            .await
            .unwrap();
        Self::add(tx, &format!("writes:{register}"), 1)
            .await
            .unwrap();
        Ok(())
    }

    async fn read_counter(tx: &mut PgConnection, counter: &str) -> Result<i64, String> {
        sqlx::query_scalar("SELECT coalesce((SELECT value FROM counters WHERE name = $1), 0)")
            .bind(counter)
            .fetch_one(tx)
            .await
            .map_err(|e| e.to_string())
    }

    async fn read_register(
        tx: &mut PgConnection,
        register: &str,
    ) -> Result<(i64, i64, i64), String> {
        sqlx::query_as("SELECT value, version, fence FROM registers WHERE name = $1")
            .bind(register)
            .fetch_one(tx)
            .await
            .map_err(|e| e.to_string())
    }
}

mod claim_first {
    idem_testkit::conformance_suite!(super::Postgres<false>);
}

mod replay_first {
    idem_testkit::conformance_suite!(super::Postgres<true>);
}

/// The leased-mode rows alone, as a store without an atomic mode runs them.
mod leased {
    idem_testkit::leased_conformance_suite!(super::Postgres<false>);
}

/// The whole suite again through a PgBouncer in transaction pooling mode,
/// with both atomic applies.
mod through_pgbouncer {
    mod claim_first {
        idem_testkit::conformance_suite!(super::super::Postgres<false, true>);
    }

    mod replay_first {
        idem_testkit::conformance_suite!(super::super::Postgres<true, true>);
    }
}

//! The shared conformance suite against the embedded SQLite store.

use std::path::PathBuf;
use std::sync::Arc;

use idem_core::{
    Applied, ApplyError, Claim, Error, Guard, GuardOrdering, ManualClock, Operation, Outcome,
};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::{self, Connection, params};
use idem_testkit::crash::{self, CrashPoint};
use idem_testkit::harness::{
    RETRYABLE_FAILURE, counter_outcome, set_outcome, stale_outcome, terminal_outcome,
};
use idem_testkit::{Effect, Harness};

struct Sqlite {
    store: SqliteStore,
    clock: ManualClock,
    path: PathBuf,
    _dir: Option<Arc<tempfile::TempDir>>,
}

fn add(conn: &Connection, counter: &str, amount: i64) -> rusqlite::Result<i64> {
    conn.query_row(
        "INSERT INTO counters (name, value) VALUES (?1, ?2) \
         ON CONFLICT (name) DO UPDATE SET value = value + excluded.value RETURNING value",
        params![counter, amount],
        |row| row.get(0),
    )
}

fn guarded_set(
    conn: &Connection,
    register: &str,
    value: i64,
    carried: i64,
    ordering: GuardOrdering,
) -> Result<(), Error> {
    let column = match ordering {
        GuardOrdering::Version => "version",
        GuardOrdering::Fence => "fence",
    };
    let guard = Guard::new("registers", "name", column, ordering).unwrap();
    conn.execute(
        "INSERT INTO registers (name) VALUES (?1) ON CONFLICT (name) DO NOTHING",
        params![register],
    )
    .unwrap();
    idem_sqlite::advance(conn, &guard, &register, carried)?;
    conn.execute(
        "UPDATE registers SET value = ?1 WHERE name = ?2",
        params![value, register],
    )
    .unwrap();
    add(conn, &format!("writes:{register}"), 1).unwrap();
    Ok(())
}

fn run_effect(
    conn: &Connection,
    counter: &str,
    amount: i64,
    effect: Effect,
) -> Result<Outcome, String> {
    match effect {
        Effect::FailTerminal => return Ok(terminal_outcome()),
        Effect::Crash(CrashPoint::AfterClaim) => crash::reach(CrashPoint::AfterClaim),
        Effect::Gate(ref gate) => {
            let _ = gate.enter().blocking_recv();
        }
        _ => {}
    }
    let value = add(conn, counter, amount).map_err(|e| e.to_string())?;
    match effect {
        Effect::FailRetryable => Err(RETRYABLE_FAILURE.to_owned()),
        Effect::Crash(point) => crash::reach(point),
        _ => Ok(counter_outcome(value)),
    }
}

impl Sqlite {
    async fn at(path: PathBuf, clock: ManualClock, dir: Option<Arc<tempfile::TempDir>>) -> Self {
        let store = SqliteStore::builder(&path)
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

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    async fn apply_add(
        &self,
        op: &Operation,
        counter: &str,
        amount: i64,
        effect: Effect,
    ) -> Result<Applied, ApplyError<String>> {
        let counter = counter.to_owned();
        self.store
            .apply(&op.scope, &op.key, op.fingerprint, move |tx| {
                run_effect(tx, &counter, amount, effect)
            })
            .await
    }

    async fn apply_batch_add(
        &self,
        ops: &[Operation],
        adds: &[(String, i64)],
    ) -> Result<Vec<Result<Applied, Error>>, ApplyError<(usize, String)>> {
        let adds = adds.to_vec();
        self.store
            .apply_batch(ops, move |tx, i| {
                let (counter, amount) = &adds[i];
                if *amount == i64::MIN {
                    return Err("refused by the test".to_owned());
                }
                run_effect(tx, counter, *amount, Effect::Succeed)
            })
            .await
    }

    async fn complete_add(
        &self,
        claim: &Claim,
        counter: &str,
        amount: i64,
    ) -> Result<Outcome, ApplyError<String>> {
        let counter = counter.to_owned();
        self.store
            .complete_with(claim, move |tx| {
                run_effect(tx, &counter, amount, Effect::Succeed)
            })
            .await
    }

    async fn counter(&self, counter: &str) -> i64 {
        let counter = counter.to_owned();
        self.store
            .with_connection(move |c| {
                c.query_row(
                    "SELECT coalesce((SELECT value FROM counters WHERE name = ?1), 0)",
                    params![counter],
                    |row| row.get(0),
                )
            })
            .await
            .unwrap()
            .unwrap()
    }

    async fn guarded_set(
        &self,
        register: &str,
        value: i64,
        carried: i64,
        ordering: GuardOrdering,
    ) -> Result<(), Error> {
        let register = register.to_owned();
        self.store
            .with_connection(move |c| {
                let tx = c.transaction().unwrap();
                guarded_set(&tx, &register, value, carried, ordering)?;
                tx.commit().unwrap();
                Ok(())
            })
            .await
            .unwrap()
    }

    async fn apply_versioned_set(
        &self,
        op: &Operation,
        register: &str,
        value: i64,
        version: i64,
    ) -> Result<Applied, ApplyError<String>> {
        let register = register.to_owned();
        self.store
            .apply(
                &op.scope,
                &op.key,
                op.fingerprint,
                move |tx| match guarded_set(tx, &register, value, version, GuardOrdering::Version) {
                    Ok(()) => Ok(set_outcome(value)),
                    Err(Error::Stale { .. }) => Ok(stale_outcome()),
                    Err(other) => Err(other.to_string()),
                },
            )
            .await
    }

    async fn register(&self, register: &str) -> (i64, i64, i64) {
        let register = register.to_owned();
        self.store
            .with_connection(move |c| {
                c.query_row(
                    "SELECT value, version, fence FROM registers WHERE name = ?1",
                    params![register],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
            })
            .await
            .unwrap()
            .unwrap()
    }
}

idem_testkit::conformance_suite!(Sqlite);

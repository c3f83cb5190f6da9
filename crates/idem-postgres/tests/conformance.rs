//! The shared conformance suite against PostgreSQL, one fresh database per test,
//! run twice: atomic apply looking for a stored outcome first
//! ([`PgStore::apply`]) and claiming the key first
//! ([`PgStore::apply_claim_first`]).

mod common;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem_core::{
    Applied, ApplyError, Claim, Error, Guard, GuardOrdering, ManualClock, Operation, Outcome,
};
use idem_postgres::PgStore;
use idem_testkit::crash::{self, CrashPoint};
use idem_testkit::harness::{
    RETRYABLE_FAILURE, counter_outcome, set_outcome, stale_outcome, terminal_outcome,
};
use idem_testkit::{Effect, Harness};
use sqlx::PgConnection;

use common::TestDb;

/// The store under test; `CLAIM_FIRST` picks which atomic apply the suite's
/// operations go through.
struct Postgres<const CLAIM_FIRST: bool> {
    store: PgStore,
    clock: ManualClock,
    url: String,
    _db: Option<Arc<TestDb>>,
}

async fn add(conn: &mut PgConnection, counter: &str, amount: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO counters (name, value) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value RETURNING value",
    )
    .bind(counter)
    .bind(amount)
    .fetch_one(conn)
    .await
}

async fn guarded_set(
    store: &PgStore,
    conn: &mut PgConnection,
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
    sqlx::query("INSERT INTO registers (name) VALUES ($1) ON CONFLICT (name) DO NOTHING")
        .bind(register)
        .execute(&mut *conn)
        .await
        .unwrap();
    store
        .advance(&mut *conn, &guard, register.to_owned(), carried)
        .await?;
    sqlx::query("UPDATE registers SET value = $1 WHERE name = $2")
        .bind(value)
        .bind(register)
        .execute(&mut *conn)
        .await
        .unwrap();
    add(conn, &format!("writes:{register}"), 1).await.unwrap();
    Ok(())
}

async fn run_effect(
    conn: &mut PgConnection,
    counter: String,
    amount: i64,
    effect: Effect,
) -> Result<Outcome, String> {
    match &effect {
        Effect::FailTerminal => return Ok(terminal_outcome()),
        Effect::Crash(CrashPoint::AfterClaim) => crash::reach(CrashPoint::AfterClaim),
        Effect::Gate(gate) => {
            let _ = gate.enter().await;
        }
        _ => {}
    }
    let value = add(conn, &counter, amount)
        .await
        .map_err(|e| e.to_string())?;
    match effect {
        Effect::FailRetryable => Err(RETRYABLE_FAILURE.to_owned()),
        Effect::Crash(point) => crash::reach(point),
        _ => Ok(counter_outcome(value)),
    }
}

impl<const CLAIM_FIRST: bool> Postgres<CLAIM_FIRST> {
    /// Atomic apply of `effect` for `op`, the way this suite applies.
    async fn apply<F>(&self, op: &Operation, effect: F) -> Result<Applied, ApplyError<String>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Outcome, String>> + Send,
    {
        if CLAIM_FIRST {
            self.store
                .apply_claim_first(&op.scope, &op.key, op.fingerprint, effect)
                .await
        } else {
            self.store
                .apply(&op.scope, &op.key, op.fingerprint, effect)
                .await
        }
    }

    async fn at(url: String, clock: ManualClock, db: Option<Arc<TestDb>>) -> Self {
        let store = PgStore::builder(url.clone())
            .clock(Arc::new(clock.clone()))
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
        }
    }
}

impl<const CLAIM_FIRST: bool> Harness for Postgres<CLAIM_FIRST> {
    type Store = PgStore;

    async fn fresh() -> Option<Self> {
        let db = Arc::new(TestDb::new().await?);
        Some(Self::at(db.url.clone(), ManualClock::starting_now(), Some(db)).await)
    }

    async fn reopen(&self) -> Self {
        Self {
            store: self.store.clone(),
            clock: self.clock.clone(),
            url: self.url.clone(),
            _db: self._db.clone(),
        }
    }

    async fn open(location: &str, clock: ManualClock) -> Self {
        Self::at(location.to_owned(), clock, None).await
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

    async fn apply_add(
        &self,
        op: &Operation,
        counter: &str,
        amount: i64,
        effect: Effect,
    ) -> Result<Applied, ApplyError<String>> {
        let counter = counter.to_owned();
        self.apply(op, move |conn| {
            run_effect(conn, counter, amount, effect).boxed()
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
            .apply_batch(ops, move |conn, i| {
                let (counter, amount) = adds[i].clone();
                async move {
                    if amount == i64::MIN {
                        return Err("refused by the test".to_owned());
                    }
                    run_effect(conn, counter, amount, Effect::Succeed).await
                }
                .boxed()
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
            .complete_with(claim, move |conn| {
                run_effect(conn, counter, amount, Effect::Succeed).boxed()
            })
            .await
    }

    async fn counter(&self, counter: &str) -> i64 {
        sqlx::query_scalar("SELECT coalesce((SELECT value FROM counters WHERE name = $1), 0)")
            .bind(counter)
            .fetch_one(self.store.pool())
            .await
            .expect("read counter")
    }

    async fn guarded_set(
        &self,
        register: &str,
        value: i64,
        carried: i64,
        ordering: GuardOrdering,
    ) -> Result<(), Error> {
        let mut tx = self.store.pool().begin().await.unwrap();
        guarded_set(&self.store, &mut tx, register, value, carried, ordering).await?;
        tx.commit().await.unwrap();
        Ok(())
    }

    async fn apply_versioned_set(
        &self,
        op: &Operation,
        register: &str,
        value: i64,
        version: i64,
    ) -> Result<Applied, ApplyError<String>> {
        let (store, register) = (self.store.clone(), register.to_owned());
        self.apply(op, move |conn| {
            async move {
                let set = guarded_set(
                    &store,
                    conn,
                    &register,
                    value,
                    version,
                    GuardOrdering::Version,
                );
                match set.await {
                    Ok(()) => Ok(set_outcome(value)),
                    Err(Error::Stale { .. }) => Ok(stale_outcome()),
                    Err(other) => Err(other.to_string()),
                }
            }
            .boxed()
        })
        .await
    }

    async fn register(&self, register: &str) -> (i64, i64, i64) {
        sqlx::query_as("SELECT value, version, fence FROM registers WHERE name = $1")
            .bind(register)
            .fetch_one(self.store.pool())
            .await
            .expect("read register")
    }
}

mod replay_first {
    idem_testkit::conformance_suite!(super::Postgres<false>);
}

mod claim_first {
    idem_testkit::conformance_suite!(super::Postgres<true>);
}

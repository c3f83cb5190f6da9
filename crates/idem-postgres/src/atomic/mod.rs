//! Atomic mode: the effect is a write to this database, so it and the record
//! commit in one transaction. A crash at any point leaves both or neither.
//!
//! # Steps and round trips
//!
//! One pooled connection serves the whole apply:
//!
//! 1. `BEGIN ISOLATION LEVEL READ COMMITTED`, through sqlx, so the effect
//!    gets a transaction sqlx knows about;
//! 2. one simple query tries the key's lock and reads the record in the next
//!    statement; then [`decide`](idem_core::decide). A key held by another
//!    transaction (the lock refused) or already recorded is read from the
//!    rows and answered (`InFlight`, a replay, `KeyReuse`) after a rollback:
//!    a duplicate never raises an error, so it never writes an `ERROR` line
//!    into the server's log;
//! 3. on a claim or takeover, the effect runs in the transaction;
//! 4. one simple query writes the record, settled with the decided token and
//!    the outcome, and commits.
//!
//! `apply` takes an idle connection without the pool's ping: `BEGIN` is its
//! first statement, and one that fails because the server had closed the
//! connection is sent again on a connection the pool has checked. Round
//! trips besides the effect's own statements, for a first apply: 3 (`BEGIN`,
//! lock and read, write and commit) and the check when the connection goes
//! back; a replay: 3 (`BEGIN`, lock and read, rollback). The bare business
//! transaction the benchmark compares with takes 4 (`BEGIN`, `COMMIT`, and
//! the pool's two pings).
//!
//! # Replay first
//!
//! `apply_replay_first` is for work where duplicates are common. It starts
//! with a prepared `SELECT` outside any transaction (`PgStore::peek`) on a
//! checked connection, which answers a replay or a refusal in one round trip;
//! otherwise it goes on with steps 1–4. A new key costs two round trips more
//! than with `apply` (the ping and the look-up).
//!
//! # Which statements go as simple queries, and why
//!
//! sqlx sends each prepared statement in a round trip of its own; only a simple
//! query carries several statements at once, and it cannot use the extended
//! protocol's prepared statements. Steps 2 and 4 are simple queries
//! (`locked`): `SET LOCAL bytea_output = hex; SELECT pg_try_advisory_xact_lock(..);
//! EXECUTE idem_fetch_v1(..)`, and `EXECUTE idem_insert_v1(..)` (or
//! `idem_replace_v1` when a record was read) `; COMMIT; BEGIN`. The values are
//! literals (`literal`), and the statements doing the real work are prepared
//! once per session with SQL `PREPARE` (`records::session`): written out in
//! full they would be parsed and planned on every call, which on a busy server
//! costs more than the round trip saved. The trailing `BEGIN` keeps the server
//! in step with sqlx, which still counts its transaction as open; dropping it
//! queues a `ROLLBACK` that the connection sends with its next message. The
//! peek, the `BEGIN` and everything the effect runs stay as they were.
//!
//! `BEGIN` keeps a round trip of its own on purpose. Sent at the head of step
//! 2's query it would save one, but sqlx would not know the connection is in
//! a transaction: a `begin()` in the effect would send a second `BEGIN`
//! instead of a savepoint, and committing it would commit the store's
//! transaction, effect and lock, before the record is written. sqlx discards
//! the rows of the query it begins a transaction with, so the lock and the
//! read cannot travel with `BEGIN` either, unless they answered by raising an
//! error, which would log every duplicate as a fault.
//!
//! # Failures
//!
//! An effect that fails rolls everything back, so the key is free for the next
//! retry; a terminal failure is an outcome and is stored like a success. An
//! effect that panics is rolled back before the panic goes on. A cancelled
//! apply leaves its sqlx transaction to roll back when the connection is next
//! used, which the pool does at once when it takes the connection back. One
//! given up while its `BEGIN` query is still unanswered has no sqlx
//! transaction yet, though the server may be in one: its connection is
//! closed instead of given back (`locked::Beginning`).

pub(crate) mod locked;

use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, BatchApplied, Claim, Error, ErrorKind,
    Fingerprint, IdempotencyKey, Operation, Outcome, Plan, Record, Replay, Scope, SetApplied,
    TxCall, crash,
};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Transaction};

use self::locked::NotCommitted;
use crate::decision::Next;
use crate::records;
use crate::store::PgStore;

/// Atomic mode on PostgreSQL: the effect gets the connection of the store's
/// transaction (a `begin()` on it opens a savepoint), and nothing it writes
/// commits before the record does. See the module docs for the round trips.
impl AtomicStore for PgStore {
    type Tx = PgConnection;

    /// Begins on an idle connection without the pool's ping (a `BEGIN` that
    /// finds it closed is sent again on a checked one), then tries the key's
    /// lock and reads its record in one round trip.
    async fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        self.apply_from(First::Claim, scope, key, fingerprint, effect)
            .await
    }

    /// Looks for a stored outcome first, outside any transaction: one round
    /// trip answers a replay. A new key costs two more than with `apply` (the
    /// look-up, and the pool's ping before it).
    async fn apply_replay_first<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        self.apply_from(First::Replay, scope, key, fingerprint, effect)
            .await
    }

    async fn apply_batch<G, F, E>(&self, ops: &[Operation], effect_for: G) -> BatchApplied<E>
    where
        G: FnMut(usize) -> F + Send + 'static,
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        self.apply_all(ops, effect_for).await
    }

    async fn apply_set<G, F, E>(&self, ops: &[Operation], effect_for: G) -> SetApplied<E>
    where
        G: FnOnce(Vec<usize>) -> F + Send + 'static,
        F: AtomicEffect<PgConnection, Vec<Outcome>, E>,
        E: Send + 'static,
    {
        self.apply_set_all(ops, effect_for).await
    }

    async fn complete_with<F, E>(&self, claim: &Claim, effect: F) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        self.complete_in_transaction(claim, effect).await
    }

    async fn transaction<F, T, E>(&self, effect: F) -> Result<T, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, T, E>,
        T: Send + 'static,
        E: Send + 'static,
    {
        let mut tx = self.begin().await?;
        let ran = AssertUnwindSafe(TxCall::call(effect, &mut *tx))
            .catch_unwind()
            .await;
        match ran {
            Ok(Ok(done)) => {
                self.commit(tx).await?;
                Ok(done)
            }
            Ok(Err(error)) => {
                self.roll_back(tx).await;
                self.notice_effect(&error);
                Err(ApplyError::Effect(error))
            }
            Err(panic) => {
                self.roll_back(tx).await;
                std::panic::resume_unwind(panic);
            }
        }
    }

    fn effect_error_kind(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        self.kind_of_cause(error)
    }
}

/// What runs once the protocol has decided to claim a key, with its lock held
/// in the transaction: an atomic effect and its settled record, or only the
/// in-flight record of a leased claim. The rest of the path (beginning, the
/// lock and the read, the decision, the answers that run nothing) is shared.
pub(crate) trait Locked: Send {
    /// What the caller is answered.
    type Output;

    /// The answer for a stored outcome.
    fn replayed(replay: Replay) -> Self::Output;

    /// The answer for a refusal or a failure before anything ran.
    fn failed(error: Error) -> Self::Output;

    /// Runs in `tx` under the key's lock, writes the record `plan` gives for
    /// `op` (replacing the one read when `replaces`) and commits.
    fn run(
        self,
        store: &PgStore,
        tx: Transaction<'_, Postgres>,
        plan: Plan,
        replaces: bool,
        op: Operation,
    ) -> impl Future<Output = Self::Output> + Send;
}

/// An atomic effect, settled in the transaction it runs in.
struct Effect<F, E> {
    effect: F,
    error: PhantomData<fn() -> E>,
}

impl<F, E> Locked for Effect<F, E>
where
    F: AtomicEffect<PgConnection, Outcome, E>,
    E: Send + 'static,
{
    type Output = Result<Applied, ApplyError<E>>;

    fn replayed(replay: Replay) -> Self::Output {
        Ok(Applied::Replayed(replay.outcome))
    }

    fn failed(error: Error) -> Self::Output {
        Err(error.into())
    }

    async fn run(
        self,
        store: &PgStore,
        tx: Transaction<'_, Postgres>,
        plan: Plan,
        replaces: bool,
        op: Operation,
    ) -> Self::Output {
        crash::point(crash::AFTER_CLAIM);
        let (tx, outcome) = store
            .run_or_roll_back(tx, self.effect)
            .await
            .map_err(ApplyError::Effect)?;
        crash::point(crash::INSIDE_EFFECT);
        let record = plan.settled(&op, outcome.clone(), store.clock().now());
        store.write_record_and_commit(tx, &record, replaces).await?;
        crash::point(crash::AFTER_COMMIT);
        Ok(Applied::Fresh(outcome))
    }
}

impl PgStore {
    async fn apply_from<F, E>(
        &self,
        first: First,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        let work = Effect {
            effect,
            error: PhantomData,
        };
        self.lock_then(first, scope, key, fingerprint, work).await
    }

    /// Begins (claim first: on an idle connection without the pool's ping;
    /// replay first: after a look-up on a checked one), tries the key's lock
    /// and reads its record, decides, and gives `work` the transaction when
    /// the key is to be claimed.
    pub(crate) async fn lock_then<W: Locked>(
        &self,
        first: First,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        work: W,
    ) -> W::Output {
        if first == First::Replay {
            let mut conn = match self.checked_connection().await {
                Ok(conn) => conn,
                Err(error) => return W::failed(error),
            };
            let peeked = if self.pooling().sessions() {
                self.peek(&mut *conn, scope, key, &fingerprint).await
            } else {
                self.peek_alone(&mut *conn, scope, key, &fingerprint).await
            };
            match peeked {
                Ok(Some(replay)) => return W::replayed(replay),
                Ok(None) => {}
                Err(error) => return W::failed(error),
            }
            let mut beginning = locked::Beginning::new(conn);
            return match beginning.begin(self.pooling().begin()).await {
                Ok(tx) => {
                    self.decide_locked_then(tx, scope, key, fingerprint, work)
                        .await
                }
                Err(error) => W::failed(self.fail(error)),
            };
        }
        // An idle connection as it is, without the pool's ping: `BEGIN` is
        // the first statement, and safe to send again on a checked
        // connection if this one turns out to be dead.
        let idle = self
            .idle_connections_trusted()
            .then(|| self.pool().try_acquire())
            .flatten();
        let (conn, checked) = match idle {
            Some(idle) => (idle, false),
            None => match self.checked_connection().await {
                Ok(conn) => (conn, true),
                Err(error) => return W::failed(error),
            },
        };
        let mut beginning = locked::Beginning::new(conn);
        match beginning.begin(self.pooling().begin()).await {
            Ok(tx) => {
                return self
                    .decide_locked_then(tx, scope, key, fingerprint, work)
                    .await;
            }
            Err(error) if !checked && locked::connection_lost(&error) => {
                tracing::debug!(%error, "an idle connection was dead; taking a checked one");
            }
            Err(error) => return W::failed(self.fail(error)),
        }
        drop(beginning); // closes it, and frees its place in the pool first
        let conn = match self.checked_connection().await {
            Ok(conn) => conn,
            Err(error) => return W::failed(error),
        };
        let mut beginning = locked::Beginning::new(conn);
        match beginning.begin(self.pooling().begin()).await {
            Ok(tx) => {
                self.decide_locked_then(tx, scope, key, fingerprint, work)
                    .await
            }
            Err(error) => W::failed(self.fail(error)),
        }
    }

    /// In `tx`, just begun: tries the key's lock and reads its record in one
    /// round trip, decides, and runs `work`, or answers without running it. A
    /// key held by another transaction or already recorded is an answer read
    /// from the rows, never a raised error.
    async fn decide_locked_then<W: Locked>(
        &self,
        mut tx: Transaction<'_, Postgres>,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        work: W,
    ) -> W::Output {
        let now = self.clock().now();
        let opened = match locked::lock_and_fetch(&mut tx, scope, key).await {
            Ok(opened) => opened,
            Err(error) => {
                self.roll_back(tx).await;
                return W::failed(self.fail(error));
            }
        };
        // A key without a record may have been swept inside its tombstone
        // grace period: the tombstone is decided on in the record's place.
        let tombstone = match (&opened.found, self.settings().tombstones) {
            (None, Some(grace)) => {
                match records::fetch_tombstones(&mut tx, &[(scope, key)], now, grace).await {
                    Ok(mut found) => found.pop(),
                    Err(error) => {
                        self.roll_back(tx).await;
                        return W::failed(self.fail(error));
                    }
                }
            }
            _ => None,
        };
        let decided = self.decide_read(
            opened.granted,
            opened.found.as_ref().or(tombstone.as_ref()),
            scope,
            key,
            &fingerprint,
            now,
        );
        let plan =
            match decided.map(|d| Next::after(d, opened.found.as_ref(), now, self.settings())) {
                Ok(Next::Run(plan)) => plan,
                Ok(Next::Replay(replay)) => {
                    // Answered without waiting for the rollback: dropping
                    // `tx` queues it, and the pool sends it when it takes the
                    // connection back, at once. The key's lock, if this
                    // transaction got it, stays held until then, which no
                    // caller waits on: a duplicate of a settled key is
                    // answered from the record whether or not it gets the
                    // lock.
                    drop(tx);
                    return W::replayed(replay);
                }
                Err(error) => {
                    // A refusal is rare: roll back before answering, so a
                    // caller that retries once the lease has ended finds
                    // the key's lock free.
                    if opened.granted {
                        self.roll_back(tx).await;
                    }
                    return W::failed(error);
                }
            };
        let replaces = opened.found.is_some();
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        work.run(self, tx, plan, replaces, op).await
    }

    /// Writes `record` (replacing the one read under the lock when
    /// `replaces`) and commits, in one round trip.
    pub(crate) async fn write_record_and_commit(
        &self,
        mut tx: Transaction<'_, Postgres>,
        record: &Record,
        replaces: bool,
    ) -> Result<(), Error> {
        match locked::write_and_commit(&mut tx, record, replaces).await {
            // Committed; dropping `tx` closes the empty transaction the query
            // left open (see `write_and_commit`).
            Ok(()) => {
                drop(tx);
                Ok(())
            }
            Err(NotCommitted::Changed) => {
                self.roll_back(tx).await;
                Err(self.changed_under_lock(1, 1))
            }
            Err(NotCommitted::Failed(error)) => {
                self.roll_back(tx).await;
                Err(self.fail_commit(error))
            }
        }
    }

    /// A pooled connection the pool has pinged before handing it out.
    async fn checked_connection(&self) -> Result<PoolConnection<Postgres>, Error> {
        self.pool().acquire().await.map_err(|e| self.fail(e))
    }
}

/// Which an apply tries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum First {
    /// A read-only look-up of the stored outcome, then the lock and the read.
    Replay,
    /// The lock and a check that the key is new, with `BEGIN`.
    Claim,
}

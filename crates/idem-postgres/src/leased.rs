//! Leased mode: claim a key with a lease, run the effect outside (or inside) the
//! database, then settle the record fenced by the claim's token.
//!
//! `claim` follows the same path as the atomic apply, in its round trips
//! (`BEGIN`; the key's lock tried and its record read; then the write and
//! `COMMIT`), and writes an in-flight record with the new token and a lease.
//! `complete`, `renew` and `release` wait for the key's lock (its holder is a
//! short claim, or a takeover whose commit rightly fences them) and then make
//! one fenced `UPDATE ... WHERE token = held AND state = 'in_flight'`. When that
//! matches nothing the claim was taken over, and the same statement reports the
//! current token. `complete` sends it all, `BEGIN` to `COMMIT`, in one round
//! trip. With group commit on (see `group`), claims and completions of
//! concurrent callers share transactions instead.
//!
//! `complete_with` ([`AtomicStore`](idem_core::AtomicStore)) is the leased completion for an effect that *is* a
//! write in this database: the effect and the fenced completion commit together,
//! so a zombie worker whose claim was taken over cannot commit its effect either.
//!
//! Releasing keeps the record, in flight with no lease: the key is free at
//! once, and the next claim is a plain claim (not a takeover, so it is not
//! counted in `lease_takeovers_total`) with the next token, so tokens never
//! repeat and the old holder stays fenced.

use idem_core::{
    ApplyError, AtomicEffect, Claim, Claimed, Error, ErrorKind, Fingerprint, IdempotencyKey,
    LeaseStore, Operation, Outcome, Plan, RecordState, Replay, Scope, StoreError, Timestamp,
};
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Transaction};

use crate::atomic::locked::{self, Beginning};
use crate::atomic::{First, Locked};
use crate::lock;
use crate::records::{self, Fence};
use crate::store::PgStore;

impl LeaseStore for PgStore {
    /// In a group with the claims of concurrent callers (see
    /// [`PgStoreBuilder::group_commit`](crate::PgStoreBuilder::group_commit)).
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        if self.group_commit() {
            let op = Operation::new(scope.clone(), key.clone(), fingerprint);
            return self.claim_either_way(op).await;
        }
        self.claim_alone(scope, key, fingerprint).await
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let now = self.clock().now();
        let lease_until = now.plus(self.settings().lease);
        self.set_lease(claim, Some(lease_until), now).await?;
        Ok(Claim {
            lease_until,
            ..claim.clone()
        })
    }

    /// In a group with the completions of concurrent callers, as `claim`.
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        if self.group_commit() {
            return self.settle_either_way(claim, outcome).await;
        }
        self.settle_alone(claim, outcome).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.release_alone(claim).await
    }

    async fn end_lease(&self, claim: &Claim) -> Result<(), Error> {
        let now = self.clock().now();
        self.set_lease(claim, Some(now), now).await
    }
}

impl PgStore {
    /// A claim in a transaction of its own, in the round trips of atomic
    /// apply: `BEGIN` on an idle connection, the lock and the read in one
    /// query, the in-flight record and `COMMIT` in another.
    pub(crate) async fn claim_alone(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        self.lock_then(First::Claim, scope, key, fingerprint, ClaimOnly)
            .await
    }

    /// A completion in a transaction of its own, in one round trip: `BEGIN`,
    /// waiting for the key's lock, the fenced update and `COMMIT` go as one
    /// simple query. (A fenced update that matches nothing commits an empty
    /// transaction.) Until the query is answered the server may be inside
    /// its transaction, so a connection whose query failed is rolled back
    /// before it goes back to the pool, and one given up on is closed.
    pub(crate) async fn settle_alone(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let now = self.clock().now();
        let sql = format!(
            "{}; SELECT pg_advisory_xact_lock({}); {}; COMMIT",
            self.pooling().begin(),
            lock::lock_key(&claim.scope, &claim.key),
            records::execute_settle(claim, outcome, now),
        );
        let conn = self.pool().acquire().await.map_err(|e| self.fail(e))?;
        let mut settling = Beginning::new(conn);
        let mut answered = Self::settle_query(settling.connection(), &sql).await;
        if matches!(&answered, Err(e) if locked::has_code(e, records::STATEMENT_MISSING)) {
            answered = match Self::roll_back_raw(settling.connection()).await {
                Ok(()) => match records::prepare_session(settling.connection()).await {
                    Ok(()) => Self::settle_query(settling.connection(), &sql).await,
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
        }
        match answered {
            Ok(fence) => {
                settling.settle();
                match fence {
                    Fence::Held => Ok(()),
                    Fence::Lost { current } => Err(self.fenced(claim, current)),
                }
            }
            Err(error) => {
                if Self::roll_back_raw(settling.connection()).await.is_ok() {
                    settling.settle();
                }
                Err(self.fail_commit(error))
            }
        }
    }

    /// Runs the completion query; its last row is the fenced update's answer.
    async fn settle_query(conn: &mut PgConnection, sql: &str) -> sqlx::Result<Fence> {
        let rows = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(conn).await?;
        match rows.last() {
            Some(row) => records::fence(row),
            None => Err(sqlx::Error::Protocol(
                "a completion's query returned no rows".to_owned(),
            )),
        }
    }

    /// Ends whatever transaction a failed simple query left open.
    async fn roll_back_raw(conn: &mut PgConnection) -> sqlx::Result<()> {
        sqlx::raw_sql("ROLLBACK").execute(conn).await.map(drop)
    }

    /// Frees the key of `claim`, keeping its record.
    pub(crate) async fn release_alone(&self, claim: &Claim) -> Result<(), Error> {
        let now = self.clock().now();
        self.set_lease(claim, None, now).await
    }
}

/// A leased claim: under the key's lock, only the in-flight record is
/// written; the effect runs after the commit, outside the transaction.
struct ClaimOnly;

impl Locked for ClaimOnly {
    type Output = Result<Claimed, Error>;

    fn replayed(replay: Replay) -> Self::Output {
        Ok(Claimed::Replayed(replay))
    }

    fn failed(error: Error) -> Self::Output {
        Err(error)
    }

    async fn run(
        self,
        store: &PgStore,
        tx: Transaction<'_, Postgres>,
        plan: Plan,
        replaces: bool,
        op: Operation,
    ) -> Self::Output {
        let now = store.clock().now();
        let record = plan.in_flight(&op, now, store.settings());
        store.write_record_and_commit(tx, &record, replaces).await?;
        Ok(Claimed::Fresh(Claim {
            scope: op.scope,
            key: op.key,
            token: plan.token,
            lease_until: now.plus(store.settings().lease),
            took_over: plan.took_over,
            expires_at: plan.expires_at,
        }))
    }
}

impl PgStore {
    /// Waits for the key's lock, moves the lease end of `claim`'s record to
    /// `until` (renew) or clears it (release), commits; `Fenced` if the
    /// claim's token is no longer current.
    async fn set_lease(
        &self,
        claim: &Claim,
        until: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut tx = self.begin().await?;
        lock::lock(&mut tx, lock::lock_key(&claim.scope, &claim.key))
            .await
            .map_err(|e| self.fail(e))?;
        let fence = records::set_lease(&mut tx, claim, until, now).await;
        match fence.map_err(|e| self.fail(e))? {
            Fence::Held => self.commit(tx).await,
            Fence::Lost { current } => {
                self.roll_back(tx).await;
                Err(self.fenced(claim, current))
            }
        }
    }

    /// Completes a leased claim whose effect is a write in this database: runs
    /// `effect` in a transaction and settles the record in the same one, only if
    /// `claim` still holds the key.
    ///
    /// `Fenced` (and the effect does not run) if the claim was taken over. An
    /// effect error rolls back the effect and leaves the claim held, as it was:
    /// the caller may try again, or [`release`](LeaseStore::release) it.
    pub(crate) async fn complete_in_transaction<F, E>(
        &self,
        claim: &Claim,
        effect: F,
    ) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<PgConnection, Outcome, E>,
        E: Send + 'static,
    {
        let mut tx = self.begin().await?;
        lock::lock(&mut tx, lock::lock_key(&claim.scope, &claim.key))
            .await
            .map_err(|e| self.fail(e))?;
        let current = records::lock_token(&mut tx, &claim.scope, &claim.key)
            .await
            .map_err(|e| self.fail(e))?;
        match current {
            Some((token, RecordState::InFlight)) if token == claim.token => {}
            other => {
                self.roll_back(tx).await;
                return Err(self.fenced(claim, other.map(|(token, _)| token)).into());
            }
        }

        let (mut tx, outcome) = self
            .run_or_roll_back(tx, effect)
            .await
            .map_err(ApplyError::Effect)?;
        let now: Timestamp = self.clock().now();
        match records::settle(&mut tx, claim, &outcome, now)
            .await
            .map_err(|e| self.fail(e))?
        {
            Fence::Held => {}
            Fence::Lost { .. } => {
                self.roll_back(tx).await;
                return Err(Error::Store(StoreError::new(
                    ErrorKind::SerializationFailure,
                    format!(
                        "the record of {}/{} changed while it was locked; run the operation again",
                        claim.scope, claim.key
                    ),
                ))
                .into());
            }
        }
        self.commit(tx).await?;
        Ok(outcome)
    }
}

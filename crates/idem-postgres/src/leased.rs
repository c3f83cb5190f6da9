//! Leased mode: claim a key with a lease, run the effect outside (or inside) the
//! database, then settle the record fenced by the claim's token.
//!
//! `claim` first sends one statement, in a query that is its own transaction
//! (`records::execute_claim`): `INSERT ... ON CONFLICT (scope, key) DO UPDATE
//! ... WHERE` the record is past its window or released by its holder,
//! `RETURNING` the token. For a new key that is the whole claim, one round
//! trip, with neither a separate lock nor a read. When it claims nothing (a
//! replay, a live or ended lease, another fingerprint, or a key whose
//! advisory lock another transaction holds), the claim follows the locked
//! path of the atomic apply after a look-up: the key's lock tried and its
//! record read, then the in-flight record written and committed; takeovers
//! of ended leases happen there. Behind a transaction pooler and with
//! tombstones kept, only the locked path is used (see
//! [`PgStore::claims_in_one_statement`]).
//!
//! `complete` is one fenced `UPDATE ... WHERE token = held AND state =
//! 'in_flight'` (without the one-statement claim: in a transaction that
//! first waits for the key's lock, all in one round trip). When it matches
//! nothing the claim was taken over, and the same statement reports the
//! current token. A locked takeover that read the record before the
//! completion committed fails its write instead of overwriting it (see
//! `records::replace_if_newer`). `renew` and `release` wait for the key's
//! lock and make the same kind of fenced update. With group commit on (see
//! `group`), claims and completions of concurrent callers may share
//! transactions instead.
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
    ApplyError, AtomicEffect, Claim, Claimed, Error, ErrorKind, FencingToken, Fingerprint,
    IdempotencyKey, LeaseStore, Operation, Outcome, Plan, RecordState, Replay, Scope, StoreError,
    Timestamp,
};
use sqlx::postgres::PgRow;
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
    /// A claim in a transaction of its own: first the one-statement claim
    /// (see the module docs), one round trip; when it claims nothing, the
    /// locked path after a look-up (a replay is the likely answer). Where the
    /// one statement is not used (see
    /// [`claims_in_one_statement`](Self::claims_in_one_statement)), the
    /// locked path in the round trips of atomic apply: `BEGIN` on an idle
    /// connection, the lock and the read in one query, the in-flight record
    /// and `COMMIT` in another.
    pub(crate) async fn claim_alone(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        if !self.claims_in_one_statement() {
            return self
                .lock_then(First::Claim, scope, key, fingerprint, ClaimOnly)
                .await;
        }
        match self
            .claim_in_one_statement(scope, key, &fingerprint)
            .await?
        {
            Some(claim) => Ok(Claimed::Fresh(claim)),
            None => {
                self.lock_then(First::Replay, scope, key, fingerprint, ClaimOnly)
                    .await
            }
        }
    }

    /// The one-statement claim: `Some` when it claimed the key, `None` when
    /// the record it found needs the locked path's decision (or a lock it
    /// would have waited for was held).
    ///
    /// An idle connection is used as it is, without the pool's ping; if it
    /// turns out to be dead, the statement is sent again on a checked one.
    /// That is safe even if the first one committed: the second finds the
    /// record in flight with a live lease, claims nothing, and the locked
    /// path answers `InFlight`; the key is never claimed twice, nor freed.
    async fn claim_in_one_statement(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Claim>, Error> {
        let now = self.clock().now();
        let settings = self.settings();
        let lease_until = now.plus(settings.lease);
        let sql = records::execute_claim(
            scope,
            key,
            fingerprint,
            FencingToken::first_at(now),
            lease_until,
            now,
            now.plus(settings.retention),
        );
        let idle = self
            .idle_connections_trusted()
            .then(|| self.pool().try_acquire())
            .flatten();
        let mut answered = None;
        if let Some(mut conn) = idle {
            match Self::claim_query(&mut conn, &sql).await {
                Err(error) if locked::connection_lost(&error) => {
                    tracing::debug!(%error, "an idle connection was dead; taking a checked one");
                    conn.close_on_drop();
                }
                done => answered = Some(done),
            }
        }
        let answered = match answered {
            Some(done) => done,
            None => {
                let mut conn = self.pool().acquire().await.map_err(|e| self.fail(e))?;
                Self::claim_query(&mut conn, &sql).await
            }
        };
        match answered {
            Ok(Some(row)) => Ok(Some(Claim {
                scope: scope.clone(),
                key: key.clone(),
                token: records::claimed_token(&row).map_err(|e| self.fail(e))?,
                lease_until,
                took_over: false,
                expires_at: records::claimed_window_end(&row).map_err(|e| self.fail(e))?,
            })),
            Ok(None) => Ok(None),
            Err(error) if locked::has_code(&error, records::CLAIM_WAITED) => Ok(None),
            Err(error) => Err(self.fail_commit(error)),
        }
    }

    /// Runs the one-statement claim on `conn`, preparing the session's
    /// statements first if it has none; its row, if it claimed.
    async fn claim_query(conn: &mut PgConnection, sql: &str) -> sqlx::Result<Option<PgRow>> {
        let rows = match sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
        {
            Err(error) if locked::has_code(&error, records::STATEMENT_MISSING) => {
                records::prepare_session(conn).await?;
                sqlx::raw_sql(AssertSqlSafe(sql))
                    .fetch_all(&mut *conn)
                    .await?
            }
            done => done?,
        };
        Ok(rows.into_iter().next())
    }

    /// A completion in a transaction of its own, in one round trip: the
    /// fenced update alone (with the one-statement claim), or `BEGIN`,
    /// waiting for the key's lock, the fenced update and `COMMIT` as one
    /// simple query. (A fenced update that matches nothing commits an empty
    /// transaction.) Until the query is answered the server may be inside
    /// its transaction, so a connection whose query failed is rolled back
    /// before it goes back to the pool, and one given up on is closed.
    pub(crate) async fn settle_alone(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let now = self.clock().now();
        let sql = if self.claims_in_one_statement() {
            records::execute_settle(claim, outcome, now)
        } else {
            format!(
                "{}; SELECT pg_advisory_xact_lock({}); {}; COMMIT",
                self.pooling().begin(),
                lock::lock_key(&claim.scope, &claim.key),
                records::execute_settle(claim, outcome, now),
            )
        };
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

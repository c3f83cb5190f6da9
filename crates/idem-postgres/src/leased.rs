//! Leased mode: claim a key with a lease, run the effect outside (or inside) the
//! database, then settle the record fenced by the claim's token.
//!
//! `claim` follows the same path as the atomic apply (fast path, then try-lock,
//! read, decide) and writes an in-flight record with the new token and a lease.
//! `complete`, `renew` and `release` wait for the key's lock (its holder is a
//! short claim, or a takeover whose commit rightly fences them) and then make
//! one fenced `UPDATE ... WHERE token = held AND state = 'in_flight'`. When that
//! matches nothing the claim was taken over, and the same statement reports the
//! current token.
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
    LeaseStore, Operation, Outcome, RecordState, Scope, StoreError, Timestamp,
};
use sqlx::PgConnection;

use crate::decision::Next;
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
            return self.claim_grouped(op).await;
        }
        self.claim_alone(scope, key, fingerprint).await
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let now = self.clock().now();
        let lease_until = now.plus(self.settings().lease);
        self.fenced_update(claim, Change::Lease(Some(lease_until)), now)
            .await?;
        Ok(Claim {
            lease_until,
            ..claim.clone()
        })
    }

    /// In a group with the completions of concurrent callers, as `claim`.
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        if self.group_commit() {
            return self.settle_grouped(claim, outcome).await;
        }
        self.settle_alone(claim, outcome).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.release_alone(claim).await
    }
}

impl PgStore {
    /// A claim in a transaction of its own: the look-up on the pool, then the
    /// lock, the read and the write.
    pub(crate) async fn claim_alone(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        if let Some(outcome) = self.peek(self.pool(), scope, key, &fingerprint).await? {
            return Ok(Claimed::Replayed(outcome));
        }

        let now = self.clock().now();
        let mut tx = self.begin().await?;
        let (decision, found) = match self
            .decide_locked(&mut tx, scope, key, &fingerprint, now)
            .await
        {
            Ok(decided) => decided,
            Err(error) => {
                self.roll_back(tx).await;
                return Err(error);
            }
        };
        let plan = match Next::after(decision, found.as_ref(), now, self.settings()) {
            Next::Run(plan) => plan,
            Next::Replay(outcome) => {
                self.roll_back(tx).await;
                return Ok(Claimed::Replayed(outcome));
            }
        };
        let lease_until = now.plus(self.settings().lease);
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        let record = plan.in_flight(&op, now, self.settings());
        self.write(&mut tx, std::slice::from_ref(&record)).await?;
        self.commit(tx).await?;
        Ok(Claimed::Fresh(Claim {
            scope: scope.clone(),
            key: key.clone(),
            token: plan.token,
            lease_until,
            took_over: plan.took_over,
        }))
    }

    /// A completion in a transaction of its own.
    pub(crate) async fn settle_alone(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let now = self.clock().now();
        self.fenced_update(claim, Change::Settle(outcome), now)
            .await
    }

    /// Frees the key of `claim`, keeping its record.
    pub(crate) async fn release_alone(&self, claim: &Claim) -> Result<(), Error> {
        let now = self.clock().now();
        self.fenced_update(claim, Change::Lease(None), now).await
    }
}

/// What a fenced update changes.
enum Change<'a> {
    /// Settle the record with this outcome.
    Settle(&'a Outcome),
    /// Move the lease end here (renew), or clear it (release).
    Lease(Option<Timestamp>),
}

impl PgStore {
    /// Waits for the key's lock, makes one fenced update, commits; `Fenced` if
    /// the claim's token is no longer current.
    async fn fenced_update(
        &self,
        claim: &Claim,
        change: Change<'_>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut tx = self.begin().await?;
        lock::lock(&mut tx, lock::lock_key(&claim.scope, &claim.key))
            .await
            .map_err(|e| self.fail(e))?;
        let fence = match change {
            Change::Settle(outcome) => records::settle(&mut tx, claim, outcome, now).await,
            Change::Lease(until) => records::set_lease(&mut tx, claim, until, now).await,
        };
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

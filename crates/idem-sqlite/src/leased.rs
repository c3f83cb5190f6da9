//! Leased mode: claim a key with a lease, run the effect outside (or inside) the
//! database, then settle the record fenced by the claim's token.
//!
//! `claim` takes the in-process hold and goes to the writer, which reads the
//! record in its transaction, decides, and writes an in-flight record with
//! the new token and a lease. Claims and completions travel to the writer
//! as lease jobs, decided and written many to a transaction (see
//! `lease_writes`). `complete`, `renew` and
//! `release` change the record on the writer only while it is in flight
//! with the claim's token; otherwise the claim was taken over and the answer
//! is `Fenced` with the current token.
//!
//! `complete_with` ([`AtomicStore`](idem_core::AtomicStore)) is the leased
//! completion for an effect that *is* a write in this database: the effect and
//! the fenced completion commit together, so a zombie worker whose claim was
//! taken over cannot commit its effect either.

use idem_core::{
    ApplyError, AtomicEffect, Claim, Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore,
    Operation, Outcome, RecordState, Scope, Settings, Timestamp,
};
use rusqlite::Connection;

use crate::lease_writes::{LeaseJob, change_held_in, claim_in, fenced};
use crate::records::{self, HeldChange};
use crate::store::{SqliteStore, run_effect};
use crate::write_tx::WriteTx;

impl LeaseStore for SqliteStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Claimed, Error> {
        let op = Operation::new(scope.clone(), key.clone(), fingerprint);
        // Straight to the writer, which reads the record in its transaction
        // anyway: a leased claim is mostly a new key (the HTTP layer answers
        // the replays it has seen from memory), and a peek on a reader first
        // would cost two thread hand-offs for nothing. Only a key held here
        // already is looked up first: a duplicate of a settled key, read
        // while another duplicate holds it, is a replay, not a conflict.
        let held = self.holds().try_hold(op.scope.as_str(), op.key.as_str());
        let Some(_hold) = held else {
            return match self.answer_early(&op).await? {
                Some(replay) => Ok(Claimed::Replayed(replay)),
                None => Err(self.busy(&op)),
            };
        };
        if self.lease_batches() {
            let (job, answer) = LeaseJob::claim(op);
            return self.connections().lease(job, answer).await;
        }
        let store = self.clone();
        self.connections()
            .write_grouped(move |conn| claim_in(conn, &store.protocol(), op))
            .await
    }

    async fn renew(&self, claim: &Claim) -> Result<Claim, Error> {
        let lease = self.settings().lease;
        let now = self
            .change_held(claim, move |now, _| {
                HeldChange::Lease(Some(now.plus(lease)))
            })
            .await?;
        Ok(Claim {
            lease_until: now.plus(lease),
            ..claim.clone()
        })
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let (claim, outcome) = (claim.clone(), outcome.clone());
        if self.lease_batches() {
            let (job, answer) = LeaseJob::complete(claim, outcome);
            return self.connections().lease(job, answer).await;
        }
        let store = self.clone();
        self.connections()
            .write_grouped(move |conn| {
                let now = store.clock().now();
                change_held_in(conn, &claim, HeldChange::Settle(&outcome), now)
            })
            .await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.change_held(claim, |_, _| HeldChange::Lease(None))
            .await
            .map(drop)
    }

    async fn end_lease(&self, claim: &Claim) -> Result<(), Error> {
        self.change_held(claim, |now, _| HeldChange::Lease(Some(now)))
            .await
            .map(drop)
    }
}

impl SqliteStore {
    /// Changes a held claim on the writer; `Fenced` when the token is no longer
    /// current.
    async fn change_held(
        &self,
        claim: &Claim,
        change: impl FnOnce(Timestamp, &Settings) -> HeldChange<'static> + Send + 'static,
    ) -> Result<Timestamp, Error> {
        let claim = claim.clone();
        let store = self.clone();
        self.connections()
            .write_grouped(move |conn| {
                let now = store.clock().now();
                change_held_in(conn, &claim, change(now, store.settings()), now)?;
                Ok(now)
            })
            .await
    }

    /// Completes a leased claim whose effect is a write in this database: runs
    /// `effect` in a transaction and settles the record in the same one, only if
    /// `claim` still holds the key (see `AtomicStore::complete_with`).
    pub(crate) async fn complete_in_transaction<F, E>(
        &self,
        claim: &Claim,
        effect: F,
    ) -> Result<Outcome, ApplyError<E>>
    where
        F: AtomicEffect<Connection, Outcome, E>,
        E: Send + 'static,
    {
        let claim = claim.clone();
        let store = self.clone();
        self.connections()
            .write(move |conn| {
                let now = store.clock().now();
                let mut tx = WriteTx::begin(conn)?;
                let found = records::select(&tx, claim.scope.as_str(), claim.key.as_str())?;
                match &found {
                    Some(r) if r.token == claim.token && r.state == RecordState::InFlight => {}
                    other => return Err(fenced(&claim, other.as_ref().map(|r| r.token)).into()),
                }
                let outcome = run_effect(effect, &mut tx).map_err(ApplyError::Effect)?;
                records::update_held(
                    &tx,
                    claim.scope.as_str(),
                    claim.key.as_str(),
                    claim.token,
                    HeldChange::Settle(&outcome),
                    now,
                )?;
                tx.commit()?;
                Ok(outcome)
            })
            .await?
    }
}
